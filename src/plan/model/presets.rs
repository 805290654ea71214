//! Built-in models: every entry of `data/model-configs.json` (a copy of
//! `shared/data/model-configs.json`), addressable by its `key` (`llama-3.1-70b`). Each entry's
//! `architecture` object is read by the same code as a `config.json`, so presets and files
//! cannot disagree, and each keeps the file its facts were taken from.

use serde_json::Value;

use crate::plan::error::{PlanError, Result};

use super::config::{format_from_description, parse_config};
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
}

fn entries() -> Result<Vec<Value>> {
    let table: Value = serde_json::from_str(MODEL_CONFIGS)
        .map_err(|err| PlanError::config("built-in presets", err.to_string()))?;
    match table.get("models") {
        Some(Value::Array(models)) => Ok(models.clone()),
        _ => Err(PlanError::config("built-in presets", "no models array")),
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

/// Every preset, in file order.
pub fn list() -> Result<Vec<PresetInfo>> {
    Ok(entries()?
        .iter()
        .map(|entry| PresetInfo {
            key: text(entry, "key"),
            hf_id: text(entry, "hf_id"),
            source: source_of(entry),
        })
        .collect())
}

/// Looks a preset up by key (case-insensitive). `Ok(None)` when there is no such key.
pub fn find(key: &str) -> Result<Option<Model>> {
    let wanted = key.trim().to_ascii_lowercase();
    let Some(entry) = entries()?
        .into_iter()
        .find(|entry| text(entry, "key") == wanted)
    else {
        return Ok(None);
    };
    let origin = format!("preset {wanted}");
    let arch_value = entry
        .get("architecture")
        .ok_or_else(|| PlanError::config(&origin, "no architecture"))?;
    let parsed = parse_config(&origin, arch_value)?;
    // gpt-oss states its MXFP4 experts under `documented`, not in the architecture.
    let documented_format = entry
        .pointer("/documented/weights_dtype")
        .and_then(Value::as_str)
        .and_then(format_from_description);
    let native = documented_format.unwrap_or(parsed.native);
    let mut model = Model::new(
        wanted,
        ModelSource::Preset(source_of(&entry)),
        parsed.arch,
        native,
    );
    model.max_context = parsed.max_context;
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
                .into_iter()
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
