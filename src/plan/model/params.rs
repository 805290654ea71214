//! Parameter counts from an architecture, split by the role each weight plays, because roles
//! differ in how they are quantised (embeddings stay 16-bit), sharded (K/V projections are
//! replicated once TP exceeds the KV heads) and read per token (only routed experts in use).
//!
//! Formulas (`shared/docs/planner-formulas.md` §1.1, rule 2): per layer
//! `h*nq*hd + 2*h*nkv*hd + nq*hd*h (+ qkv bias) + 3*h*I + 2h`, plus `V*h` for the embedding
//! and again for an untied output head. MoE layers replace `3*h*I` by
//! `E*3*h*I_moe + 3*h*I_shared + h*E`. MLA (DeepSeek-V3) replaces the projections by
//! `h*q_lora + q_lora*H*(nope+rope) + h*(kv_lora+rope) + kv_lora*H*(nope+v) + H*v*h` (+ the two
//! latent norms). These reproduce every `params_computed_b` in `model-configs.json` (tested).

use serde::Serialize;

use super::{Architecture, Attention, MlaDims};

/// Parameter counts by role. All counts are totals over the whole model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ParamBreakdown {
    /// Input token embedding.
    pub embedding: u64,
    /// Output projection (0 when tied to the embedding).
    pub lm_head: u64,
    /// Attention projections and their biases, all layers.
    pub attention: u64,
    /// The K and V projections among `attention` (replicated when TP exceeds the KV heads).
    pub kv_projection: u64,
    /// Dense MLPs, all dense layers.
    pub dense_mlp: u64,
    /// Routed experts, all MoE layers.
    pub experts: u64,
    /// Routed expert weights one token touches, all MoE layers.
    pub active_experts: u64,
    /// Shared experts, all MoE layers.
    pub shared_experts: u64,
    /// MoE routers.
    pub router: u64,
    /// Norm weights.
    pub norms: u64,
}

impl ParamBreakdown {
    /// Counts the parameters of `arch`. Arithmetic is done in 128 bits and saturates, so an
    /// absurd config (or an architecture built in code, which no parser bounded) yields huge
    /// counts rather than a wrap-around or an overflow panic.
    pub fn of(arch: &Architecture) -> Self {
        let h = u128::from(arch.hidden);
        let layers = u128::from(arch.layers);
        let attention_per_layer = attention_params(arch);
        let kv_per_layer = kv_projection_params(arch);
        let (moe_layers, moe) = match arch.moe {
            Some(moe) => (u128::from(moe.moe_layers.min(arch.layers)), Some(moe)),
            None => (0, None),
        };
        let dense_layers = layers - moe_layers;
        let expert = |intermediate: u64| mul(mul(3, h), u128::from(intermediate));
        let (experts, active, shared, router) = moe.map_or((0, 0, 0, 0), |moe| {
            let one = expert(moe.expert_intermediate);
            (
                mul(mul(moe_layers, u128::from(moe.experts)), one),
                mul(
                    mul(
                        moe_layers,
                        u128::from(moe.experts_per_token.min(moe.experts)),
                    ),
                    one,
                ),
                mul(moe_layers, expert(moe.shared_intermediate)),
                mul(mul(moe_layers, h), u128::from(moe.experts)),
            )
        });
        let latent_norms = match arch.attention {
            Attention::Mla(mla) => {
                u128::from(mla.kv_lora_rank) + u128::from(mla.q_lora_rank.unwrap_or(0))
            }
            Attention::Standard => 0,
        };
        let vocab_matrix = mul(u128::from(arch.vocab), h);
        Self {
            embedding: clamp(vocab_matrix),
            lm_head: if arch.tied_embeddings {
                0
            } else {
                clamp(vocab_matrix)
            },
            attention: clamp(mul(layers, attention_per_layer)),
            kv_projection: clamp(mul(layers, kv_per_layer)),
            dense_mlp: clamp(mul(dense_layers, expert(arch.intermediate))),
            experts: clamp(experts),
            active_experts: clamp(active),
            shared_experts: clamp(shared),
            router: clamp(router),
            norms: clamp(mul(layers, mul(2, h).saturating_add(latent_norms)).saturating_add(h)),
        }
    }

    /// Every parameter.
    pub fn total(&self) -> u64 {
        self.embedding
            .saturating_add(self.lm_head)
            .saturating_add(self.decoder_layers())
    }

    /// The parameters one token's forward pass reads (all but the unused routed experts).
    pub fn active(&self) -> u64 {
        self.total()
            .saturating_sub(self.experts)
            .saturating_add(self.active_experts)
    }

    /// Everything inside the decoder blocks.
    pub fn decoder_layers(&self) -> u64 {
        self.attention
            .saturating_add(self.dense_mlp)
            .saturating_add(self.experts)
            .saturating_add(self.shared_experts)
            .saturating_add(self.router)
            .saturating_add(self.norms)
    }

    /// The linear weights a quantisation scheme may narrow: projections, MLPs and experts.
    pub fn linear(&self) -> u64 {
        self.attention
            .saturating_add(self.dense_mlp)
            .saturating_add(self.experts)
            .saturating_add(self.shared_experts)
    }

    /// Rescales every count so the total equals `total` (used when only a parameter count is
    /// known and the shape is assumed).
    pub fn scaled_to_total(self, total: u64) -> Self {
        let current = self.total();
        if current == 0 {
            return self;
        }
        // Both factors fit in 64 bits, so the product fits in 128.
        let scale = |count: u64| clamp(u128::from(count) * u128::from(total) / u128::from(current));
        Self {
            embedding: scale(self.embedding),
            lm_head: scale(self.lm_head),
            attention: scale(self.attention),
            kv_projection: scale(self.kv_projection),
            dense_mlp: scale(self.dense_mlp),
            experts: scale(self.experts),
            active_experts: scale(self.active_experts),
            shared_experts: scale(self.shared_experts),
            router: scale(self.router),
            norms: scale(self.norms),
        }
    }
}

/// Attention projection parameters of one layer.
fn attention_params(arch: &Architecture) -> u128 {
    let h = u128::from(arch.hidden);
    let heads = u128::from(arch.heads);
    match arch.attention {
        Attention::Standard => {
            let hd = u128::from(arch.head_dim);
            let q_and_o = mul(mul(mul(2, h), heads), hd);
            let bias = if arch.qkv_bias {
                mul(heads + 2 * u128::from(arch.kv_heads), hd)
            } else {
                0
            };
            q_and_o
                .saturating_add(kv_projection_params(arch))
                .saturating_add(bias)
        }
        Attention::Mla(mla) => mla_params(h, heads, mla),
    }
}

/// The K and V projections of one layer (MLA's latent projections count as attention).
fn kv_projection_params(arch: &Architecture) -> u128 {
    match arch.attention {
        Attention::Standard => mul(
            mul(mul(2, u128::from(arch.hidden)), u128::from(arch.kv_heads)),
            u128::from(arch.head_dim),
        ),
        Attention::Mla(_) => 0,
    }
}

/// MLA projections of one layer: query (optionally through a low-rank bottleneck), the
/// shared key/value latent with its rotary part, the per-head up-projections, the output.
fn mla_params(h: u128, heads: u128, mla: MlaDims) -> u128 {
    let qk_head = u128::from(mla.qk_nope_head_dim) + u128::from(mla.qk_rope_head_dim);
    let kv_lora = u128::from(mla.kv_lora_rank);
    let query = match mla.q_lora_rank {
        Some(rank) => {
            mul(h, u128::from(rank)).saturating_add(mul(mul(u128::from(rank), heads), qk_head))
        }
        None => mul(mul(h, heads), qk_head),
    };
    let latent = mul(h, kv_lora + u128::from(mla.qk_rope_head_dim));
    let up = mul(
        mul(kv_lora, heads),
        u128::from(mla.qk_nope_head_dim) + u128::from(mla.v_head_dim),
    );
    let output = mul(mul(heads, u128::from(mla.v_head_dim)), h);
    query
        .saturating_add(latent)
        .saturating_add(up)
        .saturating_add(output)
}

/// Saturating 128-bit product (a sum of two 64-bit values cannot overflow 128 bits, a product
/// of three can).
fn mul(a: u128, b: u128) -> u128 {
    a.saturating_mul(b)
}

fn clamp(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}
