//! The training memory model against traced allocations (issue 38): each row of
//! `fixtures/training/traced-*.json` is a fine-tuning case run by
//! `scripts/measure-training-memory.py --trace` — the real transformers/PEFT/PyTorch training
//! code on fake tensors, its live storage bytes added up after every operation — and the
//! planner's model states plus activations (`plan::training::training_memory`, one device,
//! no ZeRO, the runtime overhead left out) must be within ±10 % of the traced peak.
//!
//! The same allocations, in their order, went through the script's model of PyTorch's CUDA
//! caching allocator (`scripts/caching_allocator.py`, with cuBLAS's workspaces and
//! flash-attention's backward scratch), replayed at shrinking capacities with the cache given
//! back and retried before running out, as PyTorch's allocator does: the least memory a GPU
//! runs the step in. The plan's whole device figure (allocations, CUDA context and the
//! allocator's reserve) must be within ±10 % of it plus the same context, must never fit a
//! device 10 % smaller than that, and must never fit one H200 where the modelled H200 ran out
//! of memory. (The peak an allocator that is never short reserves, also in each row, overstates
//! what a GPU needs: fms-acceleration's Llama 3 8B full fine-tune at 4096 x 8 ran on an A100
//! 80GB that figure says it outgrows.)
//!
//! Neither is a GPU measurement: the CUDA context, kernels' workspaces the script does not
//! name and the allocator's behaviour on a real device are for measured rows to confirm. It
//! checks the shape of the formulas (logits and loss, activations with and without
//! checkpointing, LoRA's saved inputs, autocast's weight copies, the allocator's
//! fragmentation) on the code users run, at any size, on any machine.
//!
//! Rows measured on a GPU (`fixtures/training/measured-*.json`: the same script without
//! `--trace`) are replayed the same way against what the GPU reserved plus its CUDA context:
//! within ±10 %, never fitting a device 10 % smaller, and never fitting the GPU a row ran out
//! of memory on. The harness is checked on rows it must reject, so it is ready for the first
//! measured file.

#![allow(clippy::expect_used)]

use hwaccel::hardware::GIB;
use hwaccel::plan::Bytes;
use hwaccel::plan::load::load_model;
use hwaccel::plan::model::{Model, presets};
use hwaccel::plan::training::{
    Adamw, Kernels, LoraTarget, Loss, Method, OptimizerStates, TrainingTarget, training_memory,
};
use serde::Deserialize;

const TOLERANCE: f64 = 0.10;

#[derive(Debug, Deserialize)]
struct Traced {
    provenance: serde_json::Value,
    rows: Vec<Row>,
}

/// One row of the measurement script's output (or a published row in its format).
#[derive(Debug, Deserialize)]
pub(crate) struct Row {
    pub(crate) case: String,
    pub(crate) status: String,
    pub(crate) model: Option<String>,
    pub(crate) method: Option<String>,
    pub(crate) seq_len: Option<u64>,
    pub(crate) micro_batch: Option<u64>,
    pub(crate) gradient_checkpointing: Option<bool>,
    pub(crate) optimizer_states: Option<String>,
    pub(crate) loss: Option<String>,
    /// Rows before the AdamW path was recorded ran the single-tensor loop, which updates in
    /// place as the fused kernel does.
    pub(crate) adamw: Option<String>,
    /// The layers' kernels (the planner's `--kernels`); rows before they were a choice ran
    /// transformers' own.
    pub(crate) layer_kernels: Option<String>,
    pub(crate) lora_rank: Option<u64>,
    pub(crate) lora_targets: Option<Vec<String>>,
    pub(crate) trainable_params: Option<u64>,
    pub(crate) peak_allocated_bytes: Option<u64>,
    /// The least capacity the modelled allocator runs the step in (cache released and retried).
    pub(crate) modelled_gpu_min_capacity_bytes: Option<u64>,
    modelled_h200: Option<String>,
    /// Measured rows: what the GPU's allocator reserved at the peak plus its CUDA context.
    pub(crate) peak_device_bytes: Option<u64>,
    /// Measured rows: the GPU's memory as CUDA reports it.
    pub(crate) device_total_bytes: Option<u64>,
}

/// The JSON files in `fixtures/training` whose names start with `prefix`, in name order, with
/// their text.
pub(crate) fn fixture_files(prefix: &str) -> Vec<(String, String)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/training");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("fixtures/training")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".json"))
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("readable");
            (p.display().to_string(), text)
        })
        .collect()
}

/// The rows files whose names start with `prefix`.
fn load(prefix: &str) -> Vec<(String, Traced)> {
    fixture_files(prefix)
        .into_iter()
        .map(|(file, text)| {
            let rows = parse(&file, &text);
            (file, rows)
        })
        .collect()
}

fn parse(file: &str, text: &str) -> Traced {
    let rows: Traced = serde_json::from_str(text).unwrap_or_else(|e| panic!("{file}: {e}"));
    assert!(
        rows.provenance["torch"].is_string() && rows.provenance["transformers"].is_string(),
        "{file}: the provenance names torch and transformers"
    );
    rows
}

/// A row's model: a preset key, or a config.json in the repository
/// (`fixtures/training/configs/`).
pub(crate) fn model(row: &Row) -> Model {
    let name = row.model.as_deref().expect("model");
    if name.ends_with(".json") {
        load_model(&format!("{}/{name}", env!("CARGO_MANIFEST_DIR")))
            .unwrap_or_else(|e| panic!("{}: {e}", row.case))
    } else {
        presets::find(name)
            .expect("preset table")
            .unwrap_or_else(|| panic!("{}: no preset {name}", row.case))
    }
}

pub(crate) fn target(row: &Row) -> TrainingTarget {
    let method = match row.method.as_deref() {
        Some("full") => Method::Full,
        Some("lora") => Method::Lora,
        Some("qlora") => Method::Qlora,
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
        // Rows traced before the loss was a choice ran transformers' own.
        loss: match row.loss.as_deref() {
            None | Some("standard") => Loss::Standard,
            Some("fused") => Loss::Fused,
            other => panic!("{}: loss {other:?}", row.case),
        },
        adamw: match row.adamw.as_deref() {
            None | Some("fused") => Adamw::Fused,
            Some("foreach") => Adamw::Foreach,
            other => panic!("{}: adamw {other:?}", row.case),
        },
        kernels: match row.layer_kernels.as_deref() {
            None | Some("standard") => Kernels::Standard,
            Some("liger") => Kernels::Liger,
            other => panic!("{}: kernels {other:?}", row.case),
        },
    }
}

/// One traced row replayed by the planner.
struct Replayed {
    case: String,
    traced_peak: f64,
    /// Weights, gradients, optimizer and activations: the plan's figure for the allocations.
    planned: f64,
    /// The least memory the modelled CUDA caching allocator runs the step in, plus the plan's
    /// CUDA context.
    modelled_device: f64,
    /// The plan's device figure: allocations, CUDA context and the allocator's whole reserve.
    planned_device: f64,
    /// Whether the plan fits one H200 (its whole budget and overhead).
    fits_one_h200: bool,
    /// Whether the modelled H200's allocator ran out of memory.
    modelled_h200_out_of_memory: bool,
    /// Whether the plan fits a device 10 % smaller than `modelled_device`.
    fits_below_modelled: bool,
    planned_trainable: u64,
    traced_trainable: u64,
}

/// An H200's memory as CUDA reports it (139.8 GiB).
const H200_BYTES: u64 = 150_108_897_280;

/// The CUDA context the script's H200 model leaves out of the allocator (512 MiB), the
/// plan's own figure for it.
const CUDA_CONTEXT: f64 = 512.0 * 1024.0 * 1024.0;

fn replay() -> Vec<Replayed> {
    let mut out = Vec::new();
    for (_, traced) in load("traced-") {
        for row in traced.rows.iter().filter(|r| r.status == "ok") {
            let model = model(row);
            let target = target(row);
            let memory = training_memory(&model, &target, 1, 0, (Bytes(1 << 50), 0.95));
            let planned = memory.weights + memory.gradients + memory.optimizer + memory.activations;
            let on_h200 = training_memory(&model, &target, 1, 0, (Bytes(H200_BYTES), 0.95));
            // A budget of the whole device, so that none of the reserve is met by a share
            // outside it: the plan's full device figure.
            let whole = training_memory(&model, &target, 1, 0, (Bytes(1 << 50), 1.0));
            let modelled_device = row
                .modelled_gpu_min_capacity_bytes
                .unwrap_or_else(|| panic!("{}: no modelled capacity", row.case))
                as f64
                + CUDA_CONTEXT;
            let smaller = Bytes::from_f64(modelled_device * 0.9);
            let below = training_memory(&model, &target, 1, 0, (smaller, 0.95));
            out.push(Replayed {
                case: row.case.clone(),
                traced_peak: row.peak_allocated_bytes.expect("peak") as f64,
                planned: planned.as_f64(),
                modelled_device,
                planned_device: (planned + whole.overhead).as_f64(),
                fits_one_h200: on_h200.device.within_budget(),
                modelled_h200_out_of_memory: match row.modelled_h200.as_deref() {
                    Some("out of memory") => true,
                    Some("fits") => false,
                    other => panic!("{}: modelled_h200 {other:?}", row.case),
                },
                fits_below_modelled: below.device.within_budget(),
                planned_trainable: memory.trainable_params,
                traced_trainable: row.trainable_params.expect("trainable_params"),
            });
        }
    }
    out
}

/// Prints `rows` as a table of `figure` against the plan's `planned` and asserts that every
/// row is within ±10 % and that there are at least 30.
fn assert_within_tolerance(rows: &[Replayed], figure: &str, of: impl Fn(&Replayed) -> (f64, f64)) {
    let gib = GIB as f64;
    let mut misses = Vec::new();
    println!("{:48} {figure:>9} {:>9} {:>7}", "case", "planned", "error");
    for row in rows {
        let (reference, planned) = of(row);
        let error = planned / reference - 1.0;
        println!(
            "{:48} {:>9.2} {:>9.2} {:>+6.1}%",
            row.case,
            reference / gib,
            planned / gib,
            error * 100.0
        );
        if error.abs() > TOLERANCE {
            misses.push(format!("{}: {:+.1}%", row.case, error * 100.0));
        }
    }
    assert!(misses.is_empty(), "outside ±10 %: {misses:?}");
    assert!(rows.len() >= 30, "{} {figure} rows", rows.len());
}

#[test]
fn training_plans_match_traced_allocations() {
    assert_within_tolerance(&replay(), "traced", |r| (r.traced_peak, r.planned));
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

/// The plan's whole device figure against the least memory the modelled allocator runs the
/// step in, plus the same CUDA context.
#[test]
fn training_plans_match_the_modelled_gpu_reserve() {
    assert_within_tolerance(&replay(), "modelled", |r| {
        (r.modelled_device, r.planned_device)
    });
}

/// Where the modelled H200 ran out of memory (its allocator gave back every cached segment
/// and retried first), the plan must not fit one; and no plan fits a device 10 % smaller
/// than the modelled run needs.
#[test]
fn no_plan_fits_where_the_modelled_allocator_runs_out() {
    let rows = replay();
    let out_of_memory: Vec<_> = rows
        .iter()
        .filter(|r| r.modelled_h200_out_of_memory)
        .collect();
    assert!(
        out_of_memory.len() >= 3,
        "{} rows ran out on the modelled H200",
        out_of_memory.len()
    );
    for row in out_of_memory {
        assert!(!row.fits_one_h200, "{} fits one H200 in the plan", row.case);
    }
    for row in &rows {
        assert!(
            !row.fits_below_modelled,
            "{} fits a device of {:.1} GiB, 10 % below what the modelled run needs",
            row.case,
            row.modelled_device * 0.9 / GIB as f64
        );
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

/// The allocator model behind `modelled_gpu_*` (`scripts/caching_allocator.py`) checks its
/// rules on worked examples (pools, segment sizes, best fit, splitting, merging, releasing
/// the cache before running out); plain Python, no PyTorch.
#[test]
fn the_caching_allocator_model_passes_its_worked_examples() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/caching_allocator.py");
    let out = std::process::Command::new("python3")
        .args([script, "--self-test"])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("self-test passed"));
}

/// One row measured on a GPU, replayed by the planner.
struct MeasuredReplay {
    case: String,
    /// What the GPU's allocator reserved at the step's peak, plus its CUDA context.
    measured_device: f64,
    /// The plan's device figure: allocations, CUDA context and the allocator's whole reserve.
    planned_device: f64,
    /// Whether the row ran out of memory.
    out_of_memory: bool,
    /// Whether the plan fits the GPU the row ran on (its whole budget and overhead).
    fits_the_gpu: bool,
    /// Whether the plan fits a device 10 % smaller than `measured_device`.
    fits_below_measured: bool,
}

/// The rows of a measured file that ran to the end or out of memory, replayed; skipped,
/// timed-out and failed cases measured nothing.
fn replay_measured(rows: &Traced) -> Vec<MeasuredReplay> {
    rows.rows
        .iter()
        .filter(|r| r.status == "ok" || r.status == "oom")
        .map(|row| {
            let model = model(row);
            let target = target(row);
            let gpu = row
                .device_total_bytes
                .unwrap_or_else(|| panic!("{}: no device_total_bytes", row.case));
            let measured_device = row
                .peak_device_bytes
                .unwrap_or_else(|| panic!("{}: no peak_device_bytes", row.case))
                as f64;
            let whole = training_memory(&model, &target, 1, 0, (Bytes(1 << 50), 1.0));
            let planned = whole.weights + whole.gradients + whole.optimizer + whole.activations;
            let on_gpu = training_memory(&model, &target, 1, 0, (Bytes(gpu), 0.95));
            let smaller = Bytes::from_f64(measured_device * 0.9);
            let below = training_memory(&model, &target, 1, 0, (smaller, 0.95));
            MeasuredReplay {
                case: row.case.clone(),
                measured_device,
                planned_device: (planned + whole.overhead).as_f64(),
                out_of_memory: row.status == "oom",
                fits_the_gpu: on_gpu.device.within_budget(),
                fits_below_measured: below.device.within_budget(),
            }
        })
        .collect()
}

/// What is wrong with a measured replay: a completed row outside ±10 %, a plan that fits a
/// device 10 % smaller than a completed row needed, a plan that fits the GPU a row ran out of
/// memory on. A row cut short by running out reached less than it needed, so only the last
/// applies to it.
fn measured_misses(rows: &[MeasuredReplay]) -> Vec<String> {
    let gib = GIB as f64;
    let mut misses = Vec::new();
    println!(
        "{:48} {:>9} {:>9} {:>7}",
        "case", "measured", "planned", "error"
    );
    for row in rows {
        if row.out_of_memory {
            println!(
                "{:48} {:>9} {:>9.2}",
                row.case,
                "oom",
                row.planned_device / gib
            );
            if row.fits_the_gpu {
                misses.push(format!(
                    "{}: fits the GPU it ran out of memory on",
                    row.case
                ));
            }
            continue;
        }
        let error = row.planned_device / row.measured_device - 1.0;
        println!(
            "{:48} {:>9.2} {:>9.2} {:>+6.1}%",
            row.case,
            row.measured_device / gib,
            row.planned_device / gib,
            error * 100.0
        );
        if error.abs() > TOLERANCE {
            misses.push(format!("{}: {:+.1}%", row.case, error * 100.0));
        }
        if row.fits_below_measured {
            misses.push(format!(
                "{}: fits {:.1} GiB, 10 % below what the GPU used",
                row.case,
                row.measured_device * 0.9 / gib
            ));
        }
    }
    misses
}

/// Issue 38's "done means": every measured row within ±10 % of the plan, none where the plan
/// fits and the GPU ran out, at least 30 of them. Until a GPU run lands there are no files to
/// replay (the traced rows above stand in); the harness's own check below shows it rejects.
#[test]
fn training_plans_match_measured_gpu_peaks() {
    let files = load("measured-");
    if files.is_empty() {
        println!("no fixtures/training/measured-*.json yet (issue 38)");
        return;
    }
    let mut rows = Vec::new();
    for (file, measured) in &files {
        assert!(
            measured.provenance["gpu"].is_string(),
            "{file}: a measured file names its GPU"
        );
        rows.extend(replay_measured(measured));
    }
    let misses = measured_misses(&rows);
    assert!(misses.is_empty(), "{misses:?}");
    let completed = rows.iter().filter(|r| !r.out_of_memory).count();
    assert!(completed >= 30, "{completed} measured rows completed");
}

/// The measured replay rejects what it must: a row measured 25 % above the plan, one whose
/// plan fits a device 10 % smaller than the GPU used, and one that ran out of memory on a GPU
/// the plan fits; and accepts a row measured at the plan's own figure. The rows are in the
/// script's measured format, their figures derived from the plan itself (not measurements).
#[test]
fn the_measured_replay_rejects_misses_and_false_fits() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/training");
    let traced: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{dir}/traced-torch-2.11-transformers-5.24.json"))
            .expect("readable"),
    )
    .expect("json");
    let raw = traced["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["status"] == "ok" && r["model"] == "llama-3.1-8b")
        .expect("a traced Llama 3.1 8B row");
    let row: Row = serde_json::from_value(raw.clone()).expect("a row");
    let row = &row;
    let planned = {
        let m = training_memory(&model(row), &target(row), 1, 0, (Bytes(1 << 50), 1.0));
        (m.weights + m.gradients + m.optimizer + m.activations + m.overhead).as_f64()
    };
    let as_measured = |case: &str, status: &str, peak: f64, total: f64| {
        let mut fields = raw.clone();
        fields["case"] = case.into();
        fields["status"] = status.into();
        fields["peak_device_bytes"] = (peak as u64).into();
        fields["device_total_bytes"] = (total as u64).into();
        fields
    };
    let file = serde_json::json!({
        "provenance": {"torch": "2.11.0", "transformers": "5.24.0", "gpu": "none: derived from the plan"},
        "rows": [
            as_measured("at the plan", "ok", planned, planned * 2.0),
            as_measured("25 % above the plan", "ok", planned * 1.25, planned * 2.0),
            as_measured("ran out where the plan fits", "oom", planned * 0.5, planned * 2.0),
            as_measured("ran out where the plan does not fit", "oom", planned * 0.5, planned * 0.8),
        ],
    });
    let rows = replay_measured(&parse("derived", &file.to_string()));
    let misses = measured_misses(&rows);
    let named = |case: &str| misses.iter().filter(|m| m.starts_with(case)).count();
    assert_eq!(named("at the plan"), 0, "{misses:?}");
    // Outside ±10 %, and the plan fits 90 % of what the row needed.
    assert_eq!(named("25 % above the plan"), 2, "{misses:?}");
    assert_eq!(named("ran out where the plan fits"), 1, "{misses:?}");
    assert_eq!(
        named("ran out where the plan does not fit"),
        0,
        "{misses:?}"
    );
}
