//! What the planner knows about a model: its architecture (enough to count parameters and size
//! the KV cache exactly), the format its checkpoint ships in, and where the facts came from.
//!
//! A model comes from one of three places ([`ModelSource`]): a built-in preset
//! ([`presets`]), a Hugging Face `config.json` ([`config`]), or a bare parameter count
//! ([`Model::from_param_count`]), for which a Llama-like shape is assumed and said so.

pub mod bounds;
pub mod config;
mod count;
pub mod params;
pub mod presets;
pub mod rope;
pub mod subset;

use serde::Serialize;

use crate::hardware::Precision;

pub use count::parse_param_count;
pub use params::ParamBreakdown;

use super::units::Bytes;

/// How attention stores its keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Attention {
    /// Multi-head, grouped-query or multi-query attention: K and V per KV head.
    Standard,
    /// DeepSeek's multi-head latent attention: one compressed latent per token and layer.
    Mla(MlaDims),
}

/// The dimensions of multi-head latent attention (DeepSeek-V2/V3 `config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MlaDims {
    /// Rank of the query compression (`q_lora_rank`); `None` when queries are not compressed.
    pub q_lora_rank: Option<u64>,
    /// Rank of the key/value latent (`kv_lora_rank`).
    pub kv_lora_rank: u64,
    /// Per-head query/key dimension without rotary embedding (`qk_nope_head_dim`).
    pub qk_nope_head_dim: u64,
    /// Per-head rotary dimension, cached next to the latent (`qk_rope_head_dim`).
    pub qk_rope_head_dim: u64,
    /// Per-head value dimension (`v_head_dim`).
    pub v_head_dim: u64,
}

/// Mixture-of-experts feed-forward layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Moe {
    /// Routed experts per MoE layer.
    pub experts: u64,
    /// Experts each token is routed to.
    pub experts_per_token: u64,
    /// Intermediate size of one routed expert.
    pub expert_intermediate: u64,
    /// Total intermediate size of the always-on shared expert(s), 0 when there are none.
    pub shared_intermediate: u64,
    /// How many of the layers are MoE layers (the rest use the dense MLP).
    pub moe_layers: u32,
}

/// Layers whose attention only looks back a fixed window (sliding window or chunked local).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SlidingWindow {
    /// Tokens each such layer attends to (and therefore caches) at most.
    pub window: u64,
    /// How many layers use the window; the others attend to the full context.
    pub layers: u32,
    /// Chunked local attention (Llama 4's `attention_chunk_size`) rather than a sliding
    /// window: engines added caching support for the two at different releases.
    pub chunked: bool,
}

/// The shape of a decoder-only transformer, as far as memory is concerned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Architecture {
    /// `model_type` from the config (`llama`, `qwen3_moe`, `deepseek_v3`...).
    pub model_type: String,
    /// Decoder layers.
    pub layers: u32,
    /// Hidden size.
    pub hidden: u64,
    /// Query heads.
    pub heads: u32,
    /// Key/value heads (equal to `heads` for MHA and for MLA).
    pub kv_heads: u32,
    /// Per-head dimension (read from the config when stated; it need not be hidden / heads).
    pub head_dim: u64,
    /// Intermediate size of the dense MLP (dense layers only for MoE models).
    pub intermediate: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// Whether the output projection shares the input embedding matrix.
    pub tied_embeddings: bool,
    /// Whether the Q/K/V projections carry biases (Qwen2, gpt-oss).
    pub qkv_bias: bool,
    /// How K and V are cached.
    pub attention: Attention,
    /// Mixture-of-experts layers, when the model has them.
    pub moe: Option<Moe>,
    /// Windowed-attention layers, when the model has them.
    pub sliding_window: Option<SlidingWindow>,
}

/// Which weights a quantised checkpoint stores in the narrow format; the rest (embeddings,
/// output head, norms, routers) stay 16-bit in every common scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QuantScope {
    /// Every linear layer of the decoder blocks (llm-compressor, AWQ, GPTQ, ModelOpt, DeepSeek
    /// FP8): attention projections, dense MLPs and experts.
    AllLinear,
    /// Only the routed experts (gpt-oss's MXFP4 checkpoint keeps attention in BF16).
    ExpertsOnly,
}

/// The precision the published checkpoint is stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NativeFormat {
    /// The narrowest precision in the checkpoint (BF16 for an unquantised model).
    pub precision: Precision,
    /// Which weights carry it, when it is a quantised format.
    pub scope: QuantScope,
}

/// Where a model description came from, for the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "detail")]
pub enum ModelSource {
    /// A built-in preset, with the file its facts were taken from.
    Preset(String),
    /// A Hugging Face `config.json` at this path.
    Config(String),
    /// A bare parameter count; the shape is assumed.
    ParamCount,
}

/// A model, ready for the memory model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Model {
    /// Display name (preset key, file name, or `70B`).
    pub name: String,
    /// Where the facts came from.
    pub source: ModelSource,
    /// The architecture (assumed for a bare parameter count: see `notes`).
    pub arch: Architecture,
    /// Parameter counts by kind.
    pub params: ParamBreakdown,
    /// The checkpoint's own precision.
    pub native: NativeFormat,
    /// True for model types vLLM refuses to run in FP16 (numerical overflow).
    pub fp16_unsafe: bool,
    /// The longest context the model supports, when its config says (with the config's RoPE
    /// scaling, or the one asked for, applied).
    pub max_context: Option<u64>,
    /// The context-lengthening RoPE scaling the config states.
    pub rope_scaling: Option<rope::RopeScaling>,
    /// A RoPE scaling the request asked for on top of the config (`--rope-scaling yarn:4`):
    /// the engines are told to apply it.
    pub rope_requested: Option<rope::RopeScaling>,
    /// The exact size of the checkpoint, when given; it replaces the computed weight bytes at
    /// the native precision.
    pub checkpoint_bytes: Option<Bytes>,
    /// Things the planner assumed or ignored while reading the model.
    pub notes: Vec<String>,
}

/// vLLM refuses FP16 for these model types ("Numerical instability. Please use bfloat16 or
/// float32 instead." — `vllm/config/model.py`, `_FLOAT16_NOT_SUPPORTED_MODELS`).
const FP16_UNSAFE_MODEL_TYPES: [&str; 5] = ["gemma2", "gemma3", "gemma3_text", "plamo2", "glm4"];

impl Model {
    /// Builds a model from a parsed architecture, computing its parameter counts.
    pub fn new(
        name: impl Into<String>,
        source: ModelSource,
        arch: Architecture,
        native: NativeFormat,
    ) -> Self {
        let params = ParamBreakdown::of(&arch);
        let fp16_unsafe = FP16_UNSAFE_MODEL_TYPES.contains(&arch.model_type.as_str());
        Self {
            name: name.into(),
            source,
            arch,
            params,
            native,
            fp16_unsafe,
            max_context: None,
            rope_scaling: None,
            rope_requested: None,
            checkpoint_bytes: None,
            notes: Vec::new(),
        }
    }

    /// A model known only by its parameter count. The KV cache needs a shape, so a dense
    /// Llama-3-like one is assumed ([`Architecture::assumed_dense`]) and noted.
    pub fn from_param_count(label: &str, params: u64) -> Self {
        let arch = Architecture::assumed_dense(params);
        let native = NativeFormat {
            precision: Precision::Bf16,
            scope: QuantScope::AllLinear,
        };
        let mut model = Self::new(label, ModelSource::ParamCount, arch, native);
        model.params = model.params.scaled_to_total(params);
        model.notes.push(format!(
            "only a parameter count was given: assumed a dense Llama-like shape ({} layers, \
             hidden {}, {} KV heads of dim {}); pass a config.json for an exact KV cache",
            model.arch.layers, model.arch.hidden, model.arch.kv_heads, model.arch.head_dim
        ));
        model
    }

    /// Sets the exact checkpoint size.
    pub fn with_checkpoint_bytes(mut self, bytes: Option<Bytes>) -> Self {
        self.checkpoint_bytes = bytes;
        self
    }
}

impl Architecture {
    /// The MLP width one token passes through in its largest layer: the routed experts'
    /// (`experts_per_token x expert_intermediate`) plus the shared expert's, or the dense MLP's
    /// where dense layers are wider. Activation estimates scale with it.
    pub fn active_intermediate(&self) -> u64 {
        self.moe.map_or(self.intermediate, |moe| {
            let routed = moe
                .experts_per_token
                .saturating_mul(moe.expert_intermediate)
                .saturating_add(moe.shared_intermediate);
            if moe.moe_layers < self.layers {
                routed.max(self.intermediate)
            } else {
                routed
            }
        })
    }

    /// A dense, Llama-3-like shape with roughly `params` parameters: the hidden size grows in
    /// the steps Llama 3 and Qwen 2.5 use, heads are 128 wide, 8 KV heads, an MLP 3.5 times the
    /// hidden size, and as many layers as the count allows.
    pub fn assumed_dense(params: u64) -> Self {
        const STEPS: [(u64, u64); 8] = [
            (2_000_000_000, 2048),
            (5_000_000_000, 3072),
            (11_000_000_000, 4096),
            (24_000_000_000, 5120),
            (45_000_000_000, 6144),
            (120_000_000_000, 8192),
            (250_000_000_000, 12288),
            (u64::MAX, 16384),
        ];
        let hidden = STEPS
            .iter()
            .find(|(limit, _)| params <= *limit)
            .map_or(16384, |&(_, hidden)| hidden);
        let head_dim = 128;
        let heads = u32::try_from(hidden / head_dim).unwrap_or(128);
        let vocab = 128_256;
        let intermediate = hidden * 7 / 2;
        // Per layer: Q and O (2h^2), K and V for 8 heads, the gated MLP, two norms.
        let per_layer = 2 * hidden * hidden + 2 * hidden * 8 * head_dim + 3 * hidden * intermediate;
        let embeddings = 2 * vocab * hidden;
        let layers = params.saturating_sub(embeddings) / per_layer.max(1);
        Self {
            model_type: "assumed-dense".to_string(),
            layers: u32::try_from(layers.clamp(1, 512)).unwrap_or(512),
            hidden,
            heads,
            kv_heads: 8,
            head_dim,
            intermediate,
            vocab,
            tied_embeddings: false,
            qkv_bias: false,
            attention: Attention::Standard,
            moe: None,
            sliding_window: None,
        }
    }

    /// True for multi-head latent attention.
    pub fn is_mla(&self) -> bool {
        matches!(self.attention, Attention::Mla(_))
    }
}
