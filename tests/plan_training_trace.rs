//! The training memory model against traced allocations (issue 38): each row of
//! `fixtures/training/traced-*.json` is a fine-tuning case run by
//! `scripts/measure-training-memory.py --trace` — the real transformers/PEFT/PyTorch training
//! code on fake tensors, its live storage bytes added up after every operation — and the
//! planner's model states plus activations (`plan::training::training_memory`, one device,
//! no ZeRO, the runtime overhead left out) must be within ±10 % of the traced peak.
//!
//! A trace is not a GPU measurement: it has no caching-allocator slack, CUDA context or
//! kernel workspaces, which the plan's overhead term and its 95 % budget stand for and which
//! only measured rows can calibrate. It checks the shape of the formulas (logits and loss,
//! activations with and without checkpointing, LoRA's saved inputs, autocast's weight
//! copies) on the code users run, at any size, on any machine.

#![allow(clippy::expect_used)]

use hwaccel::hardware::GIB;
use hwaccel::plan::Bytes;
use hwaccel::plan::load::load_model;
use hwaccel::plan::model::presets;
use hwaccel::plan::training::{
    LoraTarget, Method, OptimizerStates, TrainingTarget, training_memory,
};
use serde::Deserialize;

const TOLERANCE: f64 = 0.10;

#[derive(Debug, Deserialize)]
struct Traced {
    provenance: serde_json::Value,
    rows: Vec<Row>,
}

#[derive(Debug, Deserialize)]
struct Row {
    case: String,
    status: String,
    model: Option<String>,
    method: Option<String>,
    seq_len: Option<u64>,
    micro_batch: Option<u64>,
    gradient_checkpointing: Option<bool>,
    optimizer_states: Option<String>,
    lora_rank: Option<u64>,
    lora_targets: Option<Vec<String>>,
    trainable_params: Option<u64>,
    peak_allocated_bytes: Option<u64>,
}

fn load() -> Vec<(String, Traced)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/training");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("fixtures/training")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("traced-") && n.ends_with(".json"))
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("readable");
            let traced: Traced =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.display().to_string(), traced)
        })
        .collect()
}

fn target(row: &Row) -> TrainingTarget {
    let method = match row.method.as_deref() {
        Some("full") => Method::Full,
        Some("lora") => Method::Lora,
        Some("dpo") => Method::Dpo,
        other => panic!("{}: method {other:?}", row.case),
    };
    let optimizer_states = match row.optimizer_states.as_deref() {
        Some("fp32") => OptimizerStates::Fp32,
        Some("bf16") => OptimizerStates::Bf16,
        Some("8bit") => OptimizerStates::EightBit,
        other => panic!("{}: optimizer states {other:?}", row.case),
    };
    TrainingTarget {
        method,
        seq_len: row.seq_len.expect("seq_len"),
        micro_batch: row.micro_batch.expect("micro_batch"),
        gradient_checkpointing: row.gradient_checkpointing.expect("checkpointing"),
        lora_rank: row.lora_rank.unwrap_or(16),
        lora_targets: row
            .lora_targets
            .iter()
            .flatten()
            .map(|t| LoraTarget::parse(t).unwrap_or_else(|| panic!("{}: target {t}", row.case)))
            .collect(),
        optimizer_states,
    }
}

/// One traced row replayed by the planner.
struct Replayed {
    case: String,
    traced_peak: f64,
    /// Weights, gradients, optimizer and activations: the plan's figure for the allocations.
    planned: f64,
    /// Whether the plan fits one H200 (its whole budget and overhead).
    fits_one_h200: bool,
    planned_trainable: u64,
    traced_trainable: u64,
}

/// An H200's memory as CUDA reports it (139.8 GiB).
const H200_BYTES: u64 = 150_108_897_280;

fn replay() -> Vec<Replayed> {
    let mut out = Vec::new();
    for (file, traced) in load() {
        assert!(
            traced.provenance["torch"].is_string() && traced.provenance["transformers"].is_string(),
            "{file}: the provenance names torch and transformers"
        );
        for row in traced.rows.iter().filter(|r| r.status == "ok") {
            let name = row.model.as_deref().expect("model");
            // A preset key, or a config.json in the repository (fixtures/training/configs/).
            let model = if name.ends_with(".json") {
                load_model(&format!("{}/{name}", env!("CARGO_MANIFEST_DIR")))
                    .unwrap_or_else(|e| panic!("{}: {e}", row.case))
            } else {
                presets::find(name)
                    .expect("preset table")
                    .unwrap_or_else(|| panic!("{}: no preset {name}", row.case))
            };
            let target = target(row);
            let memory = training_memory(&model, &target, 1, 0, (Bytes(1 << 50), 0.95));
            let planned = memory.weights + memory.gradients + memory.optimizer + memory.activations;
            let on_h200 = training_memory(&model, &target, 1, 0, (Bytes(H200_BYTES), 0.95));
            out.push(Replayed {
                case: row.case.clone(),
                traced_peak: row.peak_allocated_bytes.expect("peak") as f64,
                planned: planned.as_f64(),
                fits_one_h200: on_h200.device.within_budget(),
                planned_trainable: memory.trainable_params,
                traced_trainable: row.trainable_params.expect("trainable_params"),
            });
        }
    }
    out
}

#[test]
fn training_plans_match_traced_allocations() {
    let rows = replay();
    let gib = GIB as f64;
    let mut misses = Vec::new();
    println!(
        "{:48} {:>9} {:>9} {:>7}",
        "case", "traced", "planned", "error"
    );
    for row in &rows {
        let error = row.planned / row.traced_peak - 1.0;
        println!(
            "{:48} {:>9.2} {:>9.2} {:>+6.1}%",
            row.case,
            row.traced_peak / gib,
            row.planned / gib,
            error * 100.0
        );
        if error.abs() > TOLERANCE {
            misses.push(format!("{}: {:+.1}%", row.case, error * 100.0));
        }
    }
    assert!(misses.is_empty(), "outside ±10 %: {misses:?}");
    assert!(rows.len() >= 30, "{} traced rows", rows.len());
}

/// A step whose traced allocations alone (plus the smallest CUDA context, 512 MiB) exceed an
/// H200 runs out of memory there; the plan must never say it fits one.
#[test]
fn no_plan_fits_where_the_traced_allocations_cannot() {
    let rows = replay();
    let cannot: Vec<_> = rows
        .iter()
        .filter(|r| r.traced_peak + 512.0 * 1024.0 * 1024.0 > H200_BYTES as f64)
        .collect();
    assert!(cannot.len() >= 3, "{} rows exceed an H200", cannot.len());
    for row in cannot {
        assert!(!row.fits_one_h200, "{} fits one H200 in the plan", row.case);
    }
}

/// The planner counts the trainable parameters the traced program trained (PEFT's adapters,
/// every parameter of a full fine-tune), so a miss is in the memory model, not the count.
#[test]
fn traced_rows_train_the_parameters_the_planner_counts() {
    for row in replay() {
        let error = row.planned_trainable as f64 / row.traced_trainable as f64 - 1.0;
        assert!(
            error.abs() < 0.001,
            "{}: planner {} trainable parameters, trace {}",
            row.case,
            row.planned_trainable,
            row.traced_trainable
        );
    }
}
