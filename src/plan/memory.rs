//! Per-device memory for serving, following the start-up accounting of the serving engine
//! (vLLM `vllm/v1/worker/gpu_worker.py`, `determine_available_memory`; SGLang
//! `model_runner_kv_cache_mixin.py`, `profile_max_num_token`), calibrated against published
//! start-up logs (`tests/plan_calibration.rs`, `docs/planner.md` "Calibration").
//!
//! ```text
//! vLLM    kv_free = capacity * gpu_memory_utilization
//!                   - weights - profile-run peak - non-torch [- CUDA graphs, v0.21 and later]
//! SGLang  kv_free = (capacity - non-torch) * mem_fraction_static - weights
//! fits            = kv_free holds one request of the full context (else the engine refuses)
//! max_concurrency = kv_free / bytes of one full-context request
//! kv_tokens       = kv_free / KV bytes per token, in whole 16-token blocks
//! ```
//!
//! The terms, and where they come from:
//! * Scheduler budget (`max_num_batched_tokens`, `max_num_seqs`): vLLM's API-server defaults
//!   are 8192 tokens and 1024 sequences on devices with at least 70 GiB that are not A100s,
//!   2048 and 256 elsewhere (`vllm/engine/arg_utils.py`, `get_batch_defaults`). The V0 engine
//!   (vLLM 0.7 and earlier) ran whole prompts: `max(max_model_len, 2048)` tokens, or 2048 once
//!   chunked prefill switched itself on above 32k tokens.
//! * Profile-run peak: the MLP's live tensors for a full batch,
//!   `batched_tokens * (2h + 3 * I_eff / tp) * 2` bytes (input and residual, gate/up output,
//!   activation output; `I_eff` is the routed experts' and shared expert's width for MoE),
//!   plus the sampler, one row of logits per sequence (V0's profile batch and V1's dummy
//!   sampler run both take `max_num_seqs` rows): `sequences * vocab * 8` bytes for the FP32
//!   logits and one FP32 working copy. Checked against vLLM's own profile of Llama-3.1-8B
//!   (vllm issue #10517): 2.07 GiB measured at 20,000 tokens, 2.15 GiB from this formula; 2.99
//!   GiB measured at 29,000 tokens, 3.01 GiB from it.
//! * Non-torch memory (CUDA context remainder, cuBLAS workspaces): 0.35 GiB as measured in
//!   #10517 (0.07 to 0.35 GiB in other logs), plus the communication buffers when a TP group
//!   spans devices, by the fabric its collectives run on: the inventory's NVLink-class domain
//!   when the group fits one, PCIe otherwise ([`collective_overhead`]).
//! * CUDA graphs: outside the budget (in the 10 % vLLM leaves free) until vLLM 0.21, which
//!   profiles them by default (`VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`; logged estimates of
//!   0.36 to 2.22 GiB): 1 GiB unless `enforce_eager`.
//! * SGLang applies its fraction to the memory free once the CUDA context and the
//!   communicators exist (`total_gpu_memory` is measured after `init_torch_distributed`;
//!   `profile_max_num_token` keeps `total_gpu_memory * (1 - fraction)` back from what the
//!   weights leave), so the runtime's own memory shrinks the pool by `fraction` of itself,
//!   not whole. Its activations and CUDA graphs live in the memory the fraction leaves out.
//! * SGLang's `mem_fraction_static` default: `(gpu_mem - reserved) / gpu_mem` with `reserved`
//!   = 512 MiB + 1.5 MiB per chunked-prefill token + 2 MiB per CUDA-graph batch size + 128 MiB
//!   per TP x PP rank, at least 10 GiB on devices above 60 GiB (SGLang `server_args.py`).

use serde::Serialize;

use super::kv::{BLOCK_TOKENS, KvDtype, KvLayout, WindowCaching};
use super::model::Model;
use super::units::Bytes;
use super::weights::WeightBytes;
use crate::hardware::{GIB, MIB, Vendor};

/// vLLM's default `gpu_memory_utilization`.
pub const DEFAULT_GPU_UTIL: f64 = 0.90;

/// Runtime memory outside the tensor allocator on every device (vllm issue #10517: 0.35 GiB).
const NON_TORCH: Bytes = Bytes(358 * MIB);
/// NCCL buffers per device when a TP group spans PCIe cards (no custom all-reduce, no NVLS):
/// the 2 x RTX 3090, 2/4/8 x L40S and 4 x L4 calibration rows land within 6 % with it.
const COLLECTIVES_PCIE: Bytes = Bytes(512 * MIB);
/// NCCL, vLLM custom all-reduce and FlashInfer all-reduce workspaces per device when a TP group
/// sits in one NVLink-class domain (NVLink / NVSwitch, a multi-node NVLink domain). vLLM 0.19.0
/// on H100s whose custom all-reduce ran at TP 4 (so fully NVLink-connected) logged 2.06 to 2.11
/// GiB of non-torch memory per device at TP 2 and 2.13 to 2.21 GiB at TP 4, against 0.24 to
/// 0.25 GiB at TP 1 (llm-d-incubation/llm-d-planner, commit d3121e0,
/// `accuracy/results/v0.19.0/logs/*--h100-80gb--tp{1,2,4}pp1dp1--8192.log`): 1.75 GiB on top of
/// [`NON_TORCH`] is within 0.1 GiB of every one of them. Older engines logged less (vLLM 0.10.2
/// on 2 x H200: 1.38 GiB in all), so the figure errs on the side of a smaller KV pool there.
const COLLECTIVES_NVLINK: Bytes = Bytes(1792 * MIB);
/// RCCL buffers per device on AMD Instinct parts: vLLM 0.6.4 on 8 x MI300X logged 6.78 to 7.00
/// GiB of non-torch memory per device (AUGMXNT/MI300-testing,
/// `inference-vllm-vs-vllm-rocm.ipynb`), less the 0.35 GiB every device has. Measured on XGMI
/// hives only (every MI300X/MI325X platform has one), so it applies whatever domain the
/// inventory reports.
const COLLECTIVES_ROCM: Bytes = Bytes(6656 * MIB);
/// CUDA-graph pool that vLLM 0.21 and later subtract from the budget.
const CUDA_GRAPHS: Bytes = Bytes(GIB);

/// Bytes per activation value (16-bit).
const ACTIVATION_BYTES: u64 = 2;
/// Sampler bytes per logit in the profile run: the FP32 logits and one FP32 working copy
/// (probabilities). V0 and V1 alike sample one row per sequence; a larger figure (16 bytes, for
/// sorted copies and 64-bit indices) would refuse the published Llama-3.3-70B FP8 recipe on one
/// H100 (`vllm-project/recipes` `Llama/Llama3.3-70B.md`), which starts.
const SAMPLER_BYTES_PER_LOGIT: u64 = 8;
/// Above this context the V0 engine turned chunked prefill on by itself.
const V0_CHUNKED_PREFILL_ABOVE: u64 = 32_768;

/// Which serving engine's start-up accounting a plan follows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// vLLM 0.7 and earlier (V0): the profile run batches whole prompts and the sampler sees one
    /// row per sequence; CUDA graphs live outside the budget.
    VllmV0,
    /// vLLM 0.8 to 0.20 (V1): profile run of `max_num_batched_tokens` plus a dummy sampler over
    /// `max_num_seqs` rows; CUDA graphs outside the budget.
    VllmV1,
    /// vLLM 0.21 and later: as V1, and CUDA-graph memory is profiled inside the budget.
    #[default]
    Vllm,
    /// SGLang: weights and KV cache fill `mem_fraction_static` of the device.
    Sglang,
}

/// The serving request and the engine settings that shape its memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServingTarget {
    /// Tokens per request (prompt + output): vLLM's `max_model_len`.
    pub context: u64,
    /// KV-cache element type.
    pub kv_dtype: KvDtype,
    /// Fraction of device memory the plan may use (vLLM `--gpu-memory-utilization`, SGLang
    /// `--mem-fraction-static`).
    pub gpu_util: f64,
    /// The engine whose accounting applies.
    pub engine: Engine,
    /// `--max-num-batched-tokens`; `None`: the engine's default for the device.
    pub max_num_batched_tokens: Option<u64>,
    /// `--max-num-seqs`; `None`: the engine's default for the device.
    pub max_num_seqs: Option<u64>,
    /// `--enforce-eager`: no CUDA graphs.
    pub enforce_eager: bool,
    /// SGLang only: take SGLang's own default `mem_fraction_static` for the device and layout
    /// ([`default_gpu_util`]) instead of `gpu_util`.
    pub engine_default_util: bool,
    /// Which windowed layers the engine caches for their window only (its version decides).
    pub windows: WindowCaching,
}

impl Default for ServingTarget {
    /// Today's vLLM with its defaults, for an 8192-token context.
    fn default() -> Self {
        Self {
            context: 8192,
            kv_dtype: KvDtype::Auto,
            gpu_util: DEFAULT_GPU_UTIL,
            engine: Engine::default(),
            max_num_batched_tokens: None,
            max_num_seqs: None,
            enforce_eager: false,
            engine_default_util: false,
            windows: WindowCaching::All,
        }
    }
}

impl ServingTarget {
    /// `context`-token requests with a `kv_dtype` cache under `gpu_util`, on today's vLLM.
    pub fn new(context: u64, kv_dtype: KvDtype, gpu_util: f64) -> Self {
        Self {
            context,
            kv_dtype,
            gpu_util,
            ..Self::default()
        }
    }

    /// The scheduler budget the engine profiles with on `capacity` of `product`:
    /// (tokens per step, sequences per step).
    pub fn scheduler(&self, capacity: Bytes, product: &str) -> (u64, u64) {
        let (tokens, sequences) = match self.engine {
            Engine::VllmV0 => {
                let tokens = if self.context > V0_CHUNKED_PREFILL_ABOVE {
                    2048
                } else {
                    self.context.max(2048)
                };
                (tokens, 256)
            }
            Engine::VllmV1 | Engine::Vllm => scheduler_defaults(capacity, product),
            Engine::Sglang => (sglang_chunked_prefill(capacity), 0),
        };
        (
            self.max_num_batched_tokens.unwrap_or(tokens),
            self.max_num_seqs.unwrap_or(sequences),
        )
    }
}

/// vLLM's scheduler defaults for a device (tokens per step, sequences per step).
pub fn scheduler_defaults(capacity: Bytes, product: &str) -> (u64, u64) {
    let large = capacity >= Bytes::gib(70) && !product.to_ascii_lowercase().contains("a100");
    if large { (8192, 1024) } else { (2048, 256) }
}

/// SGLang's default `chunked_prefill_size` by device memory (`server_args.py`).
fn sglang_chunked_prefill(capacity: Bytes) -> u64 {
    if capacity < Bytes::gib(35) {
        2048
    } else if capacity < Bytes::gib(60) {
        4096
    } else if capacity < Bytes::gib(160) {
        8192
    } else {
        16384
    }
}

/// SGLang's default `cuda_graph_max_bs` by device memory and TP (`server_args.py`).
fn sglang_cuda_graph_max_bs(capacity: Bytes, tp: u32) -> u64 {
    let wide = tp >= 4;
    if capacity < Bytes::gib(20) {
        8
    } else if capacity < Bytes::gib(35) {
        if wide { 80 } else { 24 }
    } else if capacity < Bytes::gib(60) {
        if wide { 160 } else { 32 }
    } else if capacity < Bytes::gib(160) {
        if wide { 512 } else { 256 }
    } else {
        512
    }
}

/// SGLang's default `mem_fraction_static` for `tp` x `pp` devices of `capacity`.
pub fn sglang_mem_fraction(capacity: Bytes, tp: u32, pp: u32) -> f64 {
    let gpu_mib = capacity.as_f64() / MIB as f64;
    let ranks = f64::from(tp.max(1)) * f64::from(pp.max(1));
    let mut reserved = 512.0
        + sglang_chunked_prefill(capacity).max(2048) as f64 * 1.5
        + sglang_cuda_graph_max_bs(capacity, tp) as f64 * 2.0
        + ranks / 8.0 * 1024.0;
    if gpu_mib > 60.0 * 1024.0 {
        reserved = reserved.max(10.0 * 1024.0);
    }
    if gpu_mib <= reserved {
        return 0.0;
    }
    ((gpu_mib - reserved) / gpu_mib * 1000.0).round() / 1000.0
}

/// Each engine's default memory fraction for `tp` x `pp` devices of `capacity`.
pub fn default_gpu_util(engine: Engine, capacity: Bytes, tp: u32, pp: u32) -> f64 {
    match engine {
        Engine::Sglang => sglang_mem_fraction(capacity, tp, pp),
        Engine::VllmV0 | Engine::VllmV1 | Engine::Vllm => DEFAULT_GPU_UTIL,
    }
}

/// One device's memory, as reported in every plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    /// Model weights on this device.
    pub weights: Bytes,
    /// KV cache reserved for the requests this device serves.
    pub kv_cache: Bytes,
    /// Peak activations (serving: the engine's profile run; training: stored activations and
    /// logits).
    pub activations: Bytes,
    /// Runtime overhead (serving: non-torch memory, communication buffers and CUDA graphs
    /// where the engine counts them; training: optimizer and gradients are broken out in the
    /// training report and counted here only as runtime).
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
    /// KV-cache tokens the replica holds, in whole blocks: what the engine logs at start-up
    /// ("GPU KV cache size: N tokens").
    pub kv_tokens: u64,
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

/// The device a layout runs on, as the memory model needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServingDevice<'a> {
    /// What the runtime lets the engine allocate ([`crate::plan::runtime_memory`]).
    pub capacity: Bytes,
    /// The product name as the vendor tool reports it.
    pub product: &'a str,
    /// Maker: whose collective library and fabric the communication buffers follow.
    pub vendor: Vendor,
    /// Most devices of the kind in one NVLink-class domain (NVLink / NVSwitch, XGMI, a
    /// multi-node NVLink domain) that a TP group can use; 0 where only PCIe links them. A TP
    /// group no wider than this runs its collectives over that fabric.
    pub fast_domain: u32,
}

impl<'a> ServingDevice<'a> {
    /// `capacity` of `vendor`'s `product`, linked by PCIe only.
    pub fn new(vendor: Vendor, capacity: Bytes, product: &'a str) -> Self {
        Self {
            capacity,
            product,
            vendor,
            fast_domain: 0,
        }
    }

    /// The same device with `devices` of it in one NVLink-class domain.
    pub fn with_fast_domain(self, devices: u32) -> Self {
        Self {
            fast_domain: devices,
            ..self
        }
    }
}

/// Evaluates one layout: `weights` in some precision, `tp` x `pp` of `device`.
/// Allocation-free: it runs in the search's inner loop.
pub fn serving_fit(
    model: &Model,
    weights: &WeightBytes,
    device: ServingDevice<'_>,
    tp: u32,
    pp: u32,
    target: &ServingTarget,
) -> ServingFit {
    let (capacity, product) = (device.capacity, device.product);
    let (batched_tokens, sequences) = target.scheduler(capacity, product);
    let util = if target.engine_default_util && target.engine == Engine::Sglang {
        default_gpu_util(Engine::Sglang, capacity, tp, pp)
    } else {
        target.gpu_util
    };
    let budget = capacity.fraction(util);
    let weights_here = weights.per_device(model, tp, pp);
    let (activations, overhead) = match target.engine {
        // SGLang sizes the pool before any forward pass: activations live in the reserve. Its
        // fraction applies to what the runtime left free, so the runtime's memory counts by
        // that fraction inside the budget.
        Engine::Sglang => (
            Bytes::ZERO,
            runtime_overhead(target, &device, tp, pp).fraction(util),
        ),
        // The V1 dummy sampler takes at most one row per scheduled token.
        Engine::VllmV0 | Engine::VllmV1 | Engine::Vllm => (
            activation_peak(model, tp, batched_tokens, sequences.min(batched_tokens)),
            runtime_overhead(target, &device, tp, pp),
        ),
    };
    let kv = KvLayout::new(model, target.kv_dtype, tp, pp).with_window_caching(target.windows);
    let per_request = kv.per_request(target.context, batched_tokens);
    let kv_free = budget.saturating_sub(weights_here + activations + overhead);
    let max_concurrency = kv_free.0.checked_div(per_request.0).unwrap_or(0);
    let per_token = kv.bytes_per_token().0;
    let kv_tokens = kv_free
        .0
        .checked_div(per_token.saturating_mul(BLOCK_TOKENS))
        .unwrap_or(0)
        .saturating_mul(BLOCK_TOKENS);
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
        kv_tokens,
    }
}

/// Memory outside the tensor allocator's profile: non-torch memory, communication buffers
/// when the TP group spans devices, and CUDA graphs where the engine counts them.
fn runtime_overhead(target: &ServingTarget, device: &ServingDevice<'_>, tp: u32, pp: u32) -> Bytes {
    let graphs = if target.engine == Engine::Vllm && !target.enforce_eager {
        CUDA_GRAPHS
    } else {
        Bytes::ZERO
    };
    NON_TORCH + collective_overhead(device, tp, pp) + graphs
}

/// Communication buffers per device of a replica of `tp` x `pp` devices like `device`, by the
/// fabric its TP group's all-reduces run on: RCCL on AMD Instinct parts; on NVIDIA parts, NCCL
/// with custom / FlashInfer all-reduce workspaces when the group fits one NVLink-class domain
/// of the inventory, plain NCCL over PCIe otherwise (a PCIe-only H100 node included). Pipeline
/// stages alone pay nothing on NVIDIA parts: vLLM 0.19.0 logged 0.07 GiB of non-torch memory
/// per device at TP 1 x PP 2 and PP 4, less than at TP 1 x PP 1 (llm-d-incubation/llm-d-planner,
/// commit d3121e0, `accuracy/results/v0.19.0/logs/meta-llama-llama-3-1-8b---h100-80gb--tp1pp{2,4}dp1--8192.log`);
/// RCCL's figure is measured at TP 8 only, so AMD replicas of more than one device keep it.
/// Matched without allocating: this runs in the search's inner loop.
pub fn collective_overhead(device: &ServingDevice<'_>, tp: u32, pp: u32) -> Bytes {
    let has = |needle: &str| contains_ignore_case(device.product, needle);
    let instinct = has("mi300") || has("mi325") || has("mi355") || has("instinct");
    if instinct && device.vendor == Vendor::Amd && tp.saturating_mul(pp) > 1 {
        return COLLECTIVES_ROCM;
    }
    if tp <= 1 {
        return Bytes::ZERO;
    }
    match device.vendor {
        Vendor::Nvidia if tp <= device.fast_domain => COLLECTIVES_NVLINK,
        // Other vendors' fabrics (Gaudi, ICI, NeuronLink) are not measured: the PCIe figure.
        _ => COLLECTIVES_PCIE,
    }
}

/// `needle` (ASCII lowercase) occurs in `hay`, ignoring ASCII case.
fn contains_ignore_case(hay: &str, needle: &str) -> bool {
    let (hay, needle) = (hay.as_bytes(), needle.as_bytes());
    needle.is_empty()
        || hay
            .windows(needle.len())
            .any(|window| window.eq_ignore_ascii_case(needle))
}

/// Peak activation bytes on one device during vLLM's profile run: the forward pass over
/// `batched_tokens` plus the sampler over `sequences` rows.
pub fn activation_peak(model: &Model, tp: u32, batched_tokens: u64, sequences: u64) -> Bytes {
    let arch = &model.arch;
    // Saturating throughout: config fields are bounded when parsed, but a model built in code
    // is not, and an overflow must read as "too big", never wrap to something that fits.
    let effective_intermediate = arch.active_intermediate();
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
    use crate::hardware::Precision;
    use crate::plan::model::presets;

    #[test]
    fn activation_formula_matches_vllms_profile_of_llama_8b() {
        // vllm issue #10517 (V0, no chunked prefill, so a 20,000-token profile step): peak
        // torch memory 17.06 GiB - weights 14.99 GiB = 2.07 GiB.
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let at = |tokens| activation_peak(&model, 1, tokens, 256).as_f64() / GIB as f64;
        assert!((at(20_000) - 2.07).abs() < 0.15, "{}", at(20_000));
        // The same thread at 29,000 tokens: 17.98 - 14.99 = 2.99 GiB.
        assert!((at(29_000) - 2.99).abs() < 0.15, "{}", at(29_000));
    }

    #[test]
    fn eight_b_on_a_24_gb_card_holds_about_35k_tokens() {
        // L4: 23,034 MiB. 90 % is 20.24 GiB; BF16 weights 14.96 GiB; ~0.95 GiB activations
        // and overhead leave ~4.3 GiB, i.e. ~35k tokens of 128 KiB each.
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let weights = WeightBytes::of(&model, Precision::Bf16);
        let target = ServingTarget {
            engine: Engine::VllmV0,
            ..ServingTarget::new(8192, KvDtype::Auto, 0.9)
        };
        let fit = serving_fit(
            &model,
            &weights,
            ServingDevice::new(Vendor::Nvidia, Bytes(23_034 * MIB), "NVIDIA L4"),
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
    fn engine_eras_change_the_profile_and_the_graphs() {
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let weights = WeightBytes::of(&model, Precision::Bf16);
        let h100 = ServingDevice::new(Vendor::Nvidia, Bytes::gib(80), "NVIDIA H100 80GB HBM3");
        let fit = |engine, enforce_eager| {
            let target = ServingTarget {
                engine,
                enforce_eager,
                ..ServingTarget::new(20_000, KvDtype::Auto, 0.9)
            };
            serving_fit(&model, &weights, h100, 1, 1, &target)
        };
        // V0 profiles the whole 20,000-token prompt; V1 8192 batched tokens but 1024 sequences.
        let v0 = fit(Engine::VllmV0, false);
        let v1 = fit(Engine::VllmV1, false);
        assert_eq!(
            v0.memory.activations,
            activation_peak(&model, 1, 20_000, 256)
        );
        assert_eq!(
            v1.memory.activations,
            activation_peak(&model, 1, 8192, 1024)
        );
        // From v0.21 CUDA graphs come out of the budget, unless the engine runs eagerly.
        let today = fit(Engine::Vllm, false);
        assert_eq!(today.memory.overhead, v1.memory.overhead + CUDA_GRAPHS);
        assert_eq!(fit(Engine::Vllm, true).memory.overhead, v1.memory.overhead);
        // Logged KV tokens are whole 16-token blocks of the free memory.
        assert_eq!(today.kv_tokens % BLOCK_TOKENS, 0);
        assert!(today.kv_tokens * 131_072 <= today.kv_free.0);
        assert!((today.kv_tokens + BLOCK_TOKENS) * 131_072 > today.kv_free.0);
    }

    #[test]
    fn sglang_reserves_by_device_size_and_counts_no_profile_run() {
        // H100 (81,920 MiB), TP 4: 512 + 8192 x 1.5 + 512 x 2 + 4/8 x 1024 = 14,336 MiB.
        let h100 = Bytes::gib(80);
        assert!((sglang_mem_fraction(h100, 4, 1) - 0.825).abs() < 1e-9);
        // TP 1: 512 + 12,288 + 256 x 2 + 128 = 13,440 MiB, above the 10 GiB floor.
        assert!((sglang_mem_fraction(h100, 1, 1) - 0.836).abs() < 1e-9);
        // 24 GB card, TP 1: 512 + 3072 + 48 + 128 = 3,760 MiB of 24,576.
        assert!((sglang_mem_fraction(Bytes::gib(24), 1, 1) - 0.847).abs() < 1e-9);
        assert_eq!(sglang_mem_fraction(Bytes::gib(1), 1, 1), 0.0);
        assert_eq!(default_gpu_util(Engine::Vllm, h100, 1, 1), DEFAULT_GPU_UTIL);
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let weights = WeightBytes::of(&model, Precision::Bf16);
        let target = ServingTarget {
            engine: Engine::Sglang,
            ..ServingTarget::new(8192, KvDtype::Auto, 0.85)
        };
        let device = ServingDevice::new(Vendor::Nvidia, h100, "NVIDIA H100");
        let fit = serving_fit(&model, &weights, device, 1, 1, &target);
        assert_eq!(fit.memory.activations, Bytes::ZERO);
        // SGLang's fraction applies to what the runtime left free: the runtime's memory counts
        // by that fraction.
        assert_eq!(fit.memory.overhead, NON_TORCH.fraction(0.85));
        assert_eq!(fit.memory.budget, h100.fraction(0.85));
    }

    #[test]
    fn communication_buffers_follow_the_inventorys_domain() {
        let nvidia = |product| ServingDevice::new(Vendor::Nvidia, Bytes::gib(80), product);
        // The same H100 takes the NVLink figure in an 8-device NVSwitch domain and the PCIe
        // figure on a PCIe-only node: the inventory decides, not the name.
        let hgx = nvidia("NVIDIA H100 80GB HBM3").with_fast_domain(8);
        let pcie_node = nvidia("NVIDIA H100 80GB HBM3");
        assert_eq!(collective_overhead(&hgx, 8, 1), COLLECTIVES_NVLINK);
        assert_eq!(collective_overhead(&hgx, 2, 1), COLLECTIVES_NVLINK);
        assert_eq!(collective_overhead(&pcie_node, 2, 1), COLLECTIVES_PCIE);
        assert_eq!(collective_overhead(&pcie_node, 8, 1), COLLECTIVES_PCIE);
        // A group wider than the domain crosses PCIe (two NVLink-bridged pairs, TP 4).
        let bridged = nvidia("NVIDIA H100 NVL").with_fast_domain(2);
        assert_eq!(collective_overhead(&bridged, 2, 1), COLLECTIVES_NVLINK);
        assert_eq!(collective_overhead(&bridged, 4, 1), COLLECTIVES_PCIE);
        // One device, or NVIDIA pipeline stages alone, need no all-reduce buffers.
        assert_eq!(collective_overhead(&hgx, 1, 1), Bytes::ZERO);
        assert_eq!(collective_overhead(&hgx, 1, 4), Bytes::ZERO);
        assert_eq!(collective_overhead(&hgx, 0, 0), Bytes::ZERO);
        // AMD Instinct parts take RCCL's measured figure; unmeasured fabrics the PCIe one.
        let mi300x = ServingDevice::new(Vendor::Amd, Bytes::gib(192), "AMD Instinct MI300X");
        assert_eq!(collective_overhead(&mi300x, 8, 1), COLLECTIVES_ROCM);
        assert_eq!(
            collective_overhead(&mi300x.with_fast_domain(8), 8, 1),
            COLLECTIVES_ROCM
        );
        // RCCL is measured at TP 8 only: AMD pipelines keep its figure; one device pays nothing.
        assert_eq!(collective_overhead(&mi300x, 1, 8), COLLECTIVES_ROCM);
        assert_eq!(collective_overhead(&mi300x, 1, 1), Bytes::ZERO);
        let gaudi = ServingDevice::new(Vendor::Intel, Bytes::gib(96), "HL-225").with_fast_domain(8);
        assert_eq!(collective_overhead(&gaudi, 8, 1), COLLECTIVES_PCIE);
    }

    #[test]
    fn only_tensor_parallel_groups_pay_for_buffers_and_the_domain_shows() {
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let weights = WeightBytes::of(&model, Precision::Bf16);
        let target = ServingTarget::new(8192, KvDtype::Auto, 0.9);
        let h100 = ServingDevice::new(Vendor::Nvidia, Bytes::gib(80), "NVIDIA H100 80GB HBM3");
        let hgx = h100.with_fast_domain(8);
        let fit = |device, tp, pp| serving_fit(&model, &weights, device, tp, pp, &target);
        let one = fit(hgx, 1, 1);
        assert_eq!(
            fit(hgx, 2, 1).memory.overhead,
            one.memory.overhead + COLLECTIVES_NVLINK
        );
        assert_eq!(
            fit(h100, 2, 1).memory.overhead,
            one.memory.overhead + COLLECTIVES_PCIE
        );
        assert_eq!(fit(hgx, 1, 2).memory.overhead, one.memory.overhead);
        // On the PCIe-only node the smaller buffers leave more for the KV cache.
        assert!(fit(h100, 2, 1).kv_free > fit(hgx, 2, 1).kv_free);
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
