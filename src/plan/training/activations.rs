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
//! * **While layers are differentiated** ([`ActivationPeak::backward_phase`]): up to every
//!   gradient, the first layer differentiated (recomputed with checkpointing, or still saved)
//!   and its working set, with what waits below it (the checkpointed inputs, or every other
//!   layer's saved activations); or, at the very end and when it is larger, the embedding's
//!   dense gradient (a second copy for a moment when the output head shares it).
//!
//! So a step needs `weights + optimizer + max(loss phase, gradients + backward phase)`.
//!
//! Per layer and token, a decoder layer keeps `26 h + 8 I` bytes for its backward pass with a
//! 16-bit residual stream (attention through a flash kernel: no `s^2` term; the MLP's gate,
//! up, activation and product `8 I`; the norms' FP32 inputs, Q/K/V with their rotary copies,
//! the attention output `26 h`, the largest traced value), and `36 h + 8 I` when the model's
//! parameters are FP32 under autocast, whose residual stream, norms and their outputs stay
//! FP32. Korthikanti et al.'s `17 h` (arXiv:2205.05198) assumes 16-bit norms and no rotary
//! copies; the traces found 21-36. Checkpointing keeps each layer's input instead (2 or 4
//! bytes per hidden unit) and recomputes one layer at a time.

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
/// with a 16-bit and with an FP32 residual stream.
const HIDDEN_BYTES_16: u128 = 26;
const HIDDEN_BYTES_32: u128 = 36;
/// Per layer and token, bytes per MLP intermediate unit of trained layers: gate, up,
/// activation, product.
const INTERMEDIATE_BYTES: u128 = 8;
/// A frozen layer (LoRA's base) keeps less: its linear layers save no input for a weight
/// gradient, so `17 h + 6 I` (traced: 16.6 h on Llama 3.1 8B), plus what its adapters keep.
const FROZEN_HIDDEN_BYTES: u128 = 17;
const FROZEN_INTERMEDIATE_BYTES: u128 = 6;
/// A frozen 4-bit base prepared for training (QLoRA: PEFT's `prepare_model_for_kbit_training`
/// casts the norms to FP32, and bitsandbytes' `Linear4bit` returns its input's dtype) carries
/// an FP32 residual stream, FP32 norm outputs and FP32 MLP activations: `20 h + 12 I` beside
/// the adapters' inputs (traced on Mistral 7B QLoRA at 4k x 2 without checkpointing: three
/// FP32 and one 16-bit intermediate-wide tensor, two FP32 and eleven 16-bit hidden-wide ones
/// per layer and token).
const FROZEN_HIDDEN_BYTES_32: u128 = 20;
const FROZEN_INTERMEDIATE_BYTES_32: u128 = 12;
/// Differentiating a frozen layer holds, beside what it saved, the gradients of its
/// activations and the adapters' FP32 copies of their inputs: per token, bytes per hidden and
/// per intermediate unit. Traced on Llama 3.1 8B LoRA at 16k tokens with a fused loss, where
/// the backward pass is the peak: `50 h + 14 I` beside the waiting inputs, against the
/// `17 h + 6 I` the layer saved.
const FROZEN_WORKING_HIDDEN_BYTES: u128 = 33;
const FROZEN_WORKING_INTERMEDIATE_BYTES: u128 = 8;
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
/// and key unit (traced: 4 to 5 h more per layer on Qwen3 8B).
const QK_NORM_BYTES: u128 = 4;

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
}

/// The activation side of a step's peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ActivationPeak {
    /// Alive when the backward pass starts, before any gradient: saved activations and the
    /// loss's logits.
    pub loss_phase: Bytes,
    /// Alive beside (up to) the full gradients while layers are differentiated: one layer and
    /// its working set, the checkpointed inputs, and the embedding's dense gradient.
    pub backward_phase: Bytes,
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
    let layers = u128::from(arch.layers);
    let qk = if qk_norm(&arch.model_type) {
        let query_key = u128::from(arch.heads).saturating_add(u128::from(arch.kv_heads));
        mul(QK_NORM_BYTES, mul(query_key, u128::from(arch.head_dim)))
    } else {
        0
    };
    let (per_token, residual_bytes) = match step.layers {
        Layers::Trained { fp32_residual } => {
            let hidden_bytes = if fp32_residual {
                HIDDEN_BYTES_32
            } else {
                HIDDEN_BYTES_16
            };
            let per_token = add(mul(hidden_bytes, h), mul(INTERMEDIATE_BYTES, intermediate));
            (per_token, if fp32_residual { 4 } else { 2 })
        }
        Layers::Frozen {
            adapter_bytes_per_token,
            fp32_residual,
        } => {
            let (hidden_bytes, intermediate_bytes) = if fp32_residual {
                (FROZEN_HIDDEN_BYTES_32, FROZEN_INTERMEDIATE_BYTES_32)
            } else {
                (FROZEN_HIDDEN_BYTES, FROZEN_INTERMEDIATE_BYTES)
            };
            let base = add(mul(hidden_bytes, h), mul(intermediate_bytes, intermediate));
            (
                add(base, u128::from(adapter_bytes_per_token)),
                if fp32_residual { 4 } else { 2 },
            )
        }
    };
    let routed = arch.moe.map_or(0, |moe| {
        let trained = matches!(step.layers, Layers::Trained { .. });
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
    let layer_saved = add(layer, mul(scores, eager.saved));
    let checkpoints = mul(mul(layers, tokens), mul(residual_bytes, h));
    let saved = if step.checkpointing {
        checkpoints
    } else {
        mul(layers, layer_saved)
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
        mul(layers.saturating_sub(1), layer_saved)
    };
    let working = match step.layers {
        Layers::Frozen { .. } => mul(
            tokens,
            add(
                mul(FROZEN_WORKING_HIDDEN_BYTES, h),
                mul(FROZEN_WORKING_INTERMEDIATE_BYTES, intermediate),
            ),
        ),
        Layers::Trained { .. } => 0,
    };
    let backward = add(
        add(waiting, working),
        add(layer_saved, mul(scores, eager.backward)),
    )
    .max(head_gradient);
    let bytes = |v: u128| Bytes(u64::try_from(v).unwrap_or(u64::MAX));
    ActivationPeak {
        loss_phase: bytes(add(saved, logits)),
        backward_phase: bytes(backward),
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
        }
    }

    const FROZEN: Layers = Layers::Frozen {
        adapter_bytes_per_token: 0,
        fp32_residual: false,
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
        // Without checkpointing: 26 h + 8 I against 36 h + 8 I per layer and token.
        let layers = |h_bytes: u64| Bytes(16 * 4096 * (h_bytes * 2048 + 8 * 8192));
        assert_eq!(at(false, false), layers(26) + logits);
        assert_eq!(at(true, false), layers(36) + logits);
    }

    /// A frozen base keeps `17 h + 6 I` per layer and token plus what its adapters keep.
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
            Bytes(32 * 1024 * ((26 - 17) * 4096 + (8 - 6) * 14_336))
        );
    }

    /// The backward phase is the first layer differentiated (recomputed, or still saved) and
    /// its working set beside what waits below it (the checkpointed inputs, or every other
    /// layer's saved activations); or, at the end, the embedding's dense gradient, when that
    /// is larger. A frozen layer's working set (the activations' gradients, the adapters'
    /// FP32 copies) comes on top of what it saved.
    #[test]
    fn the_backward_phase_is_the_first_layer_and_what_waits_or_the_embedding_gradient() {
        let model = presets::find("mistral-7b-v0.1").unwrap().unwrap();
        let layer = Bytes(1024 * (26 * 4096 + 8 * 14_336));
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
        s.embedding_gradient_bytes = 4;
        assert_eq!(
            step_activations(&model, &s).backward_phase,
            Bytes(32_000 * 4096 * 4)
        );
        s.checkpointing = false;
        s.embedding_gradient_bytes = 0;
        assert_eq!(step_activations(&model, &s).backward_phase, layer.times(32));
        let frozen = step_activations(&model, &step(1024, 1, true, FROZEN)).backward_phase;
        let frozen_layer = Bytes(1024 * (17 * 4096 + 6 * 14_336));
        let working = Bytes(1024 * (33 * 4096 + 8 * 14_336));
        assert_eq!(frozen, inputs + frozen_layer + working);
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
}
