//! `hwaccel plan --emit deployment|lws`: the plan as a workload to apply, running
//! `vllm serve <model> <the plan's vLLM arguments>` (or SGLang's server for a plan made with
//! `--engine sglang`) in the image that runs that engine on the plan's devices
//! ([`crate::plan::engine::images`]), or refusing with the reason when none does.
//!
//! A replica that fits on one node becomes a Deployment (one pod per replica); a replica that
//! spans nodes becomes a LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`, one group per
//! replica, `size` = nodes per replica) whose leader starts a Ray head and `vllm serve`, and
//! whose workers join it, as in vLLM's own LWS recipe (vllm-project/vllm,
//! `docs/deployment/frameworks/lws.md`; the helper script ships in the official image at
//! `/vllm-workspace/examples/online_serving/multi-node-serving.sh`).
//!
//! Where the pods go:
//! - `--placement FILE|-` (a ModelPlacement as `kubectl get mp NAME -o yaml` prints it): its
//!   status is the plan. `labels`: the status's `nodeSelector`; `claims`: each replica's
//!   ResourceClaims (one Deployment per replica, as each replica holds its own claims);
//!   `claimTemplate`: the status's `podTemplate` claim, one claim per pod.
//! - without it, the plan's own nodes, through required node affinity on
//!   `kubernetes.io/hostname`.
//!
//! Devices: without claims, each pod asks for its node's share of the replica's devices as the
//! vendor device plugin's extended resource (`--resource-name` overrides it), from the table in
//! [`crate::plan::engine::images::device_plugin_resource`] (NVIDIA `nvidia.com/gpu`, AMD
//! `amd.com/gpu`, Intel `gpu.intel.com/i915` and `habana.ai/gaudi`, AWS
//! `aws.amazon.com/neuron`, Google `google.com/tpu`, Qualcomm `qualcomm.com/qaic`): of the
//! plan's first device, or as a placement's `status.engine.deviceResource` names it.
//!
//! A disaggregated plan (`--disaggregated`, or a placement whose status has a `prefill` pool)
//! emits one workload per pool, `<name>-decode` and `<name>-prefill`, each placed by its own
//! nodes or role nodeSelector and running its pool's arguments.
//!
//! A plan that does not fit emits nothing: the reasons go to stderr and the exit code is 2.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::placement::{ModelPlacementStatus, PlacementClaim, PrefillStatus};
use crate::hardware::Vendor;
use crate::names::keys::PLACEMENT_LABEL;
use crate::output::{self, Format};
use crate::plan::engine::choice::EngineKind;
use crate::plan::engine::images::device_plugin_resource;
use crate::plan::error::{PlanError, Result};
use crate::plan::inventory::NodeSpec;
use crate::plan::load::read_text;
use crate::plan::report::{FractionKind, Plan};

mod validate;

/// Largest placement file read (a status with every bound filled stays far below).
const MAX_PLACEMENT_BYTES: u64 = 16 << 20;

/// The official vLLM image (docs.vllm.ai, "Using Docker"): what a placement whose status
/// names no image runs (a controller older than the image table).
pub const DEFAULT_IMAGE: &str = "docker.io/vllm/vllm-openai:latest";

/// vLLM's OpenAI-compatible server port (`vllm serve --port`, default 8000).
const PORT: i32 = 8000;

/// The Ray helper in the official vLLM image.
const RAY_HELPER: &str = "/vllm-workspace/examples/online_serving/multi-node-serving.sh";

/// Which workload to render.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EmitKind {
    /// A Deployment: one pod per replica (a replica must fit one node).
    Deployment,
    /// A LeaderWorkerSet: one group of pods per replica, one pod per node.
    Lws,
}

/// Flags of `hwaccel plan --emit`.
#[derive(Debug, Clone, clap::Args)]
pub struct EmitArgs {
    /// Print a workload that runs the plan with its engine (vLLM, or SGLang with --engine
    /// sglang) instead of the plan itself.
    #[arg(long, value_enum)]
    pub emit: Option<EmitKind>,
    /// A ModelPlacement (`kubectl get mp NAME -o yaml`, JSON or YAML; `-` for stdin) whose
    /// status is the plan: its nodeSelector or claims place the pods.
    #[arg(long, requires = "emit", conflicts_with_all = ["model", "params", "hardware", "inventory", "resource_slices"])]
    pub placement: Option<PathBuf>,
    /// Container image (default: the plan's engine's image for its devices, from the table
    /// in docs/planner.md: vLLM's CUDA, ROCm, Gaudi, Neuron or TPU image, or SGLang's; a
    /// device no image runs on is refused with the reason).
    #[arg(long, requires = "emit")]
    pub image: Option<String>,
    /// The model name or path passed to `vllm serve` (default: the preset's Hugging Face
    /// repository).
    #[arg(long, requires = "emit")]
    pub served_model: Option<String>,
    /// Workload name (default: the placement's, or the model's).
    #[arg(long, requires = "emit")]
    pub name: Option<String>,
    /// Namespace written into the workload (default: none, kubectl's).
    #[arg(long, requires = "emit")]
    pub namespace: Option<String>,
    /// Extended resource each pod asks for (default: the device vendor's plugin resource, as
    /// the placement's `status.engine.deviceResource` names it with --placement).
    #[arg(long, requires = "emit")]
    pub resource_name: Option<String>,
}

/// What an emitted workload is made of, whichever way the plan came.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Object name.
    pub name: String,
    /// Namespace, when given.
    pub namespace: Option<String>,
    /// Image.
    pub image: String,
    /// The engine the container runs.
    pub engine: EngineKind,
    /// The model the engine loads.
    pub model: String,
    /// The engine's arguments.
    pub args: Vec<String>,
    /// Replicas.
    pub replicas: u32,
    /// Distinct nodes one replica spans (the LWS group size).
    pub nodes_per_replica: u32,
    /// Devices each pod uses.
    pub devices_per_pod: u32,
    /// Where the pods go.
    pub target: Target,
    /// Disaggregated serving: the prefill pool's workload (this one is then the decode pool's;
    /// the names end in `-decode` and `-prefill`).
    pub prefill: Option<Box<Workload>>,
    /// The ModelPlacement the pods run (`--placement`): stamped on the pod template as
    /// `hwaccel.io/placement`, so the controller finds them for plan conformance. Not on a
    /// prefill pool, whose arguments are not the placement's `status.engine`.
    pub placement: Option<String>,
}

/// Where a workload's pods go and how they get their devices.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// Nodes by name, devices as an extended resource.
    Hosts {
        /// Node names.
        nodes: Vec<String>,
        /// Extended resource name.
        resource: String,
    },
    /// A nodeSelector, devices as an extended resource.
    Selector {
        /// The selector.
        selector: BTreeMap<String, String>,
        /// Extended resource name.
        resource: String,
    },
    /// Per replica, the ResourceClaims its pod uses.
    Claims(Vec<Vec<PlacementClaim>>),
    /// A ResourceClaimTemplate each pod gets its own claim from: (pod claim name, template).
    ClaimTemplate(String, String),
    /// Nodes by name, each pod's device a fraction of one through a ResourceClaimTemplate
    /// emitted with the workload: a share of a device a DRA driver publishes shareable, or a
    /// partition no device plugin resource names (AMD's).
    Share {
        /// Node names.
        nodes: Vec<String>,
        /// The pod's name for its claim.
        claim: String,
        /// The ResourceClaimTemplate, as emitted.
        template: Box<Value>,
    },
}

/// Runs `hwaccel plan --emit KIND`; `planned` plans from the flags (used without
/// `--placement`).
pub fn run(
    args: &EmitArgs,
    kind: EmitKind,
    format: Format,
    planned: impl FnOnce() -> Result<(Plan, Vec<NodeSpec>)>,
) -> ExitCode {
    let workload = match &args.placement {
        Some(path) => read_placement(path).and_then(|p| from_placement(args, p)),
        None => planned().and_then(|(plan, nodes)| from_plan(args, &plan, &nodes)),
    };
    let workload = match workload {
        Ok(Ok(workload)) => workload,
        Ok(Err(refusal)) => {
            eprintln!("hwaccel plan: nothing to emit: the model does not fit");
            for line in refusal {
                eprintln!("  - {line}");
            }
            return ExitCode::from(2);
        }
        Err(err) => return fail(&err),
    };
    match render(&workload, kind, format).and_then(|text| {
        super::write_stdout(&text).map_err(|source| PlanError::Io {
            path: PathBuf::from("<stdout>"),
            source,
        })
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => fail(&err),
    }
}

fn fail(err: &PlanError) -> ExitCode {
    eprintln!("hwaccel plan: {err}");
    ExitCode::from(1)
}

fn bad(reason: impl Into<String>) -> PlanError {
    PlanError::constraint(reason.into())
}

/// The workload, or the refusal's reasons and suggestions when nothing fits.
type Built = Result<std::result::Result<Workload, Vec<String>>>;

/// From a plan made from the flags: the plan's own nodes by name.
pub fn from_plan(args: &EmitArgs, plan: &Plan, nodes: &[NodeSpec]) -> Built {
    let name = dns_name(args.name.as_deref().unwrap_or(&plan.model.name));
    let Some(prefill) = plan.prefill.as_deref() else {
        return pool_from_plan(args, plan, nodes, name);
    };
    if !plan.fits || !prefill.fits {
        let lines = plan.reasons.iter().chain(&plan.suggestions).cloned();
        return Ok(Err(lines.collect()));
    }
    let decode = pool_from_plan(args, plan, nodes, format!("{name}-decode"))?;
    let prefill = pool_from_plan(args, prefill, nodes, format!("{name}-prefill"))?;
    Ok(decode.and_then(|decode| {
        prefill.map(|prefill| Workload {
            prefill: Some(Box::new(prefill)),
            ..decode
        })
    }))
}

/// One pool of a plan (the whole plan unless it is disaggregated), named `name`.
fn pool_from_plan(args: &EmitArgs, plan: &Plan, nodes: &[NodeSpec], name: String) -> Built {
    let engine = match (&plan.engine, plan.fits) {
        (Some(engine), true) => engine,
        _ => {
            let lines = plan.reasons.iter().chain(&plan.suggestions).cloned();
            return Ok(Err(lines.collect()));
        }
    };
    let groups = plan
        .assignments
        .iter()
        .map(|a| (a.replica, a.node.clone(), a.devices.len()));
    let shape = Shape::of(groups)?;
    let nodes_of_plan: Vec<String> = shape.nodes.iter().cloned().collect();
    let fraction = plan
        .fraction
        .as_ref()
        .filter(|_| args.resource_name.is_none());
    let partition = fraction
        .filter(|f| f.kind == FractionKind::Partition)
        .and_then(|f| f.profile.as_deref())
        .filter(|_| plan_device(plan, nodes).is_ok_and(|d| d.vendor != Vendor::Nvidia));
    let target = match (fraction, partition) {
        // A device plugin hands out whole devices: a share is asked of the DRA driver.
        (Some(f), _) if f.kind == FractionKind::Share => {
            let ask = Asked::Share(f.bytes.0);
            fraction_target(args, plan, nodes, (&name, ask), nodes_of_plan)?
        }
        // NVIDIA's device plugin names each MIG profile (`device_resource`); no other
        // vendor's does, so the partition is asked of the DRA driver by its profile.
        (_, Some(profile)) => {
            let ask = Asked::Partition(profile);
            fraction_target(args, plan, nodes, (&name, ask), nodes_of_plan)?
        }
        _ => Target::Hosts {
            nodes: nodes_of_plan,
            resource: match &args.resource_name {
                Some(name) => name.clone(),
                None => device_resource(plan, nodes)?,
            },
        },
    };
    let model = served_model(args, engine.model.as_deref())?;
    let kind = engine_kind(&engine.engine)?;
    let image = pick_image(
        args,
        engine.image.as_deref(),
        engine.image_refusal.as_deref(),
    )?;
    Ok(Ok(Workload {
        name,
        namespace: args.namespace.clone(),
        image,
        engine: kind,
        model,
        args: engine_args(kind, &engine.vllm, &engine.sglang),
        replicas: shape.replicas,
        nodes_per_replica: shape.nodes_per_replica,
        devices_per_pod: shape.devices_per_pod,
        target,
        prefill: None,
        placement: None,
    }))
}

/// What a fraction's claim asks the DRA driver for.
#[derive(Debug, Clone, Copy)]
enum Asked<'a> {
    /// This many bytes of a device's memory.
    Share(u64),
    /// One partition of this profile.
    Partition(&'a str),
}

impl Asked<'_> {
    /// The pod's claim name and the template's suffix.
    fn kind(self) -> &'static str {
        match self {
            Self::Share(_) => "share",
            Self::Partition(_) => "partition",
        }
    }
}

/// Where a plan's fraction-sized replicas go: the plan's nodes, each pod with a claim made
/// from a ResourceClaimTemplate that asks the plan's DRA driver for its fraction: `bytes` of
/// one device's memory (the scheduler rounds it to the driver's policy and packs the shares,
/// as it does for a placement's template), or one partition of the profile.
fn fraction_target(
    args: &EmitArgs,
    plan: &Plan,
    nodes: &[NodeSpec],
    (name, asked): (&str, Asked<'_>),
    on: Vec<String>,
) -> Result<Target> {
    let device = plan_device(plan, nodes)?;
    let driver = crate::dra::drivers::KNOWN_DRIVERS
        .iter()
        .find(|d| {
            d.vendor == device.vendor
                && d.family == device.family
                && match asked {
                    Asked::Share(_) => d.memory.is_some(),
                    Asked::Partition(_) => d.partition.is_some(),
                }
        })
        .ok_or_else(|| {
            bad(format!(
                "the plan takes a {} of a {} device, and no known DRA driver of it publishes \
                 one: plan with --whole-devices",
                asked.kind(),
                device.product
            ))
        })?;
    let (memory_request, partition_profile) = match asked {
        Asked::Share(bytes) => (Some(bytes), None),
        Asked::Partition(profile) => (None, Some(profile.to_string())),
    };
    let alternative = crate::dra::claim_template::Alternative {
        name: asked.kind().to_string(),
        driver: driver.name.to_string(),
        product: None,
        min_memory_bytes: None,
        count: 1,
        same_domain_attribute: None,
        memory_request,
        partition_profile,
    };
    let template_name = format!("{name}-{}", asked.kind());
    let namespace = args.namespace.as_deref().unwrap_or("default");
    let template =
        crate::dra::claim_template::claim_template(namespace, &template_name, None, &[alternative])
            .map_err(|err| bad(format!("the {}'s claim template: {err}", asked.kind())))?;
    let mut template =
        serde_json::to_value(template).map_err(|err| bad(format!("internal: {err}")))?;
    if let Some(object) = template.as_object_mut() {
        object.insert("apiVersion".into(), json!("resource.k8s.io/v1"));
        object.insert("kind".into(), json!("ResourceClaimTemplate"));
        if args.namespace.is_none()
            && let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut)
        {
            meta.remove("namespace");
        }
    }
    Ok(Target::Share {
        nodes: on,
        claim: format!("accelerator-{}", asked.kind()),
        template: Box::new(template),
    })
}

/// A ModelPlacement as read from a file: the parts `--emit` uses.
#[derive(Debug, Deserialize)]
pub struct PlacementObject {
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    status: Option<ModelPlacementStatus>,
}

#[derive(Debug, Default, Deserialize)]
struct Metadata {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

/// Reads `--placement` (a file, or `-` for stdin), at most [`MAX_PLACEMENT_BYTES`].
fn read_placement(path: &Path) -> Result<PlacementObject> {
    let text = if path == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin()
            .take(MAX_PLACEMENT_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|source| PlanError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        if bytes.len() as u64 > MAX_PLACEMENT_BYTES {
            return Err(bad(format!(
                "--placement -: larger than {} MiB",
                MAX_PLACEMENT_BYTES >> 20
            )));
        }
        String::from_utf8(bytes).map_err(|_| bad("--placement -: not UTF-8 text"))?
    } else {
        read_text(path, MAX_PLACEMENT_BYTES)?
    };
    parse_placement(&text)
        .map_err(|reason| bad(format!("--placement {}: {reason}", path.display())))
}

/// Decodes a ModelPlacement from JSON or YAML (a `List` of exactly one is accepted, as
/// `kubectl get mp -o yaml` with a selector prints one).
pub fn parse_placement(text: &str) -> std::result::Result<PlacementObject, String> {
    let value: Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(_) => {
            serde_saphyr::from_str(text).map_err(|err| format!("neither JSON nor YAML: {err}"))?
        }
    };
    let value = match value.get("kind").and_then(Value::as_str) {
        Some("ModelPlacement") => value,
        Some("List") => match value
            .get("items")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
        {
            Some([one]) => one.clone(),
            _ => return Err("a List must hold exactly one ModelPlacement".to_string()),
        },
        other => return Err(format!("expected kind ModelPlacement, found {other:?}")),
    };
    serde_json::from_value(value).map_err(|err| format!("not a ModelPlacement: {err}"))
}

/// From a ModelPlacement's status: its nodeSelector or claims place the pods.
pub fn from_placement(args: &EmitArgs, placement: PlacementObject) -> Built {
    let status = placement.status.unwrap_or_default();
    let (Some(plan), false) = (&status.plan, status.assignments.is_empty()) else {
        let mut lines: Vec<String> = status
            .reasons
            .iter()
            .chain(&status.suggestions)
            .cloned()
            .collect();
        if lines.is_empty() {
            lines.push(format!(
                "the placement is not planned (state {})",
                status.state.as_deref().unwrap_or("unknown")
            ));
        }
        return Ok(Err(lines));
    };
    let engine = status.engine.as_ref().ok_or_else(|| {
        bad("the placement's status has no engine arguments (a controller older than this CLI?)")
    })?;
    let shape = Shape::of(
        status
            .assignments
            .iter()
            .map(|a| (a.replica, a.node.clone(), a.devices.len())),
    )?;
    // The resource the controller named for the planned devices (issue 35: always
    // `nvidia.com/gpu` before, an AMD plan's pods asked for devices no node had).
    let resource = || -> Result<String> {
        args.resource_name
            .clone()
            .or_else(|| engine.device_resource.clone())
            .ok_or_else(|| {
                bad(
                    "the placement's status names no device plugin resource for its devices \
                     (a controller older than this CLI, or devices no known plugin serves): \
                     give --resource-name",
                )
            })
    };
    let target = match status.allocation.as_deref() {
        Some("claims") => {
            let mut per_replica: BTreeMap<u32, Vec<PlacementClaim>> = BTreeMap::new();
            for claim in &status.claims {
                per_replica
                    .entry(claim.replica)
                    .or_default()
                    .push(claim.clone());
            }
            if per_replica.len() != plan.replicas.max(1) as usize {
                return Err(bad(format!(
                    "the placement holds claims for {} replica(s) but plans {}",
                    per_replica.len(),
                    plan.replicas
                )));
            }
            Target::Claims(per_replica.into_values().collect())
        }
        Some("claimTemplate") => {
            let fragment = status
                .pod_template
                .as_ref()
                .and_then(|t| t.resource_claims.first())
                .ok_or_else(|| bad("allocation claimTemplate but no status.podTemplate"))?;
            Target::ClaimTemplate(
                fragment.name.clone(),
                fragment.resource_claim_template_name.clone(),
            )
        }
        _ if status.node_selector.is_empty() => {
            return Err(bad("the placement's status has no nodeSelector"));
        }
        _ => Target::Selector {
            selector: status.node_selector.clone(),
            resource: resource()?,
        },
    };
    let name = dns_name(
        args.name
            .as_deref()
            .or(placement.metadata.name.as_deref())
            .or(status.model.as_deref())
            .unwrap_or("model"),
    );
    let namespace = args.namespace.clone().or(placement.metadata.namespace);
    let kind = engine_kind(engine.engine.as_deref().unwrap_or("vllm"))?;
    let image = match (&args.image, &engine.image, &engine.image_refusal) {
        (Some(image), _, _) => image.clone(),
        (None, Some(image), _) => image.clone(),
        (None, None, Some(reason)) => {
            return Err(bad(format!("no image runs this placement: {reason}")));
        }
        // A status from a controller older than the image table.
        (None, None, None) => DEFAULT_IMAGE.to_string(),
    };
    let whole = Workload {
        name: name.clone(),
        namespace,
        image,
        engine: kind,
        model: served_model(args, engine.model.as_deref())?,
        args: engine_args(kind, &engine.vllm, &engine.sglang),
        replicas: plan.replicas.max(1),
        nodes_per_replica: shape.nodes_per_replica,
        devices_per_pod: shape.devices_per_pod,
        target,
        prefill: None,
        placement: placement.metadata.name.clone(),
    };
    let Some(prefill) = &status.prefill else {
        return Ok(Ok(whole));
    };
    // Disaggregated (labels only: the controller refuses claims for it): each pool's pods go
    // to the nodes its role label selects.
    let decode_selector = status
        .decode
        .as_ref()
        .map(|decode| decode.node_selector.clone())
        .filter(|selector| !selector.is_empty())
        .ok_or_else(|| {
            bad("the placement is disaggregated but its status has no decode nodeSelector")
        })?;
    let prefill_pool = prefill_from_status(args, prefill, &whole, resource()?)?;
    Ok(Ok(Workload {
        name: format!("{name}-decode"),
        target: Target::Selector {
            selector: decode_selector,
            resource: resource()?,
        },
        prefill: Some(Box::new(prefill_pool)),
        ..whole
    }))
}

/// The prefill pool of a disaggregated placement's status, beside `decode`'s workload.
fn prefill_from_status(
    args: &EmitArgs,
    prefill: &PrefillStatus,
    decode: &Workload,
    resource: String,
) -> Result<Workload> {
    let missing = |what: &str| bad(format!("the placement's prefill pool has no {what}"));
    let plan = prefill.plan.as_ref().ok_or_else(|| missing("plan"))?;
    let engine = prefill
        .engine
        .as_ref()
        .ok_or_else(|| missing("engine arguments"))?;
    if prefill.node_selector.is_empty() {
        return Err(missing("nodeSelector"));
    }
    let shape = Shape::of(
        prefill
            .assignments
            .iter()
            .map(|a| (a.replica, a.node.clone(), a.devices.len())),
    )?;
    Ok(Workload {
        name: format!("{}-prefill", decode.name),
        namespace: decode.namespace.clone(),
        image: decode.image.clone(),
        engine: decode.engine,
        model: served_model(args, engine.model.as_deref())?,
        args: engine_args(decode.engine, &engine.vllm, &engine.sglang),
        replicas: plan.replicas.max(1),
        nodes_per_replica: shape.nodes_per_replica,
        devices_per_pod: shape.devices_per_pod,
        target: Target::Selector {
            selector: prefill.node_selector.clone(),
            resource,
        },
        prefill: None,
        placement: None,
    })
}

fn served_model(args: &EmitArgs, known: Option<&str>) -> Result<String> {
    args.served_model
        .as_deref()
        .or(known)
        .map(str::to_string)
        .ok_or_else(|| {
            bad("the model's Hugging Face name is not known (not a preset): give --served-model")
        })
}

/// Replicas, nodes per replica and devices per pod, from `(replica, node, devices)` groups.
#[derive(Debug)]
struct Shape {
    replicas: u32,
    nodes_per_replica: u32,
    devices_per_pod: u32,
    nodes: BTreeSet<String>,
}

impl Shape {
    fn of(groups: impl Iterator<Item = (u32, String, usize)>) -> Result<Self> {
        let mut per_pod: BTreeMap<(u32, String), usize> = BTreeMap::new();
        for (replica, node, devices) in groups {
            *per_pod.entry((replica, node)).or_default() += devices;
        }
        let replicas: BTreeSet<u32> = per_pod.keys().map(|(r, _)| *r).collect();
        let nodes: BTreeSet<String> = per_pod.keys().map(|(_, n)| n.clone()).collect();
        let spans: BTreeSet<usize> = replicas
            .iter()
            .map(|r| per_pod.keys().filter(|(x, _)| x == r).count())
            .collect();
        let devices: BTreeSet<usize> = per_pod.values().copied().collect();
        let (Some(&span), Some(&devices_per_pod)) = (spans.iter().next(), devices.iter().next())
        else {
            return Err(bad("the plan places no devices"));
        };
        if spans.len() > 1 || devices.len() > 1 {
            // Pod templates are uniform: every pod of the workload asks for the same devices.
            return Err(bad(format!(
                "the plan's replicas are not uniform (nodes per replica {spans:?}, devices per node {devices:?}); one pod template cannot express it"
            )));
        }
        let count = |n: usize| u32::try_from(n).map_err(|_| bad("too many devices"));
        Ok(Self {
            replicas: count(replicas.len())?,
            nodes_per_replica: count(span)?,
            devices_per_pod: count(devices_per_pod)?,
            nodes,
        })
    }
}

/// The device plugin resource for the plan's devices
/// ([`crate::plan::engine::images::device_plugin_resource`]).
fn device_resource(plan: &Plan, nodes: &[NodeSpec]) -> Result<String> {
    let device = plan_device(plan, nodes)?;
    let partition = plan
        .fraction
        .as_ref()
        .filter(|f| f.kind == FractionKind::Partition);
    if let Some(partition) = partition {
        let profile = partition.profile.as_deref().unwrap_or_default();
        // NVIDIA's device plugin with the `mixed` MIG strategy advertises each MIG profile as
        // its own resource (NVIDIA/k8s-device-plugin README, "MIG support").
        return match device.vendor {
            crate::hardware::Vendor::Nvidia => Ok(format!("nvidia.com/mig-{profile}")),
            _ => Err(bad(format!(
                "no known device plugin resource for a {profile} partition of {}: give \
                 --resource-name, or plan with --whole-devices",
                device.product
            ))),
        };
    }
    device_plugin_resource(device.vendor, device.family, &device.product)
        .map(str::to_string)
        .ok_or_else(|| {
            bad(format!(
                "no known device plugin resource for {:?} {}: give --resource-name",
                device.vendor, device.family
            ))
        })
}

/// The device of the plan's first assignment (for a partition, the device it is part of).
fn plan_device<'a>(plan: &Plan, nodes: &'a [NodeSpec]) -> Result<&'a crate::plan::DeviceSpec> {
    let first = plan
        .assignments
        .first()
        .ok_or_else(|| bad("the plan places no devices"))?;
    nodes
        .iter()
        .find(|n| n.name == first.node)
        .and_then(|n| {
            n.devices.iter().find(|d| {
                first.devices.contains(&d.id)
                    || d.partitions.iter().any(|p| first.devices.contains(&p.id))
            })
        })
        .ok_or_else(|| {
            bad(format!(
                "node {} of the plan is not in the inventory",
                first.node
            ))
        })
}

/// The engine a plan's settings name.
fn engine_kind(name: &str) -> Result<EngineKind> {
    name.parse()
        .map_err(|err: String| bad(format!("the plan's engine: {err}")))
}

/// The arguments of the engine that runs.
fn engine_args(kind: EngineKind, vllm: &[String], sglang: &[String]) -> Vec<String> {
    match kind {
        EngineKind::Vllm => vllm.to_vec(),
        EngineKind::Sglang => sglang.to_vec(),
    }
}

/// `--image` when given, else the image the plan's engine runs on its devices, else the
/// reason none does (exit 1).
fn pick_image(args: &EmitArgs, planned: Option<&str>, refusal: Option<&str>) -> Result<String> {
    if let Some(image) = &args.image {
        return Ok(image.clone());
    }
    planned.map(str::to_string).ok_or_else(|| {
        bad(format!(
            "no image runs this plan: {}",
            refusal.unwrap_or("the plan's engine names no image")
        ))
    })
}

/// A DNS-1123 label of at most 50 characters (room for suffixes Kubernetes adds).
pub fn dns_name(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars().map(|c| c.to_ascii_lowercase()) {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
        if out.len() >= 50 {
            break;
        }
    }
    let out = out.trim_end_matches('-');
    if out.is_empty() {
        "model".to_string()
    } else if out.starts_with(|c: char| c.is_ascii_digit()) {
        format!("m-{}", &out[..out.len().min(48)])
    } else {
        out.to_string()
    }
}

/// The workload as YAML (JSON with `-o json`); several objects as one stream (JSON: a `List`).
pub fn render(workload: &Workload, kind: EmitKind, format: Format) -> Result<String> {
    let objects = objects(workload, kind)?;
    let encode = |err: String| bad(format!("cannot encode the workload: {err}"));
    if format == Format::Json {
        let value = match objects.as_slice() {
            [one] => one.clone(),
            _ => json!({"apiVersion": "v1", "kind": "List", "items": objects}),
        };
        return output::to_json(&value).map_err(|e| encode(e.to_string()));
    }
    let mut text = String::new();
    for object in &objects {
        text.push_str("---\n");
        text.push_str(&output::to_yaml(object).map_err(|e| encode(e.to_string()))?);
    }
    Ok(text)
}

/// The objects to apply: the workload's, then its prefill pool's.
pub fn objects(workload: &Workload, kind: EmitKind) -> Result<Vec<Value>> {
    let mut objects = pool_objects(workload, kind)?;
    if let Some(prefill) = &workload.prefill {
        objects.extend(pool_objects(prefill, kind)?);
    }
    Ok(objects)
}

fn pool_objects(workload: &Workload, kind: EmitKind) -> Result<Vec<Value>> {
    validate::check(workload)?;
    // The claim template a share's pods name comes first, so one apply creates both.
    let mut objects = match &workload.target {
        Target::Share { template, .. } => vec![(**template).clone()],
        _ => Vec::new(),
    };
    objects.extend(match kind {
        EmitKind::Deployment if workload.nodes_per_replica > 1 => Err(bad(format!(
            "a replica spans {} nodes: a Deployment pod runs on one node; use --emit lws",
            workload.nodes_per_replica
        ))),
        EmitKind::Deployment => deployments(workload),
        EmitKind::Lws => lws(workload).map(|object| vec![object]),
    }?);
    Ok(objects)
}

fn deployments(workload: &Workload) -> Result<Vec<Value>> {
    let (container, command) = match workload.engine {
        EngineKind::Vllm => {
            let mut args = vec![workload.model.clone()];
            args.extend(workload.args.iter().cloned());
            (
                "vllm",
                (vec!["vllm".to_string(), "serve".to_string()], args),
            )
        }
        // SGLang listens on 30000 unless told; the pods serve on vLLM's port like the rest.
        EngineKind::Sglang => {
            let mut args = vec!["--model-path".to_string(), workload.model.clone()];
            args.extend(workload.args.iter().cloned());
            args.extend(["--host", "0.0.0.0", "--port"].map(str::to_string));
            args.push(PORT.to_string());
            let head = ["python3", "-m", "sglang.launch_server"].map(str::to_string);
            ("sglang", (head.to_vec(), args))
        }
    };
    match &workload.target {
        // One Deployment per replica: each replica's pod names its own claims.
        Target::Claims(per_replica) => per_replica
            .iter()
            .enumerate()
            .map(|(index, claims)| {
                let name = format!("{}-r{index}", workload.name);
                let template = pod_template(workload, &name, container, &command, Some(claims))?;
                deployment(workload, &name, 1, template)
            })
            .collect(),
        _ => {
            let template = pod_template(workload, &workload.name, container, &command, None)?;
            Ok(vec![deployment(
                workload,
                &workload.name,
                workload.replicas,
                template,
            )?])
        }
    }
}

fn deployment(workload: &Workload, name: &str, replicas: u32, template: Value) -> Result<Value> {
    let value = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(workload, name),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": template,
        },
    });
    // Through the typed object: a field Kubernetes does not know fails here, not at apply.
    let typed: Deployment = serde_json::from_value(value)
        .map_err(|err| bad(format!("internal: not a Deployment: {err}")))?;
    serde_json::to_value(typed).map_err(|err| bad(format!("internal: {err}")))
}

fn lws(workload: &Workload) -> Result<Value> {
    if workload.engine == EngineKind::Sglang {
        return Err(bad(
            "a multi-node SGLang replica is not rendered (its nodes start with --nnodes, \
             --node-rank and --dist-init-addr, not Ray); use --engine vllm for a LeaderWorkerSet",
        ));
    }
    if matches!(workload.target, Target::Claims(_)) && workload.nodes_per_replica > 1 {
        return Err(bad(
            "allocation claims with a multi-node replica: a LeaderWorkerSet's pod templates \
             cannot name one claim per pod; use allocation labels or claimTemplate",
        ));
    }
    if let Target::Claims(per_replica) = &workload.target
        && per_replica.len() > 1
    {
        return Err(bad(
            "allocation claims with several replicas: a LeaderWorkerSet's groups share one \
             template; use --emit deployment (one per replica)",
        ));
    }
    let claims = match &workload.target {
        Target::Claims(per_replica) => per_replica.first().map(Vec::as_slice),
        _ => None,
    };
    let model_args: Vec<String> = std::iter::once(workload.model.clone())
        .chain(workload.args.iter().cloned())
        .collect();
    let leader_line = format!(
        "bash {RAY_HELPER} leader --ray_cluster_size=$(LWS_GROUP_SIZE); vllm serve {} --distributed-executor-backend ray",
        model_args
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let worker_line = format!("bash {RAY_HELPER} worker --ray_address=$(LWS_LEADER_ADDRESS)");
    let shell = |line: String| (vec!["sh".to_string(), "-c".to_string()], vec![line]);
    let leader = pod_template(
        workload,
        &workload.name,
        "vllm-leader",
        &shell(leader_line),
        claims,
    )?;
    let worker = pod_template(
        workload,
        &workload.name,
        "vllm-worker",
        &shell(worker_line),
        claims,
    )?;
    Ok(json!({
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": metadata(workload, &workload.name),
        "spec": {
            "replicas": workload.replicas,
            "leaderWorkerTemplate": {
                "size": workload.nodes_per_replica,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }))
}

fn metadata(workload: &Workload, name: &str) -> Value {
    let mut meta = json!({
        "name": name,
        "labels": {
            "app.kubernetes.io/name": name,
            "app.kubernetes.io/managed-by": "hwaccel",
        },
    });
    if let (Some(namespace), Some(map)) = (&workload.namespace, meta.as_object_mut()) {
        map.insert("namespace".to_string(), json!(namespace));
    }
    meta
}

/// One pod template: the container, its devices, and where it may run.
fn pod_template(
    workload: &Workload,
    app: &str,
    container: &str,
    (command, args): &(Vec<String>, Vec<String>),
    claims: Option<&[PlacementClaim]>,
) -> Result<Value> {
    let mut spec = serde_json::Map::new();
    let mut resources = serde_json::Map::new();
    let leader = container.ends_with("leader") || container == "vllm" || container == "sglang";
    match (&workload.target, claims) {
        (Target::Claims(_), Some(claims)) => {
            // Each claim's pod-side name is the same constant; several claims in one pod
            // (pipeline stages on one node) get their stage as a suffix.
            let several = claims.len() > 1;
            let mut refs = Vec::new();
            let mut uses = Vec::new();
            let mut selector = BTreeMap::new();
            for claim in claims {
                for r in &claim.pod_template.resource_claims {
                    let name = if several {
                        format!("{}-{}", r.name, claim.stage)
                    } else {
                        r.name.clone()
                    };
                    refs.push(json!({"name": name, "resourceClaimName": r.resource_claim_name}));
                    uses.push(json!({"name": name}));
                }
                selector.extend(claim.pod_template.node_selector.clone());
            }
            spec.insert("resourceClaims".into(), json!(refs));
            resources.insert("claims".into(), json!(uses));
            if !selector.is_empty() {
                spec.insert("nodeSelector".into(), json!(selector));
            }
        }
        (Target::ClaimTemplate(name, template), _) => {
            spec.insert(
                "resourceClaims".into(),
                json!([{"name": name, "resourceClaimTemplateName": template}]),
            );
            resources.insert("claims".into(), json!([{"name": name}]));
        }
        (Target::Selector { selector, resource }, _) => {
            spec.insert("nodeSelector".into(), json!(selector));
            resources.insert(
                "limits".into(),
                json!({resource.as_str(): workload.devices_per_pod.to_string()}),
            );
        }
        (
            Target::Share {
                nodes,
                claim,
                template,
            },
            _,
        ) => {
            spec.insert("affinity".into(), host_affinity(nodes));
            let template_name = template
                .pointer("/metadata/name")
                .cloned()
                .unwrap_or_default();
            spec.insert(
                "resourceClaims".into(),
                json!([{"name": claim, "resourceClaimTemplateName": template_name}]),
            );
            resources.insert("claims".into(), json!([{"name": claim}]));
        }
        (Target::Hosts { nodes, resource }, _) => {
            spec.insert("affinity".into(), host_affinity(nodes));
            resources.insert(
                "limits".into(),
                json!({resource.as_str(): workload.devices_per_pod.to_string()}),
            );
        }
        (Target::Claims(_), None) => return Err(bad("internal: claims without a replica")),
    }
    let mut main = json!({
        "name": container,
        "image": workload.image,
        "command": command,
        "args": args,
        "resources": resources,
        // Tensor-parallel workers exchange tensors through shared memory (vLLM's Docker
        // docs ask for --ipc=host or a large /dev/shm).
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    });
    if leader && let Some(map) = main.as_object_mut() {
        map.insert(
            "ports".into(),
            json!([{"name": "http", "containerPort": PORT}]),
        );
        map.insert(
            "readinessProbe".into(),
            json!({"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10}),
        );
    }
    spec.insert("containers".into(), json!([main]));
    spec.insert(
        "volumes".into(),
        json!([{"name": "dshm", "emptyDir": {"medium": "Memory"}}]),
    );
    let mut labels = json!({"app.kubernetes.io/name": app});
    if let (Some(placement), Some(map)) = (&workload.placement, labels.as_object_mut()) {
        map.insert(PLACEMENT_LABEL.to_string(), json!(placement));
    }
    let value = json!({
        "metadata": {"labels": labels},
        "spec": spec,
    });
    let typed: PodTemplateSpec = serde_json::from_value(value)
        .map_err(|err| bad(format!("internal: not a pod template: {err}")))?;
    serde_json::to_value(typed).map_err(|err| bad(format!("internal: {err}")))
}

/// Required node affinity to `nodes` by hostname.
fn host_affinity(nodes: &[String]) -> Value {
    json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{
            "key": "kubernetes.io/hostname",
            "operator": "In",
            "values": nodes,
        }]}],
    }}})
}

/// `text` as one shell word.
fn shell_quote(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._/:=,@+-".contains(c));
    if plain {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests;
