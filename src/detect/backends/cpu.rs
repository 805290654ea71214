//! The host CPU: model, sockets, cores, AI ISA flags, memory, cgroup limits.

use crate::detect::{Backend, Context, Findings};

/// The `cpu` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu;

impl Backend for Cpu {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn detect(&self, _ctx: &Context) -> Findings {
        Findings::default()
    }
}
