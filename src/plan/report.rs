//! The plan as the planner reports it: one serialisable [`Plan`] for `-o json` (and for the
//! controller's status), and a table that explains the memory behind the decision.

use serde::Serialize;

use crate::hardware::Precision;

use super::capability::Execution;
use super::kv::KvDtype;
use super::memory::DeviceMemory;
use super::model::rope::RopeScaling;
use super::model::{Model, ModelSource};
use super::packing::Assignment;
use super::throughput::ThroughputEstimate;
use super::training::{Adamw, Kernels, Loss, Method, OptimizerStates, ZeroStage};
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
    /// The loss assumed.
    pub loss: Loss,
    /// The AdamW implementation assumed.
    pub adamw: Adamw,
    /// The layer kernels assumed.
    pub kernels: Kernels,
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
    /// How much of each device the plan takes, for plans on devices a DRA driver publishes
    /// shareable: a share of each (its claim requests `bytes` of the device's memory) or the
    /// whole of each (its claim requests all of it). Absent for every other plan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fraction: Option<Fraction>,
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
            fraction: None,
            prefill: None,
        }
    }
}

/// How much of a shareable device each of a plan's replicas takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fraction {
    /// A partition, a share of the device's memory, or the whole device.
    pub kind: FractionKind,
    /// What each replica takes of the device's memory: the partition's, the share as the
    /// driver's policy rounds it (what its claim requests), or all of it.
    pub bytes: Bytes,
    /// The device's memory.
    pub device_bytes: Bytes,
    /// The partition's profile (`3g.40gb`), for a partition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// Which fraction of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FractionKind {
    /// A partition the driver publishes (an NVIDIA MIG device), held whole.
    Partition,
    /// A share of a device others may share too (`capacity.requests.memory`).
    Share,
    /// The whole device (a claim for all of its capacity, so no share lands beside it).
    Device,
}

impl FractionKind {
    /// The name the JSON, the table and the CRD status use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Partition => "partition",
            Self::Share => "share",
            Self::Device => "device",
        }
    }
}

/// The engines' arguments for one plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineSettings {
    /// The engine the plan's memory was accounted for (`vllm`, `sglang`); the other engine's
    /// arguments are rendered too, converted to the same weights and KV pool.
    pub engine: String,
    /// Its version or generation (`current` when none was given).
    pub version: String,
    /// The container image that runs this engine on the plan's devices
    /// ([`super::engine::images::image_for`]); `None` when none does (`image_refusal` says why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Why no image runs the engine on the plan's devices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_refusal: Option<String>,
    /// The extended resource a pod asks for to get one of the plan's devices from the
    /// vendor's device plugin (`nvidia.com/gpu`, `amd.com/gpu`...,
    /// [`super::engine::images::device_plugin_resource`]); `None` when no known plugin serves them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_resource: Option<String>,
    /// The name to pass the engine (a preset's Hugging Face repository); `None` when the plan
    /// came from a file or a parameter count, whose repository the planner does not know.
    pub model: Option<String>,
    /// Arguments after `vllm serve <model>`.
    pub vllm: Vec<String>,
    /// Arguments after `python -m sglang.launch_server --model-path <model>`.
    pub sglang: Vec<String>,
    /// What the arguments cannot say (a pre-quantized checkpoint is needed...).
    pub notes: Vec<String>,
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
