//! Qualcomm Cloud AI 100: the `qaic` accel device and `qaic-util`.

use crate::detect::{Backend, Context, Findings};

/// The `qualcomm` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Qualcomm;

impl Backend for Qualcomm {
    fn name(&self) -> &'static str {
        "qualcomm"
    }

    fn detect(&self, _ctx: &Context) -> Findings {
        Findings::default()
    }
}
