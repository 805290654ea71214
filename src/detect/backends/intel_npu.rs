//! Intel NPU (Meteor Lake and later): the `intel_vpu` accel device.

use crate::detect::{Backend, Context, Findings};

/// The `intel-npu` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct IntelNpu;

impl Backend for IntelNpu {
    fn name(&self) -> &'static str {
        "intel-npu"
    }

    fn detect(&self, _ctx: &Context) -> Findings {
        Findings::default()
    }
}
