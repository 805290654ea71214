//! AMD XDNA NPU (Ryzen AI): the `amdxdna` accel device.

use crate::detect::{Backend, Context, Findings};

/// The `xdna` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Xdna;

impl Backend for Xdna {
    fn name(&self) -> &'static str {
        "xdna"
    }

    fn detect(&self, _ctx: &Context) -> Findings {
        Findings::default()
    }
}
