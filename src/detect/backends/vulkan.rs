//! Any GPU with a Vulkan driver, from `vulkaninfo --summary`; fills gaps left by vendor backends.

use crate::detect::{Backend, Context, Findings};

/// The `vulkan` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Vulkan;

impl Backend for Vulkan {
    fn name(&self) -> &'static str {
        "vulkan"
    }

    fn detect(&self, _ctx: &Context) -> Findings {
        Findings::default()
    }
}
