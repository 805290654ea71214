//! Activation memory of one fine-tuning step: what the backward pass needs saved, the loss's
//! logits, and the working set while the gradients fill in. Calibrated on traced allocations
//! of the training code users run (transformers 5, PEFT, PyTorch autograd;
//! `scripts/measure-training-memory.py --trace`, rows in `fixtures/training/`).
//!
//! A step peaks at one of two moments (docs/planner.md, "Training memory, traced"):
//! * **The start of the backward pass** ([`ActivationPeak::loss_phase`]): every saved
//!   activation is alive and the loss holds 12 bytes per logit — the FP32 log-probabilities
//!   log-softmax saved, their gradient and the gradient of its input — but no parameter
//!   gradient exists yet. A fused loss (Liger Kernel's) holds one chunk of logits instead, and
//!   the hidden states' gradient it made in the forward pass.
//! * **While layers are differentiated** ([`ActivationPeak::backward_phase`]): the first layer
//!   differentiated (recomputed with checkpointing, or still saved) and its working set, with
//!   what waits below it (the checkpointed inputs, or every other layer's saved activations);
//!   the gradients fill in as what waits is freed, so beside the full gradients the phase is
//!   that moment less the smaller of the two ([`ActivationPeak::settled`]); or, at the very end
//!   and when it is larger, the embedding's dense gradient (a second copy for a moment when
//!   the output head shares it).
//!
//! So a step needs `weights + optimizer + max(loss phase, gradients + backward phase)`.
//!
//! Per layer and token, a decoder layer keeps `21 h + 4 kv + 8 I` bytes for its backward pass
//! with a 16-bit residual stream (attention through a flash kernel: no `s^2` term; the MLP's
//! gate, up, activation and product `8 I`; the 16-bit keys and values `4 kv`, `kv` their
//! heads' width; the norms' FP32 inputs, the queries, the attention output `21 h`), and
//! `31 h + 4 kv + 8 I` when the model's parameters are FP32 under autocast, whose residual
//! stream, norms and their outputs stay FP32. Korthikanti et al.'s `17 h` (arXiv:2205.05198)
//! assumes 16-bit norms and no rotary copies. Checkpointing keeps each layer's input instead (2
//! or 4 bytes per hidden unit) and recomputes one layer at a time. Liger Kernel's layers
//! ([`super::Kernels`]) keep less per norm and MLP.

use super::super::model::Model;
use super::super::units::Bytes;

/// Bytes per logit the loss holds when the backward pass starts: log-softmax's saved FP32
/// output, the gradient of that output and the gradient of its input (4 + 4 + 4). The forward
/// pass peaks lower: 16-bit logits, their FP32 copy and the log-probabilities (2 + 4 + 4).
const LOSS_BYTES_PER_LOGIT: u128 = 12;

/// DPO scores the reference model while the policy's log-probabilities wait for the loss:
/// 4 saved bytes per policy logit plus the reference's 10 (16-bit logits, FP32 copy,
/// log-probabilities), above the 12 of the policy's own backward pass.
const DPO_BYTES_PER_LOGIT: u128 = 14;

/// Per layer and token, bytes per hidden unit kept for the backward pass of trained layers
/// with a 16-bit and with an FP32 residual stream, beside [`KV_BYTES`] per key and value unit.
const HIDDEN_BYTES_16: u128 = 21;
const HIDDEN_BYTES_32: u128 = 31;
/// Per layer and token, bytes per MLP intermediate unit of trained layers: gate, up,
/// activation, product.
const INTERMEDIATE_BYTES: u128 = 8;
/// Per layer and token, bytes per key and value unit (`kv_heads x head_dim`): the 16-bit keys
/// and values attention saves. A model with as many key-value heads as query heads (Llama 2
/// 7B) keeps 3 h more per layer and token than one with a quarter as many (Llama 3.1 8B,
/// Llama 3.2 3B, Qwen3 8B), traced without checkpointing.
const KV_BYTES: u128 = 4;
/// A frozen layer (LoRA's base) keeps less: its linear layers save no input for a weight
/// gradient, so `13 h + 4 kv + 6 I` (traced: 13.1-13.6 h + 6 I with a quarter as many key-value
/// heads, 16.2 h + 6 I with as many), plus what its adapters keep.
const FROZEN_HIDDEN_BYTES: u128 = 13;
const FROZEN_INTERMEDIATE_BYTES: u128 = 6;
/// A frozen 4-bit base prepared for training (QLoRA: PEFT's `prepare_model_for_kbit_training`
/// casts the norms to FP32, and bitsandbytes' `Linear4bit` returns its input's dtype) carries
/// an FP32 residual stream, FP32 norm outputs and FP32 MLP activations: `18 h + 4 kv + 12 I`
/// beside the adapters' inputs (traced on Mistral 7B QLoRA at 4k x 2 without checkpointing:
/// 18.2 h + 12 I).
const FROZEN_HIDDEN_BYTES_32: u128 = 18;
const FROZEN_INTERMEDIATE_BYTES_32: u128 = 12;
/// A 4-bit base on a 16-bit residual stream (BF16 states, or Liger Kernel's norms) keeps, per
/// layer and token, bytes per hidden unit more than a 16-bit one: bitsandbytes' 4-bit matmul
/// keeps what a 16-bit frozen linear layer frees (traced on Mistral 7B QLoRA at 4k x 2 with
/// Liger's layers: 4.2 h more than LoRA's base).
const QUANTIZED_BASE_HIDDEN_BYTES: u128 = 4;
/// Differentiating a frozen layer holds, beside what it saved, the gradients of its
/// activations: per token, bytes per MLP intermediate unit. transformers' MLP holds 6 (the
/// gradients of the product, of the activation and of the gate and up projections), and 8
/// when the down projection has an adapter (its input's gradient comes through both paths);
/// Liger Kernel's SwiGLU writes the gate's and up's gradients over their inputs, 2, unless a
/// down adapter holds the 8 (less its norms' saving, [`LIGER_NORM_WORKING_BYTES`]). Traced on
/// Llama 3.1 8B LoRA at 16k tokens with a fused loss, where the backward pass is the peak, on
/// q/k/v/o, q/v, o, gate/up (5.9-6.3 I), down and gate/up/down and every projection (7.9-8.5
/// I), and Qwen2.5 14B (8.2 I); Liger's 2.1 I and 8 I less 4.1 h.
const FROZEN_WORKING_INTERMEDIATE_BYTES: u128 = 6;
const DOWN_ADAPTER_WORKING_INTERMEDIATE_BYTES: u128 = 2;
const LIGER_WORKING_INTERMEDIATE_BYTES: u128 = 2;
/// A trained layer being differentiated holds, beside what it saved, 4 bytes per MLP
/// intermediate unit and token of activation gradients (traced on Llama 3.1 8B full
/// fine-tuning with BF16 states and a fused loss at 4096 x 16, where the backward pass starts
/// the step's peak: 4.0 I beyond the head's gradient, the checkpointed inputs and the layer).
const TRAINED_WORKING_INTERMEDIATE_BYTES: u128 = 4;
/// An MoE layer also keeps, per token and routed expert, bytes per hidden unit: the token's
/// copy gathered for its expert and the expert's output before the router's weighting
/// (transformers 5's grouped experts). Traced per `k x h` (k experts per token): frozen 3.1
/// (Qwen3-30B-A3B) and 1.9 (Mixtral), trained 5.5 and 3.4; gpt-oss's clamped SwiGLU keeps
/// more, 8.0 frozen and 11.5 trained.
const MOE_ROUTED_BYTES_FROZEN: u128 = 4;
const MOE_ROUTED_BYTES_TRAINED: u128 = 6;
const GPT_OSS_ROUTED_BYTES_FROZEN: u128 = 8;
const GPT_OSS_ROUTED_BYTES_TRAINED: u128 = 12;

/// Qwen3's per-head RMSNorm on queries and keys keeps their FP32 copies: 4 bytes per query
/// and key unit (traced: 4 to 5 h more per layer on Qwen3 8B); Liger Kernel's keeps the
/// 16-bit input, 2 (traced on Qwen3 8B LoRA at 8k x 2 without checkpointing).
const QK_NORM_BYTES: u128 = 4;
const LIGER_QK_NORM_BYTES: u128 = 2;

/// What Liger Kernel's layer kernels (`--kernels liger`, [`super::Kernels`]) keep less than
/// transformers' code, per layer and token: for each norm, bytes per hidden unit of a trained
/// and of a frozen layer, and of a frozen layer's working set (its backward pass writes the
/// input's gradient over the output's); and bytes per intermediate unit of a dense MLP (the
/// activation recomputed, not saved). Traced against the same cases run with transformers'
/// code: Llama 3.2 1B full fine-tuning without checkpointing 8.25 h + 2 I less per layer and
/// token (BF16 and FP32 states alike), Llama 3.2 3B LoRA 4 h + 2 I, Gemma 2 9B LoRA (four
/// norms) 8 h + 2 I; a frozen layer's working set 4 h less with two norms (Llama 3.1 8B and
/// Qwen2.5 14B LoRA with checkpointing and a fused loss).
const LIGER_NORM_TRAINED_BYTES: u128 = 4;
const LIGER_NORM_FROZEN_BYTES: u128 = 2;
const LIGER_NORM_WORKING_BYTES: u128 = 2;
const LIGER_ACTIVATION_BYTES: u128 = 2;

/// Bytes per attention score (`batch x heads x s x s`) that eager attention keeps for the
/// backward pass, and that differentiating one such layer holds beside them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct EagerScores {
    saved: u128,
    backward: u128,
}

/// Gemma 2: the soft-cap's tanh (2), softmax's FP32 output (4), the 16-bit probabilities (2)
/// and the mask's share; traced 9.1-10.2 bytes saved per score without checkpointing and
/// 12.6-13.5 in all for the layer being differentiated (fixtures/training/).
const GEMMA2_SCORES: EagerScores = EagerScores {
    saved: 10,
    backward: 4,
};
/// gpt-oss: the 16-bit probabilities with the sink column (2); traced 2.0 bytes saved (two
/// rows of different sequence lengths solved for the per-token and per-score bytes) and
/// 5.8-6.0 in all.
const GPT_OSS_SCORES: EagerScores = EagerScores {
    saved: 2,
    backward: 4,
};

/// Bytes per `b x s x s` element of the 16-bit bias a windowed layer's SDPA keeps when the
/// sequence is longer than the window (Mistral 7B's 4096 tokens): traced on Mistral 7B LoRA at
/// 8k x 2 without checkpointing, one `(b, 1, s, s)` BF16 tensor per layer beside the boolean
/// mask built once.
const WINDOW_BIAS_BYTES: u128 = 2;

/// A fused linear cross-entropy (Liger Kernel's, `--loss fused`) keeps, per token, the
/// hidden states' gradient it computes in the forward pass and the final norm's output it
/// reads (one residual-stream element per hidden unit each), and its FP32 loss per token;
/// and one chunk of 16-bit logits at a time, `next_power_of_two(tokens / ceil(V / h))` rows
/// (`ops/fused_linear_cross_entropy.py`): about as many values as the hidden states.
const FUSED_HIDDEN_COPIES: u128 = 2;
const FUSED_LOSS_BYTES_PER_TOKEN: u128 = 4;
const FUSED_CHUNK_BYTES_PER_LOGIT: u128 = 2;
/// When the output head is trained, the fused loss makes its gradient in the forward pass
/// (before any other gradient exists), and a 16-bit head adds each chunk's product to it
/// through a 16-bit result and its FP32 copy (`torch.mm(...).float()`, 2 + 4 bytes per head
/// parameter); an FP32 head on CUDA (PyTorch 2.8 and later, sm80 and later) accumulates in
/// place (`torch.addmm(..., out_dtype=torch.float32)`).
const FUSED_HEAD_TRANSIENT_BYTES: u128 = 6;

/// Gemma 2's final logit soft-capping (`tanh(logits / 30) * 30` in 16 bits) keeps the tanh's
/// 16-bit output for the backward pass.
const SOFTCAP_BYTES_PER_LOGIT: u128 = 2;

/// Half-bytes per hidden unit, layer and token of the checkpointed inputs of a frozen base
/// that ZeRO-3 or FSDP (`FULL_SHARD`) shards: 3.5 bytes, where a 16-bit stream on one device
/// keeps 2. Fitted on fms-acceleration's two-GPU FSDP runs
/// (`fixtures/training/published-fms-acceleration-a100-80gb.json`): beyond the loss and the
/// layer being differentiated, Mistral 7B's LoRA and QLoRA runs kept 2.5 to 2.8 bytes per
/// hidden unit and layer for each token, Llama 2 70B's QLoRA run 4.2; 3.5 holds all six
/// completed rows within 10 % (4 puts Mistral's QLoRA at 4 x 4096 10.1 % above, 3 Llama's at
/// 2 x 4096 13.5 % below). What holds the bytes is not identified (FSDP's hooks on each unit under
/// reentrant checkpointing are the likely place); a GPU under FSDP is to confirm it.
pub const SHARDED_CHECKPOINT_HALF_BYTES: u128 = 7;

/// How the decoder layers are trained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layers {
    /// Every weight trained (full fine-tuning, DPO's policy).
    Trained {
        /// The parameters are FP32 under autocast, so the residual stream stays FP32.
        fp32_residual: bool,
    },
    /// A frozen base with adapters (LoRA, QLoRA).
    Frozen {
        /// Bytes per token and layer the adapters keep: each adapter saves its input.
        adapter_bytes_per_token: u64,
        /// The residual stream is FP32 (a 4-bit base prepared for training).
        fp32_residual: bool,
        /// The base is 4-bit (QLoRA).
        quantized_base: bool,
        /// The MLP's down projection has an adapter.
        down_adapter: bool,
    },
}

/// One training step's shape, as far as activations are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Tokens per sequence.
    pub seq_len: u64,
    /// Sequences per micro-batch on the device (DPO's chosen and rejected counted apart).
    pub batch: u64,
    /// Whether each layer is recomputed in the backward pass.
    pub checkpointing: bool,
    /// Trained or frozen layers.
    pub layers: Layers,
    /// Bytes per element of the embedding's gradient when the embedding is trained (full
    /// fine-tuning, DPO); zero when it is frozen (LoRA).
    pub embedding_gradient_bytes: u64,
    /// DPO: a frozen reference model is scored in the same step.
    pub reference_model: bool,
    /// The loss is a fused linear cross-entropy over chunks of tokens, not the whole logits.
    pub fused_loss: bool,
    /// Liger Kernel's RMSNorm and SwiGLU/GeGLU run the layers, not transformers' own.
    pub liger_layers: bool,
    /// A frozen base sharded by ZeRO-3 or FSDP (`FULL_SHARD`): its checkpointed layer inputs
    /// are counted at [`SHARDED_CHECKPOINT_HALF_BYTES`] per hidden unit.
    pub sharded_frozen_base: bool,
}

/// The activation side of a step's peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ActivationPeak {
    /// Alive when the backward pass starts, before any gradient: saved activations and the
    /// loss's logits.
    pub loss_phase: Bytes,
    /// Alive beside the full gradients while layers are differentiated: one layer and its
    /// working set with what waits below it, or the embedding's dense gradient.
    /// [`super::training_memory`] takes off what the gradients replace ([`Self::settled`]).
    pub backward_phase: Bytes,
    /// Of the backward phase, what waits below the first layer differentiated (the
    /// checkpointed inputs, or every other layer's saved activations): freed layer by layer
    /// as the gradients fill in.
    #[serde(skip)]
    pub waiting: Bytes,
    /// The head's gradient, which exists from the start of the backward pass (zero when the
    /// head is frozen).
    #[serde(skip)]
    pub head_gradient: Bytes,
    /// The first layer's moment alone (the backward phase without the embedding's gradient).
    #[serde(skip)]
    pub first_layer: Bytes,
}

impl ActivationPeak {
    /// The backward phase beside `gradients` bytes of gradients. The backward pass fills the
    /// gradients in from the top layer down and frees what waited for each layer as it
    /// passes it, so it peaks at its start (the head's gradient beside everything waiting) or
    /// at its end (every gradient, nothing waiting), never with both: the phase beyond the
    /// full gradients is the first layer's moment less the smaller of the two. A LoRA step,
    /// whose gradients are small, keeps nearly all of it.
    #[must_use]
    pub fn settled(self, gradients: Bytes) -> Self {
        let filling = gradients.saturating_sub(self.head_gradient);
        let first_layer = self.first_layer.saturating_sub(filling.min(self.waiting));
        Self {
            backward_phase: first_layer.max(self.head_gradient),
            first_layer,
            ..self
        }
    }
}

/// What eager attention keeps for `model_type` when transformers trains it so: its modeling
/// files set `_supports_sdpa = False` for Gemma 2 (SDPA cannot soft-cap scores) and gpt-oss
/// (attention sinks), so without flash-attention kernels both run eager attention.
fn eager_scores(model_type: &str) -> Option<EagerScores> {
    match model_type {
        "gemma2" => Some(GEMMA2_SCORES),
        "gpt_oss" => Some(GPT_OSS_SCORES),
        _ => None,
    }
}

/// Whether the model normalises each head's queries and keys (`q_norm`, `k_norm`).
fn qk_norm(model_type: &str) -> bool {
    matches!(model_type, "qwen3" | "qwen3_moe")
}

/// RMSNorms per decoder layer: Gemma 2 and 3 normalise each sub-layer's output as well as its
/// input.
fn norms_per_layer(model_type: &str) -> u128 {
    match model_type {
        "gemma2" | "gemma3" | "gemma3_text" => 4,
        _ => 2,
    }
}

/// Whether the model soft-caps its final logits (Gemma 2's `final_logit_softcapping`).
fn softcapped_logits(model_type: &str) -> bool {
    model_type == "gemma2"
}

/// The activation peak of `step` on `model`.
///
/// `seq_len x batch` alone can exceed 64 bits (both are user input), so the products are
/// taken in 128 bits and saturate: an absurd request comes out as `u64::MAX` bytes, which
/// never fits.
pub fn step_activations(model: &Model, step: &Step) -> ActivationPeak {
    let arch = &model.arch;
    let mul = u128::saturating_mul;
    let add = u128::saturating_add;
    let tokens = mul(u128::from(step.seq_len), u128::from(step.batch));
    let h = u128::from(arch.hidden);
    let intermediate = u128::from(arch.active_intermediate());
    let kv = mul(
        KV_BYTES,
        mul(u128::from(arch.kv_heads), u128::from(arch.head_dim)),
    );
    let layers = u128::from(arch.layers);
    let qk = if qk_norm(&arch.model_type) {
        let query_key = u128::from(arch.heads).saturating_add(u128::from(arch.kv_heads));
        let bytes = if step.liger_layers {
            LIGER_QK_NORM_BYTES
        } else {
            QK_NORM_BYTES
        };
        mul(bytes, mul(query_key, u128::from(arch.head_dim)))
    } else {
        0
    };
    // What Liger's kernels keep less per layer and token, and in a frozen layer's working
    // set; an MoE's experts are Liger's own, not traced, so only its norms count.
    let trained = matches!(step.layers, Layers::Trained { .. });
    let (liger_saved, liger_working) = if step.liger_layers {
        let norms = norms_per_layer(&arch.model_type);
        let per_norm = if trained {
            LIGER_NORM_TRAINED_BYTES
        } else {
            LIGER_NORM_FROZEN_BYTES
        };
        let activation = if arch.moe.is_none() {
            mul(LIGER_ACTIVATION_BYTES, intermediate)
        } else {
            0
        };
        (
            add(mul(mul(norms, per_norm), h), activation),
            mul(mul(norms, LIGER_NORM_WORKING_BYTES), h),
        )
    } else {
        (0, 0)
    };
    let (per_token, residual_bytes) = match step.layers {
        Layers::Trained { fp32_residual } => {
            let hidden_bytes = if fp32_residual {
                HIDDEN_BYTES_32
            } else {
                HIDDEN_BYTES_16
            };
            let per_token = add(
                add(mul(hidden_bytes, h), kv),
                mul(INTERMEDIATE_BYTES, intermediate),
            );
            (
                per_token.saturating_sub(liger_saved),
                if fp32_residual { 4 } else { 2 },
            )
        }
        Layers::Frozen {
            adapter_bytes_per_token,
            fp32_residual,
            quantized_base,
            ..
        } => {
            let (hidden_bytes, intermediate_bytes) = match (fp32_residual, quantized_base) {
                (true, _) => (FROZEN_HIDDEN_BYTES_32, FROZEN_INTERMEDIATE_BYTES_32),
                (false, false) => (FROZEN_HIDDEN_BYTES, FROZEN_INTERMEDIATE_BYTES),
                (false, true) => (
                    FROZEN_HIDDEN_BYTES + QUANTIZED_BASE_HIDDEN_BYTES,
                    FROZEN_INTERMEDIATE_BYTES,
                ),
            };
            let base = add(
                add(mul(hidden_bytes, h), kv),
                mul(intermediate_bytes, intermediate),
            )
            .saturating_sub(liger_saved);
            (
                add(base, u128::from(adapter_bytes_per_token)),
                if fp32_residual { 4 } else { 2 },
            )
        }
    };
    let routed = arch.moe.map_or(0, |moe| {
        let bytes = match (arch.model_type.as_str(), trained) {
            ("gpt_oss", false) => GPT_OSS_ROUTED_BYTES_FROZEN,
            ("gpt_oss", true) => GPT_OSS_ROUTED_BYTES_TRAINED,
            (_, false) => MOE_ROUTED_BYTES_FROZEN,
            (_, true) => MOE_ROUTED_BYTES_TRAINED,
        };
        mul(bytes, mul(u128::from(moe.experts_per_token), h))
    });
    let layer = mul(tokens, add(add(per_token, qk), routed));
    let eager = eager_scores(&arch.model_type).unwrap_or(EagerScores {
        saved: 0,
        backward: 0,
    });
    let scores = mul(
        mul(u128::from(step.batch), u128::from(arch.heads)),
        mul(u128::from(step.seq_len), u128::from(step.seq_len)),
    );
    // A window shorter than the sequence needs a mask, built once (1 byte per `b x s x s`
    // element) and, under SDPA, turned into each layer's 16-bit bias, which the
    // memory-efficient kernel a masked SDPA runs keeps for its backward pass.
    let masked = arch.sliding_window.is_some_and(|w| step.seq_len > w.window)
        && eager_scores(&arch.model_type).is_none();
    let (mask, bias) = if masked {
        let elements = mul(
            u128::from(step.batch),
            mul(u128::from(step.seq_len), u128::from(step.seq_len)),
        );
        (elements, mul(WINDOW_BIAS_BYTES, elements))
    } else {
        (0, 0)
    };
    let layer_saved = add(add(layer, mul(scores, eager.saved)), bias);
    let checkpoint_half_bytes = if step.sharded_frozen_base && !trained {
        mul(2, residual_bytes).max(SHARDED_CHECKPOINT_HALF_BYTES)
    } else {
        mul(2, residual_bytes)
    };
    // Halved, except where the product saturated: a saturated figure stays saturated.
    let checkpoint_halves = mul(mul(layers, tokens), mul(checkpoint_half_bytes, h));
    let checkpoints = add(
        if checkpoint_halves == u128::MAX {
            u128::MAX
        } else {
            checkpoint_halves / 2
        },
        mask,
    );
    let saved = if step.checkpointing {
        checkpoints
    } else {
        add(mul(layers, layer_saved), mask)
    };
    let vocab = u128::from(arch.vocab);
    let head_gradient = mul(mul(vocab, h), u128::from(step.embedding_gradient_bytes));
    let logits = if step.fused_loss {
        fused_loss_bytes(
            tokens,
            vocab,
            h,
            residual_bytes,
            step.embedding_gradient_bytes,
        )
    } else {
        let mut per_logit = if step.reference_model {
            DPO_BYTES_PER_LOGIT
        } else {
            LOSS_BYTES_PER_LOGIT
        };
        if softcapped_logits(&arch.model_type) {
            per_logit += SOFTCAP_BYTES_PER_LOGIT;
        }
        mul(mul(tokens, vocab), per_logit)
    };
    // Differentiating the first layer: its activations (recomputed, or still saved) and its
    // working set, while what the layers below saved waits (the first layer differentiated
    // peaks highest when the working set is large, as eager scores are); or, at the very end,
    // the embedding's gradient, which never coexists with them.
    let waiting = if step.checkpointing {
        checkpoints
    } else {
        add(mul(layers.saturating_sub(1), layer_saved), mask)
    };
    let working = match step.layers {
        Layers::Frozen { down_adapter, .. } => {
            let transformers = if down_adapter {
                FROZEN_WORKING_INTERMEDIATE_BYTES + DOWN_ADAPTER_WORKING_INTERMEDIATE_BYTES
            } else {
                FROZEN_WORKING_INTERMEDIATE_BYTES
            };
            // Liger's SwiGLU on a dense MLP; an MoE's experts are counted as transformers'.
            let per_token = match (step.liger_layers && arch.moe.is_none(), down_adapter) {
                (false, _) => mul(transformers, intermediate),
                (true, false) => mul(LIGER_WORKING_INTERMEDIATE_BYTES, intermediate),
                (true, true) => mul(transformers, intermediate).saturating_sub(liger_working),
            };
            mul(tokens, per_token)
        }
        Layers::Trained { .. } => mul(
            tokens,
            mul(TRAINED_WORKING_INTERMEDIATE_BYTES, intermediate),
        ),
    };
    let first_layer = add(
        add(waiting, working),
        add(layer_saved, mul(scores, eager.backward)),
    );
    let bytes = |v: u128| Bytes(u64::try_from(v).unwrap_or(u64::MAX));
    ActivationPeak {
        loss_phase: bytes(add(saved, logits)),
        backward_phase: bytes(first_layer.max(head_gradient)),
        waiting: bytes(waiting),
        head_gradient: bytes(head_gradient),
        first_layer: bytes(first_layer),
    }
}

/// What a fused linear cross-entropy holds when the backward pass starts (see
/// [`FUSED_HIDDEN_COPIES`]): per token the hidden states' gradient, the final norm's output and
/// an FP32 loss; one chunk's 16-bit logits; and a trained head's gradient (`head_bytes` per
/// parameter, 0 when the head is frozen), with a 16-bit head's transient products.
fn fused_loss_bytes(
    tokens: u128,
    vocab: u128,
    h: u128,
    residual_bytes: u128,
    head_bytes: u64,
) -> u128 {
    let mul = u128::saturating_mul;
    let per_token = (FUSED_HIDDEN_COPIES * residual_bytes)
        .saturating_mul(h)
        .saturating_add(FUSED_LOSS_BYTES_PER_TOKEN);
    let chunk = mul(
        mul(fused_chunk_rows(tokens, vocab, h), vocab),
        FUSED_CHUNK_BYTES_PER_LOGIT,
    );
    let head_transient = if head_bytes == 2 {
        FUSED_HEAD_TRANSIENT_BYTES
    } else {
        0
    };
    let head = mul(
        mul(vocab, h),
        u128::from(head_bytes).saturating_add(head_transient),
    );
    mul(tokens, per_token)
        .saturating_add(chunk)
        .saturating_add(head)
}

/// The rows of logits a fused linear cross-entropy makes at once for `tokens` tokens: Liger
/// Kernel's `next_power_of_two(ceil(tokens / ceil(vocab / hidden)))`, at most every token.
pub fn fused_chunk_rows(tokens: u128, vocab: u128, hidden: u128) -> u128 {
    let per_hidden = vocab.div_ceil(hidden.max(1)).max(1);
    let rows = tokens.div_ceil(per_hidden).max(1);
    rows.checked_next_power_of_two()
        .unwrap_or(u128::MAX)
        .min(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::model::presets;

    fn step(seq_len: u64, batch: u64, checkpointing: bool, layers: Layers) -> Step {
        Step {
            seq_len,
            batch,
            checkpointing,
            layers,
            embedding_gradient_bytes: 0,
            reference_model: false,
            fused_loss: false,
            liger_layers: false,
            sharded_frozen_base: false,
        }
    }

    const FROZEN: Layers = Layers::Frozen {
        adapter_bytes_per_token: 0,
        fp32_residual: false,
        quantized_base: false,
        down_adapter: false,
    };

    /// With checkpointing, the backward pass starts with each layer's 16-bit input and 12
    /// bytes per logit, nothing else.
    #[test]
    fn the_loss_phase_is_the_layer_inputs_and_twelve_bytes_per_logit() {
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let (s, b) = (2048u64, 2u64);
        let peak = step_activations(&model, &step(s, b, true, FROZEN));
        let tokens = s * b;
        assert_eq!(
            peak.loss_phase.0,
            32 * tokens * 4096 * 2 + tokens * 128_256 * 12
        );
        // The forward pass's figure (10 bytes per logit) would be short by 2 per logit.
        assert!(peak.loss_phase.0 > 32 * tokens * 4096 * 2 + tokens * 128_256 * 10);
    }

    /// Liger Kernel's chunking: `next_power_of_two(ceil(tokens / ceil(V / h)))` rows, at
    /// most every token (its own example: 16,384 tokens, V 32,000, h 4096: 2048 rows).
    #[test]
    fn a_fused_loss_chunks_tokens_as_liger_kernel_does() {
        assert_eq!(fused_chunk_rows(16_384, 32_000, 4096), 2048);
        // Llama 3.1 8B: ceil(128,256 / 4096) = 32; 28,454 / 32 = 890 -> 1024.
        assert_eq!(fused_chunk_rows(28_454, 128_256, 4096), 1024);
        assert_eq!(fused_chunk_rows(3, 128_256, 4096), 1);
        assert_eq!(fused_chunk_rows(5, 10, 4096), 5);
        // No overflow at the edge: 2^128 - 1 tokens in chunks of 2^123 rows.
        assert_eq!(fused_chunk_rows(u128::MAX, 128_256, 4096), 1 << 123);
    }

    /// A fused loss keeps, instead of 12 bytes per logit, two residual-stream copies of the
    /// hidden states and 4 bytes per token, one chunk of 16-bit logits, and, when the head is
    /// trained, its gradient (and a 16-bit head's 6 transient bytes per parameter).
    #[test]
    fn a_fused_loss_keeps_a_chunk_of_logits_not_all_of_them() {
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let (s, v, h) = (16_384u64, 128_256u64, 4096u64);
        let mut fused = step(s, 1, true, FROZEN);
        fused.fused_loss = true;
        let inputs = 32 * s * h * 2;
        let loss = s * (2 * 2 * h + 4) + 512 * v * 2;
        assert_eq!(
            step_activations(&model, &fused).loss_phase,
            Bytes(inputs + loss)
        );
        let standard = step_activations(&model, &step(s, 1, true, FROZEN)).loss_phase;
        assert_eq!(standard, Bytes(inputs + s * v * 12));
        // A trained 16-bit head: its gradient and the chunks' 16-bit and FP32 products.
        fused.layers = Layers::Trained {
            fp32_residual: false,
        };
        fused.embedding_gradient_bytes = 2;
        assert_eq!(
            step_activations(&model, &fused).loss_phase,
            Bytes(inputs + loss + v * h * (2 + 6))
        );
        // An FP32 head accumulates in place: its gradient only, over an FP32 stream.
        fused.layers = Layers::Trained {
            fp32_residual: true,
        };
        fused.embedding_gradient_bytes = 4;
        let loss32 = s * (2 * 4 * h + 4) + 512 * v * 2;
        assert_eq!(
            step_activations(&model, &fused).loss_phase,
            Bytes(2 * inputs + loss32 + v * h * 4)
        );
    }

    /// An FP32 residual stream doubles what checkpointing keeps and widens every layer.
    #[test]
    fn an_fp32_residual_stream_keeps_more() {
        let model = presets::find("llama-3.2-1b").unwrap().unwrap();
        let at = |fp32_residual, checkpointing| {
            step_activations(
                &model,
                &step(4096, 1, checkpointing, Layers::Trained { fp32_residual }),
            )
            .loss_phase
        };
        let logits = Bytes(4096 * 128_256 * 12);
        let inputs = |bytes: u64| Bytes(16 * 4096 * 2048 * bytes);
        assert_eq!(at(false, true), inputs(2) + logits);
        assert_eq!(at(true, true), inputs(4) + logits);
        // Without checkpointing: 21 h + 4 kv + 8 I against 31 h + 4 kv + 8 I per layer and
        // token (8 key-value heads of 64).
        let layers = |h_bytes: u64| Bytes(16 * 4096 * (h_bytes * 2048 + 4 * 512 + 8 * 8192));
        assert_eq!(at(false, false), layers(21) + logits);
        assert_eq!(at(true, false), layers(31) + logits);
    }

    /// A frozen base keeps `13 h + 4 kv + 6 I` per layer and token plus what its adapters
    /// keep; a trained layer `21 h + 4 kv + 8 I`.
    #[test]
    fn a_frozen_base_keeps_less_than_a_trained_one_plus_its_adapters() {
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let frozen = |adapter_bytes_per_token| {
            step_activations(
                &model,
                &step(
                    1024,
                    1,
                    false,
                    Layers::Frozen {
                        adapter_bytes_per_token,
                        fp32_residual: false,
                        quantized_base: false,
                        down_adapter: false,
                    },
                ),
            )
            .loss_phase
        };
        let trained = step_activations(
            &model,
            &step(
                1024,
                1,
                false,
                Layers::Trained {
                    fp32_residual: false,
                },
            ),
        )
        .loss_phase;
        assert!(frozen(0) < trained);
        assert_eq!(
            frozen(1000).saturating_sub(frozen(0)),
            Bytes(32 * 1024 * 1000)
        );
        assert_eq!(
            trained.saturating_sub(frozen(0)),
            Bytes(32 * 1024 * ((21 - 13) * 4096 + (8 - 6) * 14_336))
        );
    }

    /// The backward phase is the first layer differentiated (recomputed, or still saved) and
    /// its working set beside what waits below it (the checkpointed inputs, or every other
    /// layer's saved activations); or, at the end, the embedding's dense gradient, when that
    /// is larger. A frozen layer's working set (the activations' gradients: 6 bytes per
    /// intermediate unit, 8 with a down adapter) comes on top of what it saved.
    #[test]
    fn the_backward_phase_is_the_first_layer_and_what_waits_or_the_embedding_gradient() {
        let model = presets::find("mistral-7b-v0.1").unwrap().unwrap();
        // A trained layer's saved activations and its working set (4 bytes per intermediate
        // unit of activation gradients).
        let saved = Bytes(1024 * (21 * 4096 + 4 * 1024 + 8 * 14_336));
        let layer = saved + Bytes(1024 * 4 * 14_336);
        let inputs = Bytes(32 * 1024 * 4096 * 2);
        let trained = Layers::Trained {
            fp32_residual: false,
        };
        let mut s = step(1024, 1, true, trained);
        assert_eq!(step_activations(&model, &s).backward_phase, inputs + layer);
        // Mistral's embedding gradient (32,000 x 4096 x 2) is smaller than the first layer
        // and the inputs; a wider one wins.
        s.embedding_gradient_bytes = 2;
        assert_eq!(step_activations(&model, &s).backward_phase, inputs + layer);
        // An FP32 one (0.52 GB) beside half as many tokens (0.27 GB of inputs and layer).
        let mut short = step(512, 1, true, trained);
        short.embedding_gradient_bytes = 4;
        assert_eq!(
            step_activations(&model, &short).backward_phase,
            Bytes(32_000 * 4096 * 4)
        );
        s.checkpointing = false;
        s.embedding_gradient_bytes = 0;
        assert_eq!(
            step_activations(&model, &s).backward_phase,
            saved.times(32) + Bytes(1024 * 4 * 14_336)
        );
        let frozen = step_activations(&model, &step(1024, 1, true, FROZEN)).backward_phase;
        let frozen_layer = Bytes(1024 * (13 * 4096 + 4 * 1024 + 6 * 14_336));
        let working = Bytes(1024 * 6 * 14_336);
        assert_eq!(frozen, inputs + frozen_layer + working);
        let down = Layers::Frozen {
            adapter_bytes_per_token: 0,
            fp32_residual: false,
            quantized_base: false,
            down_adapter: true,
        };
        let with_down = step_activations(&model, &step(1024, 1, true, down)).backward_phase;
        assert_eq!(with_down, frozen + Bytes(1024 * 2 * 14_336));
    }

    /// Gemma 2's eager attention keeps the `s x s` scores (10 bytes each, 14 while its layer
    /// is differentiated), and its soft-capped logits two more bytes each; gpt-oss's keeps 2
    /// and 6; the same shapes under another model type keep neither.
    #[test]
    fn eager_attention_keeps_the_scores() {
        let extra = |key: &str, s: &Step| {
            let model = presets::find(key).unwrap().unwrap();
            let mut plain = model.clone();
            plain.arch.model_type = "llama".to_string();
            // Under SDPA a window shorter than the sequence would add its mask's bias.
            plain.arch.sliding_window = None;
            let (e, p) = (step_activations(&model, s), step_activations(&plain, s));
            (
                e.loss_phase.saturating_sub(p.loss_phase),
                e.backward_phase.saturating_sub(p.backward_phase),
            )
        };
        let gemma_scores = 2 * 16 * 4096 * 4096u64;
        let logits = Bytes(2 * 4096 * 256_000 * 2);
        let checkpointed = step(4096, 2, true, FROZEN);
        assert_eq!(
            extra("gemma-2-9b", &checkpointed),
            (logits, Bytes(gemma_scores * 14))
        );
        // Without checkpointing the first layer differentiated holds its own working set
        // beside every layer's saved scores.
        let saved = step(4096, 2, false, FROZEN);
        assert_eq!(
            extra("gemma-2-9b", &saved),
            (
                logits + Bytes(42 * gemma_scores * 10),
                Bytes(gemma_scores * (42 * 10 + 4))
            )
        );
        // gpt-oss: the scores, and its routed tokens' 8 bytes per hidden unit against the
        // generic MoE's 4 (4 experts per token, h 2880).
        let oss_scores = 64 * 8192 * 8192u64;
        assert_eq!(
            extra("gpt-oss-20b", &step(8192, 1, true, FROZEN)),
            (
                Bytes::ZERO,
                Bytes(oss_scores * 6 + 8192 * (8 - 4) * 4 * 2880)
            )
        );
    }

    /// An MoE layer keeps bytes per routed token copy: 4 per `k x h` frozen, 6 trained (8 and
    /// 12 for gpt-oss); a dense model of the same shape keeps none.
    #[test]
    fn moe_layers_keep_each_routed_copy() {
        let extra = |key: &str, layers: Layers| {
            let model = presets::find(key).unwrap().unwrap();
            let mut dense = model.clone();
            dense.arch.moe = None;
            dense.arch.intermediate = model.arch.moe.map_or(0, |m| {
                m.experts_per_token * m.expert_intermediate + m.shared_intermediate
            });
            let s = step(1024, 1, false, layers);
            step_activations(&model, &s)
                .loss_phase
                .saturating_sub(step_activations(&dense, &s).loss_phase)
        };
        let trained = Layers::Trained {
            fp32_residual: false,
        };
        // Mixtral 8x7B: 32 layers, 2 experts per token, h 4096; gpt-oss-20b: 24, 4, 2880.
        for (key, layers, expected) in [
            ("mixtral-8x7b", FROZEN, 32 * 1024 * 4 * 2 * 4096u64),
            ("mixtral-8x7b", trained, 32 * 1024 * 6 * 2 * 4096),
            ("gpt-oss-20b", FROZEN, 24 * 1024 * 8 * 4 * 2880),
            ("gpt-oss-20b", trained, 24 * 1024 * 12 * 4 * 2880),
        ] {
            assert_eq!(extra(key, layers), Bytes(expected), "{key} {layers:?}");
        }
    }

    /// Qwen3's query and key norms keep 4 bytes per query and key unit in every layer.
    #[test]
    fn qwen3_query_key_norms_add_to_every_layer() {
        let qwen3 = presets::find("qwen3-8b").unwrap().unwrap();
        let mut plain = qwen3.clone();
        plain.arch.model_type = "qwen2".to_string();
        let s = step(1024, 1, false, FROZEN);
        let extra = step_activations(&qwen3, &s)
            .loss_phase
            .saturating_sub(step_activations(&plain, &s).loss_phase);
        assert_eq!(extra, Bytes(36 * 1024 * 4 * (32 + 8) * 128));
    }

    /// DPO holds 14 bytes per logit (the policy's saved log-probabilities while the reference
    /// is scored), not 12.
    #[test]
    fn dpo_scores_the_reference_beside_the_policy_logits() {
        let model = presets::find("llama-3.2-1b").unwrap().unwrap();
        let mut s = step(1024, 2, true, FROZEN);
        let plain = step_activations(&model, &s).loss_phase;
        s.reference_model = true;
        let dpo = step_activations(&model, &s).loss_phase;
        assert_eq!(dpo.saturating_sub(plain), Bytes(2 * 1024 * 128_256 * 2));
    }
    /// Liger Kernel's layers keep 2 bytes per hidden unit less for each norm of a frozen
    /// layer (4 of a trained one) and one 16-bit intermediate-wide tensor less; Gemma 2 has
    /// four norms. A frozen layer's working set without a down adapter drops to 2 bytes per
    /// intermediate unit, with one by 2 per hidden unit and norm.
    #[test]
    fn liger_layers_keep_less_per_norm_and_activation() {
        let at = |key: &str, layers: Layers, checkpointing: bool, liger: bool| {
            let model = presets::find(key).unwrap().unwrap();
            let mut s = step(1024, 1, checkpointing, layers);
            s.liger_layers = liger;
            step_activations(&model, &s)
        };
        let saved = |key, layers| {
            at(key, layers, false, false)
                .loss_phase
                .saturating_sub(at(key, layers, false, true).loss_phase)
        };
        let trained = Layers::Trained {
            fp32_residual: false,
        };
        // Llama 3.1 8B: h 4096, I 14,336, 32 layers, two norms each.
        assert_eq!(
            saved("llama-3.1-8b", FROZEN),
            Bytes(32 * 1024 * (2 * 2 * 4096 + 2 * 14_336))
        );
        assert_eq!(
            saved("llama-3.1-8b", trained),
            Bytes(32 * 1024 * (2 * 4 * 4096 + 2 * 14_336))
        );
        // Gemma 2 9B: h 3584, I 14,336, 42 layers, four norms each.
        assert_eq!(
            saved("gemma-2-9b", FROZEN),
            Bytes(42 * 1024 * (4 * 2 * 3584 + 2 * 14_336))
        );
        let working = |layers, liger| {
            let peak = at("llama-3.1-8b", layers, true, liger);
            peak.backward_phase.saturating_sub(peak.waiting)
        };
        let layer = |liger: bool| {
            let base = 13 * 4096 + 4 * 1024 + 6 * 14_336;
            Bytes(
                1024 * if liger {
                    base - (4 * 4096 + 2 * 14_336)
                } else {
                    base
                },
            )
        };
        assert_eq!(
            working(FROZEN, false),
            layer(false) + Bytes(1024 * 6 * 14_336)
        );
        assert_eq!(
            working(FROZEN, true),
            layer(true) + Bytes(1024 * 2 * 14_336)
        );
        let down = Layers::Frozen {
            adapter_bytes_per_token: 0,
            fp32_residual: false,
            quantized_base: false,
            down_adapter: true,
        };
        assert_eq!(
            working(down, true),
            layer(true) + Bytes(1024 * (8 * 14_336 - 2 * 2 * 4096))
        );
    }

    /// A window shorter than the sequence (Mistral 7B's 4096 tokens) makes SDPA keep a 16-bit
    /// bias per layer (`b x s x s`) beside the boolean mask built once; at or under the window
    /// nothing, and eager attention's scores already hold it.
    #[test]
    fn a_window_shorter_than_the_sequence_keeps_a_bias_per_layer() {
        let model = presets::find("mistral-7b-v0.1").unwrap().unwrap();
        let mut unwindowed = model.clone();
        unwindowed.arch.sliding_window = None;
        let extra = |s: &Step| {
            step_activations(&model, s)
                .loss_phase
                .saturating_sub(step_activations(&unwindowed, s).loss_phase)
        };
        assert_eq!(extra(&step(4096, 2, false, FROZEN)), Bytes::ZERO);
        let elements = 2 * 8192 * 8192u64;
        assert_eq!(
            extra(&step(8192, 2, false, FROZEN)),
            Bytes(32 * 2 * elements + elements)
        );
        // Checkpointed, the mask waits with the layers' inputs.
        assert_eq!(extra(&step(8192, 2, true, FROZEN)), Bytes(elements));
    }

    /// The backward pass trades what waits for the gradients it makes: beside the full
    /// gradients, it holds the first layer's moment less the smaller of the gradients still
    /// to come and what waits; the head's gradient exists from the start.
    #[test]
    fn the_backward_phase_gives_back_what_the_gradients_replace() {
        let model = presets::find("llama-3.2-1b").unwrap().unwrap();
        let mut s = step(
            8192,
            4,
            true,
            Layers::Trained {
                fp32_residual: false,
            },
        );
        s.embedding_gradient_bytes = 2;
        let peak = step_activations(&model, &s);
        assert_eq!(peak.settled(Bytes::ZERO), peak);
        let head = Bytes(128_256 * 2048 * 2);
        assert_eq!(peak.head_gradient, head);
        // Gradients beyond the head's smaller than what waits: all of them come off.
        let small = head + Bytes::gib(1);
        assert_eq!(
            peak.settled(small).backward_phase,
            peak.first_layer.saturating_sub(Bytes::gib(1))
        );
        // Larger: at most what waits comes off, and never below the embedding's gradient.
        let settled = peak.settled(Bytes::gib(1000));
        assert_eq!(
            settled.first_layer,
            peak.first_layer.saturating_sub(peak.waiting)
        );
        assert_eq!(
            settled.backward_phase,
            settled.first_layer.max(peak.head_gradient)
        );
    }
}
