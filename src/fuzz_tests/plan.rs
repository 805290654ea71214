//! Planner input on arbitrary values: model configs, hardware shorthand, counts and sizes,
//! inventory files, and whole ModelPlacement specs through the controller's pure path.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use proptest::prelude::*;
use serde_json::{Map, Number, Value, json};

use super::{cases, text};
use crate::api::placement::ModelPlacementSpec;
use crate::api::quantity;
use crate::controller::core::fleet_view::FleetView;
use crate::controller::placement::core::evaluate::evaluate;
use crate::plan::Reservations;
use crate::plan::load::{interpret, parse_bytes};
use crate::plan::model::config::{parse_config, parse_config_text};
use crate::plan::model::parse_param_count;
use crate::plan::shorthand::parse_hardware;
use crate::testing::inventory::fixture_inventory;

/// The fields `config.json` parsing looks at, so arbitrary configs reach the arithmetic.
const CONFIG_KEYS: &[&str] = &[
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "first_k_dense_replace",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "sliding_window",
    "tie_word_embeddings",
    "torch_dtype",
    "quantization_config",
    "model_type",
    "architectures",
    "layer_types",
    "text_config",
];

/// A JSON number or other scalar, biased to the values arithmetic trips on.
fn scalar() -> BoxedStrategy<Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop_oneof![
            Just(0_u64),
            Just(1),
            Just(2),
            Just(u64::from(u32::MAX)),
            Just(1 << 22),
            Just(u64::MAX)
        ]
        .prop_map(Value::from),
        any::<f64>().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        any::<bool>().prop_map(Value::Bool),
        ".{0,16}".prop_map(Value::String),
        prop::sample::select(vec![
            "bfloat16", "float16", "fp8", "mxfp4", "nf4", "int4", "llama"
        ])
        .prop_map(|s| Value::String(s.to_string())),
        Just(Value::Null),
    ]
    .boxed()
}

/// Arbitrary JSON, a few levels deep.
fn json_value() -> BoxedStrategy<Value> {
    scalar()
        .prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::btree_map(".{0,12}", inner, 0..8)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
        .boxed()
}

/// A config-shaped object: known keys with arbitrary values, sometimes nested.
fn config_value() -> BoxedStrategy<Value> {
    let entries = prop::collection::btree_map(
        prop::sample::select(CONFIG_KEYS.to_vec()),
        prop_oneof![4 => scalar(), 1 => json_value()],
        0..CONFIG_KEYS.len(),
    );
    (entries, prop::option::of(json_value()))
        .prop_map(|(entries, nested)| {
            let mut map: Map<String, Value> = entries
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            if let Some(nested) = nested {
                map.insert("text_config".to_string(), nested);
            }
            Value::Object(map)
        })
        .boxed()
}

/// A dimension: mostly plausible, sometimes absurd.
fn dimension() -> BoxedStrategy<Value> {
    prop_oneof![
        4 => (1_u64..=256).prop_map(Value::from),
        2 => (1_u64..=(1 << 16)).prop_map(Value::from),
        1 => (1_u64..=(1 << 22)).prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        1 => scalar(),
    ]
    .boxed()
}

/// A config with every field the memory model needs, so the arithmetic behind it runs.
fn full_config() -> BoxedStrategy<Value> {
    let keys = [
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
    ];
    let moe = prop::option::of((dimension(), dimension(), dimension()));
    (
        prop::collection::vec(dimension(), keys.len()),
        moe,
        prop::sample::select(vec!["bfloat16", "float16", "float32", "fp8", "int4"]),
    )
        .prop_map(move |(values, moe, dtype)| {
            let mut map: Map<String, Value> = keys
                .iter()
                .zip(values)
                .map(|(k, v)| ((*k).to_string(), v))
                .collect();
            if let Some((experts, per_token, size)) = moe {
                map.insert("num_local_experts".into(), experts);
                map.insert("num_experts_per_tok".into(), per_token);
                map.insert("moe_intermediate_size".into(), size);
            }
            map.insert("torch_dtype".into(), Value::from(dtype));
            Value::Object(map)
        })
        .boxed()
}

/// A u32 the way a spec field can hold it: anything, with the edges well represented.
fn number() -> impl Strategy<Value = u32> {
    prop_oneof![
        any::<u32>(),
        Just(0),
        Just(1),
        Just(u32::MAX),
        1_u32..=8192,
        1_u32..=1_048_576,
    ]
}

/// A ModelPlacement spec as the controller decodes it, arbitrary in every field a tenant sets.
fn spec_json() -> BoxedStrategy<Value> {
    let precision = prop::sample::select(vec![
        "auto", "bf16", "fp16", "fp8", "int8", "int4", "nf4", "fp4",
    ]);
    let model: BoxedStrategy<Value> = prop_oneof![
        prop::sample::select(vec![
            "llama-3.1-8b",
            "llama-3.1-70b",
            "deepseek-v3",
            "mixtral-8x7b",
            "nope"
        ])
        .prop_map(|p| json!({"preset": p})),
        "[0-9.]{0,6}[KMBTx]?".prop_map(|p| json!({"parameters": p})),
        prop_oneof![4 => full_config(), 2 => config_value(), 1 => json_value()]
            .prop_map(|c| json!({"huggingFaceConfig": c.to_string()})),
    ]
    .boxed();
    let goal: BoxedStrategy<Value> = prop_oneof![
        (number(), number()).prop_map(|(context, concurrency)| {
            json!({"serve": {"context": context, "concurrency": concurrency}})
        }),
        (
            prop::sample::select(vec!["full", "lora", "qlora", "dpo"]),
            number(),
            number(),
            number(),
            prop::sample::select(vec!["standard", "fused", "chunky"]),
            prop::sample::select(vec!["fp32", "bf16", "8bit", "fp8"]),
            prop::sample::select(vec!["fused", "foreach", "adam"]),
        )
            .prop_map(|(method, seq, micro, rank, loss, states, adamw)| {
                json!({"train": {"method": method, "seqLen": seq, "microBatch": micro,
                                 "loraRank": rank, "loss": loss, "optimizerStates": states,
                                 "adamw": adamw}})
            }),
    ]
    .boxed();
    let constraints = prop::option::of((
        prop::option::of(precision.clone()),
        prop::option::of(precision),
        prop::option::of(number()),
        prop::option::of(number()),
        prop::collection::vec(
            prop::sample::select(vec!["gpu", "tpu", "npu", "asic", "x"]),
            0..3,
        ),
    ));
    // Issue 23: the engine fields, in and out of the CRD's bounds (the controller must judge
    // what reaches it without the apiserver's rules: a clear Invalid, never a panic).
    let engine = prop::option::of((
        prop::option::of(prop::sample::select(vec!["vllm", "sglang", "tgi"])),
        prop::option::of(prop::sample::select(vec![
            "v0", "v1", "current", "0.10.2", "0.21", "1.0.0rc1", "x", "",
        ])),
        any::<bool>(),
        prop::option::of(number()),
        prop::option::of(number()),
        prop::option::of(number()),
    ));
    (
        model,
        prop::option::of(any::<u64>()),
        goal,
        constraints,
        prop::option::of(number()),
        engine,
    )
        .prop_map(
            |(mut model, checkpoint, goal, constraints, replicas, engine)| {
                if let (Some(bytes), Some(map)) = (checkpoint, model.as_object_mut()) {
                    map.insert("checkpointBytes".into(), json!(bytes));
                }
                let mut spec = json!({"model": model, "goal": goal});
                if let Some((precision, kv, max_nodes, util, families)) = constraints {
                    spec["constraints"] = json!({
                        "precision": precision, "kvCachePrecision": kv, "maxNodes": max_nodes,
                        "memoryUtilizationPercent": util, "families": families,
                    });
                }
                if let Some(replicas) = replicas {
                    spec["replicas"] = json!(replicas);
                }
                if let Some((name, version, eager, seqs, tokens, fraction)) = engine {
                    spec["engine"] = json!({
                        "name": name, "version": version, "enforceEager": eager,
                        "maxNumSeqs": seqs, "maxNumBatchedTokens": tokens,
                        "memFractionStaticPercent": fraction,
                    });
                }
                spec
            },
        )
        .boxed()
}

/// A fleet with an NVSwitch H100 node and an MI300X node, detected once from fixtures.
fn fleet() -> &'static FleetView {
    static FLEET: OnceLock<FleetView> = OnceLock::new();
    FLEET.get_or_init(|| {
        let inventories = [
            fixture_inventory("h100-8x-nvswitch", "dgx-1"),
            fixture_inventory("mi300x-8x", "mi-1"),
        ];
        FleetView::new(inventories.iter(), &BTreeMap::new())
    })
}

proptest! {
    #![proptest_config(cases(1))]

    #[test]
    fn config_text(s in text()) {
        let once = format!("{:?}", parse_config_text("fuzz", &s));
        prop_assert_eq!(once, format!("{:?}", parse_config_text("fuzz", &s)));
    }

    #[test]
    fn config_json(value in prop_oneof![full_config(), config_value(), json_value()]) {
        let once = format!("{:?}", parse_config("fuzz", &value));
        prop_assert_eq!(&once, &format!("{:?}", parse_config("fuzz", &value)));
        // What the controller keeps of a placement's config reads exactly as the whole.
        if let Some(subset) = crate::plan::model::subset::planning_subset(&value) {
            prop_assert_eq!(once, format!("{:?}", parse_config("fuzz", &subset)));
        }
    }

    #[test]
    fn shorthand_counts_sizes_and_quantities(s in text()) {
        let all = |s: &str| {
            let q = Quantity(s.to_string());
            format!(
                "{:?} {:?} {:?} {:?} {:?}",
                parse_hardware(s),
                parse_param_count(s),
                parse_bytes(s),
                quantity::parse_millis(&q),
                quantity::parse_whole(&q),
            )
        };
        prop_assert_eq!(all(&s), all(&s));
    }

    #[test]
    fn inventory_file_text(s in prop_oneof![
        text(),
        json_value().prop_map(|v| v.to_string()),
        json_value().prop_map(|v| json!({"name": "n", "devices": [v]}).to_string()),
        json_value().prop_map(|v| json!({"schemaVersion": 1, "devices": [v]}).to_string()),
        json_value().prop_map(|v| json!({"kind": "AcceleratorInventory", "spec": v}).to_string()),
    ]) {
        let path = Path::new("fuzz.yaml");
        let once = format!("{:?}", interpret(path, &s, &crate::dra::inventory_node::planner_node_from_object));
        prop_assert_eq!(once, format!("{:?}", interpret(path, &s, &crate::dra::inventory_node::planner_node_from_object)));
    }
}

proptest! {
    #![proptest_config(cases(8))]

    #[test]
    fn model_placement_to_plan(spec in spec_json()) {
        // A spec the client cannot decode never reaches the planner.
        let Ok(spec) = serde_json::from_value::<ModelPlacementSpec>(spec) else {
            return Ok(());
        };
        let fleet = fleet();
        let reserved = Reservations::default();
        let once = evaluate(&spec, "ns", "mp", fleet, &reserved);
        prop_assert_eq!(once, evaluate(&spec, "ns", "mp", fleet, &reserved));
    }
}
