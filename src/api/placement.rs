//! `ModelPlacement`: a namespaced request to place a model on the fleet, and the controller's
//! answer in its status.
//!
//! The spec says *what* (a model, by preset, parameter count or an inline Hugging Face
//! `config.json`), *for what* (serving at a context length and concurrency, or a training
//! method) and *within which limits* (precision, families, products, node selector, node
//! count). Validation happens in two layers: the OpenAPI schema and CEL rules make the
//! apiserver reject nonsense outright (two model sources, a zero context); what only the
//! planner can judge (an unknown preset, a model that does not fit) becomes a `Planned=False`
//! condition with a reason.
//!
//! The status carries the chosen plan, the device assignments, and a ready-made
//! `nodeSelector` that selects exactly the chosen nodes through a placement label.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

// The enums below are the API's own, not the planner's: a variant the planner adds (a
// precision only `hwaccel plan` offers, say) must not change the CRD. Their wire names are
// the planner's flag names; `controller::placement::core::request` converts them, and a test
// there checks every variant against the planner's parser.

// The doc line below is the CRD field's description: keep it as is.
/// Weight precision choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PrecisionChoice {
    /// Let the planner choose: the highest precision that fits.
    #[default]
    Auto,
    /// bfloat16.
    Bf16,
    /// float16.
    Fp16,
    /// 8-bit float.
    Fp8,
    /// 8-bit integer.
    Int8,
    /// 4-bit integer (AWQ/GPTQ).
    Int4,
    /// 4-bit NormalFloat (QLoRA).
    Nf4,
    /// 4-bit float (MXFP4/NVFP4).
    Fp4,
}

/// A fine-tuning method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TrainMethod {
    /// Every parameter trained.
    Full,
    /// Low-rank adapters on a frozen 16-bit base.
    Lora,
    /// Low-rank adapters on a frozen NF4 base.
    Qlora,
    /// Direct preference optimisation: full fine-tuning plus a frozen reference model.
    Dpo,
}

// The doc line below is the CRD field's description.
/// Precision of the optimizer's states: `fp32` (the default: mixed precision, FP32 master
/// weights and Adam moments, 16 bytes per trained parameter), `bf16` (weights, gradients and
/// moments in BF16, 8 bytes) or `8bit` (8-bit Adam moments, FP32 master, 10 bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OptimizerStates {
    /// FP32 master weights and Adam moments (mixed precision).
    #[default]
    #[serde(rename = "fp32")]
    Fp32,
    /// Weights, gradients and Adam moments all in BF16.
    #[serde(rename = "bf16")]
    Bf16,
    /// 8-bit Adam moments (bitsandbytes), FP32 master weights.
    #[serde(rename = "8bit")]
    EightBit,
}

// The doc line below is the CRD field's description.
/// How the training loss is computed: `standard` (the default: transformers' cross-entropy on
/// the whole logits tensor, upcast to FP32) or `fused` (a fused linear cross-entropy over
/// chunks of tokens, such as Liger Kernel's with `use_liger_kernel=True`; the logits are never
/// whole, which saves about 12 bytes per token and vocabulary entry).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TrainLoss {
    /// transformers' cross-entropy on the whole logits tensor.
    #[default]
    Standard,
    /// A fused linear cross-entropy over chunks of tokens (Liger Kernel).
    Fused,
}

// The doc line below is the CRD field's description.
/// How AdamW steps: `fused` (the default: each parameter updated in place, as the HF
/// Trainer's `adamw_torch_fused` and DeepSpeed's FusedAdam do) or `foreach` (PyTorch's
/// multi-tensor path, `torch.optim.AdamW`'s default on CUDA and the HF Trainer's `adamw_torch`,
/// which holds a copy of the moments during the step).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TrainAdamw {
    /// Each parameter updated in place.
    #[default]
    Fused,
    /// PyTorch's multi-tensor path: a copy of the moments during the step.
    Foreach,
}

// The doc line below is the CRD field's description.
/// Which kernels run the layers' norms, rotary embedding and MLP activation: `standard` (the
/// default: transformers' own) or `liger` (Liger Kernel's RMSNorm, RoPE and SwiGLU/GeGLU, as
/// `use_liger_kernel=True` puts them in beside its fused loss; they keep less for the backward
/// pass).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TrainKernels {
    /// transformers' own modeling code.
    #[default]
    Standard,
    /// Liger Kernel's layer kernels.
    Liger,
}

/// Desired placement of one model.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "hwaccel.io",
    version = "v1alpha1",
    kind = "ModelPlacement",
    plural = "modelplacements",
    shortname = "mp",
    namespaced,
    status = "ModelPlacementStatus",
    printcolumn = r#"{"name":"Model","type":"string","jsonPath":".status.model"}"#,
    printcolumn = r#"{"name":"Precision","type":"string","jsonPath":".status.plan.precision"}"#,
    printcolumn = r#"{"name":"TP","type":"integer","jsonPath":".status.plan.tensorParallel"}"#,
    printcolumn = r#"{"name":"PP","type":"integer","jsonPath":".status.plan.pipelineParallel"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".status.plan.replicas"}"#,
    printcolumn = r#"{"name":"Nodes","type":"string","jsonPath":".status.nodeNames","priority":1}"#,
    printcolumn = r#"{"name":"Claims","type":"string","jsonPath":".status.claimNames","priority":1}"#,
    printcolumn = r#"{"name":"Devices","type":"string","jsonPath":".status.deviceNames","priority":1}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Conformant","type":"string","jsonPath":".status.conditions[?(@.type==\"Conformant\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ModelPlacementSpec {
    /// The model to place.
    pub model: ModelSource,
    /// What the model is placed for.
    pub goal: Goal,
    /// Limits on the choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraints: Option<Constraints>,
    /// Serving replicas (data-parallel copies), each holding its share of the concurrency.
    /// Without it, the controller places as many as the concurrency needs. Training picks
    /// its own data-parallel degree and ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1024").message("replicas must be between 1 and 1024"))]
    pub replicas: Option<u32>,
    /// How the chosen devices are held: `labels` (a nodeSelector and the controller's own
    /// ledger), `claims` (ResourceClaims allocated to exactly the chosen devices, which
    /// Kubernetes enforces; only devices a DRA driver publishes are planned on), `auto`
    /// (claims when every chosen device is published by a DRA driver, labels otherwise) or
    /// `claimTemplate` (a ResourceClaimTemplate whose prioritized list holds the planner's
    /// alternatives in order; the scheduler picks the devices, nothing is reserved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<AllocationMode>,
    /// The serving engine and the settings of it that change memory (default: today's vLLM
    /// with its defaults, named in the plan's reasons). Serving only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineSpec>,
}

/// The serving engine (issue 23): which one, which version, and its memory settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.memFractionStaticPercent) || (has(self.name) && self.name == 'sglang')").message("memFractionStaticPercent is SGLang's setting: set name: sglang"))]
#[x_kube(validation = Rule::new("!has(self.maxNumSeqs) || !has(self.maxNumBatchedTokens) || self.maxNumBatchedTokens >= self.maxNumSeqs").message("maxNumBatchedTokens must be at least maxNumSeqs"))]
pub struct EngineSpec {
    /// `vllm` (default) or `sglang`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<EngineName>,
    /// A release as the engine prints it (`0.10`, `0.11.2`, `0.10.1.1`, `0.6.6.post1`,
    /// `0.4.1+cu121`) or a vLLM generation (`v0`: 0.7 and earlier, `v1`: 0.8 to 0.20,
    /// `current`: 0.21 and later); default `current`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^(v0|v1|current|latest|v?[0-9]{1,4}[.][0-9]{1,4}([.][a-z0-9]{1,12}){0,2}([+][a-z0-9.]{1,24})?)$')").message("version must be a release such as 0.10, 0.11.2, 0.10.1.1 or 0.6.6.post1, or v0, v1 or current"))]
    pub version: Option<String>,
    /// Run without CUDA graphs (vLLM `--enforce-eager`, SGLang `--disable-cuda-graph`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enforce_eager: bool,
    /// Sequences run at once (vLLM `--max-num-seqs`, SGLang `--max-running-requests`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 65536").message("maxNumSeqs must be between 1 and 65536"))]
    pub max_num_seqs: Option<u32>,
    /// Tokens per scheduler step (vLLM `--max-num-batched-tokens`, SGLang
    /// `--chunked-prefill-size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 4194304").message("maxNumBatchedTokens must be between 1 and 4194304"))]
    pub max_num_batched_tokens: Option<u32>,
    /// SGLang's `--mem-fraction-static` in percent (weights and KV pool per device); replaces
    /// `constraints.memoryUtilizationPercent`. Default: SGLang's own for the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 100").message("memFractionStaticPercent must be between 10 and 100"))]
    pub mem_fraction_static_percent: Option<u32>,
}

/// The serving engines a placement can name.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum EngineName {
    /// vLLM.
    #[default]
    Vllm,
    /// SGLang.
    Sglang,
}

/// How a placement holds its devices (see `docs/dra.md`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum AllocationMode {
    /// Claims where every chosen device is published by a DRA driver, labels otherwise.
    #[default]
    Auto,
    /// A nodeSelector and the controller's ledger only.
    Labels,
    /// ResourceClaims allocated by the controller; only DRA-published devices are planned on.
    Claims,
    /// A ResourceClaimTemplate listing the planner's alternatives in order; the scheduler
    /// picks the devices and nothing is reserved by the controller.
    ClaimTemplate,
}

impl AllocationMode {
    /// The name used in the spec and the status.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Labels => "labels",
            Self::Claims => "claims",
            Self::ClaimTemplate => "claimTemplate",
        }
    }
}

/// Where the model's architecture comes from: exactly one source.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.preset), has(self.parameters), has(self.huggingFaceConfig)].filter(x, x).size() == 1").message("set exactly one of preset, parameters or huggingFaceConfig"))]
pub struct ModelSource {
    /// A built-in model preset (`llama-3.1-70b`); `hwaccel plan --list-models` lists them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9][a-z0-9._-]{0,127}$')").message("preset must be a lowercase model key such as llama-3.1-70b"))]
    pub preset: Option<String>,
    /// A bare parameter count (`70B`, `8B`, `1.5T`, `350M`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+([.][0-9]+)?[KMBT]$')").message("parameters must look like 70B, 1.5T or 350M"))]
    pub parameters: Option<String>,
    /// An inline Hugging Face `config.json`, as its JSON text (dense, GQA, MoE, MLA and
    /// sliding-window models); at most 65,536 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "config_text")]
    pub hugging_face_config: Option<InlineJson>,
    /// Exact checkpoint size in bytes; overrides the weight bytes computed from parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0").message("checkpointBytes must be positive"))]
    pub checkpoint_bytes: Option<u64>,
    /// YaRN RoPE scaling to serve beyond the config's maximum context, as the model card
    /// gives it: `yarn:FACTOR` or `yarn:FACTOR:ORIGINAL` (Qwen3: `yarn:4:32768`); the engine
    /// is told to apply it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 40))]
    #[x_kube(validation = Rule::new("self.matches('^[yY][aA][rR][nN]:[0-9]+([.][0-9]+)?(:[0-9]+)?$')").message("ropeScaling must look like yarn:4 or yarn:4:32768"))]
    pub rope_scaling: Option<String>,
}

/// What the placement is for: exactly one of serving or training.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.serve) != has(self.train)").message("set exactly one of serve or train"))]
pub struct Goal {
    /// Serve the model for inference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<ServeGoal>,
    /// Fine-tune the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train: Option<TrainGoal>,
}

/// Serving: every request may use the full context; `concurrency` requests at once.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.prefillReplicas) || (has(self.disaggregated) && self.disaggregated)").message("prefillReplicas needs disaggregated: true"))]
pub struct ServeGoal {
    /// Context length in tokens (prompt plus output) each request may use.
    #[serde(default = "default_context")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 10485760").message("context must be between 1 and 10485760 tokens"))]
    pub context: u32,
    /// Requests served at the same time across all replicas.
    #[serde(default = "default_concurrency")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1048576").message("concurrency must be between 1 and 1048576"))]
    pub concurrency: u32,
    /// Plan a decode pool (for `concurrency`) and a separate prefill pool on other devices,
    /// whose KV caches a router hands to decode. Only with `allocation: labels` for now.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disaggregated: bool,
    /// Prefill replicas (default 1), each holding one full-context request; only with
    /// `disaggregated: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 64").message("prefillReplicas must be between 1 and 64"))]
    pub prefill_replicas: Option<u32>,
}

fn default_context() -> u32 {
    8192
}

fn default_concurrency() -> u32 {
    1
}

/// Training: method and batch shape.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainGoal {
    /// The method.
    pub method: TrainMethod,
    /// Sequence length in tokens.
    #[serde(default = "default_seq_len")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1048576").message("seqLen must be between 1 and 1048576"))]
    pub seq_len: u32,
    /// Sequences per device per step.
    #[serde(default = "default_micro_batch")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 4096").message("microBatch must be between 1 and 4096"))]
    pub micro_batch: u32,
    /// LoRA adapter rank (lora and qlora; adapters on every attention and MLP projection).
    #[serde(default = "default_lora_rank")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 4096").message("loraRank must be between 1 and 4096"))]
    pub lora_rank: u32,
    /// Precision of the optimizer's states: `fp32` (the default: mixed precision, FP32 master
    /// weights and Adam moments, 16 bytes per trained parameter), `bf16` (weights, gradients
    /// and moments in BF16, 8 bytes) or `8bit` (8-bit Adam moments, FP32 master, 10 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_states: Option<OptimizerStates>,
    /// How the loss is computed: `standard` (the default: transformers' cross-entropy on the
    /// whole logits tensor, upcast to FP32) or `fused` (a fused linear cross-entropy over
    /// chunks of tokens, such as Liger Kernel's with `use_liger_kernel=True`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<TrainLoss>,
    /// How AdamW steps: `fused` (the default: each parameter updated in place, as the HF
    /// Trainer's `adamw_torch_fused` and DeepSpeed's FusedAdam do) or `foreach` (PyTorch's
    /// multi-tensor path, `torch.optim.AdamW`'s default on CUDA and the HF Trainer's
    /// `adamw_torch`, which holds a copy of the moments during the step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adamw: Option<TrainAdamw>,
    /// Which kernels run the layers' norms, rotary embedding and MLP activation: `standard`
    /// (the default: transformers' own) or `liger` (Liger Kernel's RMSNorm, RoPE and
    /// SwiGLU/GeGLU, as `use_liger_kernel=True` puts them in beside its fused loss).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels: Option<TrainKernels>,
}

fn default_seq_len() -> u32 {
    4096
}

fn default_micro_batch() -> u32 {
    1
}

fn default_lora_rank() -> u32 {
    16
}

/// Limits on where and how the model is placed.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Constraints {
    /// Weight precision; `auto` picks the highest that fits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<PrecisionChoice>,
    /// KV-cache precision (`auto` follows the weights' 16-bit type; `fp8` halves the cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_precision: Option<PrecisionChoice>,
    /// Accelerator families allowed (`gpu`, `tpu`, `asic`...); empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    #[x_kube(validation = Rule::new("self.all(f, f in ['gpu', 'tpu', 'npu', 'asic'])").message("families must be among gpu, tpu, npu, asic"))]
    pub families: Vec<String>,
    /// Accelerator products allowed, as the `hwaccel.io/product` label slug
    /// (`nvidia-h100-80gb-hbm3`); empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.all(p, size(p) <= 128)").message("each product must be at most 128 characters (a hwaccel.io/product label value is at most 63)"))]
    pub products: Vec<String>,
    /// Only nodes whose labels match all of these.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("self.all(k, size(k) <= 317 && size(self[k]) <= 63)").message("nodeSelector keys must be at most 317 characters and values at most 63 (Kubernetes label limits)"))]
    pub node_selector: BTreeMap<String, String>,
    /// At most this many nodes per replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1024").message("maxNodes must be between 1 and 1024"))]
    pub max_nodes: Option<u32>,
    /// Share of each device's memory the serving engine may use, in percent (vLLM's
    /// `gpu_memory_utilization` × 100). Default 90.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 100").message("memoryUtilizationPercent must be between 10 and 100"))]
    pub memory_utilization_percent: Option<u32>,
    /// Plan whole devices only: no share of a device a DRA driver publishes shareable (a
    /// `claimTemplate` placement may otherwise ask for a share sized to the model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub whole_devices: Option<bool>,
}

/// Observed state, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelPlacementStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Planned`, `Ready` and `Degraded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// One word for `kubectl get`: `Planned`, `Pending` (does not fit now) or `Invalid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The model as understood (`llama-3.1-70b`, `70B params`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The chosen plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanStatus>,
    /// Devices assigned, per node and stage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16384))]
    pub assignments: Vec<Assignment>,
    /// Chosen nodes, comma-separated, for `kubectl get -o wide`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 262144))]
    pub node_names: Option<String>,
    /// A nodeSelector that selects exactly the chosen nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// How the devices are held now: `labels`, `claims` or `claimTemplate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub allocation: Option<String>,
    /// The ResourceClaims holding the devices, one per replica and pipeline stage, each
    /// with the pod spec fragment that uses it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4096))]
    pub claims: Vec<PlacementClaim>,
    /// The claims' names, comma-separated (for `kubectl get mp -o wide`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 262144))]
    pub claim_names: Option<String>,
    /// The held DRA devices as `pool/device`, comma-separated (for `kubectl get mp -o wide`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 262144))]
    pub device_names: Option<String>,
    /// The ResourceClaimTemplate (`allocation: claimTemplate`), named after the placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub claim_template: Option<String>,
    /// The template's alternatives in the order the scheduler tries them
    /// (`2x gpu.nvidia.com >=75Gi`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(length(max = 128)))]
    pub alternatives: Vec<String>,
    /// What to copy into the workload's pod template to use the claim template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<PodTemplateClaimFragment>,
    /// The serving engines' command-line arguments for the plan (serving plans that fit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineStatus>,
    /// Disaggregated serving: the prefill pool (plan, devices, nodes, engine). The fields
    /// above then describe the decode pool, except `nodeNames` and `nodeSelector`, which cover
    /// the whole placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<PrefillStatus>,
    /// Disaggregated serving: the decode pool's nodes and the role nodeSelector that picks
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode: Option<RoleNodes>,
    /// Why the model does not fit, or what constrained the choice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// What would make it fit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suggestions: Vec<String>,
}

impl ModelPlacementStatus {
    /// Every device assignment the placement holds: the decode (or only) pool's, then the
    /// prefill pool's.
    pub fn all_assignments(&self) -> impl Iterator<Item = &Assignment> {
        self.assignments.iter().chain(
            self.prefill
                .iter()
                .flat_map(|prefill| prefill.assignments.iter()),
        )
    }
}

/// The prefill pool of a disaggregated placement.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrefillStatus {
    /// The prefill pool's plan in numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanStatus>,
    /// The prefill pool's devices, per node and stage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16384))]
    pub assignments: Vec<Assignment>,
    /// The prefill pool's nodes, comma-separated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 262144))]
    pub node_names: Option<String>,
    /// A nodeSelector that selects exactly the prefill pool's nodes (the role label).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// The serving engines' arguments for a prefill instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineStatus>,
}

/// One role's nodes in a disaggregated placement.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleNodes {
    /// The role's nodes, comma-separated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 262144))]
    pub node_names: Option<String>,
    /// A nodeSelector that selects exactly the role's nodes (the role label).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
}

/// The plan in numbers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanStatus {
    /// Weight precision.
    pub precision: String,
    /// Tensor-parallel degree.
    pub tensor_parallel: u32,
    /// Pipeline-parallel degree.
    pub pipeline_parallel: u32,
    /// Model replicas.
    pub replicas: u32,
    /// Devices in total.
    pub devices: u32,
    /// Nodes in total.
    pub nodes: u32,
    /// Concurrent full-context requests that fit per replica (serving).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u64>,
    /// Memory on each device, in bytes.
    pub memory_per_device: MemoryBreakdown,
    /// Estimated decode tokens per second per replica (memory-bandwidth roofline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_tokens_per_second: Option<u64>,
    /// How much of each device a replica takes, on devices a DRA driver publishes shareable:
    /// a share (its claim requests `bytes` of the device's memory) or the whole device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<FractionStatus>,
}

/// How much of a device each replica takes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FractionStatus {
    /// `partition`, `share` or `device`.
    #[schemars(length(max = 16))]
    pub kind: String,
    /// Bytes of the device's memory each replica takes (what a share's claim requests).
    pub bytes: u64,
    /// The device's memory, in bytes.
    pub device_bytes: u64,
    /// The partition's profile (`3g.40gb`), for a partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub profile: Option<String>,
}

/// The arguments that make a serving engine run the plan (`hwaccel plan -o yaml` prints the
/// same under `engine`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineStatus {
    /// The engine the plan's memory was accounted for (`vllm`, `sglang`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub engine: Option<String>,
    /// Its version (`current` unless `spec.engine.version` named one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub version: Option<String>,
    /// The container image that runs the engine on the planned devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub image: Option<String>,
    /// Why no image runs the engine on the planned devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub image_refusal: Option<String>,
    /// The extended resource a pod asks for to get one of the planned devices from the
    /// vendor's device plugin (`nvidia.com/gpu`, `amd.com/gpu`...), when one is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub device_resource: Option<String>,
    /// The model name to serve (a preset's Hugging Face repository), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub model: Option<String>,
    /// Arguments after `vllm serve <model>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 256)))]
    pub vllm: Vec<String>,
    /// Arguments after `python -m sglang.launch_server --model-path <model>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 256)))]
    pub sglang: Vec<String>,
    /// What the arguments cannot say (a pre-quantized checkpoint is needed...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 1024)))]
    pub notes: Vec<String>,
}

/// Per-device memory, in bytes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryBreakdown {
    /// Model weights (or the shard on this device).
    pub weights: u64,
    /// KV cache (serving) or optimizer state and gradients (training).
    pub kv_cache: u64,
    /// Activations.
    pub activations: u64,
    /// Runtime overhead.
    pub overhead: u64,
    /// Sum of the above.
    pub total: u64,
    /// Usable capacity of the device.
    pub capacity: u64,
}

/// Devices of one node given to one replica's pipeline stage.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Assignment {
    /// Node name.
    pub node: String,
    /// Device names as in the node's AcceleratorInventory.
    pub devices: Vec<String>,
    /// Replica index.
    pub replica: u32,
    /// Pipeline stage index.
    pub stage: u32,
}

/// One ResourceClaim a placement holds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementClaim {
    /// The claim's name, in the placement's namespace.
    #[schemars(length(max = 253))]
    pub name: String,
    /// The replica it serves.
    pub replica: u32,
    /// The pipeline stage it serves.
    pub stage: u32,
    /// The node its devices are on.
    #[schemars(length(max = 253))]
    pub node: String,
    /// The devices it is allocated to.
    #[schemars(length(max = 32))]
    pub devices: Vec<crate::api::DeviceRef>,
    /// True once the allocation is written (the devices are then held).
    pub allocated: bool,
    /// What to copy into the pod template of the workload for this replica and stage.
    pub pod_template: PodClaimFragment,
}

/// The part of a pod spec that uses a placement's claim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodClaimFragment {
    /// `spec.resourceClaims` of the pod.
    #[schemars(length(max = 1))]
    pub resource_claims: Vec<PodResourceClaimRef>,
    /// `spec.nodeSelector` of the pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
}

/// One entry of a pod's `spec.resourceClaims`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodResourceClaimRef {
    /// The name containers use in `resources.claims[].name`.
    #[schemars(length(max = 63))]
    pub name: String,
    /// The ResourceClaim.
    #[schemars(length(max = 253))]
    pub resource_claim_name: String,
}

/// The part of a pod spec that uses a placement's ResourceClaimTemplate: each pod gets its
/// own claim made from it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplateClaimFragment {
    /// `spec.resourceClaims` of the pod.
    #[schemars(length(max = 1))]
    pub resource_claims: Vec<PodResourceClaimTemplateRef>,
}

/// One entry of a pod's `spec.resourceClaims` that names a ResourceClaimTemplate.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodResourceClaimTemplateRef {
    /// The name containers use in `resources.claims[].name`.
    #[schemars(length(max = 63))]
    pub name: String,
    /// The ResourceClaimTemplate.
    #[schemars(length(max = 253))]
    pub resource_claim_template_name: String,
}

/// Characters an inline `config.json` may have. Real ones have 1 to 10 KiB (the largest seen,
/// a quantised MoE listing every ignored module, about 30 KiB). The bound is on the text, so
/// the apiserver enforces it with `maxLength`, at no CEL cost, whatever the JSON inside:
/// a free-form object could be bounded only in its number of top-level keys, and one
/// placement reached 1.3 MB that way (issue 27 item 1).
pub const MAX_CONFIG_CHARS: u32 = 65_536;

fn config_text(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": MAX_CONFIG_CHARS,
        "description": "An inline Hugging Face config.json, as its JSON text (at most 65,536 characters).",
    })
}

/// An inline `config.json`: the JSON text a tenant wrote.
///
/// Whoever keeps many placements (the controller's caches above all) keeps a bounded model
/// description, not what the tenant stored: its projection of a placement calls
/// [`InlineJson::reduce_with`] with the planner's subset (`controller::cache`), about 1 KiB of
/// a real config. Text that is not a JSON object (malformed, nested too deeply to decode, an
/// array) is kept as it is, within the CRD's bound, so the planner reports its own error for
/// it and that placement alone becomes `Invalid`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct InlineJson(String);

impl InlineJson {
    /// Keeps `subset` of the text when it is a JSON object and `subset` gives one, else the
    /// text as it is.
    pub fn reduce_with(
        &mut self,
        subset: impl FnOnce(&serde_json::Value) -> Option<serde_json::Value>,
    ) {
        let kept = serde_json::from_str::<serde_json::Value>(&self.0)
            .ok()
            .and_then(|value| subset(&value));
        if let Some(kept) = kept {
            self.0 = kept.to_string();
        }
    }

    /// The JSON text.
    pub fn text(&self) -> &str {
        &self.0
    }

    /// Decodes the value (fails on malformed or too deeply nested JSON).
    pub fn value(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(&self.0)
    }
}

impl TryFrom<serde_json::Value> for InlineJson {
    type Error = serde_json::Error;

    /// The value's JSON text (a test and tool convenience; never fails for a `Value`).
    fn try_from(value: serde_json::Value) -> Result<Self, Self::Error> {
        serde_json::to_string(&value).map(Self)
    }
}

impl ModelPlacementStatus {
    /// This status cut to the CRD's size bounds, so that writing it is never refused for size
    /// (the controller would retry a refused write forever). Plans stay far inside them; what
    /// a cut removes is named in `reasons`.
    pub fn fitted(self) -> Self {
        let Some(schema) = super::crds::field_schema("ModelPlacement", "status") else {
            return self;
        };
        let (mut fitted, cut) = super::bounds::fit_typed(self, schema, "status");
        if !cut.is_empty() {
            fitted
                .reasons
                .truncate(super::bounds::room_for_one_more(schema, "reasons"));
            fitted.reasons.push(format!(
                "status cut to fit its size limits: {}",
                super::bounds::describe_cut(&cut)
            ));
        }
        fitted
    }
}

impl PartialEq for InlineJson {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}
