//! NVIDIA GPUs: NVML when `libnvidia-ml` loads, `nvidia-smi` otherwise; MIG and NVLink topology.

use crate::detect::{Backend, Context, Findings};

/// The `nvidia` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Nvidia;

impl Backend for Nvidia {
    fn name(&self) -> &'static str {
        "nvidia"
    }

    fn detect(&self, _ctx: &Context) -> Findings {
        Findings::default()
    }
}
