//! The runtime environment: container, Kubernetes, cloud and instance type from DMI, kernel, OS.

use crate::detect::{Backend, Context, Findings};

/// The `runtime` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Runtime;

impl Backend for Runtime {
    fn name(&self) -> &'static str {
        "runtime"
    }

    fn detect(&self, _ctx: &Context) -> Findings {
        Findings::default()
    }
}
