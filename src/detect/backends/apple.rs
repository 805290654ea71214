//! Apple silicon GPU and Neural Engine, from the device tree (Asahi Linux).

use crate::detect::{Backend, Context, Findings};

/// The `apple` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Apple;

impl Backend for Apple {
    fn name(&self) -> &'static str {
        "apple"
    }

    fn detect(&self, _ctx: &Context) -> Findings {
        Findings::default()
    }
}
