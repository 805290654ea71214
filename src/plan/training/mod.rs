//! Per-device memory for fine-tuning: model states (weights, gradients, optimizer) under ZeRO
//! sharding, activations from sequence length and micro-batch, and the trainable-parameter
//! count of each method.
//!
//! * Full fine-tuning, mixed-precision Adam: 2 (16-bit weights) + 2 (16-bit gradients) + 12
//!   (FP32 master weights, momentum, variance) = 16 bytes per parameter (ZeRO paper,
//!   arXiv:1910.02054). The optimizer's precision is a choice ([`OptimizerStates`]): BF16
//!   states (a model loaded in BF16 and trained with plain `torch.optim.AdamW`) keep 2 + 2 + 4
//!   = 8 bytes, 8-bit Adam 2 + 2 + 4 (FP32 master) + 2 = 10. ZeRO-1 shards the optimizer's
//!   share, ZeRO-2 also the gradients, ZeRO-3 also the
//!   weights across the data-parallel devices; ZeRO-3 then gathers one layer at a time, so it
//!   keeps `4 x largest layer` bytes of gather buffers (DeepSpeed `stage3.py`,
//!   `estimate_zero3_model_states_mem_needs`).
//! * LoRA: the frozen base in 16 bits; `r * (d_in + d_out)` trainable parameters per adapted
//!   matrix (arXiv:2106.09685), kept in FP32 by PEFT with FP32 gradients and Adam: 16 bytes each.
//! * QLoRA: the base's linear layers in NF4 with double quantisation, 4.127 bits per parameter
//!   (arXiv:2305.14314 §3), embeddings and head in 16 bits; adapters as for LoRA (PEFT keeps
//!   a 4-bit base's adapters in FP32 too: 16 bytes per trainable parameter), and, as TRL
//!   prepares a 4-bit model (FP32 norms, `Linear4bit` keeping its input's dtype), an FP32
//!   residual stream (traced, `fixtures/training/`).
//! * DPO: the policy as in full fine-tuning plus a frozen 16-bit reference model; each step
//!   runs the chosen and the rejected sequence, doubling activations.
//! * Activations ([`activations`]): the saved activations and the loss's logits when the
//!   backward pass starts, or the full gradients with one layer being differentiated when it
//!   ends, whichever is larger; the loss's logits whole (transformers' loss) or one chunk at
//!   a time (a fused loss, [`Loss`]); calibrated on traced allocations of transformers/PEFT
//!   training (`fixtures/training/`).

pub mod activations;
mod adamw;
mod kernels;

use serde::{Deserialize, Serialize};

use self::activations::{ActivationPeak, Layers, Step, step_activations};
pub use self::adamw::Adamw;
pub use self::kernels::Kernels;
use super::memory::DeviceMemory;
use super::model::{Attention, Model};
use super::units::Bytes;
use crate::hardware::{MIB, Precision};

/// Default fraction of device memory a training plan may use. Training frameworks reserve no
/// share up front the way vLLM does; the 5 % left meets the caching allocator's reserve
/// first (`ALLOCATOR_RESERVE`), and the overhead holds what it does not.
pub const DEFAULT_TRAINING_GPU_UTIL: f64 = 0.95;

/// A fine-tuning method (`hwaccel plan --train`, a ModelPlacement's `goal.train.method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Every parameter trained, mixed-precision Adam.
    Full,
    /// Low-rank adapters on a frozen 16-bit base.
    Lora,
    /// Low-rank adapters on a frozen NF4 base.
    Qlora,
    /// Direct preference optimisation: full fine-tuning plus a frozen reference model.
    Dpo,
}

/// The precision of the optimizer's states (`hwaccel plan --optimizer-states`, a
/// ModelPlacement's `goal.train.optimizerStates`).
///
/// Bytes per trained parameter, (weights, gradients, optimizer):
///
/// | states | full / DPO policy | LoRA adapters | QLoRA adapters |
/// |---|---|---|---|
/// | `fp32` | 2 + 2 + 12 (FP32 master, m, v) | 4 + 4 + 8 (PEFT's FP32 adapters) | 4 + 4 + 8 |
/// | `bf16` | 2 + 2 + 4 (m, v in BF16, no master) | 2 + 2 + 4 | 2 + 2 + 4 |
/// | `8bit` | 2 + 2 + 6 (FP32 master, 8-bit m and v) | 4 + 4 + 2 | 4 + 4 + 2 |
///
/// `fp32` is mixed precision as DeepSpeed, FSDP's mixed-precision policy and Megatron run it
/// (ZeRO paper, arXiv:1910.02054 §3.1: 16 bytes per parameter). `bf16` is what a model loaded
/// in BF16 (transformers 5's default dtype) trained with `torch.optim.AdamW` keeps: the moments
/// take the parameters' dtype (`torch.zeros_like`), and there is no master copy. `8bit` is
/// block-wise 8-bit Adam (Dettmers et al., arXiv:2110.02861, bitsandbytes `Adam8bit`,
/// `paged_adamw_8bit`): one byte per moment, plus one FP32 absmax per 2,048-value block
/// (0.004 bytes per parameter, not counted); the master copy stays where mixed precision keeps
/// one.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum OptimizerStates {
    /// FP32 master weights and Adam moments (mixed precision).
    #[default]
    #[serde(rename = "fp32")]
    Fp32,
    /// Weights, gradients and Adam moments all in BF16.
    #[serde(rename = "bf16")]
    Bf16,
    /// 8-bit Adam moments (bitsandbytes), FP32 master weights.
    #[serde(rename = "8bit")]
    EightBit,
}

impl OptimizerStates {
    /// The name as the flag and the CRD write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fp32 => "fp32",
            Self::Bf16 => "bf16",
            Self::EightBit => "8bit",
        }
    }

    /// The assumption, for the plan's reasons.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Fp32 => {
                "optimizer states fp32: mixed precision, FP32 master weights and Adam moments (16 bytes per trained parameter; --optimizer-states bf16 or 8bit for less)"
            }
            Self::Bf16 => {
                "optimizer states bf16: weights, gradients and Adam moments in BF16, no FP32 master (8 bytes per trained parameter)"
            }
            Self::EightBit => {
                "optimizer states 8bit: 8-bit Adam moments (bitsandbytes), FP32 master weights (10 bytes per trained parameter)"
            }
        }
    }

    /// Optimizer bytes per trained parameter when the trained weights are 16-bit: the master
    /// copy (if any) and the two moments.
    fn optimizer_bytes(self) -> f64 {
        match self {
            Self::Fp32 => 12.0,
            Self::Bf16 => 4.0,
            Self::EightBit => 6.0,
        }
    }

    /// (weight, gradient, optimizer) bytes per parameter of an adapter that PEFT keeps in
    /// FP32 (LoRA on a 16-bit or a 4-bit base; traced, the QLoRA rows' adapters were FP32
    /// too): FP32 adapters need no master copy; BF16 states cast the adapters to BF16 too.
    fn fp32_adapter_bytes(self) -> (f64, f64, f64) {
        match self {
            Self::Fp32 => (4.0, 4.0, 8.0),
            Self::Bf16 => (2.0, 2.0, 4.0),
            Self::EightBit => (4.0, 4.0, 2.0),
        }
    }
}

impl std::fmt::Display for OptimizerStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How the loss turns the last hidden states into a loss and its gradient (`hwaccel plan
/// --loss`, a ModelPlacement's `goal.train.loss`).
///
/// `standard` is transformers' own: the output head makes the whole `tokens x vocabulary`
/// logits tensor, the loss upcasts it to FP32 and keeps the log-probabilities and their
/// gradient (12 bytes per logit when the backward pass starts; more than the layers at long
/// sequences and large vocabularies). `fused` is a fused linear cross-entropy: Liger Kernel's
/// `LigerFusedLinearCrossEntropyLoss` (TRL's and the HF Trainer's `use_liger_kernel=True`,
/// Axolotl's `liger_fused_linear_cross_entropy`, LLaMA-Factory's `enable_liger_kernel`),
/// which runs the head and the loss over chunks of about as many logits as the hidden states
/// have values and computes the hidden states' gradient in the forward pass, so the logits are
/// never whole (`ops/fused_linear_cross_entropy.py`). Apple's Cut Cross-Entropy (Unsloth) and
/// torchtune's chunked loss keep as little or less.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Loss {
    /// The whole logits tensor, upcast to FP32 (transformers' `ForCausalLMLoss`).
    #[default]
    Standard,
    /// A fused linear cross-entropy over chunks of tokens (Liger Kernel).
    Fused,
}

impl Loss {
    /// The name as the flag and the CRD write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Standard => "standard",
            Self::Fused => "fused",
        }
    }

    /// The assumption, for the plan's reasons.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Standard => {
                "loss standard: transformers' cross-entropy on the whole logits tensor, upcast to FP32 (12 bytes per logit; --loss fused for a fused linear cross-entropy such as Liger Kernel's)"
            }
            Self::Fused => {
                "loss fused: a fused linear cross-entropy (Liger Kernel's, `use_liger_kernel=True`) over chunks of tokens; the logits are never whole (--kernels liger for the layer kernels the same flag puts in)"
            }
        }
    }
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A ZeRO stage (0 is plain data parallelism).
pub type ZeroStage = u8;

/// The linear modules LoRA can adapt, by their usual short names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LoraTarget {
    /// Query projection.
    Q,
    /// Key projection.
    K,
    /// Value projection.
    V,
    /// Attention output projection.
    O,
    /// MLP gate projection.
    Gate,
    /// MLP up projection.
    Up,
    /// MLP down projection.
    Down,
}

impl LoraTarget {
    /// Every linear module ("all-linear").
    pub const ALL: [Self; 7] = [
        Self::Q,
        Self::K,
        Self::V,
        Self::O,
        Self::Gate,
        Self::Up,
        Self::Down,
    ];

    /// Parses `q`, `q_proj`, `gate_proj`...
    pub fn parse(text: &str) -> Option<Self> {
        let name = text.trim().to_ascii_lowercase();
        let name = name.strip_suffix("_proj").unwrap_or(&name);
        Some(match name {
            "q" => Self::Q,
            "k" => Self::K,
            "v" => Self::V,
            "o" => Self::O,
            "gate" | "w1" => Self::Gate,
            "up" | "w3" => Self::Up,
            "down" | "w2" => Self::Down,
            _ => return None,
        })
    }
}

/// What is being trained and how.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainingTarget {
    /// The method.
    pub method: Method,
    /// Tokens per sequence.
    pub seq_len: u64,
    /// Sequences per device per step.
    pub micro_batch: u64,
    /// Whether activations are recomputed in the backward pass.
    pub gradient_checkpointing: bool,
    /// LoRA rank (LoRA and QLoRA).
    pub lora_rank: u64,
    /// Adapted modules (LoRA and QLoRA).
    pub lora_targets: Vec<LoraTarget>,
    /// The optimizer's precision.
    pub optimizer_states: OptimizerStates,
    /// How the loss is computed.
    pub loss: Loss,
    /// How AdamW steps.
    pub adamw: Adamw,
    /// Which kernels run the layers' norms and activations.
    pub kernels: Kernels,
}

/// Model-state and activation bytes on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TrainingMemory {
    /// Parameters trained.
    pub trainable_params: u64,
    /// Weights held on the device (policy, frozen base, reference model, gather buffers).
    pub weights: Bytes,
    /// Gradients.
    pub gradients: Bytes,
    /// Optimizer states (and FP32 master weights).
    pub optimizer: Bytes,
    /// Transient memory at the step's peak beyond the model states: the largest of the loss
    /// phase less the gradients (which do not exist yet then), the backward phase and the
    /// optimizer step's own transient ([`Self::optimizer_step`]).
    pub activations: Bytes,
    /// The two moments of the forward and backward passes a step can peak at
    /// ([`ActivationPeak`]).
    pub activation_peak: ActivationPeak,
    /// What the optimizer step holds beyond the model states, once every gradient exists
    /// and the activations are gone: the foreach AdamW's copy of the moments ([`Adamw`]).
    pub optimizer_step: Bytes,
    /// Runtime overhead: the CUDA context, collective buffers and [`Self::allocator_reserve`].
    pub overhead: Bytes,
    /// Of the overhead, what the caching allocator holds beyond the step's allocations and
    /// beyond the share of the device the budget leaves unused.
    pub allocator_reserve: Bytes,
    /// The ZeRO stage assumed.
    pub zero_stage: ZeroStage,
    /// Data-parallel devices sharing the states.
    pub devices: u32,
    /// The breakdown in the shape every plan reports; its `weights` holds all model states
    /// (weights, gradients and optimizer) and its `kv_cache` is zero.
    pub device: DeviceMemory,
}

/// Whether `devices` data-parallel devices at ZeRO `stage` shard the weights themselves
/// (ZeRO-3, FSDP `FULL_SHARD`): what the sharded-base checkpoint and reserve terms apply to.
pub fn shards_weights(devices: u32, stage: ZeroStage) -> bool {
    stage >= 3 && devices > 1
}

/// Runtime memory outside the allocator (CUDA context, cuBLAS workspaces), and NCCL buffers
/// when training spans devices; the same figures as for serving.
const BASE_OVERHEAD: Bytes = Bytes(512 * MIB);
const COLLECTIVE_OVERHEAD: Bytes = Bytes(512 * MIB);

/// What the caching allocator reserves beyond a step's allocations (freed blocks it keeps,
/// kernels' workspaces): 1.5 GiB plus 2 bytes per logit, of which the share of the device
/// the budget leaves unused (5 % by default) covers the first part. First taken from the GPU
/// figures issue 38 reports (Llama 3.1 8B LoRA at 2k tokens measured 10-13 % above a plan
/// that matched its allocations, the shortfall growing with sequence x micro-batch x
/// vocabulary); then fitted on the traced rows' allocations replayed through a model of
/// PyTorch's CUDA caching allocator (`scripts/caching_allocator.py`) at the least capacity
/// they run in with the cache released and retried: with this reserve the plan's device
/// figure is within -8.0 to +9.2 % of it on all 73 traced rows (docs/planner.md, "The
/// allocator's reserve, modelled"). The large blocks of the loss (FP32 logits and their
/// gradient) are what the allocator cannot reuse once smaller allocations have split them.
/// Measured rows are still to confirm it; the plan's reasons state it.
pub const ALLOCATOR_RESERVE: Bytes = Bytes(1536 * MIB);
/// The reserve's part per logit alive at once (see [`ALLOCATOR_RESERVE`]): every logit of
/// the standard loss, one chunk's of a fused one.
pub const ALLOCATOR_RESERVE_BYTES_PER_LOGIT: u64 = 2;
/// With a fused loss no large logits blocks stand for the allocator's fragmentation; what it
/// reserves beyond the 1.5 GiB then follows the layers' activations (the blocks of the layer
/// being differentiated, freed and taken again in other sizes). 5 % of the activations,
/// fitted on the five traced fused-loss rows: the modelled reserve's excess over 1.5 GiB
/// there was 0.4 to 3.7 GiB, 3 to 16 % of the plan's activations on four rows and 62 % on
/// Qwen3 8B full with BF16 states (2.0 GiB of activations beside 15 GiB of gradients); no
/// share of one figure covers them all, and at 3 % Mistral 7B without checkpointing (the
/// modelled H200 runs out) fits one in the plan. On the fourteen fused rows traced since, the
/// plan is within -7.7 to +8.8 % of the least capacity the allocator model runs them in.
pub const ALLOCATOR_RESERVE_FUSED_ACTIVATIONS: f64 = 0.05;
/// ZeRO-3 and FSDP gather each layer's weights on a stream of their own and free them layer
/// by layer while the forward pass leaves each layer's checkpointed input (or saved
/// activations) behind, and PyTorch's caching allocator keeps each stream's blocks apart:
/// the reserve grows with what the layers leave waiting for the backward pass. Half of it,
/// fitted on the one sharded run that ran out of memory where a smaller reserve fits it
/// (fms-acceleration's Llama 2 70B QLoRA on two A100 80GB at 4 x 4096 tokens each, 35 GiB of
/// checkpoints planned; 41 % fits it, 50 % refuses it by 3.3 GiB; at 2 x 4096 it ran in
/// 43.5 GiB allocated and the plan fits it). The same runs' nvidia-smi figures put what the
/// devices held beyond their allocations at 4 to 19 GiB (with no pressure to give the cache
/// back).
pub const ALLOCATOR_RESERVE_SHARDED_WAITING: f64 = 0.5;
/// A full fine-tune with BF16 states also loses the loss's freed blocks to its optimizer in
/// the allocator model: AdamW makes its moments at the first step, into the blocks the
/// standard loss's logits have just left, and every later step's logits take new segments.
/// Beyond the per-logit reserve, up to 6 more bytes per logit and at most a quarter of the
/// optimizer's states (a fused loss's chunk is small). Fitted on the traced BF16-state full
/// fine-tunes: Qwen2 7B at 1k x 8 (152k vocabulary) reserves 59.3 GiB in its first step and
/// 75.5 from its second, and runs in no less than 70.0 GiB with the cache released and retried
/// (58.8 GiB allocated: 9.6 bytes per logit beyond its allocations). With FP32 states under
/// autocast (whose BF16 weight copies come and go every step) the traced rows needed less,
/// within the per-logit reserve's reach.
pub const ALLOCATOR_RESERVE_TRAINED_BYTES_PER_LOGIT: u64 = 6;
/// The cap on [`ALLOCATOR_RESERVE_TRAINED_BYTES_PER_LOGIT`]: a share of the optimizer's states.
pub const ALLOCATOR_RESERVE_TRAINED_STATES_SHARE: f64 = 0.25;

/// Trainable parameters of `method` on `model`.
pub fn trainable_params(model: &Model, target: &TrainingTarget) -> u64 {
    match target.method {
        Method::Full | Method::Dpo => model.params.total(),
        Method::Lora | Method::Qlora => lora_params(model, target.lora_rank, &target.lora_targets),
    }
}

/// `r * (d_in + d_out)` summed over the adapted matrices of every layer (every expert too; fused
/// gate and up experts as PEFT adapts them, `PEFT_FUSED_GATE_UP`).
pub fn lora_params(model: &Model, rank: u64, targets: &[LoraTarget]) -> u64 {
    let arch = &model.arch;
    // Saturating u128 arithmetic: a rank or a shape far beyond any real model yields a huge
    // count (which never fits), not a panic or a wrapped small one.
    let h = u128::from(arch.hidden);
    let r = u128::from(rank);
    let adapter = |d_in: u128, d_out: u128| r.saturating_mul(d_in.saturating_add(d_out));
    let (q_out, kv_out, o_in) = match arch.attention {
        Attention::Standard => {
            let hd = u128::from(arch.head_dim);
            (
                u128::from(arch.heads) * hd,
                u128::from(arch.kv_heads) * hd,
                u128::from(arch.heads) * hd,
            )
        }
        // MLA: q maps to all heads' query dims, k/v to the latent, o from the value heads.
        Attention::Mla(mla) => {
            let heads = u128::from(arch.heads);
            let qk = u128::from(mla.qk_nope_head_dim) + u128::from(mla.qk_rope_head_dim);
            (
                heads.saturating_mul(qk),
                u128::from(mla.kv_lora_rank) + u128::from(mla.qk_rope_head_dim),
                heads.saturating_mul(u128::from(mla.v_head_dim)),
            )
        }
    };
    let layers = u128::from(arch.layers);
    let (moe_layers, experts, expert_i, shared_i) = match arch.moe {
        Some(moe) => (
            u128::from(moe.moe_layers.min(arch.layers)),
            u128::from(moe.experts),
            u128::from(moe.expert_intermediate),
            u128::from(moe.shared_intermediate),
        ),
        None => (0, 0, 0, 0),
    };
    let dense_layers = layers - moe_layers;
    let dense_i = u128::from(arch.intermediate);
    // One MLP projection's adapters in every layer: the dense layers' and, in MoE layers,
    // each routed expert's and the shared expert's (a plain MLP of its own width).
    let mlp = || {
        let shared = if shared_i > 0 {
            adapter(h, shared_i)
        } else {
            0
        };
        let per_moe_layer = experts
            .saturating_mul(adapter(h, expert_i))
            .saturating_add(shared);
        dense_layers
            .saturating_mul(adapter(h, dense_i))
            .saturating_add(moe_layers.saturating_mul(per_moe_layer))
    };
    let mut total: u128 = 0;
    for target in targets {
        let count = match target {
            LoraTarget::Q => layers.saturating_mul(adapter(h, q_out)),
            LoraTarget::K | LoraTarget::V => layers.saturating_mul(adapter(h, kv_out)),
            LoraTarget::O => layers.saturating_mul(adapter(o_in, h)),
            LoraTarget::Gate | LoraTarget::Up | LoraTarget::Down => mlp(),
        };
        total = total.saturating_add(count);
    }
    if targets.contains(&LoraTarget::Gate)
        && targets.contains(&LoraTarget::Up)
        && PEFT_FUSED_GATE_UP.contains(&arch.model_type.as_str())
    {
        // PEFT adapts these families' routed experts on transformers 5's fused `gate_up_proj`
        // as one adapter of rank 2r: the same A as the two adapters, but a dense B of
        // 2I x 2r per expert where the two keep I x r each.
        let extra = r.saturating_mul(2).saturating_mul(expert_i);
        total = total.saturating_add(moe_layers.saturating_mul(experts).saturating_mul(extra));
    }
    u64::try_from(total).unwrap_or(u64::MAX)
}

/// What a LoRA plan assumed about an MoE model's routed experts, when its targets reach the
/// MLP: PEFT's fused gate and up adapters, or, where PEFT's module targets do not reach the
/// experts at all (gpt-oss, Llama 4: 3-D parameters outside PEFT's conversion table; a trace
/// of gpt-oss with all seven targets adapts the attention only, and no error says so),
/// separate adapters that PEFT trains only when `target_parameters` names them.
pub fn expert_adapter_note(model: &Model, target: &TrainingTarget) -> Option<String> {
    let arch = &model.arch;
    let lora = matches!(target.method, Method::Lora | Method::Qlora);
    let mlp = target
        .lora_targets
        .iter()
        .any(|t| matches!(t, LoraTarget::Gate | LoraTarget::Up | LoraTarget::Down));
    if !lora || !mlp || arch.moe.is_none() {
        return None;
    }
    let model_type = &arch.model_type;
    Some(if PEFT_FUSED_GATE_UP.contains(&model_type.as_str()) {
        format!(
            "LoRA on {model_type}'s routed experts counted as PEFT trains them on transformers 5: gate and up as one adapter of twice the rank on the fused gate_up_proj (its B dense), down on down_proj"
        )
    } else {
        format!(
            "LoRA on {model_type}'s routed experts counted as a separate adapter per expert projection; PEFT's target_modules do not reach them (transformers keeps them as 3-D parameters) and adapt only the attention and any shared expert unless target_parameters names the experts' gate_up_proj and down_proj"
        )
    })
}

/// The MoE families whose experts transformers 5 stores fused (`gate_up_proj`, `down_proj` as
/// 3-D parameters) and whose LoRA targets PEFT converts onto them, fusing the gate and up
/// adapters into one of twice the rank (PEFT 0.21, `_MODEL_TO_CONVERSION_PATTERN` and
/// `_MOE_FUSED_TARGETS` in `peft/utils/transformers_weight_conversion.py`; it refuses gate
/// without up). Traced: Qwen3-30B-A3B with all seven targets trains 994.8 M parameters.
/// gpt-oss and Llama 4 keep their experts fused in a layout PEFT's module targets do not
/// reach (they need `target_parameters`); the planner counts their experts as separate
/// adapters.
const PEFT_FUSED_GATE_UP: &[&str] = &[
    "mixtral",
    "minimax",
    "minimax_m2",
    "qwen3_moe",
    "qwen3_next",
    "qwen3_omni_moe",
    "qwen3_omni_moe_text",
    "qwen3_omni_moe_thinker",
    "deepseek_v2",
    "deepseek_v3",
    "deepseek_v32",
    "dots1",
    "ernie4_5_moe",
    "glm4_moe",
    "glm4_moe_lite",
    "glm4v_moe",
    "glm_moe_dsa",
    "hunyuan_v1_moe",
    "longcat_flash",
    "flex_olmo",
    "olmoe",
    "exaone_moe",
    "cohere2_moe",
    "afmoe",
    "beam",
    "mellum",
    "sarvam_mla",
    "solar_open",
];

/// Per-device memory for `target` with `devices` data-parallel devices at ZeRO `stage`, on
/// devices of `capacity` of which the fraction `gpu_util` may be used.
pub fn training_memory(
    model: &Model,
    target: &TrainingTarget,
    devices: u32,
    stage: ZeroStage,
    (capacity, gpu_util): (Bytes, f64),
) -> TrainingMemory {
    let n = u64::from(devices.max(1));
    let shard = |bytes: Bytes, from_stage: ZeroStage| {
        if stage >= from_stage {
            bytes.div_ceil(n)
        } else {
            bytes
        }
    };
    let sharded_weights = shards_weights(devices, stage);
    let trainable = trainable_params(model, target);
    let total = model.params.total();
    let per_param = |count: u64, bytes: f64| Bytes::from_f64(count as f64 * bytes);
    // DeepSpeed budgets 4 bytes per parameter of the largest layer for ZeRO-3's gathers: two
    // layers' 16-bit weights, the one computed and the one prefetched. A 4-bit base is
    // gathered as it is stored.
    let gather_buffer = if stage >= 3 {
        largest_gathered_bytes(model, target).times(2)
    } else {
        Bytes::ZERO
    };
    let states = target.optimizer_states;
    let (weights, gradients, optimizer) = match target.method {
        Method::Full | Method::Dpo => {
            let policy = shard(per_param(total, 2.0), 3);
            let reference = if target.method == Method::Dpo {
                shard(per_param(total, 2.0), 3)
            } else {
                Bytes::ZERO
            };
            (
                policy + reference + gather_buffer,
                shard(per_param(total, 2.0), 2),
                shard(per_param(total, states.optimizer_bytes()), 1),
            )
        }
        Method::Lora => {
            let base = shard(per_param(total, 2.0), 3);
            let (w, g, o) = states.fp32_adapter_bytes();
            (
                base + per_param(trainable, w) + gather_buffer,
                shard(per_param(trainable, g), 2),
                shard(per_param(trainable, o), 1),
            )
        }
        Method::Qlora => {
            let base = shard(qlora_base_bytes(model, target.optimizer_states), 3);
            // PEFT keeps a 4-bit base's adapters in FP32 too (traced).
            let (w, g, o) = states.fp32_adapter_bytes();
            (
                base + per_param(trainable, w) + gather_buffer,
                shard(per_param(trainable, g), 2),
                shard(per_param(trainable, o), 1),
            )
        }
    };
    let batch = if target.method == Method::Dpo {
        target.micro_batch.saturating_mul(2)
    } else {
        target.micro_batch
    };
    // Parameters trained in FP32 under autocast keep an FP32 residual stream; a LoRA base
    // and BF16 states run in 16 bits.
    let fp32_params = matches!(states, OptimizerStates::Fp32 | OptimizerStates::EightBit);
    let full = matches!(target.method, Method::Full | Method::Dpo);
    let liger_layers = target.kernels.liger_layers(&model.arch.model_type);
    let peak = step_activations(
        model,
        &Step {
            seq_len: target.seq_len,
            batch,
            checkpointing: target.gradient_checkpointing,
            // Sharded data parallelism (ZeRO-2/3, FSDP) gathers and computes in 16 bits, so
            // the residual stream is 16-bit there whatever the states' precision.
            layers: if full {
                Layers::Trained {
                    fp32_residual: fp32_params && stage < 2,
                }
            } else {
                Layers::Frozen {
                    adapter_bytes_per_token: adapter_inputs(model, target),
                    // QLoRA's prepared 4-bit base: FP32 norms, and `Linear4bit` keeps its
                    // input's dtype, so the stream turns FP32 (traced); Liger's norms return
                    // their input's dtype, so it stays 16-bit.
                    fp32_residual: target.method == Method::Qlora
                        && states != OptimizerStates::Bf16
                        && stage < 2
                        && !liger_layers,
                    quantized_base: target.method == Method::Qlora,
                    down_adapter: target.lora_targets.contains(&LoraTarget::Down),
                }
            },
            // Autocast differentiates FP32 parameters into FP32 gradients; sharded
            // data parallelism (ZeRO-2/3, FSDP) produces them in the 16-bit compute dtype.
            embedding_gradient_bytes: match (full, fp32_params && stage < 2) {
                (false, _) => 0,
                (true, true) => 4,
                (true, false) => 2,
            },
            reference_model: target.method == Method::Dpo,
            fused_loss: target.loss == Loss::Fused,
            liger_layers,
            sharded_frozen_base: !full && sharded_weights,
        },
    );
    // The optimizer step's transient, sharded as the moments are.
    let optimizer_step = shard(
        per_param(
            trainable,
            target.adamw.step_bytes_per_param(target.optimizer_states),
        ),
        1,
    );
    // weights + optimizer + max(loss phase, gradients + backward phase, gradients + the
    // optimizer step), with the gradients counted among the model states.
    let peak = peak.settled(gradients);
    let passes = peak
        .loss_phase
        .saturating_sub(gradients)
        .max(peak.backward_phase);
    let activations = passes.max(optimizer_step);
    // The logits alive at once: all of them, or one chunk of a fused loss.
    let tokens = target.seq_len.saturating_mul(batch);
    let logits = match target.loss {
        Loss::Standard => tokens.saturating_mul(model.arch.vocab),
        Loss::Fused => {
            let vocab = u128::from(model.arch.vocab);
            let rows = activations::fused_chunk_rows(
                u128::from(tokens),
                vocab,
                u128::from(model.arch.hidden),
            );
            u64::try_from(rows.saturating_mul(vocab)).unwrap_or(u64::MAX)
        }
    };
    // The budget's unused share (5 % by default) already stands for the allocator's slack;
    // only what the reserve needs beyond it is added.
    let unbudgeted = capacity.saturating_sub(capacity.fraction(gpu_util));
    let of_activations = match target.loss {
        Loss::Standard => Bytes::ZERO,
        Loss::Fused => passes.fraction(ALLOCATOR_RESERVE_FUSED_ACTIVATIONS),
    } + if sharded_weights {
        peak.waiting.fraction(ALLOCATOR_RESERVE_SHARDED_WAITING)
    } else {
        Bytes::ZERO
    };
    let split_by_states = match (target.loss, full && states == OptimizerStates::Bf16) {
        (Loss::Standard, true) => {
            Bytes(logits.saturating_mul(ALLOCATOR_RESERVE_TRAINED_BYTES_PER_LOGIT))
                .min(optimizer.fraction(ALLOCATOR_RESERVE_TRAINED_STATES_SHARE))
        }
        _ => Bytes::ZERO,
    };
    // The reserve for the loss's blocks stands beside the passes; when the optimizer step
    // peaks higher (foreach AdamW), the logits are long gone and only the rest applies there.
    let of_logits =
        Bytes(logits.saturating_mul(ALLOCATOR_RESERVE_BYTES_PER_LOGIT)) + split_by_states;
    let beside_passes = ALLOCATOR_RESERVE + of_logits + of_activations;
    let needed = (passes + beside_passes).max(optimizer_step + ALLOCATOR_RESERVE);
    let allocator_reserve = needed
        .saturating_sub(activations)
        .saturating_sub(unbudgeted);
    let overhead = if devices > 1 {
        BASE_OVERHEAD + COLLECTIVE_OVERHEAD + allocator_reserve
    } else {
        BASE_OVERHEAD + allocator_reserve
    };
    let states = weights + gradients + optimizer;
    TrainingMemory {
        trainable_params: trainable,
        weights,
        gradients,
        optimizer,
        activations,
        activation_peak: peak,
        optimizer_step,
        overhead,
        allocator_reserve,
        zero_stage: stage,
        devices: devices.max(1),
        device: DeviceMemory::new(
            states,
            Bytes::ZERO,
            activations,
            overhead,
            capacity,
            capacity.fraction(gpu_util),
        ),
    }
}

/// Bytes per token and layer LoRA's adapters keep for the backward pass: each adapter saves
/// its input in 16 bits. FP32 adapters under autocast (FP32 or 8-bit states) each save their
/// own BF16 copy of it; BF16 adapters save the input itself, once per distinct input (Q, K
/// and V read the same one, as do gate and up). Traced on Llama 3.1 8B and Qwen3 8B
/// (`fixtures/training/`): 2 bytes per input unit per adapter.
fn adapter_inputs(model: &Model, target: &TrainingTarget) -> u64 {
    let arch = &model.arch;
    let intermediate = arch.active_intermediate();
    let attention_out = u64::from(arch.heads).saturating_mul(arch.head_dim);
    let input = |t: &LoraTarget| match t {
        LoraTarget::Q | LoraTarget::K | LoraTarget::V => (0, arch.hidden),
        LoraTarget::O => (1, attention_out),
        LoraTarget::Gate | LoraTarget::Up => (2, arch.hidden),
        LoraTarget::Down => (3, intermediate),
    };
    let mut targets = target.lora_targets.clone();
    targets.sort();
    targets.dedup();
    let own_copies = !matches!(target.optimizer_states, OptimizerStates::Bf16);
    let mut inputs: Vec<(u8, u64)> = targets.iter().map(input).collect();
    if !own_copies {
        inputs.dedup_by_key(|(group, _)| *group);
    }
    inputs.iter().fold(0u64, |sum, (_, width)| {
        sum.saturating_add(width.saturating_mul(2))
    })
}

/// The frozen QLoRA base as transformers 5 loads a model in 4 bits: linear layers in NF4,
/// everything else in 16 bits, and an MoE's routed experts unquantized
/// ([`qlora_unquantized_experts`]) in the dtype PEFT's preparation leaves them: FP32 (it casts
/// every 16-bit parameter that is not 4-bit), 16-bit with BF16 states.
fn qlora_base_bytes(model: &Model, states: OptimizerStates) -> Bytes {
    let p = &model.params;
    let experts = qlora_unquantized_experts(model);
    let nf4 = p.linear().saturating_sub(experts);
    let linear = Bytes::from_f64(nf4 as f64 * Precision::Nf4.bytes_per_param());
    let rest = p.total().saturating_sub(p.linear());
    linear
        + Bytes(experts.saturating_mul(qlora_expert_bytes(states)))
        + Bytes(rest.saturating_mul(2))
}

/// Bytes per unquantized routed-expert parameter of a QLoRA base: FP32 once PEFT's
/// `prepare_model_for_kbit_training` casts it, 16-bit where BF16 states keep the model so.
pub fn qlora_expert_bytes(states: OptimizerStates) -> u64 {
    if states == OptimizerStates::Bf16 {
        2
    } else {
        4
    }
}

/// The routed-expert parameters a 4-bit (bitsandbytes) load leaves unquantized. transformers 5
/// keeps every MoE family's routed experts as 3-D parameters (`gate_up_proj`, `down_proj`),
/// and bitsandbytes replaces `nn.Linear` modules only (`replace_with_bnb_linear`); Llama 4's
/// are the one exception, split into linear layers for bitsandbytes
/// (`MODULES_TO_PATCH_FOR_QUANTIZATION` in `quantizers/base.py`). Loaded by transformers
/// 5.24 with `load_in_4bit`, a Mixtral's experts stay BF16 and PEFT's
/// `prepare_model_for_kbit_training` makes them FP32. transformers 4 kept experts as linear
/// modules, which were quantized.
pub fn qlora_unquantized_experts(model: &Model) -> u64 {
    match model.arch.moe {
        Some(_) if model.arch.model_type != "llama4" => model.params.experts,
        _ => 0,
    }
}

/// Bytes of the largest unit ZeRO-3 gathers, as it is stored: one decoder layer (16-bit, or
/// under QLoRA NF4 linear layers and the experts bitsandbytes leaves unquantized), or the
/// 16-bit embedding.
fn largest_gathered_bytes(model: &Model, target: &TrainingTarget) -> Bytes {
    let p = &model.params;
    let layers = u64::from(model.arch.layers.max(1));
    let per_layer = p.decoder_layers() / layers;
    let layer = if target.method == Method::Qlora {
        let linear = p.linear() / layers;
        let experts = qlora_unquantized_experts(model) / layers;
        Bytes::from_f64(linear.saturating_sub(experts) as f64 * Precision::Nf4.bytes_per_param())
            + Bytes(experts.saturating_mul(qlora_expert_bytes(target.optimizer_states)))
            + Bytes(per_layer.saturating_sub(linear).saturating_mul(2))
    } else {
        Bytes(per_layer.saturating_mul(2))
    };
    layer.max(Bytes(p.embedding.saturating_mul(2)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::model::presets;

    fn target(method: Method, seq_len: u64) -> TrainingTarget {
        TrainingTarget {
            method,
            seq_len,
            micro_batch: 1,
            gradient_checkpointing: true,
            lora_rank: 16,
            lora_targets: LoraTarget::ALL.to_vec(),
            optimizer_states: OptimizerStates::Fp32,
            loss: Default::default(),
            adamw: Default::default(),
            kernels: Default::default(),
        }
    }

    /// QLoRA of an MoE on transformers 5: bitsandbytes quantizes the linear layers, not the
    /// routed experts (3-D parameters), which PEFT's preparation makes FP32 (16-bit with BF16
    /// states); Llama 4's experts are split into linear layers for bitsandbytes; a dense
    /// model has none (`scripts/qlora-moe-experts.py` shows the load).
    #[test]
    fn qlora_leaves_an_moes_routed_experts_unquantized() {
        let qlora = |key: &str, states| {
            let model = presets::find(key).unwrap().unwrap();
            let target = TrainingTarget {
                optimizer_states: states,
                ..target(Method::Qlora, 512)
            };
            let m = training_memory(&model, &target, 1, 0, (Bytes(1 << 50), 1.0));
            (
                model,
                m.weights
                    .saturating_sub(Bytes::from_f64(m.trainable_params as f64 * 4.0)),
            )
        };
        let (mixtral, fp32) = qlora("mixtral-8x7b", OptimizerStates::Fp32);
        let experts = mixtral.params.experts;
        assert_eq!(qlora_unquantized_experts(&mixtral), experts);
        let p = &mixtral.params;
        let nf4 = Bytes::from_f64((p.linear() - experts) as f64 * Precision::Nf4.bytes_per_param());
        let rest = Bytes((p.total() - p.linear()) * 2);
        assert_eq!(fp32, nf4 + Bytes(experts * 4) + rest);
        assert!(fp32 > Bytes::gib(160), "{fp32}");
        let (_, bf16) = qlora("mixtral-8x7b", OptimizerStates::Bf16);
        assert!(bf16 < fp32);
        let scout = presets::find("llama-4-scout").unwrap().unwrap();
        assert!(scout.arch.moe.is_some());
        assert_eq!(qlora_unquantized_experts(&scout), 0);
        let dense = presets::find("llama-3.1-8b").unwrap().unwrap();
        assert_eq!(qlora_unquantized_experts(&dense), 0);
    }

    /// The foreach AdamW's copy of the moments: at short sequences a full fine-tune's step
    /// peaks in the optimizer step, at five times the BF16 parameter bytes with BF16 states
    /// (weights, gradients, two moments, the copy) and 20 bytes per parameter with FP32
    /// ones; ZeRO-1 shards the copy with the moments; LoRA's copy is the adapters' only.
    #[test]
    fn the_foreach_optimizer_step_holds_a_copy_of_the_moments() {
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let params = model.params.total() as f64;
        let device = (Bytes(1 << 50), 1.0);
        let with = |method, states, adamw, devices, stage| {
            let target = TrainingTarget {
                optimizer_states: states,
                adamw,
                ..target(method, 512)
            };
            training_memory(&model, &target, devices, stage, device)
        };
        let peak =
            |m: &TrainingMemory| (m.weights + m.gradients + m.optimizer + m.activations).as_f64();
        let bf16 = with(Method::Full, OptimizerStates::Bf16, Adamw::Foreach, 1, 0);
        assert_eq!(bf16.activations, bf16.optimizer_step);
        assert!((peak(&bf16) / (10.0 * params) - 1.0).abs() < 1e-6);
        let fused = with(Method::Full, OptimizerStates::Bf16, Adamw::Fused, 1, 0);
        assert_eq!(fused.optimizer_step, Bytes::ZERO);
        assert!(peak(&fused) < 8.5 * params);
        let fp32 = with(Method::Full, OptimizerStates::Fp32, Adamw::Foreach, 1, 0);
        assert!((peak(&fp32) / (20.0 * params) - 1.0).abs() < 1e-6);
        let eight_bit = with(
            Method::Full,
            OptimizerStates::EightBit,
            Adamw::Foreach,
            1,
            0,
        );
        assert_eq!(eight_bit.optimizer_step, Bytes::ZERO);
        let sharded = with(Method::Full, OptimizerStates::Bf16, Adamw::Foreach, 4, 1);
        assert_eq!(sharded.optimizer_step, bf16.optimizer_step.div_ceil(4));
        let lora = with(Method::Lora, OptimizerStates::Fp32, Adamw::Foreach, 1, 0);
        assert_eq!(
            lora.optimizer_step,
            Bytes::from_f64(lora.trainable_params as f64 * 4.0)
        );
        assert!(lora.activations > lora.optimizer_step);
    }

    #[test]
    fn full_fine_tuning_costs_sixteen_bytes_per_parameter_unsharded() {
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let m = training_memory(
            &model,
            &target(Method::Full, 512),
            1,
            0,
            (Bytes::gib(80), 0.9),
        );
        let states = m.weights + m.gradients + m.optimizer;
        assert_eq!(states.0 / model.params.total(), 16);
    }

    /// Issue 38: BF16 states (torch AdamW on a BF16 model) keep 8 bytes per parameter, 8-bit
    /// Adam 10 (FP32 master, one byte per moment); ZeRO-1 shards exactly the optimizer's part.
    #[test]
    fn optimizer_state_precision_sets_the_bytes_per_parameter() {
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let per_param = |states, devices, stage| {
            let t = TrainingTarget {
                optimizer_states: states,
                loss: Default::default(),
                ..target(Method::Full, 512)
            };
            let m = training_memory(&model, &t, devices, stage, (Bytes::gib(80), 0.9));
            (m.weights + m.gradients + m.optimizer).as_f64() / model.params.total() as f64
        };
        for (states, bytes) in [
            (OptimizerStates::Fp32, 16.0),
            (OptimizerStates::Bf16, 8.0),
            (OptimizerStates::EightBit, 10.0),
        ] {
            assert!((per_param(states, 1, 0) - bytes).abs() < 1e-6, "{states}");
            // ZeRO-1 over 4 devices: 4 bytes of weights and gradients, a quarter of the rest.
            let sharded = 4.0 + (bytes - 4.0) / 4.0;
            assert!((per_param(states, 4, 1) - sharded).abs() < 1e-6, "{states}");
        }
        // LoRA: PEFT's FP32 adapters take 16 bytes each under fp32 states, 8 under bf16, 10
        // under 8-bit Adam; the frozen base is the same 2 bytes per parameter in all three.
        let lora = |states| {
            let t = TrainingTarget {
                optimizer_states: states,
                loss: Default::default(),
                ..target(Method::Lora, 512)
            };
            let m = training_memory(&model, &t, 1, 0, (Bytes::gib(80), 0.9));
            let base = model.params.total() * 2;
            (m.weights.0 + m.gradients.0 + m.optimizer.0 - base) as f64 / m.trainable_params as f64
        };
        assert!((lora(OptimizerStates::Fp32) - 16.0).abs() < 1e-3);
        assert!((lora(OptimizerStates::Bf16) - 8.0).abs() < 1e-3);
        assert!((lora(OptimizerStates::EightBit) - 10.0).abs() < 1e-3);
        assert_eq!(
            serde_json::to_value(OptimizerStates::EightBit).unwrap(),
            "8bit"
        );
    }

    #[test]
    fn zero_stages_shard_progressively() {
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let t = target(Method::Full, 512);
        let states = |stage| {
            let m = training_memory(&model, &t, 8, stage, (Bytes::gib(80), 0.9));
            m.weights + m.gradients + m.optimizer
        };
        assert!(states(1) < states(0) && states(2) < states(1) && states(3) < states(2));
    }

    /// ZeRO-3 gathers two layers at a time as they are stored: 16-bit under LoRA, NF4 linear
    /// layers under QLoRA, whose largest unit is then the 16-bit embedding.
    #[test]
    fn zero3_gathers_two_layers_as_they_are_stored() {
        let model = presets::find("llama-2-70b").unwrap().unwrap();
        let gathered = |method| {
            let t = target(method, 4096);
            let sharded = training_memory(&model, &t, 2, 3, (Bytes::gib(80), 0.95));
            let base = match method {
                Method::Qlora => qlora_base_bytes(&model, t.optimizer_states),
                _ => Bytes(model.params.total() * 2),
            };
            let adapters = Bytes::from_f64(sharded.trainable_params as f64 * 4.0);
            sharded.weights.0 - base.div_ceil(2).0 - adapters.0
        };
        let layer = model.params.decoder_layers() / u64::from(model.arch.layers);
        assert_eq!(gathered(Method::Lora), 2 * 2 * layer);
        let qlora = gathered(Method::Qlora);
        assert!(qlora < 2 * 2 * layer / 3, "{qlora}");
        assert!(qlora >= 2 * 2 * model.params.embedding, "{qlora}");
    }

    /// A frozen base sharded over several devices keeps 3.5 bytes per hidden unit of each
    /// checkpointed layer input (2 on one device), and the allocator's reserve takes half of
    /// them beside the usual 1.5 GiB and 2 bytes per logit; a full fine-tune's checkpoints stay
    /// 16-bit.
    #[test]
    fn a_sharded_frozen_base_keeps_more_per_checkpoint_and_reserves_half_of_it() {
        let model = presets::find("mistral-7b-v0.1").unwrap().unwrap();
        let (seq_len, layers, hidden) = (4096u64, 32u64, 4096u64);
        let lora = TrainingTarget {
            lora_targets: vec![LoraTarget::Q, LoraTarget::K, LoraTarget::V, LoraTarget::O],
            ..target(Method::Lora, seq_len)
        };
        let unbounded = (Bytes(1 << 50), 1.0);
        let one = training_memory(&model, &lora, 1, 0, unbounded);
        let sharded = training_memory(&model, &lora, 2, 3, unbounded);
        let checkpoints = layers * seq_len * hidden;
        assert_eq!(one.activation_peak.waiting.0, checkpoints * 2);
        assert_eq!(sharded.activation_peak.waiting.0, checkpoints * 7 / 2);
        assert_eq!(
            sharded.activation_peak.loss_phase.0 - one.activation_peak.loss_phase.0,
            checkpoints * 3 / 2
        );
        let logits = seq_len * model.arch.vocab;
        assert_eq!(
            sharded.allocator_reserve,
            ALLOCATOR_RESERVE
                + Bytes(logits * ALLOCATOR_RESERVE_BYTES_PER_LOGIT)
                + sharded
                    .activation_peak
                    .waiting
                    .fraction(ALLOCATOR_RESERVE_SHARDED_WAITING)
        );
        assert_eq!(
            one.allocator_reserve,
            ALLOCATOR_RESERVE + Bytes(logits * ALLOCATOR_RESERVE_BYTES_PER_LOGIT)
        );
        // Two devices at ZeRO-2 keep the base whole and the checkpoints 16-bit.
        let zero2 = training_memory(&model, &lora, 2, 2, unbounded);
        assert_eq!(zero2.activation_peak.waiting, one.activation_peak.waiting);
        let full = target(Method::Full, seq_len);
        let full_one = training_memory(&model, &full, 1, 0, unbounded);
        let full_sharded = training_memory(&model, &full, 2, 3, unbounded);
        assert_eq!(full_sharded.activation_peak.waiting.0, checkpoints * 2);
        assert!(full_one.activation_peak.waiting >= full_sharded.activation_peak.waiting);
    }

    #[test]
    fn qwen3_30b_a3b_needs_zero3_on_16_gpus() {
        // QwenLM/Qwen3 docs/source/training/ms_swift.md: full SFT of Qwen3-30B-A3B runs out of
        // memory with ZeRO-2 on 16 x 80 GiB and fits with ZeRO-3.
        let model = presets::find("qwen3-30b-a3b").unwrap().unwrap();
        let t = target(Method::Full, 2048);
        let zero2 = training_memory(&model, &t, 16, 2, (Bytes::gib(80), 0.9));
        let zero3 = training_memory(&model, &t, 16, 3, (Bytes::gib(80), 0.9));
        assert!(
            zero2.device.total > zero2.device.capacity,
            "{}",
            zero2.device.total
        );
        assert!(zero3.device.within_budget(), "{}", zero3.device.total);
    }

    /// Issue 38: PEFT 0.21 on transformers 5 adapts Qwen3-MoE's and Mixtral's fused experts
    /// with gate and up as one adapter of rank 2r (a dense 2I x 2r B per expert); traced
    /// counts (`fixtures/training/`): 994,836,480 for Qwen3-30B-A3B with all seven targets at
    /// r = 16. Without both of gate and up, and on gpt-oss (whose experts PEFT's module
    /// targets do not reach), each expert projection counts as its own adapter.
    #[test]
    fn lora_on_fused_moe_experts_counts_what_peft_trains() {
        let qwen = presets::find("qwen3-30b-a3b").unwrap().unwrap();
        assert_eq!(lora_params(&qwen, 16, &LoraTarget::ALL), 994_836_480);
        let separate = |model: &Model, targets: &[LoraTarget]| {
            targets
                .iter()
                .map(|t| lora_params(model, 16, std::slice::from_ref(t)))
                .sum::<u64>()
        };
        // 48 layers x 128 experts x 2 x 16 x 768 more than seven separate adapters.
        assert_eq!(
            lora_params(&qwen, 16, &LoraTarget::ALL) - separate(&qwen, &LoraTarget::ALL),
            48 * 128 * 2 * 16 * 768
        );
        let gate_down = [LoraTarget::Gate, LoraTarget::Down];
        assert_eq!(
            lora_params(&qwen, 16, &gate_down),
            separate(&qwen, &gate_down)
        );
        let gpt_oss = presets::find("gpt-oss-20b").unwrap().unwrap();
        assert_eq!(
            lora_params(&gpt_oss, 16, &LoraTarget::ALL),
            separate(&gpt_oss, &LoraTarget::ALL)
        );
    }

    /// The plan says which way it counted an MoE's expert adapters, and only when LoRA
    /// reaches the MLP of an MoE model.
    #[test]
    fn the_expert_adapter_note_names_what_peft_does() {
        let preset = |key| presets::find(key).unwrap().unwrap();
        let lora = target(Method::Lora, 2048);
        let note = |key, t: &TrainingTarget| expert_adapter_note(&preset(key), t);
        for (key, says) in [
            ("qwen3-30b-a3b", "twice the rank"),
            ("mixtral-8x7b", "twice the rank"),
            ("gpt-oss-20b", "target_parameters"),
            ("llama-4-scout", "target_parameters"),
        ] {
            let text = note(key, &lora).unwrap_or_else(|| panic!("{key}: no note"));
            assert!(text.contains(says), "{key}: {text}");
        }
        assert_eq!(note("llama-3.1-8b", &lora), None);
        assert_eq!(note("qwen3-30b-a3b", &target(Method::Full, 2048)), None);
        let attention = TrainingTarget {
            lora_targets: vec![LoraTarget::Q, LoraTarget::V],
            ..lora
        };
        assert_eq!(note("gpt-oss-20b", &attention), None);
    }

    #[test]
    fn lora_trainable_parameters_follow_the_paper() {
        // Llama-3.1-8B, r=16 on q,k,v,o,gate,up,down: per layer
        // 16*(4096+4096)*2 + 16*(4096+1024)*2 + 16*(4096+14336)*3 = 1,048,576... x 32 layers.
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let per_layer = 16 * (4096 + 4096) * 2 + 16 * (4096 + 1024) * 2 + 16 * (4096 + 14336) * 3;
        assert_eq!(lora_params(&model, 16, &LoraTarget::ALL), 32 * per_layer);
        assert_eq!(lora_params(&model, 16, &[]), 0);
    }

    #[test]
    fn checkpointing_cuts_activations() {
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let at = |checkpointing| {
            let t = TrainingTarget {
                gradient_checkpointing: checkpointing,
                ..target(Method::Lora, 4096)
            };
            training_memory(&model, &t, 1, 0, (Bytes::gib(80), 0.9)).activations
        };
        let (with, without) = (at(true), at(false));
        assert!(
            with.as_f64() * 4.0 < without.as_f64(),
            "{with} vs {without}"
        );
    }

    /// A fused loss drops the whole logits from the step and from the allocator's reserve,
    /// which counts one chunk's logits and 5 % of the activations instead.
    #[test]
    fn a_fused_loss_shrinks_long_sequences_and_reserves_by_the_activations() {
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let mut t = target(Method::Lora, 32_768);
        // A budget of the whole device, so the reserve is all in the overhead.
        let whole = (Bytes::gib(1 << 20), 1.0);
        let standard = training_memory(&model, &t, 1, 0, whole);
        t.loss = Loss::Fused;
        let fused = training_memory(&model, &t, 1, 0, whole);
        let logits = 32_768 * 128_256;
        assert_eq!(
            standard.allocator_reserve,
            ALLOCATOR_RESERVE + Bytes(logits * ALLOCATOR_RESERVE_BYTES_PER_LOGIT)
        );
        let chunk = 1024 * 128_256; // 32,768 / 32 rows
        assert_eq!(
            fused.allocator_reserve,
            ALLOCATOR_RESERVE
                + Bytes(chunk * ALLOCATOR_RESERVE_BYTES_PER_LOGIT)
                + fused
                    .activations
                    .fraction(ALLOCATOR_RESERVE_FUSED_ACTIVATIONS)
        );
        // 12 bytes per logit less at the loss; the step then peaks in the backward pass.
        assert!(standard.device.total.as_f64() > 1.8 * fused.device.total.as_f64());
        assert_eq!(fused.activations, fused.activation_peak.backward_phase);
        assert_eq!(
            (fused.weights, fused.optimizer),
            (standard.weights, standard.optimizer)
        );
    }

    /// QLoRA as TRL prepares a 4-bit model: FP32 adapters (16 bytes per trainable parameter
    /// with FP32 states) and an FP32 residual stream, so twice LoRA's checkpointed inputs; BF16
    /// states keep both in 16 bits.
    #[test]
    fn qlora_counts_fp32_adapters_and_an_fp32_stream() {
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let device = (Bytes::gib(1 << 20), 0.95);
        let qlora = training_memory(&model, &target(Method::Qlora, 4096), 1, 0, device);
        let lora = training_memory(&model, &target(Method::Lora, 4096), 1, 0, device);
        let t = qlora.trainable_params;
        assert_eq!(t, lora.trainable_params);
        assert_eq!(
            (qlora.gradients, qlora.optimizer),
            (Bytes(4 * t), Bytes(8 * t))
        );
        let checkpoints = |m: &TrainingMemory| m.activation_peak.loss_phase;
        let logits = Bytes(4096 * 128_256 * 12);
        let inputs = Bytes(32 * 4096 * 4096 * 2);
        assert_eq!(checkpoints(&lora), inputs + logits);
        assert_eq!(checkpoints(&qlora), inputs.times(2) + logits);
        let mut bf16 = target(Method::Qlora, 4096);
        bf16.optimizer_states = OptimizerStates::Bf16;
        let bf16 = training_memory(&model, &bf16, 1, 0, device);
        assert_eq!(checkpoints(&bf16), inputs + logits);
        assert_eq!(bf16.gradients, Bytes(2 * t));
    }

    #[test]
    fn dpo_adds_a_reference_model() {
        let model = presets::find("llama-3.2-1b").unwrap().unwrap();
        let full = training_memory(
            &model,
            &target(Method::Full, 2048),
            1,
            0,
            (Bytes::gib(80), 0.9),
        );
        let dpo = training_memory(
            &model,
            &target(Method::Dpo, 2048),
            1,
            0,
            (Bytes::gib(80), 0.9),
        );
        assert_eq!((dpo.weights.0 - full.weights.0) / model.params.total(), 2);
        assert!(dpo.activations > full.activations);
    }

    /// A step needs `weights + optimizer + max(loss phase, gradients + backward phase)`: LoRA
    /// (almost no gradients) peaks at the loss, a full fine-tune of a 32k-vocabulary model at
    /// short sequences when its gradients are complete.
    #[test]
    fn the_step_peaks_at_the_larger_of_its_two_moments() {
        let device = (Bytes::gib(1 << 20), 0.95);
        let lora_model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let lora = training_memory(&lora_model, &target(Method::Lora, 4096), 1, 0, device);
        let full_model = presets::find("mistral-7b-v0.1").unwrap().unwrap();
        let full = training_memory(&full_model, &target(Method::Full, 512), 1, 0, device);
        for (m, loss_wins) in [(lora, true), (full, false)] {
            let peak = m.activation_peak;
            let at_loss = peak.loss_phase.saturating_sub(m.gradients);
            assert_eq!(at_loss >= peak.backward_phase, loss_wins, "{peak:?}");
            assert_eq!(m.activations, at_loss.max(peak.backward_phase));
            assert_eq!(
                m.device.total,
                m.weights + m.optimizer + (m.gradients + m.activations) + m.overhead
            );
        }
    }

    /// The allocator's reserve (1.5 GiB + 2 bytes per logit) is met by the share of the device
    /// outside the budget first: nothing more on an 80 GiB device at 2k tokens, the rest on a
    /// 24 GiB one, and all of it at a budget of the whole device.
    #[test]
    fn the_allocator_reserve_counts_only_beyond_the_unbudgeted_share() {
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let t = target(Method::Lora, 2048);
        let reserve = |gib, util| training_memory(&model, &t, 1, 0, (Bytes::gib(gib), util));
        let whole = Bytes(1536 * MIB + 2048 * 128_256 * ALLOCATOR_RESERVE_BYTES_PER_LOGIT);
        assert_eq!(reserve(80, 0.95).allocator_reserve, Bytes::ZERO);
        let small = reserve(24, 0.95);
        assert_eq!(
            small.allocator_reserve,
            whole.saturating_sub(Bytes::gib(24).saturating_sub(Bytes::gib(24).fraction(0.95)))
        );
        assert_eq!(small.overhead, BASE_OVERHEAD + small.allocator_reserve);
        assert_eq!(reserve(80, 1.0).allocator_reserve, whole);
    }

    #[test]
    fn lora_targets_parse() {
        assert_eq!(LoraTarget::parse("q_proj"), Some(LoraTarget::Q));
        assert_eq!(LoraTarget::parse("W2"), Some(LoraTarget::Down));
        assert_eq!(LoraTarget::parse("lm_head"), None);
    }
}
