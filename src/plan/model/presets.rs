//! Built-in models: every entry of `data/model-configs.json` (started as a copy of
//! `shared/data/model-configs.json`, since completed from the models' own `config.json`),
//! addressable by its `key` (`llama-3.1-70b`). Each entry's `architecture` object is read by the
//! same code as a `config.json`, so presets and files cannot disagree. Each keeps the file its
//! shapes were taken from (`source`) and the Hugging Face repository whose `config.json` states
//! its context, dtype, tied embeddings and quantisation (`config_source`); a unit test below
//! fails when a preset lacks any field the planner reads.

use std::sync::OnceLock;

use serde_json::Value;

use crate::plan::error::{PlanError, Result};

use super::config::parse_config;
use super::{Model, ModelSource};

/// The embedded table.
const MODEL_CONFIGS: &str = include_str!("../data/model-configs.json");

/// One preset's identity, for listings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresetInfo {
    /// The key to pass to `--model`.
    pub key: String,
    /// The Hugging Face repository it describes.
    pub hf_id: String,
    /// Where its numbers come from.
    pub source: String,
    /// The `config.json` its context, dtype and quantisation come from (`repo@revision`).
    pub config: String,
}

/// The built-in table's entries, parsed once per process: the controller looks a preset up on
/// every plan, and parsing the whole table each time was a visible share of its CPU at 10,000
/// nodes (issue 41).
fn entries() -> Result<&'static [Value]> {
    static ENTRIES: OnceLock<std::result::Result<Vec<Value>, String>> = OnceLock::new();
    let parsed = ENTRIES.get_or_init(|| {
        let table: Value = serde_json::from_str(MODEL_CONFIGS).map_err(|err| err.to_string())?;
        match table.get("models") {
            Some(Value::Array(models)) => Ok(models.clone()),
            _ => Err("no models array".to_string()),
        }
    });
    match parsed {
        Ok(entries) => Ok(entries),
        Err(why) => Err(PlanError::config("built-in presets", why.clone())),
    }
}

fn text(entry: &Value, field: &str) -> String {
    entry
        .get(field)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// "repo path @commit" for the entry's source.
fn source_of(entry: &Value) -> String {
    let source = entry.get("source").cloned().unwrap_or(Value::Null);
    let commit = text(&source, "commit");
    let short = commit.get(..7).unwrap_or(&commit);
    format!(
        "{} {} @{short}",
        text(&source, "repo"),
        text(&source, "path")
    )
}

/// "huggingface.co/<repo> config.json @revision" for the entry's `config_source`.
fn config_of(entry: &Value) -> String {
    let source = entry.get("config_source").cloned().unwrap_or(Value::Null);
    format!(
        "huggingface.co/{} {} @{}",
        text(&source, "repo"),
        text(&source, "path"),
        text(&source, "revision")
    )
}

/// Every preset, in file order.
pub fn list() -> Result<Vec<PresetInfo>> {
    Ok(entries()?
        .iter()
        .map(|entry| PresetInfo {
            key: text(entry, "key"),
            hf_id: text(entry, "hf_id"),
            source: source_of(entry),
            config: config_of(entry),
        })
        .collect())
}

/// Looks a preset up by key (case-insensitive). `Ok(None)` when there is no such key.
pub fn find(key: &str) -> Result<Option<Model>> {
    let wanted = key.trim().to_ascii_lowercase();
    let Some(entry) = entries()?.iter().find(|entry| text(entry, "key") == wanted) else {
        return Ok(None);
    };
    let origin = format!("preset {wanted}");
    let arch_value = entry
        .get("architecture")
        .ok_or_else(|| PlanError::config(&origin, "no architecture"))?;
    let parsed = parse_config(&origin, arch_value)?;
    let mut model = Model::new(
        wanted,
        ModelSource::Preset(format!("{}; {}", source_of(entry), config_of(entry))),
        parsed.arch,
        parsed.native,
    );
    model.max_context = parsed.max_context;
    model.rope_scaling = parsed.rope_scaling;
    model.notes = parsed.notes;
    Ok(Some(model))
}

/// `; did you mean a, b?` when preset keys resemble `name`, else `otherwise`: the tail of an
/// "unknown model" message.
pub fn hint(name: &str, otherwise: &str) -> String {
    let similar = similar(name);
    if similar.is_empty() {
        otherwise.to_string()
    } else {
        format!("; did you mean {}?", similar.join(", "))
    }
}

/// Preset keys that resemble `name`, for "did you mean" hints.
pub fn similar(name: &str) -> Vec<String> {
    let wanted = name.trim().to_ascii_lowercase();
    let stem: String = wanted.chars().take(5).collect();
    list()
        .unwrap_or_default()
        .into_iter()
        .map(|info| info.key)
        .filter(|key| !stem.is_empty() && (key.contains(&stem) || wanted.contains(key.as_str())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Precision;
    use crate::plan::model::QuantScope;

    /// Every preset parses, and the parameter counts computed from its architecture match the
    /// file's `params_computed_b` / `active_params_computed_b` within 0.1 %.
    #[test]
    fn every_preset_reproduces_its_parameter_counts() {
        let presets = list().unwrap();
        assert!(presets.len() >= 26, "{}", presets.len());
        for info in presets {
            let model = find(&info.key).unwrap().unwrap();
            let entry = entries()
                .unwrap()
                .iter()
                .find(|e| text(e, "key") == info.key)
                .unwrap();
            let expected = entry["architecture"]["params_computed_b"].as_f64().unwrap() * 1e9;
            let total = model.params.total() as f64;
            assert!(
                (total / expected - 1.0).abs() < 1e-3,
                "{}: {total} vs {expected}",
                info.key
            );
            if let Some(active) = entry["architecture"]["active_params_computed_b"].as_f64() {
                let ratio = model.params.active() as f64 / (active * 1e9);
                assert!(
                    (ratio - 1.0).abs() < 1e-3,
                    "{}: active ratio {ratio}",
                    info.key
                );
            }
            assert!(info.source.contains('@'), "{}", info.source);
        }
    }

    /// The fields every preset must state itself, as its `config.json` does: the planner reads
    /// each of them, and a missing one would silently become a default (a 4,096-token context,
    /// BF16 weights, untied embeddings).
    const REQUIRED: [&str; 9] = [
        "model_type",
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "max_position_embeddings",
        "torch_dtype",
        "tie_word_embeddings",
    ];

    /// Issue 23: no preset may lack a field the planner reads, nor a cited `config.json`.
    #[test]
    fn every_preset_states_every_field_the_planner_reads() {
        let mut missing = Vec::new();
        for entry in entries().unwrap() {
            let key = text(entry, "key");
            let arch = &entry["architecture"];
            for field in REQUIRED {
                if arch.get(field).is_none() {
                    missing.push(format!("{key}: {field}"));
                }
            }
            // The per-layer shapes: a head size (or MLA's latent dimensions) and an MLP.
            let mla = arch.get("kv_lora_rank").is_some();
            if !mla && arch.get("head_dim").is_none() {
                missing.push(format!("{key}: head_dim"));
            }
            let moe = arch.get("moe").and_then(Value::as_bool) == Some(true);
            let mlp = if moe {
                [
                    "num_experts",
                    "num_experts_per_tok",
                    "moe_intermediate_size",
                ]
                .as_slice()
            } else {
                ["intermediate_size"].as_slice()
            };
            for field in mlp {
                if arch.get(field).is_none() {
                    missing.push(format!("{key}: {field}"));
                }
            }
            // A quantised checkpoint says how, as its config.json does.
            let model = find(&key).unwrap().unwrap();
            let sixteen = matches!(model.native.precision, Precision::Bf16 | Precision::Fp16);
            if !sixteen && arch.get("quantization_config").is_none() {
                missing.push(format!("{key}: quantization_config"));
            }
            for field in ["repo", "path", "revision", "url"] {
                if text(&entry["config_source"], field).is_empty() {
                    missing.push(format!("{key}: config_source.{field}"));
                }
            }
            assert!(
                model.max_context.is_some_and(|max| max >= 2048),
                "{key}: {:?}",
                model.max_context
            );
        }
        assert!(missing.is_empty(), "presets lack: {missing:#?}");
    }

    /// The values issue 23 found wrong, as the models' config.json files state them.
    #[test]
    fn contexts_and_formats_match_the_models_own_configs() {
        let context = |key: &str| find(key).unwrap().unwrap().max_context;
        assert_eq!(context("deepseek-v3"), Some(163_840));
        assert_eq!(context("llama-2-7b"), Some(4096));
        assert_eq!(context("llama-2-70b"), Some(4096));
        assert_eq!(context("qwen3-8b"), Some(40_960));
        assert_eq!(context("qwen3-235b-a22b"), Some(40_960));
        assert_eq!(context("phi-3-mini"), Some(4096));
        assert_eq!(context("mixtral-8x22b"), Some(65_536));
        assert_eq!(context("llama-4-scout"), Some(10_485_760));
        assert_eq!(context("llama-4-maverick"), Some(1_048_576));
        let small = find("gpt-oss-20b").unwrap().unwrap();
        assert_eq!(small.native.precision, Precision::Mxfp4);
        assert_eq!(small.native.scope, QuantScope::ExpertsOnly);
        let scout = find("llama-4-scout").unwrap().unwrap();
        assert_eq!(scout.arch.sliding_window.map(|w| w.window), Some(8192));
        for info in list().unwrap() {
            assert!(
                info.config.starts_with("huggingface.co/"),
                "{}",
                info.config
            );
        }
    }

    #[test]
    fn native_formats_of_quantised_checkpoints() {
        let gpt_oss = find("gpt-oss-120b").unwrap().unwrap();
        assert_eq!(gpt_oss.native.precision, Precision::Mxfp4);
        assert_eq!(gpt_oss.native.scope, QuantScope::ExpertsOnly);
        let deepseek = find("DeepSeek-V3").unwrap().unwrap();
        assert_eq!(deepseek.native.precision, Precision::Fp8);
        assert!(deepseek.arch.is_mla());
        assert_eq!(
            find("llama-2-7b").unwrap().unwrap().native.precision,
            Precision::Fp16
        );
        assert!(find("gemma-2-27b").unwrap().unwrap().fp16_unsafe);
        assert!(!find("llama-3.1-8b").unwrap().unwrap().fp16_unsafe);
    }

    #[test]
    fn unknown_keys_are_none_with_hints() {
        assert!(find("llama-9").unwrap().is_none());
        assert!(similar("llama-3.1-7b").contains(&"llama-3.1-8b".to_string()));
    }
}
