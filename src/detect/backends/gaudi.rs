//! Intel Gaudi (Habana): sysfs `/sys/class/accel`/habanalabs and `hl-smi`.

use crate::detect::{Backend, Context, Findings};

/// The `gaudi` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gaudi;

impl Backend for Gaudi {
    fn name(&self) -> &'static str {
        "gaudi"
    }

    fn detect(&self, _ctx: &Context) -> Findings {
        Findings::default()
    }
}
