//! Generic PCI accelerators by vendor id and class (Cerebras, Graphcore, Groq, Tenstorrent...), so nothing with a PCI function goes unseen.

use crate::detect::{Backend, Context, Findings};

/// The `pci` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pci;

impl Backend for Pci {
    fn name(&self) -> &'static str {
        "pci"
    }

    fn detect(&self, _ctx: &Context) -> Findings {
        Findings::default()
    }
}
