//! KV-cache bytes, per device, for one request.
//!
//! vLLM's page size per layer is `2 * block * kv_heads_per_gpu * head_dim * dtype_bytes`
//! (`vllm/v1/kv_cache_interface.py`, `AttentionSpec.real_page_size_bytes`), so per token and
//! layer a rank stores `2 * max(1, kv_heads / tp) * head_dim * dtype_bytes`: KV heads are
//! replicated once TP exceeds them (`vllm/config/model.py`, `get_num_kv_heads`). MLA stores one
//! latent of `kv_lora_rank + qk_rope_head_dim` values, replicated on every TP rank, or 656
//! bytes in vLLM's `fp8_ds_mla` layout; with data-parallel attention each attention rank keeps
//! the cache of its own requests only ([`KvLayout::sharded`]). The fullest pipeline stage
//! holds `ceil(layers / pp)` layers (vLLM's split, `layout::stage_layers`).
//! Windowed layers keep at most
//! `cdiv(min(window - 1 + max_num_batched_tokens, context), 16) + 1` blocks
//! (`SlidingWindowSpec.max_memory_usage_bytes`); full layers keep
//! `cdiv(context, 16)` blocks. Only engines that cache a windowed layer for its window do so
//! ([`WindowCaching`]): before vLLM's hybrid KV cache manager a model mixing windowed and full
//! layers kept every layer for the full context.

use serde::Serialize;

use super::layout::Sharding;
use super::model::{Attention, Model};
use super::units::Bytes;

/// Tokens per KV block (`vllm/config/cache.py`, `DEFAULT_BLOCK_SIZE = 16`).
pub const BLOCK_TOKENS: u64 = 16;

/// Bytes per token and layer of vLLM's `fp8_ds_mla` cache: 512 FP8 latent values, four FP32
/// scales, 64 BF16 rotary values (`kv_cache_interface.py`).
const FP8_MLA_BYTES_PER_TOKEN_LAYER: f64 = 656.0;

/// The KV-cache element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    /// The model's 16-bit activation type (vLLM's `auto`).
    #[default]
    Auto,
    /// bfloat16.
    Bf16,
    /// float16.
    Fp16,
    /// FP8 (E4M3), one byte per value.
    Fp8,
}

impl KvDtype {
    /// Bytes per cached value.
    pub fn bytes(self) -> f64 {
        match self {
            Self::Fp8 => 1.0,
            Self::Auto | Self::Bf16 | Self::Fp16 => 2.0,
        }
    }

    /// The name for reports, with `auto` resolved to what it means.
    pub fn resolved_name(self) -> &'static str {
        match self {
            Self::Fp8 => "fp8",
            Self::Fp16 => "fp16",
            Self::Auto | Self::Bf16 => "bf16",
        }
    }
}

/// Which windowed layers an engine caches for their window only; the others keep the full
/// context like any full-attention layer.
///
/// vLLM's history, each step cited:
/// * V0 (0.7 and earlier) and V1 up to 0.9.0: one block table for every layer. A model whose
///   every layer slides (Mistral-7B-v0.1) keeps its window (V0's block manager,
///   `block_sliding_window`; V1 from 0.8.3, "V1 engine now supports native sliding window
///   attention (#14097)"); a model mixing windowed and full layers (Gemma 2, gpt-oss, Llama
///   4) is cached as full attention on every layer (#14097 still regards a model with global
///   and sliding-window attention as global-attention-only; the hybrid allocator RFC #11382
///   counts the waste at 25 % for Gemma 2).
/// * 0.9.1: "Initial full support for Hybrid Memory Allocator (#17996)" (release notes):
///   sliding-window layers of mixed models keep their window.
/// * 0.9.2: chunked local attention joins it (#19351, "Support Local Chunked Attention for
///   Hybrid KV Cache", Llama 4).
/// * 0.10.1: #21761 switches it off again for chunked local attention by default
///   (`VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE`, a latency regression); #29627
///   turned it back on, and vLLM 0.19.0's start-up logs print the variable as `True`
///   (llm-d-incubation/llm-d-planner@d3121e0). The release of #29627 is not pinned, so the
///   planner takes chunked layers as full from 0.10.1 to 0.18 and windowed from 0.19: it
///   errs toward the larger cache.
///
/// SGLang keeps a separate pool for windowed layers (its SWA memory pool) and is planned as
/// [`WindowCaching::All`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowCaching {
    /// Sliding and chunked layers keep their window (the hybrid allocator with both).
    #[default]
    All,
    /// Sliding-window layers keep their window; chunked local layers the full context.
    SlidingOnly,
    /// Only a model whose every layer is windowed keeps the window; mixed models cache every
    /// layer for the full context.
    UniformOnly,
}

/// The KV cache of one model on one parallel layout.
#[derive(Debug, Clone, Copy)]
pub struct KvLayout<'a> {
    model: &'a Model,
    dtype: KvDtype,
    tp: u32,
    pp: u32,
    windows: WindowCaching,
}

impl<'a> KvLayout<'a> {
    /// The cache of `model` in `dtype` with `tp`-way tensor and `pp`-way pipeline parallelism.
    pub fn new(model: &'a Model, dtype: KvDtype, tp: u32, pp: u32) -> Self {
        Self {
            model,
            dtype,
            tp: tp.max(1),
            pp: pp.max(1),
            windows: WindowCaching::All,
        }
    }

    /// The same cache on an engine that caches windowed layers as `windows` says.
    pub fn with_window_caching(self, windows: WindowCaching) -> Self {
        Self { windows, ..self }
    }

    /// Whether the engine keeps the model's windowed layers for their window only.
    pub fn windows_cached(&self) -> bool {
        let arch = &self.model.arch;
        let Some(window) = arch.sliding_window else {
            return false;
        };
        match self.windows {
            WindowCaching::All => true,
            WindowCaching::SlidingOnly => !window.chunked,
            WindowCaching::UniformOnly => !window.chunked && window.layers >= arch.layers,
        }
    }

    /// The cache of `model` under `sharding`: with data-parallel attention each attention
    /// rank (`tp / attention_dp` devices) holds only its own requests, so KV heads are split
    /// by the attention's TP and an MLA latent is kept once per attention rank instead of on
    /// every device of the group. Per-request bytes are per device; the group holds
    /// `attention_dp` times as many requests.
    pub fn sharded(model: &'a Model, dtype: KvDtype, sharding: &Sharding) -> Self {
        Self::new(model, dtype, sharding.attention_tp(), sharding.pp)
    }

    /// Bytes one rank stores per token for one layer.
    pub fn bytes_per_token_layer(&self) -> f64 {
        let arch = &self.model.arch;
        match arch.attention {
            Attention::Standard => {
                let kv_heads_per_rank = (arch.kv_heads / self.tp).max(1);
                2.0 * f64::from(kv_heads_per_rank) * arch.head_dim as f64 * self.dtype.bytes()
            }
            Attention::Mla(_) if self.dtype == KvDtype::Fp8 => FP8_MLA_BYTES_PER_TOKEN_LAYER,
            Attention::Mla(mla) => {
                (mla.kv_lora_rank as f64 + mla.qk_rope_head_dim as f64) * self.dtype.bytes()
            }
        }
    }

    /// Bytes per token on the heaviest rank if every layer kept the full context.
    pub fn bytes_per_token(&self) -> Bytes {
        let (full, windowed) = self.stage_layers();
        Bytes::from_f64(self.bytes_per_token_layer() * f64::from(full + windowed))
    }

    /// (full-attention, windowed) layers on the heaviest stage: the stage with the fewest
    /// windowed layers, since those are the cheap ones. Windowed layers the engine caches in
    /// full count as full-attention ones.
    fn stage_layers(&self) -> (u32, u32) {
        let layers = self.model.arch.layers.max(1);
        let stage = layers.div_ceil(self.pp).min(layers);
        let windowed_total = if self.windows_cached() {
            self.model
                .arch
                .sliding_window
                .map_or(0, |w| w.layers.min(layers))
        } else {
            0
        };
        let windowed = (u64::from(windowed_total) * u64::from(stage) / u64::from(layers)) as u32;
        (stage - windowed.min(stage), windowed.min(stage))
    }

    /// Bytes one rank reserves for a request of `context` tokens, with
    /// `batched_tokens` as the scheduler's per-step token budget.
    pub fn per_request(&self, context: u64, batched_tokens: u64) -> Bytes {
        let (full, windowed) = self.stage_layers();
        let full_tokens = context.div_ceil(BLOCK_TOKENS).saturating_mul(BLOCK_TOKENS);
        let window_tokens = match self.model.arch.sliding_window {
            Some(w) if windowed > 0 => {
                let span = (w.window.saturating_sub(1))
                    .saturating_add(batched_tokens)
                    .min(context);
                (span.div_ceil(BLOCK_TOKENS).saturating_add(1)).saturating_mul(BLOCK_TOKENS)
            }
            _ => 0,
        };
        let per_layer = self.bytes_per_token_layer();
        Bytes::from_f64(
            per_layer
                * (f64::from(full) * full_tokens as f64
                    + f64::from(windowed) * window_tokens as f64),
        )
    }

    /// The longest context whose single request fits in `budget`, in whole blocks.
    pub fn max_context(&self, budget: Bytes, batched_tokens: u64, limit: u64) -> u64 {
        if self.per_request(BLOCK_TOKENS, batched_tokens) > budget {
            return 0;
        }
        // `per_request` grows with the context, so a binary search over blocks finds the edge.
        let (mut fits, mut too_long) = (1u64, limit.div_ceil(BLOCK_TOKENS).max(1) + 1);
        while too_long - fits > 1 {
            let mid = fits + (too_long - fits) / 2;
            if self.per_request(mid.saturating_mul(BLOCK_TOKENS), batched_tokens) <= budget {
                fits = mid;
            } else {
                too_long = mid;
            }
        }
        fits.saturating_mul(BLOCK_TOKENS).min(limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::GIB;
    use crate::plan::model::presets;

    fn layout(key: &str, dtype: KvDtype, tp: u32) -> (Model, KvDtype, u32) {
        (presets::find(key).unwrap().unwrap(), dtype, tp)
    }

    #[test]
    fn per_token_bytes_match_the_formulas_doc() {
        // planner-formulas.md §1.2: 8B 131,072 B; 70B 327,680 B; Llama-2-7B (MHA) 524,288 B.
        for (key, expected) in [
            ("llama-3.1-8b", 131_072),
            ("llama-3.1-70b", 327_680),
            ("llama-2-7b", 524_288),
        ] {
            let (model, dtype, tp) = layout(key, KvDtype::Auto, 1);
            assert_eq!(
                KvLayout::new(&model, dtype, tp, 1).bytes_per_token(),
                Bytes(expected),
                "{key}"
            );
        }
    }

    #[test]
    fn a_full_context_request_matches_the_llama_blog() {
        // HF Llama 3.1 blog: KV cache at 128k tokens is 15.62 GiB (8B) and 39.06 GiB (70B).
        let (model, dtype, _) = layout("llama-3.1-70b", KvDtype::Auto, 1);
        let bytes = KvLayout::new(&model, dtype, 1, 1).per_request(128_000, 8192);
        assert!((bytes.as_f64() / GIB as f64 - 39.06).abs() < 0.01);
    }

    #[test]
    fn kv_heads_are_replicated_beyond_tp_equal_kv_heads() {
        let (model, dtype, _) = layout("qwen3-235b-a22b", KvDtype::Auto, 1); // 4 KV heads
        let at = |tp| KvLayout::new(&model, dtype, tp, 1).bytes_per_token();
        assert_eq!(at(2).0 * 2, at(1).0);
        assert_eq!(at(4), at(8));
    }

    #[test]
    fn mla_caches_one_latent_replicated_on_every_rank() {
        // 576 values x 61 layers x 2 bytes = 70,272 B per token; fp8_ds_mla 656 B per layer.
        let (model, _, _) = layout("deepseek-v3", KvDtype::Auto, 1);
        assert_eq!(
            KvLayout::new(&model, KvDtype::Auto, 8, 1).bytes_per_token(),
            Bytes(70_272)
        );
        assert_eq!(
            KvLayout::new(&model, KvDtype::Fp8, 8, 1).bytes_per_token(),
            Bytes(656 * 61)
        );
    }

    #[test]
    fn dp_attention_splits_kv_heads_by_the_attention_width() {
        use crate::plan::layout::Sharding;
        // Qwen3-235B (4 KV heads) on a group of 8: TP 8 replicates each KV head twice; with
        // 2 attention ranks of TP 4 no head is copied, so a device's share halves.
        let (model, dtype, _) = layout("qwen3-235b-a22b", KvDtype::Auto, 1);
        let plain = KvLayout::sharded(&model, dtype, &Sharding::new(8, 1)).bytes_per_token();
        let dp = KvLayout::sharded(&model, dtype, &Sharding::new(8, 1).with_moe(2, true))
            .bytes_per_token();
        assert_eq!(plain, dp, "per device per request: 1 KV head either way");
        // DeepSeek's latent is the same per device; the capacity gain is in the request count.
        let (ds, _, _) = layout("deepseek-v3", KvDtype::Auto, 1);
        let ds_dp = KvLayout::sharded(&ds, KvDtype::Auto, &Sharding::new(8, 1).with_moe(8, true));
        assert_eq!(ds_dp.bytes_per_token(), Bytes(70_272));
    }

    #[test]
    fn sliding_window_layers_are_capped() {
        let (model, _, _) = layout("gpt-oss-120b", KvDtype::Auto, 1); // window 128 on half
        let kv = KvLayout::new(&model, KvDtype::Auto, 1, 1);
        let long = kv.per_request(131_072, 8192);
        let full_only = Bytes::from_f64(kv.bytes_per_token_layer() * 18.0 * 131_072.0);
        assert!(
            long > full_only && long.as_f64() < full_only.as_f64() * 1.07,
            "{long} {full_only}"
        );
    }

    /// Issue 38: engines before the hybrid allocator cache a mixed model's windowed layers for
    /// the full context; a model whose every layer slides keeps its window on all of them.
    #[test]
    fn engines_before_the_hybrid_allocator_cache_mixed_windows_in_full() {
        let per_request = |key: &str, windows| {
            let (model, _, _) = layout(key, KvDtype::Auto, 1);
            KvLayout::new(&model, KvDtype::Auto, 1, 1)
                .with_window_caching(windows)
                .per_request(131_072, 8192)
        };
        // gpt-oss-120b: 18 of 36 layers slide over 128 tokens.
        let hybrid = per_request("gpt-oss-120b", WindowCaching::All);
        let before = per_request("gpt-oss-120b", WindowCaching::UniformOnly);
        let (model, _, _) = layout("gpt-oss-120b", KvDtype::Auto, 1);
        let every_layer =
            KvLayout::new(&model, KvDtype::Auto, 1, 1).bytes_per_token_layer() * 36.0 * 131_072.0;
        assert_eq!(before, Bytes::from_f64(every_layer));
        assert!(
            hybrid.as_f64() < before.as_f64() * 0.55,
            "{hybrid} {before}"
        );
        assert_eq!(
            per_request("gpt-oss-120b", WindowCaching::SlidingOnly),
            hybrid
        );
        // Llama 4 Scout's 36 chunked layers of 48 (8,192-token chunks): windowed only where
        // chunked local attention is cached so; at 131,072 tokens about a third of the cache.
        let scout_all = per_request("llama-4-scout", WindowCaching::All);
        let scout_sliding = per_request("llama-4-scout", WindowCaching::SlidingOnly);
        assert!(scout_all.as_f64() < scout_sliding.as_f64() * 0.4);
        assert_eq!(
            scout_sliding,
            per_request("llama-4-scout", WindowCaching::UniformOnly)
        );
        // Mistral-7B-v0.1 slides on every layer: the window holds on every engine.
        let mistral_all = per_request("mistral-7b-v0.1", WindowCaching::All);
        assert_eq!(
            mistral_all,
            per_request("mistral-7b-v0.1", WindowCaching::UniformOnly)
        );
        let (mistral, _, _) = layout("mistral-7b-v0.1", KvDtype::Auto, 1);
        let full = KvLayout::new(&mistral, KvDtype::Auto, 1, 1)
            .bytes_per_token()
            .as_f64();
        assert!(mistral_all.as_f64() < full * 131_072.0 * 0.2);
    }

    #[test]
    fn fp8_halves_the_cache_and_max_context_inverts_per_request() {
        let (model, _, _) = layout("llama-3.1-8b", KvDtype::Auto, 1);
        let bf16 = KvLayout::new(&model, KvDtype::Auto, 1, 1);
        let fp8 = KvLayout::new(&model, KvDtype::Fp8, 1, 1);
        assert_eq!(
            fp8.per_request(4096, 2048).0 * 2,
            bf16.per_request(4096, 2048).0
        );
        let budget = Bytes::gib(4);
        let max = bf16.max_context(budget, 2048, 1 << 20);
        assert_eq!(max, 32_768);
        assert!(bf16.per_request(max, 2048) <= budget);
        assert!(bf16.per_request(max + BLOCK_TOKENS, 2048) > budget);
        assert_eq!(bf16.max_context(Bytes(10), 2048, 1 << 20), 0);
    }
}
