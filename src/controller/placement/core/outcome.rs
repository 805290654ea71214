//! Plan → status: the [`Outcome`] of planning one request, and the `ModelPlacementStatus`
//! that says so. Pure; the spec became a planner request in [`request`](super::request), and
//! [`evaluate`](super::evaluate) calls in here.

use std::collections::BTreeSet;

use crate::api::placement::{
    Assignment, EngineStatus, FractionStatus, MemoryBreakdown, ModelPlacementStatus, PlanStatus,
    PrefillStatus, RoleNodes,
};
pub use crate::controller::core::outcome::Outcome;
use crate::plan::report::Plan;
use crate::plan::{FleetIndex, NodeSpec, PlanError, Reservations, plan, plan_indexed};

use super::labels;
use super::request::Request;

/// Plans `request` on `nodes` minus `reserved`, through the planner's index of `nodes` when
/// there is one: the plan's status, or why there is none.
pub(super) fn outcome_of(
    request: &Request,
    (nodes, index): (&[NodeSpec], Option<&FleetIndex>),
    reserved: &Reservations,
    namespace: &str,
    name: &str,
) -> Outcome {
    let planned = match index {
        Some(index) => plan_indexed(&request.model, (nodes, index), reserved, &request.request),
        None => plan(&request.model, nodes, reserved, &request.request),
    };
    match planned {
        Ok(plan) if plan.fits => {
            let mut status = planned_status(&plan, namespace, name);
            status.reasons.extend(request.notes.iter().cloned());
            status.reasons = in_spec_terms(status.reasons);
            status.suggestions = in_spec_terms(status.suggestions);
            Outcome::Planned(status)
        }
        Ok(plan) => Outcome::Unschedulable(refusal(
            Some(plan.model.name.clone()),
            plan.reasons,
            plan.suggestions,
        )),
        Err(PlanError::NoDevices(reason)) => Outcome::Unschedulable(no_devices(request, &reason)),
        Err(err) => Outcome::Invalid(refusal(
            Some(request.model.name.clone()),
            vec![err.to_string()],
            Vec::new(),
        )),
    }
}

/// The refusal when no accelerator is left to plan on, saying why.
pub(super) fn no_devices(request: &Request, reason: &str) -> ModelPlacementStatus {
    refusal(
        Some(request.model.name.clone()),
        vec![format!("no free accelerator matches: {reason}")],
        vec![
            "wait for another placement to be deleted, add nodes, or relax constraints".to_string(),
        ],
    )
}

pub(super) fn refusal(
    model: Option<String>,
    reasons: Vec<String>,
    suggestions: Vec<String>,
) -> ModelPlacementStatus {
    ModelPlacementStatus {
        model,
        reasons: in_spec_terms(reasons),
        suggestions: in_spec_terms(suggestions),
        ..ModelPlacementStatus::default()
    }
}

/// The planner explains itself in `hwaccel plan` flags; a ModelPlacement user edits spec
/// fields, so the flag names are rewritten to the field paths that mean the same.
const FLAG_TO_FIELD: [(&str, &str); 18] = [
    ("--engine-version", "spec.engine.version"),
    ("--engine", "spec.engine.name"),
    ("--enforce-eager", "spec.engine.enforceEager"),
    ("--max-num-seqs", "spec.engine.maxNumSeqs"),
    (
        "--max-num-batched-tokens",
        "spec.engine.maxNumBatchedTokens",
    ),
    (
        "--mem-fraction-static",
        "spec.engine.memFractionStaticPercent",
    ),
    ("--prefill-replicas ", "spec.goal.serve.prefillReplicas="),
    ("--disaggregated", "spec.goal.serve.disaggregated"),
    ("--precision ", "spec.constraints.precision="),
    ("--kv-dtype ", "spec.constraints.kvCachePrecision="),
    ("--max-nodes ", "spec.constraints.maxNodes="),
    ("--gpu-util", "spec.constraints.memoryUtilizationPercent"),
    ("--context ", "spec.goal.serve.context="),
    ("--concurrency ", "spec.goal.serve.concurrency="),
    ("--seq-len ", "spec.goal.train.seqLen="),
    ("--micro-batch ", "spec.goal.train.microBatch="),
    ("--train ", "spec.goal.train.method="),
    ("--replicas ", "spec.replicas "),
];

fn in_spec_terms(lines: Vec<String>) -> Vec<String> {
    lines
        .into_iter()
        .map(|line| {
            FLAG_TO_FIELD
                .iter()
                .fold(line, |text, (flag, field)| text.replace(flag, field))
        })
        .collect()
}

/// One pool's assignments, plan numbers and engine arguments.
fn pool_status(plan: &Plan) -> (Vec<Assignment>, PlanStatus, Option<EngineStatus>) {
    let assignments: Vec<Assignment> = plan
        .assignments
        .iter()
        .map(|a| Assignment {
            node: a.node.clone(),
            devices: a.devices.clone(),
            replica: a.replica,
            stage: a.stage,
        })
        .collect();
    let memory = plan.per_device.map(|m| MemoryBreakdown {
        weights: m.weights.0,
        kv_cache: m.kv_cache.0,
        activations: m.activations.0,
        overhead: m.overhead.0,
        total: m.total.0,
        capacity: m.capacity.0,
    });
    let plan_status = PlanStatus {
        precision: plan.precision.map(|p| p.to_string()).unwrap_or_default(),
        tensor_parallel: plan.tp.unwrap_or(1),
        pipeline_parallel: plan.pp.unwrap_or(1),
        replicas: plan.replicas.unwrap_or(1),
        devices: plan.devices.unwrap_or(0),
        nodes: plan.nodes.unwrap_or(0),
        max_concurrency: plan.max_concurrency,
        memory_per_device: memory.unwrap_or_default(),
        estimated_tokens_per_second: plan
            .throughput
            .as_ref()
            .map(|t| t.single_stream_tokens_per_s.round().max(0.0) as u64),
        fraction: plan.fraction.as_ref().map(|f| FractionStatus {
            kind: f.kind.as_str().to_string(),
            bytes: f.bytes.0,
            device_bytes: f.device_bytes.0,
            profile: f.profile.clone(),
        }),
    };
    let engine = plan.engine.as_ref().map(|e| EngineStatus {
        engine: Some(e.engine.clone()),
        version: Some(e.version.clone()),
        image: e.image.clone(),
        image_refusal: e.image_refusal.clone(),
        device_resource: e.device_resource.clone(),
        model: e.model.clone(),
        vllm: e.vllm.clone(),
        sglang: e.sglang.clone(),
        notes: e.notes.clone(),
    });
    (assignments, plan_status, engine)
}

/// The status for a plan that fits: for a disaggregated plan, the decode pool at the top
/// level and the prefill pool under `prefill`.
pub fn planned_status(plan: &Plan, namespace: &str, name: &str) -> ModelPlacementStatus {
    let (assignments, plan_status, engine) = pool_status(plan);
    let nodes: BTreeSet<&str> = assignments.iter().map(|a| a.node.as_str()).collect();
    let node_names = nodes.into_iter().collect::<Vec<_>>().join(",");
    let mut status = ModelPlacementStatus {
        model: Some(plan.model.name.clone()),
        plan: Some(plan_status),
        node_names: Some(node_names.clone()),
        node_selector: labels::node_selector(namespace, name),
        assignments,
        engine,
        reasons: plan.reasons.clone(),
        suggestions: plan.suggestions.clone(),
        prefill: plan
            .prefill
            .as_deref()
            .map(|prefill| prefill_status(prefill, namespace, name)),
        decode: plan.prefill.as_ref().map(|_| RoleNodes {
            node_names: Some(node_names),
            node_selector: labels::role_node_selector(labels::DECODE_LABEL_PREFIX, namespace, name),
        }),
        ..ModelPlacementStatus::default()
    };
    if status.prefill.is_some() {
        // The whole placement's nodes, like its nodeSelector; `decode` names the decode pool's.
        let all: BTreeSet<&str> = status.all_assignments().map(|a| a.node.as_str()).collect();
        status.node_names = Some(all.into_iter().collect::<Vec<_>>().join(","));
    }
    status
}

/// The prefill pool's part of a disaggregated placement's status.
fn prefill_status(prefill: &Plan, namespace: &str, name: &str) -> PrefillStatus {
    let pool = pool_status(prefill);
    let nodes: BTreeSet<&str> = pool.0.iter().map(|a| a.node.as_str()).collect();
    PrefillStatus {
        node_names: Some(nodes.iter().copied().collect::<Vec<_>>().join(",")),
        node_selector: labels::role_node_selector(labels::PREFILL_LABEL_PREFIX, namespace, name),
        assignments: pool.0,
        plan: Some(pool.1),
        engine: pool.2,
    }
}
