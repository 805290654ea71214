//! Which kernels run the decoder layers' norms, rotary embedding and gated activation
//! (`hwaccel plan --kernels`, a ModelPlacement's `goal.train.kernels`), and what they keep for
//! the backward pass.
//!
//! `use_liger_kernel=True` (the HF Trainer's and TRL's flag, LLaMA-Factory's
//! `enable_liger_kernel`) puts in Liger Kernel's RMSNorm, RoPE and SwiGLU/GeGLU beside its fused
//! loss (`apply_liger_kernel_to_<model>` with its defaults). They keep less than transformers'
//! own code (traced with Liger 0.8.5's Python code and its Triton launches made no-ops,
//! `scripts/measure-training-memory.py --trace`, `fixtures/training/`):
//! * **RMSNorm** saves its 16-bit input and an FP32 inverse RMS per row, where transformers'
//!   saves the input upcast to FP32 (and, when the norm's weight is trained, the normalised
//!   16-bit copy the weight multiplies): 2 bytes per hidden unit less for each norm of a
//!   frozen layer, 4 of a trained one; and its backward pass writes the input's gradient over
//!   the output's (2 less each in a frozen layer's working set). Qwen3's per-head query and
//!   key norms keep 2 bytes per unit instead of 4.
//! * **SwiGLU/GeGLU** saves the gate and up projections and recomputes the activation in the
//!   backward pass: one 16-bit intermediate-wide tensor less per layer and token.
//! * Its output dtype is its input's, so a 4-bit base prepared for training (FP32 norms) keeps
//!   a 16-bit residual stream where transformers' norms turn it FP32 (QLoRA's checkpoints are
//!   half as large).
//!
//! RoPE keeps what transformers' does (the cosines and sines). Liger Kernel replaces an MoE's
//! experts with its own; their routed activations are counted as transformers' grouped experts
//! keep them (not traced), and only the norms' saving is taken for MoE layers.

use serde::{Deserialize, Serialize};

/// The kernels that run the decoder layers.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Kernels {
    /// transformers' own modeling code.
    #[default]
    Standard,
    /// Liger Kernel's RMSNorm, RoPE and SwiGLU/GeGLU (`use_liger_kernel=True`).
    Liger,
}

/// The model types whose layers `apply_liger_kernel_to_<model>` patches with Liger's RMSNorm
/// and SwiGLU or GeGLU (Liger Kernel 0.8.5, `MODEL_TYPE_TO_APPLY_LIGER_FN`; its multimodal
/// wrappers left out).
const LIGER_MODEL_TYPES: &[&str] = &[
    "deepseek_v2",
    "deepseek_v3",
    "exaone4",
    "falcon_h1",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "glm4",
    "gpt_oss",
    "granite",
    "hunyuan_v1_dense",
    "hunyuan_v1_moe",
    "llama",
    "llama4",
    "llama4_text",
    "ministral",
    "mistral",
    "mixtral",
    "olmo2",
    "olmo3",
    "phi3",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "qwen3_next",
    "smollm3",
];

impl Kernels {
    /// The name as the flag and the CRD write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Standard => "standard",
            Self::Liger => "liger",
        }
    }

    /// Whether Liger Kernel's layer kernels run `model_type`'s layers under this choice.
    pub fn liger_layers(self, model_type: &str) -> bool {
        self == Self::Liger && LIGER_MODEL_TYPES.contains(&model_type)
    }

    /// The assumption, for the plan's reasons.
    pub fn describe(self, model_type: &str) -> String {
        match self {
            Self::Standard => "kernels standard: transformers' own norms, rotary embedding and MLP activation (--kernels liger when use_liger_kernel=True puts Liger Kernel's in, which keep less)".to_string(),
            Self::Liger if self.liger_layers(model_type) => "kernels liger: Liger Kernel's RMSNorm, RoPE and SwiGLU/GeGLU (use_liger_kernel=True) keep a 16-bit input per norm and recompute the MLP's activation; the loss is --loss's choice".to_string(),
            Self::Liger => format!(
                "kernels liger: Liger Kernel has no layer kernels for {model_type}; its layers are counted as transformers' own"
            ),
        }
    }
}

impl std::fmt::Display for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liger_runs_the_layers_of_the_types_it_patches_only() {
        assert!(Kernels::Liger.liger_layers("llama"));
        assert!(Kernels::Liger.liger_layers("gemma2"));
        assert!(!Kernels::Standard.liger_layers("llama"));
        assert!(!Kernels::Liger.liger_layers("gpt_bigcode"));
        assert!(
            Kernels::Liger
                .describe("gpt_bigcode")
                .contains("no layer kernels for gpt_bigcode")
        );
        assert!(
            Kernels::Liger
                .describe("llama")
                .starts_with("kernels liger:")
        );
        assert_eq!(Kernels::default(), Kernels::Standard);
        // The list is sorted, so a new entry goes where a reader looks for it.
        assert!(LIGER_MODEL_TYPES.windows(2).all(|w| w[0] < w[1]));
    }
}
