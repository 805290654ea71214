//! Per-device memory for serving, following vLLM's start-up budget
//! (`vllm/v1/worker/gpu_worker.py`, `determine_available_memory`):
//!
//! ```text
//! budget    = capacity * gpu_memory_utilization          (default 0.90)
//! kv_free   = budget - weights - peak activations - runtime overhead
//! fits      = kv_free holds one request of the full context (else vLLM refuses to start)
//! max_concurrency = kv_free / bytes of one full-context request
//! ```
//!
//! Constants, and why:
//! * Scheduler budget: vLLM's defaults for its API server — 8192 batched tokens and 1024
//!   sequences on devices with at least 70 GiB that are not A100s, 2048 and 256 elsewhere
//!   (`vllm/engine/arg_utils.py`, `get_batch_defaults`).
//! * Peak activations: the MLP's live tensors for a full batch,
//!   `batched_tokens * (2h + 3 * I_eff / tp) * 2` bytes (input and residual, gate/up output,
//!   activation output), plus the sampler's logits for every sequence,
//!   `sequences * vocab * 8` bytes (FP32 logits and one FP32 working copy). Checked against
//!   vLLM's own profile of Llama-3.1-8B (vllm issue #10517): 2.07 GiB measured at 20,000
//!   tokens, 2.15 GiB from this formula.
//! * Runtime overhead outside PyTorch's allocator (CUDA context, cuBLAS workspaces): 0.5 GiB
//!   (0.35 GiB measured in the same issue), plus 0.5 GiB of NCCL buffers when the replica
//!   spans devices. CUDA graphs live in the 10 % vLLM leaves outside its budget.

use serde::Serialize;

use super::kv::{KvDtype, KvLayout};
use super::model::Model;
use super::units::Bytes;
use super::weights::WeightBytes;
use crate::hardware::MIB;

/// vLLM's default `gpu_memory_utilization`.
pub const DEFAULT_GPU_UTIL: f64 = 0.90;

/// Runtime memory outside the tensor allocator on every device.
const BASE_OVERHEAD: Bytes = Bytes(512 * MIB);
/// Extra communication buffers when a replica spans more than one device.
const COLLECTIVE_OVERHEAD: Bytes = Bytes(512 * MIB);

/// Bytes per activation value (16-bit).
const ACTIVATION_BYTES: u64 = 2;
/// Bytes per sampler logit: the FP32 logits and one FP32 working copy.
const SAMPLER_BYTES_PER_LOGIT: u64 = 8;

/// One device's memory, as reported in every plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    /// Model weights on this device.
    pub weights: Bytes,
    /// KV cache reserved for the requests this device serves.
    pub kv_cache: Bytes,
    /// Peak activations (training: stored activations and logits).
    pub activations: Bytes,
    /// Runtime overhead (CUDA context, communication buffers; training: optimizer and
    /// gradients are broken out in the training report and counted here only as runtime).
    pub overhead: Bytes,
    /// The sum of the above.
    pub total: Bytes,
    /// The device's memory.
    pub capacity: Bytes,
    /// `capacity * utilisation`: what the plan may use.
    pub budget: Bytes,
}

impl DeviceMemory {
    /// A breakdown with `total` filled in.
    pub fn new(
        weights: Bytes,
        kv_cache: Bytes,
        activations: Bytes,
        overhead: Bytes,
        capacity: Bytes,
        budget: Bytes,
    ) -> Self {
        Self {
            weights,
            kv_cache,
            activations,
            overhead,
            total: weights + kv_cache + activations + overhead,
            capacity,
            budget,
        }
    }

    /// True when the total stays within the budget. A total that saturated (absurd inputs
    /// made some term overflow) never fits, whatever the budget.
    pub fn within_budget(&self) -> bool {
        self.total <= self.budget && !self.total.is_saturated()
    }
}

/// vLLM's scheduler defaults for a device (tokens per step, sequences per step).
pub fn scheduler_defaults(capacity: Bytes, product: &str) -> (u64, u64) {
    let large = capacity >= Bytes::gib(70) && !product.to_ascii_lowercase().contains("a100");
    if large { (8192, 1024) } else { (2048, 256) }
}

/// The serving request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServingTarget {
    /// Tokens per request (prompt + output): vLLM's `max_model_len`.
    pub context: u64,
    /// KV-cache element type.
    pub kv_dtype: KvDtype,
    /// Fraction of device memory the plan may use.
    pub gpu_util: f64,
}

/// How one replica layout fares on one device type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ServingFit {
    /// Memory with the KV cache of a single full-context request.
    pub memory: DeviceMemory,
    /// What is left for the KV cache after weights, activations and overhead.
    pub kv_free: Bytes,
    /// KV bytes of one full-context request on this device.
    pub per_request: Bytes,
    /// Full-context requests the replica holds at once.
    pub max_concurrency: u64,
}

impl ServingFit {
    /// True when at least one full-context request fits.
    pub fn fits(&self) -> bool {
        self.max_concurrency >= 1 && self.memory.within_budget()
    }

    /// The breakdown with the KV cache of `concurrency` requests.
    pub fn with_concurrency(&self, concurrency: u64) -> DeviceMemory {
        let m = self.memory;
        let kv = self.per_request.times(concurrency.max(1));
        DeviceMemory::new(
            m.weights,
            kv,
            m.activations,
            m.overhead,
            m.capacity,
            m.budget,
        )
    }
}

/// Evaluates one layout: `weights` in some precision, `tp` x `pp` devices of `capacity`.
pub fn serving_fit(
    model: &Model,
    weights: &WeightBytes,
    device: (Bytes, &str),
    tp: u32,
    pp: u32,
    target: &ServingTarget,
) -> ServingFit {
    let (capacity, product) = device;
    let (batched_tokens, sequences) = scheduler_defaults(capacity, product);
    let budget = capacity.fraction(target.gpu_util);
    let weights_here = weights.per_device(model, tp, pp);
    let activations = activation_peak(model, tp, batched_tokens, sequences);
    let overhead = if tp.saturating_mul(pp) > 1 {
        BASE_OVERHEAD + COLLECTIVE_OVERHEAD
    } else {
        BASE_OVERHEAD
    };
    let kv = KvLayout::new(model, target.kv_dtype, tp, pp);
    let per_request = kv.per_request(target.context, batched_tokens);
    let kv_free = budget.saturating_sub(weights_here + activations + overhead);
    let max_concurrency = kv_free.0.checked_div(per_request.0).unwrap_or(0);
    ServingFit {
        memory: DeviceMemory::new(
            weights_here,
            per_request,
            activations,
            overhead,
            capacity,
            budget,
        ),
        kv_free,
        per_request,
        max_concurrency,
    }
}

/// Peak activation bytes on one device during a full scheduler step.
pub fn activation_peak(model: &Model, tp: u32, batched_tokens: u64, sequences: u64) -> Bytes {
    let arch = &model.arch;
    // Saturating throughout: config fields are bounded when parsed, but a model built in code
    // is not, and an overflow must read as "too big", never wrap to something that fits.
    let effective_intermediate = arch.moe.map_or(arch.intermediate, |moe| {
        let routed = moe
            .experts_per_token
            .saturating_mul(moe.expert_intermediate)
            .saturating_add(moe.shared_intermediate);
        let has_dense = moe.moe_layers < arch.layers;
        if has_dense {
            routed.max(arch.intermediate)
        } else {
            routed
        }
    });
    let per_token = arch
        .hidden
        .saturating_mul(2)
        .saturating_add(effective_intermediate.saturating_mul(3) / u64::from(tp.max(1)));
    let mlp = Bytes(
        batched_tokens
            .saturating_mul(per_token)
            .saturating_mul(ACTIVATION_BYTES),
    );
    let sampler = Bytes(
        sequences
            .saturating_mul(arch.vocab)
            .saturating_mul(SAMPLER_BYTES_PER_LOGIT),
    );
    mlp + sampler
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{GIB, Precision};
    use crate::plan::model::presets;

    #[test]
    fn activation_formula_matches_vllms_profile_of_llama_8b() {
        // vllm issue #10517 (V0, no chunked prefill, so a 20,000-token profile step): peak
        // torch memory 17.06 GiB - weights 14.99 GiB = 2.07 GiB.
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let peak = activation_peak(&model, 1, 20_000, 256).as_f64() / GIB as f64;
        assert!((peak - 2.07).abs() < 0.15, "{peak}");
    }

    #[test]
    fn eight_b_on_a_24_gb_card_holds_about_35k_tokens() {
        // L4: 23,034 MiB. 90 % is 20.24 GiB; BF16 weights 14.96 GiB; ~0.95 GiB activations
        // and overhead leave ~4.3 GiB, i.e. ~35k tokens of 128 KiB each.
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let weights = WeightBytes::of(&model, Precision::Bf16);
        let target = ServingTarget {
            context: 8192,
            kv_dtype: KvDtype::Auto,
            gpu_util: 0.9,
        };
        let fit = serving_fit(
            &model,
            &weights,
            (Bytes(23_034 * MIB), "NVIDIA L4"),
            1,
            1,
            &target,
        );
        assert!(fit.fits());
        let tokens = fit.kv_free.0 / 131_072;
        assert!((30_000..40_000).contains(&tokens), "{tokens}");
        assert_eq!(fit.max_concurrency, tokens / 8192);
        assert!(fit.memory.total <= fit.memory.budget);
    }

    #[test]
    fn scheduler_defaults_follow_vllm() {
        assert_eq!(
            scheduler_defaults(Bytes::gib(80), "NVIDIA H100 80GB HBM3"),
            (8192, 1024)
        );
        assert_eq!(
            scheduler_defaults(Bytes::gib(80), "NVIDIA A100-SXM4-80GB"),
            (2048, 256)
        );
        assert_eq!(scheduler_defaults(Bytes::gib(24), "NVIDIA L4"), (2048, 256));
    }
}
