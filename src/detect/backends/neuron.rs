//! AWS Inferentia and Trainium: `/dev/neuron*`, sysfs, `neuron-ls`.

use crate::detect::{Backend, Context, Findings};

/// The `neuron` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Neuron;

impl Backend for Neuron {
    fn name(&self) -> &'static str {
        "neuron"
    }

    fn detect(&self, _ctx: &Context) -> Findings {
        Findings::default()
    }
}
