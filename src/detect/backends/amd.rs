//! AMD Instinct/Radeon GPUs: sysfs and KFD topology (XGMI hives), `amd-smi`/`rocm-smi`; compute/memory partitions.

use crate::detect::{Backend, Context, Findings};

/// The `amd` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Amd;

impl Backend for Amd {
    fn name(&self) -> &'static str {
        "amd"
    }

    fn detect(&self, _ctx: &Context) -> Findings {
        Findings::default()
    }
}
