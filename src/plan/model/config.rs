//! Reads a Hugging Face `config.json` into an [`Architecture`] and the checkpoint's native
//! format.
//!
//! Field names vary between model families, so each fact is looked up under the names the
//! families use (`num_local_experts` in Mixtral, `num_experts` in Qwen3-MoE, `n_routed_experts`
//! in DeepSeek). Multimodal configs nest the language model under `text_config`; it is read
//! from there. Anything missing that the memory model needs is an error naming the field;
//! anything ignored or assumed becomes a note on the model.

use serde_json::{Map, Value};

use crate::hardware::Precision;
use crate::plan::error::{PlanError, Result};

use super::{
    Architecture, Attention, MlaDims, Model, ModelSource, Moe, NativeFormat, QuantScope,
    SlidingWindow,
};

/// What a config says, beyond the architecture.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedConfig {
    /// The architecture.
    pub arch: Architecture,
    /// The checkpoint's format.
    pub native: NativeFormat,
    /// `max_position_embeddings`, when stated, lengthened by a `rope_scaling` that does.
    pub max_context: Option<u64>,
    /// The config's context-lengthening RoPE scaling.
    pub rope_scaling: Option<super::rope::RopeScaling>,
    /// Assumptions made while reading.
    pub notes: Vec<String>,
}

impl Model {
    /// The model a config describes, named `name`; `origin` is where the config came from.
    pub fn from_config(
        name: impl Into<String>,
        origin: impl Into<String>,
        parsed: ParsedConfig,
    ) -> Self {
        let mut model = Self::new(
            name,
            ModelSource::Config(origin.into()),
            parsed.arch,
            parsed.native,
        );
        model.max_context = parsed.max_context;
        model.rope_scaling = parsed.rope_scaling;
        model.notes = parsed.notes;
        model
    }
}

pub use super::bounds::{MAX_CONTEXT, MAX_DIM, MAX_HEADS, MAX_LAYERS, MAX_VOCAB};

/// Parses config.json text. `origin` names the file in error messages.
pub fn parse_config_text(origin: &str, text: &str) -> Result<ParsedConfig> {
    let value: Value = serde_json::from_str(text)
        .map_err(|err| PlanError::config(origin, format!("not valid JSON: {err}")))?;
    parse_config(origin, &value)
}

/// Parses an already-decoded config (a `config.json`, or a preset's `architecture` object).
pub fn parse_config(origin: &str, value: &Value) -> Result<ParsedConfig> {
    let top = value
        .as_object()
        .ok_or_else(|| PlanError::config(origin, "expected a JSON object"))?;
    // Multimodal configs (Llama 4, Gemma 3, Mistral 3...) describe the language model in
    // `text_config`; the top level keeps the quantisation and dtype.
    let text = match top.get("text_config") {
        Some(Value::Object(inner)) => inner,
        _ => top,
    };
    let fields = Fields { origin, text, top };
    let mut notes = Vec::new();
    let arch = architecture(&fields, &mut notes)?;
    let native = native_format(&fields, &mut notes)?;
    let max_context = fields.at_most(
        &[
            "max_position_embeddings",
            "max_sequence_length",
            "seq_length",
            "n_positions",
        ],
        MAX_CONTEXT,
    )?;
    // vLLM derives the longest context from the scaling too (`_get_and_verify_max_len`).
    let rope_scaling = super::rope::from_config(
        origin,
        fields
            .get("rope_scaling")
            .or_else(|| fields.get("rope_parameters")),
        max_context,
    )?;
    let max_context = match (max_context, rope_scaling) {
        (Some(max), Some(scaling)) => {
            let extended = scaling.extended(MAX_CONTEXT);
            if extended != max {
                notes.push(format!(
                    "context: rope_scaling ({}) makes the longest context {extended} tokens \
                     (max_position_embeddings says {max})",
                    scaling.describe()
                ));
            }
            Some(extended)
        }
        (max, _) => max,
    };
    Ok(ParsedConfig {
        arch,
        native,
        max_context,
        rope_scaling,
        notes,
    })
}

/// Field lookup over the language-model object, falling back to the top level.
struct Fields<'a> {
    origin: &'a str,
    text: &'a Map<String, Value>,
    top: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        self.text
            .get(name)
            .or_else(|| self.top.get(name))
            .filter(|v| !v.is_null())
    }

    fn error(&self, reason: String) -> PlanError {
        PlanError::config(self.origin, reason)
    }

    /// The first of `names` present, as a non-negative integer (`4096.0` is accepted).
    fn u64_any(&self, names: &[&str]) -> Result<Option<u64>> {
        for name in names {
            if let Some(value) = self.get(name) {
                return as_count(value).map(Some).ok_or_else(|| {
                    self.error(format!("{name} is not a non-negative integer: {value}"))
                });
            }
        }
        Ok(None)
    }

    /// Like `u64_any`, but the field must be present, at least 1 and at most `max`.
    fn required(&self, names: &[&str], max: u64) -> Result<u64> {
        let value = self
            .u64_any(names)?
            .ok_or_else(|| self.error(format!("missing {}", names.join(" / "))))?;
        self.bounded(names[0], value, max)
    }

    /// Like `u64_any`, but a value present must be at most `max`; the error names the field
    /// found.
    fn at_most(&self, names: &[&str], max: u64) -> Result<Option<u64>> {
        for name in names {
            if self.get(name).is_some() {
                let Some(value) = self.u64_any(&[name])? else {
                    return Ok(None);
                };
                if value > max {
                    return Err(self.error(format!("{name} = {value} is out of range (0..={max})")));
                }
                return Ok(Some(value));
            }
        }
        Ok(None)
    }

    fn bounded(&self, name: &str, value: u64, max: u64) -> Result<u64> {
        if value == 0 || value > max {
            Err(self.error(format!("{name} = {value} is out of range (1..={max})")))
        } else {
            Ok(value)
        }
    }

    fn bool(&self, name: &str) -> Option<bool> {
        self.get(name).and_then(Value::as_bool)
    }

    fn str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(Value::as_str)
    }
}

fn as_count(value: &Value) -> Option<u64> {
    value.as_u64().or_else(|| {
        value
            .as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0 && f.fract() == 0.0 && *f < 9.0e18)
            .map(|f| f as u64)
    })
}

fn architecture(fields: &Fields<'_>, notes: &mut Vec<String>) -> Result<Architecture> {
    let model_type = fields.str("model_type").unwrap_or("unknown").to_string();
    let layers = fields.required(&["num_hidden_layers", "n_layer", "num_layers"], MAX_LAYERS)?;
    let layers = u32::try_from(layers).unwrap_or(u32::MAX);
    let hidden = fields.required(&["hidden_size", "n_embd", "d_model"], MAX_DIM)?;
    let heads = fields.required(&["num_attention_heads", "n_head"], MAX_HEADS)?;
    let kv_heads = match fields.u64_any(&["num_key_value_heads", "num_kv_heads"])? {
        Some(kv) => fields.bounded("num_key_value_heads", kv, MAX_HEADS)?,
        None => heads,
    };
    let head_dim = match fields.u64_any(&["head_dim"])? {
        Some(dim) => fields.bounded("head_dim", dim, MAX_DIM)?,
        None => (hidden / heads).max(1),
    };
    let vocab = fields.required(&["vocab_size", "padded_vocab_size"], MAX_VOCAB)?;
    let attention = attention(fields)?;
    if attention == Attention::Standard && (kv_heads > heads || heads % kv_heads != 0) {
        return Err(fields.error(format!(
            "num_key_value_heads ({kv_heads}) must divide num_attention_heads ({heads})"
        )));
    }
    let moe = moe(fields, layers)?;
    let intermediate = match fields.u64_any(&[
        "intermediate_size_mlp",
        "intermediate_size",
        "ffn_dim",
        "n_inner",
    ])? {
        Some(size) => fields.bounded("intermediate_size", size, MAX_DIM)?,
        None if moe.is_some() => 0,
        None => {
            notes.push("config states no intermediate_size: assumed 4 x hidden".to_string());
            hidden.saturating_mul(4)
        }
    };
    let sliding_window = sliding_window(fields, &model_type, layers, notes)?;
    let qkv_bias = fields
        .bool("qkv_bias")
        .or_else(|| fields.bool("attention_bias"))
        // Qwen2 always has Q/K/V biases but its config has no flag for them.
        .unwrap_or(matches!(model_type.as_str(), "qwen2" | "qwen2_moe"));
    Ok(Architecture {
        model_type,
        layers,
        hidden,
        heads: u32::try_from(heads).unwrap_or(u32::MAX),
        kv_heads: u32::try_from(kv_heads).unwrap_or(u32::MAX),
        head_dim,
        intermediate,
        vocab,
        tied_embeddings: fields.bool("tie_word_embeddings").unwrap_or(false),
        qkv_bias,
        attention,
        moe,
        sliding_window,
    })
}

fn attention(fields: &Fields<'_>) -> Result<Attention> {
    let Some(kv_lora_rank) = fields.u64_any(&["kv_lora_rank"])? else {
        return Ok(Attention::Standard);
    };
    let need = |name: &str| fields.required(&[name], MAX_DIM);
    Ok(Attention::Mla(MlaDims {
        q_lora_rank: fields
            .at_most(&["q_lora_rank"], MAX_DIM)?
            .filter(|&rank| rank > 0),
        kv_lora_rank: fields.bounded("kv_lora_rank", kv_lora_rank, MAX_DIM)?,
        qk_nope_head_dim: need("qk_nope_head_dim")?,
        qk_rope_head_dim: need("qk_rope_head_dim")?,
        v_head_dim: need("v_head_dim")?,
    }))
}

fn moe(fields: &Fields<'_>, layers: u32) -> Result<Option<Moe>> {
    let experts = fields.u64_any(&[
        "num_local_experts",
        "num_experts",
        "n_routed_experts",
        "moe_num_experts",
    ])?;
    let Some(experts) = experts.filter(|&e| e > 1) else {
        return Ok(None);
    };
    let experts = fields.bounded("num_experts", experts, MAX_HEADS)?;
    let per_token = fields
        .required(
            &[
                "num_experts_per_tok",
                "num_experts_per_token",
                "moe_topk",
                "top_k",
            ],
            MAX_HEADS,
        )?
        .min(experts);
    // Mixtral and gpt-oss size their experts with `intermediate_size`.
    let expert_intermediate =
        fields.required(&["moe_intermediate_size", "intermediate_size"], MAX_DIM)?;
    let shared_intermediate = shared_expert_size(fields, expert_intermediate)?;
    Ok(Some(Moe {
        experts,
        experts_per_token: per_token,
        expert_intermediate,
        shared_intermediate,
        moe_layers: moe_layer_count(fields, layers)?,
    }))
}

fn shared_expert_size(fields: &Fields<'_>, expert_intermediate: u64) -> Result<u64> {
    if let Some(size) = fields.at_most(&["shared_expert_intermediate_size"], MAX_DIM)? {
        return Ok(size);
    }
    if let Some(count) = fields.at_most(&["n_shared_experts", "num_shared_experts"], MAX_HEADS)? {
        return Ok(count.saturating_mul(expert_intermediate));
    }
    // Llama 4 always has one shared expert of the routed experts' size.
    Ok(
        if fields.str("model_type") == Some("llama4_text")
            || fields.str("model_type") == Some("llama4")
        {
            expert_intermediate
        } else {
            0
        },
    )
}

/// How many layers are MoE: stated outright, as a list, as "every k-th", or as "all but the
/// first k" (DeepSeek's `first_k_dense_replace`).
fn moe_layer_count(fields: &Fields<'_>, layers: u32) -> Result<u32> {
    if let Some(Value::Array(list)) = fields.get("moe_layers") {
        return Ok(u32::try_from(list.len()).unwrap_or(u32::MAX).min(layers));
    }
    if let Some(count) = fields.u64_any(&["moe_layers"])? {
        return Ok(u32::try_from(count).unwrap_or(u32::MAX).min(layers));
    }
    if let Some(step) = fields.u64_any(&[
        "interleave_moe_layer_step",
        "decoder_sparse_step",
        "moe_layer_freq",
    ])? {
        let step = u32::try_from(step.max(1)).unwrap_or(u32::MAX);
        let dense_only = match fields.get("mlp_only_layers") {
            Some(Value::Array(list)) => u32::try_from(list.len()).unwrap_or(0),
            _ => 0,
        };
        return Ok((layers / step).saturating_sub(dense_only));
    }
    let dense_first = fields.u64_any(&["first_k_dense_replace"])?.unwrap_or(0);
    Ok(layers.saturating_sub(u32::try_from(dense_first).unwrap_or(u32::MAX)))
}

/// Which layers attend only to a window. Explicit `layer_types` wins; otherwise the family's
/// fixed pattern applies (Gemma 2 and gpt-oss alternate, Gemma 3 has 5 local per global,
/// Llama 4 chunks 3 of every 4 layers), and a plain `sliding_window` covers every layer.
fn sliding_window(
    fields: &Fields<'_>,
    model_type: &str,
    layers: u32,
    notes: &mut Vec<String>,
) -> Result<Option<SlidingWindow>> {
    if model_type.starts_with("llama4") {
        let Some(chunk) = fields.at_most(&["attention_chunk_size"], MAX_CONTEXT)? else {
            notes
                .push("no attention_chunk_size: every layer treated as full attention".to_string());
            return Ok(None);
        };
        let chunked = match fields.get("no_rope_layers") {
            Some(Value::Array(flags)) => flags.iter().filter(|f| f.as_u64() == Some(1)).count(),
            _ => (layers - layers / 4) as usize,
        };
        return Ok(
            window(chunk, u32::try_from(chunked).unwrap_or(layers).min(layers))
                .map(|w| SlidingWindow { chunked: true, ..w }),
        );
    }
    let Some(size) = fields.at_most(&["sliding_window"], MAX_CONTEXT)? else {
        return Ok(None);
    };
    if fields.bool("use_sliding_window") == Some(false) {
        return Ok(None);
    }
    let windowed = if let Some(Value::Array(types)) = fields.get("layer_types") {
        types
            .iter()
            .filter(|t| matches!(t.as_str(), Some("sliding_attention" | "chunked_attention")))
            .count()
    } else {
        match model_type {
            "gemma2" | "gpt_oss" => layers.div_ceil(2) as usize,
            "gemma3" | "gemma3_text" => {
                let pattern = fields
                    .u64_any(&["sliding_window_pattern"])?
                    .unwrap_or(6)
                    .max(1);
                (u64::from(layers) - u64::from(layers) / pattern) as usize
            }
            _ => layers as usize,
        }
    };
    Ok(window(
        size,
        u32::try_from(windowed).unwrap_or(layers).min(layers),
    ))
}

fn window(size: u64, layers: u32) -> Option<SlidingWindow> {
    (size > 0 && layers > 0).then_some(SlidingWindow {
        window: size,
        layers,
        chunked: false,
    })
}

/// The checkpoint's format, from `quantization_config` or else the stored dtype.
fn native_format(fields: &Fields<'_>, notes: &mut Vec<String>) -> Result<NativeFormat> {
    let sixteen_bit = match fields.str("torch_dtype").or_else(|| fields.str("dtype")) {
        Some("float16") => Precision::Fp16,
        _ => Precision::Bf16,
    };
    let plain = NativeFormat {
        precision: sixteen_bit,
        scope: QuantScope::AllLinear,
    };
    if let Some(dtype) = fields.str("weights_dtype") {
        return Ok(format_from_description(dtype).unwrap_or(plain));
    }
    let Some(Value::Object(quant)) = fields.top.get("quantization_config") else {
        return Ok(plain);
    };
    match quantization(quant) {
        Some(format) => Ok(format),
        None => {
            let method = quant
                .get("quant_method")
                .and_then(Value::as_str)
                .unwrap_or("unnamed");
            notes.push(format!(
                "quantization method {method:?} is not modelled: weights counted at 16 bits; \
                 pass --checkpoint-bytes for the exact size"
            ));
            Ok(plain)
        }
    }
}

/// Reads the common `quantization_config` shapes (fp8, mxfp4, AWQ/GPTQ, bitsandbytes,
/// compressed-tensors, ModelOpt).
fn quantization(quant: &Map<String, Value>) -> Option<NativeFormat> {
    let method = quant
        .get("quant_method")
        .and_then(Value::as_str)?
        .to_ascii_lowercase();
    let bits = quant.get("bits").and_then(Value::as_u64);
    let all = |precision| {
        Some(NativeFormat {
            precision,
            scope: QuantScope::AllLinear,
        })
    };
    match method.as_str() {
        "fp8" | "fbgemm_fp8" => all(Precision::Fp8),
        "mxfp4" => Some(NativeFormat {
            precision: Precision::Mxfp4,
            scope: QuantScope::ExpertsOnly,
        }),
        "awq" | "gptq" | "awq_marlin" | "gptq_marlin" => match bits {
            Some(8) => all(Precision::Int8),
            Some(4) | None => all(Precision::Int4),
            _ => None,
        },
        "bitsandbytes" => {
            if quant.get("load_in_4bit").and_then(Value::as_bool) == Some(true) {
                all(Precision::Nf4)
            } else {
                all(Precision::Int8)
            }
        }
        "modelopt" => {
            let algo = quant
                .get("quant_algo")
                .and_then(Value::as_str)
                .unwrap_or("");
            format_from_description(algo)
        }
        "compressed-tensors" => compressed_tensors(quant),
        _ => None,
    }
}

/// compressed-tensors names its weight format per config group; the first group decides.
fn compressed_tensors(quant: &Map<String, Value>) -> Option<NativeFormat> {
    if let Some(found) = quant
        .get("format")
        .and_then(Value::as_str)
        .and_then(format_from_description)
    {
        return Some(found);
    }
    let groups = quant.get("config_groups")?.as_object()?;
    let weights = groups.values().next()?.get("weights")?;
    let bits = weights.get("num_bits").and_then(Value::as_u64)?;
    let float = weights.get("type").and_then(Value::as_str) == Some("float");
    let precision = match (bits, float) {
        (8, true) => Precision::Fp8,
        (8, false) => Precision::Int8,
        (4, true) => Precision::Nvfp4,
        (4, false) => Precision::Int4,
        _ => return None,
    };
    Some(NativeFormat {
        precision,
        scope: QuantScope::AllLinear,
    })
}

/// Free-text format names (`"fp8 e4m3, 128x128 block scales"`, `"NVFP4"`,
/// `"MXFP4 MoE weights (native), BF16 rest"`).
pub(crate) fn format_from_description(text: &str) -> Option<NativeFormat> {
    let lower = text.to_ascii_lowercase();
    let (precision, scope) = if lower.contains("mxfp4") {
        let scope = if lower.contains("moe") || lower.contains("expert") {
            QuantScope::ExpertsOnly
        } else {
            QuantScope::AllLinear
        };
        (Precision::Mxfp4, scope)
    } else if lower.contains("nvfp4") {
        (Precision::Nvfp4, QuantScope::AllLinear)
    } else if lower.contains("fp8") {
        (Precision::Fp8, QuantScope::AllLinear)
    } else {
        return None;
    };
    Some(NativeFormat { precision, scope })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_llama_config() {
        let parsed = parse_config_text(
            "t",
            r#"{"model_type":"llama","num_hidden_layers":32,"hidden_size":4096,
               "num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,
               "vocab_size":128256,"max_position_embeddings":131072,"torch_dtype":"bfloat16"}"#,
        )
        .unwrap();
        assert_eq!(parsed.arch.head_dim, 128);
        assert_eq!(parsed.arch.kv_heads, 8);
        assert_eq!(parsed.max_context, Some(131072));
        assert_eq!(parsed.native.precision, Precision::Bf16);
        assert!(parsed.arch.moe.is_none() && parsed.arch.sliding_window.is_none());
    }

    #[test]
    fn explicit_head_dim_wins_over_hidden_over_heads() {
        // Qwen3-32B: 64 heads x 128 = 8192 != hidden 5120.
        let parsed = parse_config_text(
            "t",
            r#"{"num_hidden_layers":64,"hidden_size":5120,"num_attention_heads":64,
               "num_key_value_heads":8,"head_dim":128,"intermediate_size":25600,"vocab_size":151936}"#,
        )
        .unwrap();
        assert_eq!(parsed.arch.head_dim, 128);
    }

    #[test]
    fn multimodal_configs_are_read_from_text_config() {
        let parsed = parse_config_text(
            "t",
            r#"{"model_type":"llama4","quantization_config":{"quant_method":"fp8"},
                "text_config":{"model_type":"llama4_text","num_hidden_layers":48,"hidden_size":5120,
                "num_attention_heads":40,"num_key_value_heads":8,"head_dim":128,
                "intermediate_size":8192,"intermediate_size_mlp":16384,"num_local_experts":128,
                "num_experts_per_tok":1,"interleave_moe_layer_step":2,"vocab_size":202048,
                "attention_chunk_size":8192}}"#,
        )
        .unwrap();
        let moe = parsed.arch.moe.unwrap();
        assert_eq!(
            (moe.experts, moe.moe_layers, moe.expert_intermediate),
            (128, 24, 8192)
        );
        assert_eq!(moe.shared_intermediate, 8192);
        assert_eq!(parsed.arch.intermediate, 16384);
        assert_eq!(parsed.arch.sliding_window.unwrap().layers, 36);
        assert_eq!(parsed.native.precision, Precision::Fp8);
    }

    #[test]
    fn gpt_oss_layer_types_and_mxfp4_experts() {
        let parsed = parse_config_text(
            "t",
            r#"{"model_type":"gpt_oss","num_hidden_layers":4,"hidden_size":2880,
               "num_attention_heads":64,"num_key_value_heads":8,"head_dim":64,
               "intermediate_size":2880,"num_local_experts":32,"num_experts_per_tok":4,
               "vocab_size":201088,"sliding_window":128,
               "layer_types":["sliding_attention","full_attention","sliding_attention","full_attention"],
               "quantization_config":{"quant_method":"mxfp4"}}"#,
        )
        .unwrap();
        assert_eq!(
            parsed.arch.sliding_window,
            Some(SlidingWindow {
                window: 128,
                layers: 2,
                chunked: false,
            })
        );
        assert_eq!(parsed.native.precision, Precision::Mxfp4);
        assert_eq!(parsed.native.scope, QuantScope::ExpertsOnly);
    }

    #[test]
    fn qwen2_sliding_window_is_off_unless_enabled() {
        let parsed = parse_config_text(
            "t",
            r#"{"model_type":"qwen2","num_hidden_layers":28,"hidden_size":3584,
               "num_attention_heads":28,"num_key_value_heads":4,"intermediate_size":18944,
               "vocab_size":152064,"sliding_window":131072,"use_sliding_window":false}"#,
        )
        .unwrap();
        assert!(parsed.arch.sliding_window.is_none());
        assert!(parsed.arch.qkv_bias);
    }

    #[test]
    fn awq_and_bitsandbytes_formats() {
        let awq = r#"{"num_hidden_layers":2,"hidden_size":64,"num_attention_heads":4,"vocab_size":100,
            "quantization_config":{"quant_method":"awq","bits":4}}"#;
        assert_eq!(
            parse_config_text("t", awq).unwrap().native.precision,
            Precision::Int4
        );
        let bnb = r#"{"num_hidden_layers":2,"hidden_size":64,"num_attention_heads":4,"vocab_size":100,
            "quantization_config":{"quant_method":"bitsandbytes","load_in_4bit":true}}"#;
        assert_eq!(
            parse_config_text("t", bnb).unwrap().native.precision,
            Precision::Nf4
        );
        let odd = r#"{"num_hidden_layers":2,"hidden_size":64,"num_attention_heads":4,"vocab_size":100,
            "quantization_config":{"quant_method":"hqq"}}"#;
        let parsed = parse_config_text("t", odd).unwrap();
        assert_eq!(parsed.native.precision, Precision::Bf16);
        assert!(parsed.notes.iter().any(|n| n.contains("hqq")));
    }

    #[test]
    fn clear_errors_for_broken_configs() {
        let cases = [
            ("{", "not valid JSON"),
            ("[]", "expected a JSON object"),
            (
                r#"{"hidden_size":64,"num_attention_heads":4,"vocab_size":10}"#,
                "missing num_hidden_layers",
            ),
            (
                r#"{"num_hidden_layers":0,"hidden_size":64,"num_attention_heads":4,"vocab_size":10}"#,
                "out of range",
            ),
            (
                r#"{"num_hidden_layers":"x","hidden_size":64,"num_attention_heads":4,"vocab_size":10}"#,
                "not a non-negative integer",
            ),
            (
                r#"{"num_hidden_layers":2,"hidden_size":64,"num_attention_heads":6,"num_key_value_heads":4,"vocab_size":10}"#,
                "must divide",
            ),
        ];
        for (text, expected) in cases {
            let err = parse_config_text("cfg.json", text).unwrap_err().to_string();
            assert!(
                err.contains(expected) && err.contains("cfg.json"),
                "{text}: {err}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_arbitrary_text(s in ".*") {
            let _ = parse_config_text("p", &s);
        }

        #[test]
        fn never_panics_on_arbitrary_numbers(
            layers in proptest::num::i64::ANY, hidden in proptest::num::i64::ANY,
            heads in proptest::num::i64::ANY, kv in proptest::num::i64::ANY,
            experts in proptest::num::i64::ANY,
        ) {
            let text = format!(
                r#"{{"num_hidden_layers":{layers},"hidden_size":{hidden},"num_attention_heads":{heads},
                   "num_key_value_heads":{kv},"vocab_size":1000,"num_experts":{experts},
                   "num_experts_per_tok":2,"moe_intermediate_size":{hidden}}}"#
            );
            if let Ok(parsed) = parse_config_text("p", &text) {
                let _ = super::super::ParamBreakdown::of(&parsed.arch).total();
            }
        }
    }
}
