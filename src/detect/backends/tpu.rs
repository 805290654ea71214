//! Google TPUs: `/dev/accel*`, `/sys/class/accel`, PCI ids for v4/v5e/v5p/v6e, ICI topology from the environment.

use crate::detect::{Backend, Context, Findings};

/// The `tpu` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tpu;

impl Backend for Tpu {
    fn name(&self) -> &'static str {
        "tpu"
    }

    fn detect(&self, _ctx: &Context) -> Findings {
        Findings::default()
    }
}
