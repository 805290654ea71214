//! The part of a Hugging Face `config.json` that [`super::config`] reads, and nothing else.
//!
//! A ModelPlacement carries a tenant's whole `config.json`; the controller keeps every
//! placement in memory, so it keeps only this subset (issue 27 item 1: 60 placements of
//! 1.3 MB each took a fresh controller to 99 % of its memory limit). The subset parses to the
//! same model as the whole file, which a test checks on every preset and fixture; its size is
//! bounded by the fields listed here, whatever else the file holds.

use serde_json::{Map, Value};

/// Every field name [`super::config`] looks up in a config or its `text_config`. A name read
/// there and missing here makes the controller plan differently from `hwaccel plan`; the test
/// below compares the two on every preset and fixture.
const FIELDS: &[&str] = &[
    "attention_bias",
    "attention_chunk_size",
    "d_model",
    "decoder_sparse_step",
    "dtype",
    "ffn_dim",
    "first_k_dense_replace",
    "head_dim",
    "hidden_size",
    "interleave_moe_layer_step",
    "intermediate_size",
    "intermediate_size_mlp",
    "kv_lora_rank",
    "layer_types",
    "max_position_embeddings",
    "max_sequence_length",
    "mlp_only_layers",
    "model_type",
    "moe_intermediate_size",
    "moe_layer_freq",
    "moe_layers",
    "moe_num_experts",
    "moe_topk",
    "n_embd",
    "n_head",
    "n_inner",
    "n_layer",
    "n_positions",
    "n_routed_experts",
    "n_shared_experts",
    "no_rope_layers",
    "num_attention_heads",
    "num_experts",
    "num_experts_per_tok",
    "num_experts_per_token",
    "num_hidden_layers",
    "num_key_value_heads",
    "num_kv_heads",
    "num_layers",
    "num_local_experts",
    "num_shared_experts",
    "padded_vocab_size",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "qkv_bias",
    "seq_length",
    "shared_expert_intermediate_size",
    "sliding_window",
    "sliding_window_pattern",
    "tie_word_embeddings",
    "top_k",
    "torch_dtype",
    "use_sliding_window",
    "v_head_dim",
    "vocab_size",
    "weights_dtype",
];

/// What [`super::rope`] reads of `rope_scaling` / `rope_parameters`.
const ROPE_FIELDS: &[&str] = &[
    "rope_type",
    "type",
    "factor",
    "original_max_position_embeddings",
];

/// What [`super::config`] reads of `quantization_config` (besides `config_groups`).
const QUANT_FIELDS: &[&str] = &[
    "quant_method",
    "bits",
    "load_in_4bit",
    "quant_algo",
    "format",
];

/// The planner's subset of `config`; `None` when it is not a JSON object (the planner's own
/// error for that comes from the value as it is).
pub fn planning_subset(config: &Value) -> Option<Value> {
    let top = config.as_object()?;
    let mut kept = pick(top, FIELDS);
    if let Some(Value::Object(text)) = top.get("text_config") {
        kept.insert("text_config".into(), Value::Object(pick(text, FIELDS)));
    }
    keep_rope(top, &mut kept);
    if let (Some(Value::Object(text)), Some(Value::Object(kept_text))) =
        (top.get("text_config"), kept.get_mut("text_config"))
    {
        keep_rope(text, kept_text);
    }
    // Only the top level's quantisation is read (the text model's is not).
    if let Some(quant) = top.get("quantization_config") {
        kept.insert("quantization_config".into(), quantization_subset(quant));
    }
    Some(Value::Object(kept))
}

/// `rope_scaling` / `rope_parameters` of `from`, down to the fields the planner reads (a
/// value that is not an object is kept as it is, for the planner's error).
fn keep_rope(from: &Map<String, Value>, into: &mut Map<String, Value>) {
    for name in ["rope_scaling", "rope_parameters"] {
        if let Some(rope) = from.get(name) {
            let rope = match rope.as_object() {
                Some(rope) => Value::Object(pick(rope, ROPE_FIELDS)),
                None => rope.clone(),
            };
            into.insert(name.into(), rope);
        }
    }
}

fn pick(object: &Map<String, Value>, names: &[&str]) -> Map<String, Value> {
    names
        .iter()
        .filter_map(|name| Some(((*name).to_string(), object.get(*name)?.clone())))
        .collect()
}

/// `quantization_config` down to its method fields and the first config group's weight
/// format (compressed-tensors: the first group decides).
fn quantization_subset(quant: &Value) -> Value {
    let Some(quant) = quant.as_object() else {
        return quant.clone();
    };
    let mut kept = pick(quant, QUANT_FIELDS);
    if let Some(groups) = quant.get("config_groups") {
        let first = groups.as_object().and_then(|groups| {
            let (name, group) = groups.iter().next()?;
            let weights = group
                .get("weights")
                .map(|weights| match weights.as_object() {
                    Some(weights) => Value::Object(pick(weights, &["num_bits", "type"])),
                    None => weights.clone(),
                });
            let group = match weights {
                Some(weights) => serde_json::json!({ "weights": weights }),
                None => serde_json::json!({}),
            };
            Some(Value::Object(Map::from_iter([(name.clone(), group)])))
        });
        kept.insert(
            "config_groups".into(),
            first.unwrap_or_else(|| {
                if groups.is_object() {
                    serde_json::json!({})
                } else {
                    groups.clone()
                }
            }),
        );
    }
    Value::Object(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::model::config::parse_config;

    fn presets_and_fixtures() -> Vec<(String, Value)> {
        let data: Value =
            serde_json::from_str(include_str!("../data/model-configs.json")).expect("presets");
        let mut configs: Vec<(String, Value)> = data
            .as_array()
            .or_else(|| data.get("models").and_then(Value::as_array))
            .expect("a list of presets")
            .iter()
            .filter_map(|entry| {
                Some((
                    entry.get("key")?.as_str()?.to_string(),
                    entry.get("architecture")?.clone(),
                ))
            })
            .collect();
        for dir in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/models"))
            .expect("fixtures/models")
        {
            let path = dir.expect("entry").path().join("config.json");
            let text = std::fs::read_to_string(&path).expect("config.json");
            configs.push((
                path.display().to_string(),
                serde_json::from_str(&text).expect("JSON"),
            ));
        }
        assert!(configs.len() > 20, "{} configs", configs.len());
        configs
    }

    #[test]
    fn the_subset_reads_as_the_whole_config_for_every_preset_and_fixture() {
        for (name, config) in presets_and_fixtures() {
            let subset = planning_subset(&config).expect("an object");
            let whole = parse_config("c", &config);
            let part = parse_config("c", &subset);
            assert_eq!(
                format!("{part:?}"),
                format!("{whole:?}"),
                "{name}: the subset reads differently"
            );
        }
    }

    #[test]
    fn the_subset_drops_what_the_planner_never_reads_and_keeps_errors() {
        let mut config = serde_json::json!({
            "model_type": "llama", "hidden_size": "big", "num_hidden_layers": 2,
            "quantization_config": {"quant_method": "compressed-tensors",
                "config_groups": {"a": {"weights": {"num_bits": 8, "type": "float", "x": [1]},
                                         "targets": ["Linear"]},
                                  "b": {"weights": {"num_bits": 4}}},
                "ignore": ["lm_head"]},
        });
        for i in 0..500 {
            config[format!("junk_{i}")] = Value::String("x".repeat(1000));
        }
        let subset = planning_subset(&config).expect("an object");
        assert!(subset.to_string().len() < 400, "{subset}");
        assert_eq!(subset["hidden_size"], "big");
        assert_eq!(
            subset["quantization_config"]["config_groups"],
            serde_json::json!({"a": {"weights": {"num_bits": 8, "type": "float"}}})
        );
        assert_eq!(
            format!("{:?}", parse_config("c", &subset)),
            format!("{:?}", parse_config("c", &config))
        );
        assert_eq!(planning_subset(&Value::from(3)), None);
    }
}
