//! The plan as the planner reports it: one serialisable [`Plan`] for `-o json` (and for the
//! controller's status), and a table that explains the memory behind the decision.

use std::fmt::Write as _;

use serde::Serialize;

use crate::hardware::Precision;
use crate::output::Table;

use super::capability::Execution;
use super::engine::EngineSettings;
use super::fleet::Assignment;
use super::kv::KvDtype;
use super::memory::DeviceMemory;
use super::model::rope::RopeScaling;
use super::model::{Model, ModelSource};
use super::throughput::ThroughputEstimate;
use super::training::{Method, OptimizerStates, ZeroStage};
use super::units::Bytes;

/// The model, as the plan summarises it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSummary {
    /// Name.
    pub name: String,
    /// Where its facts came from.
    pub source: ModelSource,
    /// Total parameters.
    pub params: u64,
    /// Parameters one token uses (MoE: fewer than `params`).
    pub active_params: u64,
    /// The checkpoint's own precision.
    pub native_precision: Precision,
    /// Layers, heads, KV heads, head dim.
    pub layers: u32,
    /// Query heads.
    pub heads: u32,
    /// KV heads.
    pub kv_heads: u32,
    /// A RoPE scaling asked for on top of the config; the engine arguments apply it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
}

impl ModelSummary {
    /// Summarises `model`.
    pub fn of(model: &Model) -> Self {
        Self {
            name: model.name.clone(),
            source: model.source.clone(),
            params: model.params.total(),
            active_params: model.params.active(),
            native_precision: model.native.precision,
            layers: model.arch.layers,
            heads: model.arch.heads,
            kv_heads: model.arch.kv_heads,
            rope_scaling: model.rope_requested,
        }
    }
}

/// Training-specific facts of a training plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TrainingSummary {
    /// Method.
    pub method: Method,
    /// Parameters trained.
    pub trainable_params: u64,
    /// ZeRO stage.
    pub zero_stage: ZeroStage,
    /// Tokens per sequence.
    pub seq_len: u64,
    /// Sequences per device per step.
    pub micro_batch: u64,
    /// Whether activations are recomputed.
    pub gradient_checkpointing: bool,
    /// The optimizer states' precision assumed.
    pub optimizer_states: OptimizerStates,
    /// Per device: weights (policy, frozen base, reference, gather buffers).
    pub weights: Bytes,
    /// Per device: gradients.
    pub gradients: Bytes,
    /// Per device: optimizer states.
    pub optimizer: Bytes,
}

/// A plan, or a refusal with the nearest miss.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// Whether the goal fits the hardware.
    pub fits: bool,
    /// `serve` or `train`.
    pub goal: &'static str,
    /// The model.
    pub model: ModelSummary,
    /// Weight precision (training: the compute precision of the trained weights).
    pub precision: Option<Precision>,
    /// Whether the device computes in `precision` or widens weights on the fly.
    pub execution: Option<Execution>,
    /// KV-cache type (serving).
    pub kv_dtype: Option<&'static str>,
    /// Tokens per request (serving).
    pub context: Option<u64>,
    /// Concurrent full-context requests asked for (serving).
    pub concurrency: Option<u64>,
    /// The device product used.
    pub device: Option<String>,
    /// The oldest kernel driver among the devices used, when the hardware states one (the
    /// engine image's minimum is checked against it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// Tensor-parallel size.
    pub tp: Option<u32>,
    /// Pipeline-parallel size.
    pub pp: Option<u32>,
    /// Data-parallel replicas.
    pub replicas: Option<u32>,
    /// Devices used.
    pub devices: Option<u32>,
    /// Nodes used.
    pub nodes: Option<u32>,
    /// Memory on the most loaded device (for a refusal: of the nearest miss).
    pub per_device: Option<DeviceMemory>,
    /// Full-context requests all replicas hold at once (serving).
    pub max_concurrency: Option<u64>,
    /// KV-cache tokens one replica holds, as the engine would log it at start-up (serving).
    pub kv_tokens: Option<u64>,
    /// Fraction of each device's memory the engine may use (serving:
    /// `--gpu-memory-utilization`).
    pub gpu_memory_utilization: Option<f64>,
    /// Expert-parallel size of the MoE layers (serving; `None`: experts split by TP).
    pub expert_parallel: Option<u32>,
    /// Data-parallel attention ranks per replica (serving; `None`: attention split by TP).
    pub attention_data_parallel: Option<u32>,
    /// Where each group runs.
    pub assignments: Vec<Assignment>,
    /// Decode throughput per replica (serving).
    pub throughput: Option<ThroughputEstimate>,
    /// The serving engines' arguments for this plan (serving plans that fit).
    pub engine: Option<EngineSettings>,
    /// Training details.
    pub training: Option<TrainingSummary>,
    /// Why this plan (or why none).
    pub reasons: Vec<String>,
    /// What would make it fit, or make it better.
    pub suggestions: Vec<String>,
    /// The serving suggestions as typed changes, each checked to fit when applied (its `text`
    /// is also in `suggestions`).
    pub suggested_changes: Vec<Suggestion>,
    /// Disaggregated serving: the prefill pool (the fields above describe the decode pool).
    /// Absent from the output of an ordinary plan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill: Option<Box<Plan>>,
}

impl Plan {
    /// An empty plan for `model` that does not fit yet; the search fills it in.
    pub fn new(goal: &'static str, model: &Model) -> Self {
        Self {
            fits: false,
            goal,
            model: ModelSummary::of(model),
            precision: None,
            execution: None,
            kv_dtype: None,
            context: None,
            concurrency: None,
            device: None,
            driver_version: None,
            tp: None,
            pp: None,
            replicas: None,
            devices: None,
            nodes: None,
            per_device: None,
            max_concurrency: None,
            kv_tokens: None,
            gpu_memory_utilization: None,
            expert_parallel: None,
            attention_data_parallel: None,
            assignments: Vec::new(),
            throughput: None,
            engine: None,
            training: None,
            reasons: Vec::new(),
            suggestions: Vec::new(),
            suggested_changes: Vec::new(),
            prefill: None,
        }
    }

    /// The table people read: the decision, the memory behind it, where it runs, and why. A
    /// disaggregated plan shows the decode pool, then the prefill pool, each with its memory.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let verdict = if self.fits { "FITS" } else { "DOES NOT FIT" };
        let _ = writeln!(
            out,
            "{verdict}: {} {} ({:.1}B params){}",
            self.goal,
            self.model.name,
            self.model.params as f64 / 1e9,
            if self.prefill.is_some() {
                ", disaggregated"
            } else {
                ""
            }
        );
        match &self.prefill {
            Some(prefill) => {
                out.push_str("\n== decode pool ==\n");
                self.pool_table(&mut out);
                out.push_str("\n== prefill pool ==\n");
                prefill.pool_table(&mut out);
                if !prefill.reasons.is_empty() {
                    let _ = writeln!(out, "\nwhy (prefill pool):");
                    for line in &prefill.reasons {
                        let _ = writeln!(out, "  - {line}");
                    }
                }
            }
            None => self.pool_table(&mut out),
        }
        for (title, lines) in [("why", &self.reasons), ("try", &self.suggestions)] {
            if !lines.is_empty() {
                let _ = writeln!(out, "\n{title}:");
                for line in lines {
                    let _ = writeln!(out, "  - {line}");
                }
            }
        }
        out
    }

    /// One pool's layout, memory, context, throughput, engine line and assignments.
    fn pool_table(&self, out: &mut String) {
        if let (Some(device), Some(precision)) = (&self.device, self.precision) {
            let layout = format!(
                "{} x {} | precision {precision}{} | TP {} x PP {} x {} replica(s) on {} node(s)",
                self.devices.unwrap_or(0),
                device,
                if self.execution == Some(Execution::WeightOnly) {
                    " (weight-only)"
                } else {
                    ""
                },
                self.tp.unwrap_or(0),
                self.pp.unwrap_or(0),
                self.replicas.unwrap_or(0),
                self.nodes.unwrap_or(0),
            );
            let _ = writeln!(out, "{layout}");
        }
        if let Some(memory) = &self.per_device {
            out.push('\n');
            out.push_str(&memory_table(memory, self.fits));
        }
        if let (Some(context), Some(max)) = (self.context, self.max_concurrency) {
            let _ = writeln!(
                out,
                "\ncontext {context} tokens, {max} concurrent full-context request(s) fit{}",
                self.kv_tokens
                    .map_or(String::new(), |kv| format!(" ({kv} KV tokens per replica)"))
            );
        }
        if let Some(t) = &self.throughput {
            let _ = writeln!(
                out,
                "decode estimate (bandwidth roofline, per replica): {:.0} tok/s single stream, {:.0} tok/s at {} streams",
                t.single_stream_tokens_per_s, t.batched_tokens_per_s, t.batch
            );
        }
        if let Some(engine) = &self.engine {
            let _ = writeln!(out, "run with: {}", engine.vllm_command(&self.model.name));
        }
        if !self.assignments.is_empty() {
            out.push('\n');
            let mut table = Table::new(["REPLICA", "STAGE", "NODE", "DEVICES"]);
            for a in &self.assignments {
                table.row([
                    a.replica.to_string(),
                    a.stage.to_string(),
                    a.node.clone(),
                    a.devices.join(","),
                ]);
            }
            out.push_str(&table.render());
        }
    }
}

fn memory_table(memory: &DeviceMemory, fits: bool) -> String {
    let mut table = Table::new(["PER DEVICE", "BYTES", ""]);
    let rows = [
        ("weights", memory.weights),
        ("kv cache", memory.kv_cache),
        ("activations", memory.activations),
        ("overhead", memory.overhead),
        ("total", memory.total),
        ("budget", memory.budget),
        ("capacity", memory.capacity),
    ];
    for (name, bytes) in rows {
        let share = if memory.budget.0 > 0 && name != "capacity" && name != "budget" {
            format!(
                "{:.0}% of budget",
                100.0 * bytes.as_f64() / memory.budget.as_f64()
            )
        } else {
            String::new()
        };
        table.row([name.to_string(), bytes.to_string(), share]);
    }
    let mut text = table.render();
    if !fits && memory.total > memory.budget {
        let _ = writeln!(
            text,
            "over budget by {}",
            memory.total.saturating_sub(memory.budget)
        );
    }
    text
}

/// What a suggestion changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum Change {
    /// Serve shorter requests (`--context`).
    Context {
        /// Tokens per request.
        context: u64,
    },
    /// Hold fewer requests at once (`--concurrency`).
    Concurrency {
        /// Concurrent full-context requests.
        concurrency: u64,
    },
    /// Pin another weight precision (`--precision`).
    Precision {
        /// The precision.
        precision: Precision,
    },
    /// Another KV-cache type (`--kv-dtype`).
    KvDtype {
        /// The KV-cache type.
        kv_dtype: KvDtype,
    },
    /// Allow more nodes (`--max-nodes`).
    MaxNodes {
        /// The node cap.
        max_nodes: u32,
    },
    /// Place another number of replicas (`--replicas`).
    Replicas {
        /// Replicas.
        replicas: u32,
    },
    /// Add nodes to the fleet: `count` copies of node `like` holding its `devices` devices of
    /// `product` (its other devices are not needed), all free; with `max_nodes`, raise the
    /// node cap to it as well (rendered `with --max-nodes M`, which the controller rewrites to
    /// `spec.constraints.maxNodes=M`).
    AddNodes {
        /// The node to copy.
        like: String,
        /// The device product the copies carry.
        product: String,
        /// Devices of `product` on each copy.
        devices: u32,
        /// Copies to add.
        count: u32,
        /// The node cap the enlarged fleet needs, when the asked one is too low.
        max_nodes: Option<u32>,
    },
}

/// A change that makes the goal fit, and the line that explains it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Suggestion {
    /// The change.
    #[serde(flatten)]
    pub change: Change,
    /// What users read (also in the plan's `suggestions`).
    pub text: String,
}

impl Suggestion {
    /// A suggestion whose line is the change's flag followed by `why`.
    pub fn new(change: Change, why: impl std::fmt::Display) -> Self {
        let text = match &change {
            Change::Context { context } => format!("--context {context}: {why}"),
            Change::Concurrency { concurrency } => format!("--concurrency {concurrency}: {why}"),
            Change::Precision { precision } => format!("--precision {precision}: {why}"),
            Change::KvDtype { kv_dtype } => {
                format!("--kv-dtype {}: {why}", kv_dtype.resolved_name())
            }
            Change::MaxNodes { max_nodes } => format!("--max-nodes {max_nodes}: {why}"),
            Change::Replicas { replicas } => format!("--replicas {replicas}: {why}"),
            Change::AddNodes {
                like,
                product,
                devices,
                count,
                max_nodes,
            } => format!(
                "add {count} more node(s) like {like} ({devices} x {product}){}: {why}",
                max_nodes.map_or(String::new(), |m| format!(" with --max-nodes {m}"))
            ),
        };
        Self { change, text }
    }
}
