//! How AdamW steps (`hwaccel plan --adamw`, a ModelPlacement's `goal.train.adamw`), and the
//! memory the step itself holds beside the model states.
//!
//! PyTorch has three AdamW paths. The fused kernel (`torch.optim.AdamW(fused=True)`, the HF
//! Trainer's `adamw_torch_fused`, its default from torch 2.8; DeepSpeed's `FusedAdam`) and the
//! single-tensor loop (`foreach=False`) update each parameter in place. The multi-tensor path
//! (`foreach`, what `torch.optim.AdamW(params)` picks on CUDA, and the HF Trainer's
//! `adamw_torch`, its default before torch 2.8) first takes the square root of every second
//! moment at once (`torch._foreach_sqrt` in `_multi_tensor_adamw`): a transient copy of the
//! moments, one value per trained parameter in the moments' dtype, beside the weights,
//! gradients and moments. Published A100 runs of full fine-tunes with `adamw_torch` on
//! transformers 4.48 and torch 2.4 peak at exactly five times their BF16 parameter bytes
//! whatever the batch (weights, gradients, two moments and that copy; fms-acceleration's
//! `scripts/benchmarks/refs/a100_80gb.csv`, docs/planner.md "Published GPU measurements").

use serde::{Deserialize, Serialize};

use super::OptimizerStates;

/// The AdamW implementation a training step runs.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Adamw {
    /// A fused kernel (or the single-tensor loop): each parameter updated in place.
    #[default]
    Fused,
    /// PyTorch's multi-tensor path: a transient copy of the second moments at every step.
    Foreach,
}

impl Adamw {
    /// The name as the flag and the CRD write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fused => "fused",
            Self::Foreach => "foreach",
        }
    }

    /// Bytes per trained parameter the optimizer step holds beyond the model states: the
    /// foreach path's copy of the moments, in their dtype. bitsandbytes' 8-bit Adam updates
    /// each tensor in its own kernel whichever path is asked for.
    pub fn step_bytes_per_param(self, states: OptimizerStates) -> f64 {
        match (self, states) {
            (Self::Fused, _) | (_, OptimizerStates::EightBit) => 0.0,
            (Self::Foreach, OptimizerStates::Fp32) => 4.0,
            (Self::Foreach, OptimizerStates::Bf16) => 2.0,
        }
    }

    /// The assumption, for the plan's reasons.
    pub fn describe(self, states: OptimizerStates) -> &'static str {
        match (self, states) {
            (_, OptimizerStates::EightBit) => {
                "adamw: bitsandbytes' 8-bit AdamW updates each tensor in place; --adamw does not apply"
            }
            (Self::Fused, _) => {
                "adamw fused: each parameter updated in place (the HF Trainer's default adamw_torch_fused from torch 2.8, DeepSpeed's FusedAdam); --adamw foreach if the loop calls torch.optim.AdamW with its defaults, which holds a copy of the moments during the step"
            }
            (Self::Foreach, _) => {
                "adamw foreach: PyTorch's multi-tensor AdamW (torch.optim.AdamW's default on CUDA, the HF Trainer's adamw_torch) holds a copy of the second moments during the step"
            }
        }
    }
}

impl std::fmt::Display for Adamw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_foreach_path_holds_a_copy_of_the_moments() {
        for states in [
            OptimizerStates::Fp32,
            OptimizerStates::Bf16,
            OptimizerStates::EightBit,
        ] {
            assert_eq!(Adamw::Fused.step_bytes_per_param(states), 0.0);
        }
        assert_eq!(
            Adamw::Foreach.step_bytes_per_param(OptimizerStates::Fp32),
            4.0
        );
        assert_eq!(
            Adamw::Foreach.step_bytes_per_param(OptimizerStates::Bf16),
            2.0
        );
        assert_eq!(
            Adamw::Foreach.step_bytes_per_param(OptimizerStates::EightBit),
            0.0
        );
        assert!(
            Adamw::Foreach
                .describe(OptimizerStates::EightBit)
                .contains("does not apply")
        );
        assert_eq!(Adamw::default(), Adamw::Fused);
    }
}
