//! Intel data-center and Arc GPUs: xe/i915 DRM sysfs and `xpu-smi`.

use crate::detect::{Backend, Context, Findings};

/// The `intel-gpu` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct IntelGpu;

impl Backend for IntelGpu {
    fn name(&self) -> &'static str {
        "intel-gpu"
    }

    fn detect(&self, _ctx: &Context) -> Findings {
        Findings::default()
    }
}
