//! The pure middle of a reconcile: a ModelPlacement spec becomes a planner request, the live
//! inventories become the planner's nodes, and the planner's answer becomes a
//! `ModelPlacementStatus`. No client, no clock: everything here is unit-tested.
//!
//! Device ids: the planner names devices by their detection id (a PCI bus id), users and the
//! status by the inventory's DNS-label device name (`gpu-0000-18-00-0`). The nodes handed to
//! the planner are renamed to inventory names up front, so reservations, assignments and the
//! ledger all speak one language.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use crate::api::placement::{
    AllocationMode, Assignment, Constraints, EngineStatus, MemoryBreakdown, ModelPlacementSpec,
    ModelPlacementStatus, PlanStatus, PrefillStatus, RoleNodes,
};
use crate::plan::report::Plan;
use crate::plan::request::prepare;
use crate::plan::{Model, NodeSpec, PlanError, PlanRequest, Reservations, plan};

use super::labels;
use super::no_match;
use crate::controller::core::fleet_view::FleetView;

/// A spec the planner can work on.
#[derive(Debug, Clone)]
pub struct Request {
    /// The model.
    pub model: Model,
    /// Goal, precision and limits.
    pub request: PlanRequest,
    /// Which devices may be used.
    pub filter: DeviceFilter,
    /// Notes about parts of the spec that were not applied.
    pub notes: Vec<String>,
}

/// Which devices and nodes a placement may use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceFilter {
    /// Allowed families (`gpu`...); empty means any.
    pub families: BTreeSet<String>,
    /// Allowed product slugs; empty means any.
    pub products: BTreeSet<String>,
    /// Labels a node must carry.
    pub node_selector: BTreeMap<String, String>,
    /// Only devices a DRA driver publishes (`allocation: claims`).
    pub dra_only: bool,
}

/// Turns a spec into a planner request, the way `hwaccel plan` turns its flags into one
/// ([`crate::plan::request::prepare`]); the error lists what is wrong with the spec.
pub fn request_from_spec(spec: &ModelPlacementSpec) -> Result<Request, Vec<String>> {
    let constraints = spec.constraints.clone().unwrap_or_default();
    // A selector or product that is not label syntax can never match: Invalid, not Pending.
    let invalid = no_match::invalid_constraints(&constraints.node_selector, &constraints.products);
    if !invalid.is_empty() {
        return Err(invalid);
    }
    let input = spec.plan_input().map_err(|reason| vec![reason])?;
    let prepared = prepare(input).map_err(|err| vec![err.to_string()])?;
    Ok(Request {
        model: prepared.model,
        request: prepared.request,
        filter: DeviceFilter {
            // Both claim modes hold devices through DRA, so only what a driver publishes counts.
            dra_only: matches!(
                spec.allocation,
                Some(AllocationMode::Claims | AllocationMode::ClaimTemplate)
            ),
            ..filter(&constraints)
        },
        notes: prepared.notes,
    })
}

fn filter(constraints: &Constraints) -> DeviceFilter {
    DeviceFilter {
        families: constraints.families.iter().cloned().collect(),
        products: constraints.products.iter().cloned().collect(),
        node_selector: constraints.node_selector.clone(),
        dra_only: false,
    }
}

/// Why a disaggregated placement with DRA allocation is refused.
pub const DISAGGREGATED_NEEDS_LABELS: &str = "disaggregated serving supports allocation: labels for now (spec.allocation is claims or claimTemplate)";

/// What planning concluded.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// It fits: the status describes the plan and its assignments.
    Planned(ModelPlacementStatus),
    /// Valid, but it does not fit on the free devices now.
    Unschedulable(ModelPlacementStatus),
    /// The spec cannot be planned whatever the hardware.
    Invalid(ModelPlacementStatus),
}

impl Outcome {
    /// The status part of the outcome (without conditions).
    pub fn status(&self) -> &ModelPlacementStatus {
        match self {
            Self::Planned(s) | Self::Unschedulable(s) | Self::Invalid(s) => s,
        }
    }
}

/// Plans `spec` for `namespace/name` on `fleet` minus `reserved`.
pub fn evaluate(
    spec: &ModelPlacementSpec,
    namespace: &str,
    name: &str,
    fleet: &FleetView,
    reserved: &Reservations,
) -> Outcome {
    let request = match request_from_spec(spec) {
        Ok(request) => request,
        Err(reasons) => return Outcome::Invalid(refusal(None, reasons, Vec::new())),
    };
    if request.request.disaggregation.is_some()
        && matches!(
            spec.allocation,
            Some(AllocationMode::Claims | AllocationMode::ClaimTemplate)
        )
    {
        return Outcome::Invalid(refusal(
            Some(request.model.name.clone()),
            vec![DISAGGREGATED_NEEDS_LABELS.to_string()],
            vec!["set spec.allocation: labels, or drop spec.goal.serve.disaggregated".to_string()],
        ));
    }
    let nodes = fleet.filtered(&request.filter);
    let nodes = if request.filter.dra_only {
        Cow::Owned(dra_published(&nodes, fleet))
    } else {
        nodes
    };
    // The planner sees only what is left; the whole fleet says why nothing is.
    if let Some(why) = no_match::why_nothing_left(fleet, &request.filter, &nodes) {
        return Outcome::Unschedulable(no_devices(&request, &why));
    }
    if spec.allocation == Some(AllocationMode::ClaimTemplate) {
        return super::template::evaluate_template(&request, &nodes, fleet, namespace, name);
    }
    outcome_of(&request, &nodes, reserved, namespace, name)
}

/// Plans `request` on `nodes` minus `reserved`: the plan's status, or why there is none.
pub(super) fn outcome_of(
    request: &Request,
    nodes: &[NodeSpec],
    reserved: &Reservations,
    namespace: &str,
    name: &str,
) -> Outcome {
    match plan(&request.model, nodes, reserved, &request.request) {
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
fn no_devices(request: &Request, reason: &str) -> ModelPlacementStatus {
    refusal(
        Some(request.model.name.clone()),
        vec![format!("no free accelerator matches: {reason}")],
        vec![
            "wait for another placement to be deleted, add nodes, or relax constraints".to_string(),
        ],
    )
}

/// `nodes` with only the devices a DRA driver publishes, and only nodes left with some.
pub(super) fn dra_published(nodes: &[NodeSpec], fleet: &FleetView) -> Vec<NodeSpec> {
    nodes
        .iter()
        .filter_map(|node| {
            let mut node = node.clone();
            node.devices
                .retain(|device| fleet.dra_device(&node.name, &device.id).is_some());
            (!node.devices.is_empty()).then_some(node)
        })
        .collect()
}

fn refusal(
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
    };
    let engine = plan.engine.as_ref().map(|e| EngineStatus {
        engine: Some(e.engine.clone()),
        version: Some(e.version.clone()),
        image: e.image.clone(),
        image_refusal: e.image_refusal.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::placement::{
        Goal as ApiGoal, ModelSource as ApiModel, PrecisionChoice, TrainMethod,
    };
    use crate::plan::Goal;
    use crate::testing::PlacementBuilder;
    use crate::testing::inventory::fixture_inventory as inventory;

    fn serve(preset: &str, context: u32) -> ModelPlacementSpec {
        PlacementBuilder::serve(preset).context(context).spec()
    }

    fn fleet() -> FleetView {
        let inventories = [
            inventory("h100-8x-nvswitch", "dgx-1"),
            inventory("mi300x-8x", "mi-1"),
        ];
        FleetView::new(inventories.iter(), &BTreeMap::new())
    }

    /// Issue 23 item 4: status.engine names the image for the planned devices, and the
    /// engine the spec asked for.
    #[test]
    fn the_status_names_the_image_for_the_planned_devices() {
        let inventories = [inventory("mi300x-8x", "mi-1")];
        let amd = FleetView::new(inventories.iter(), &BTreeMap::new());
        let spec = serve("llama-3.1-8b", 8192);
        let Outcome::Planned(status) = evaluate(&spec, "ml", "amd", &amd, &Reservations::none())
        else {
            panic!("an 8B model fits an MI300X");
        };
        let engine = status.engine.expect("engine arguments");
        assert_eq!(
            engine.image.as_deref(),
            Some("docker.io/vllm/vllm-openai-rocm:latest")
        );
        assert_eq!(engine.engine.as_deref(), Some("vllm"));
        assert!(engine.image_refusal.is_none());
        let mut sglang = serve("llama-3.1-8b", 8192);
        sglang.engine = Some(crate::api::placement::EngineSpec {
            name: Some(crate::api::placement::EngineName::Sglang),
            ..crate::api::placement::EngineSpec::default()
        });
        let Outcome::Planned(status) =
            evaluate(&sglang, "ml", "amd-sglang", &amd, &Reservations::none())
        else {
            panic!("an 8B model fits an MI300X under SGLang's accounting too");
        };
        let engine = status.engine.expect("engine arguments");
        assert_eq!(engine.engine.as_deref(), Some("sglang"));
        assert!(engine.image.is_none());
        assert!(
            engine
                .image_refusal
                .as_deref()
                .is_some_and(|r| r.contains("no SGLang image")),
            "{engine:?}"
        );
        assert!(
            status
                .reasons
                .iter()
                .any(|r| r == "engine: SGLang current, as asked"),
            "{:?}",
            status.reasons
        );
    }

    #[test]
    fn asked_replicas_are_placed_and_training_ignores_them() {
        let fleet = fleet();
        let mut spec = serve("llama-3.1-8b", 8192);
        spec.replicas = Some(3);
        let Outcome::Planned(status) =
            evaluate(&spec, "ml", "three", &fleet, &Reservations::none())
        else {
            panic!("three 8B replicas fit");
        };
        assert_eq!(status.plan.as_ref().map(|p| p.replicas), Some(3));
        let devices: usize = status.assignments.iter().map(|a| a.devices.len()).sum();
        assert_eq!(devices, 3, "one device per 8B replica: {status:?}");
        spec.goal = ApiGoal {
            serve: None,
            train: Some(crate::api::placement::TrainGoal {
                method: TrainMethod::Lora,
                seq_len: 2048,
                micro_batch: 1,
                lora_rank: 64,
            }),
        };
        let request = request_from_spec(&spec).unwrap();
        assert_eq!(request.request.replicas, None);
        assert!(request.notes.iter().any(|n| n.contains("--replicas")));
        let Goal::Train(target) = &request.request.goal else {
            panic!("a training goal");
        };
        assert_eq!(target.lora_rank, 64);
        let Outcome::Planned(status) =
            evaluate(&spec, "ml", "train", &fleet, &Reservations::none())
        else {
            panic!("LoRA on an 8B model fits");
        };
        assert!(
            status
                .reasons
                .iter()
                .any(|r| r.starts_with("spec.replicas applies to serving")),
            "the note in spec terms: {:?}",
            status.reasons
        );
    }

    #[test]
    fn a_disaggregated_plan_has_a_prefill_status_and_role_selectors() {
        let fleet = fleet();
        let spec = PlacementBuilder::serve("llama-3.1-8b")
            .concurrency(8)
            .disaggregated(Some(2))
            .spec();
        let outcome = evaluate(&spec, "ml", "pd", &fleet, &Reservations::none());
        let Outcome::Planned(status) = outcome else {
            panic!("expected a plan: {outcome:?}");
        };
        let prefill = status.prefill.as_ref().expect("status.prefill");
        let decode = status.decode.as_ref().expect("status.decode");
        assert_eq!(prefill.plan.as_ref().map(|p| p.replicas), Some(2));
        let devices = |list: &[Assignment]| -> BTreeSet<(String, String)> {
            list.iter()
                .flat_map(|a| a.devices.iter().map(|d| (a.node.clone(), d.clone())))
                .collect()
        };
        assert!(devices(&status.assignments).is_disjoint(&devices(&prefill.assignments)));
        assert_eq!(status.node_selector, labels::node_selector("ml", "pd"));
        assert_eq!(
            prefill.node_selector,
            labels::role_node_selector(labels::PREFILL_LABEL_PREFIX, "ml", "pd")
        );
        assert_eq!(
            decode.node_selector,
            labels::role_node_selector(labels::DECODE_LABEL_PREFIX, "ml", "pd")
        );
        // nodeNames covers both pools; each role names its own.
        let all: BTreeSet<&str> = status.all_assignments().map(|a| a.node.as_str()).collect();
        let names = |list: Option<&String>| -> BTreeSet<String> {
            list.map(|s| s.split(',').map(str::to_string).collect())
                .unwrap_or_default()
        };
        assert_eq!(
            names(status.node_names.as_ref()),
            all.iter().map(|n| n.to_string()).collect()
        );
        assert!(
            names(prefill.node_names.as_ref())
                .iter()
                .all(|n| all.contains(n.as_str()))
        );
        // Claims cannot hold two pools yet: refused with a reason that says so.
        let mut claims = spec.clone();
        claims.allocation = Some(AllocationMode::Claims);
        let refused = evaluate(&claims, "ml", "pd", &fleet, &Reservations::none());
        let Outcome::Invalid(status) = refused else {
            panic!("expected a refusal: {refused:?}");
        };
        assert_eq!(status.reasons, [DISAGGREGATED_NEEDS_LABELS]);
    }

    #[test]
    fn a_plan_becomes_a_status_with_inventory_device_names() {
        let fleet = fleet();
        let outcome = evaluate(
            &serve("llama-3.1-70b", 8192),
            "ml",
            "llama",
            &fleet,
            &Reservations::none(),
        );
        let Outcome::Planned(status) = outcome else {
            panic!("expected a plan: {outcome:?}");
        };
        let plan = status.plan.as_ref().unwrap();
        assert!(plan.tensor_parallel >= 1 && plan.devices >= 1);
        assert!(!status.assignments.is_empty());
        for assignment in &status.assignments {
            fleet.holds(std::slice::from_ref(assignment)).unwrap();
            assert!(
                assignment.devices.iter().all(|d| !d.contains(':')),
                "{assignment:?}"
            );
        }
        let nodes: BTreeSet<&str> = status.assignments.iter().map(|a| a.node.as_str()).collect();
        assert_eq!(
            status.node_names.as_deref(),
            Some(nodes.into_iter().collect::<Vec<_>>().join(",").as_str())
        );
        assert_eq!(status.node_selector, labels::node_selector("ml", "llama"));
        assert_eq!(status.model.as_deref(), Some("llama-3.1-70b"));
        // The engines' arguments carry the same layout as the plan.
        let engine = status
            .engine
            .as_ref()
            .expect("a serving plan has engine arguments");
        let tp = plan.tensor_parallel.to_string();
        assert!(
            engine
                .vllm
                .windows(2)
                .any(|w| w[0] == "--tensor-parallel-size" && w[1] == tp),
            "{engine:?}"
        );
        assert!(
            engine
                .sglang
                .windows(2)
                .any(|w| w[0] == "--context-length" && w[1] == "8192"),
            "{engine:?}"
        );
        assert_eq!(
            engine.model.as_deref(),
            Some("meta-llama/Llama-3.1-70B-Instruct")
        );
    }

    #[test]
    fn reserved_devices_are_not_offered_again() {
        let fleet = fleet();
        let first = evaluate(
            &serve("llama-3.1-70b", 8192),
            "ml",
            "a",
            &fleet,
            &Reservations::none(),
        );
        assert!(matches!(first, Outcome::Planned(_)), "{first:?}");
        let mut reserved = Reservations::none();
        for a in &first.status().assignments {
            for d in &a.devices {
                reserved.insert(a.node.clone(), d.clone());
            }
        }
        let second = evaluate(&serve("llama-3.1-70b", 8192), "ml", "b", &fleet, &reserved);
        let Outcome::Planned(second) = second else {
            panic!("two nodes of 8 accelerators hold two 70B copies: {second:?}");
        };
        for a in &second.assignments {
            for d in &a.devices {
                assert!(
                    !reserved.contains(&a.node, d),
                    "{} {d} handed out twice",
                    a.node
                );
            }
        }
    }

    #[test]
    fn unknown_presets_and_bad_configs_are_invalid_with_reasons() {
        let fleet = fleet();
        let Outcome::Invalid(status) = evaluate(
            &serve("llama-3.1-7b", 8192),
            "ml",
            "x",
            &fleet,
            &Reservations::none(),
        ) else {
            panic!("unknown preset is invalid");
        };
        assert!(
            status.reasons[0].contains("unknown model preset"),
            "{:?}",
            status.reasons
        );
        assert!(
            status.reasons[0].contains("llama-3.1-8b"),
            "a hint: {:?}",
            status.reasons
        );
        let mut spec = serve("x", 8192);
        spec.model = ApiModel {
            hugging_face_config: Some(
                serde_json::json!({"hidden_size": "big"})
                    .try_into()
                    .unwrap(),
            ),
            ..ApiModel::default()
        };
        let outcome = evaluate(&spec, "ml", "x", &fleet, &Reservations::none());
        assert!(matches!(outcome, Outcome::Invalid(_)), "{outcome:?}");
        assert!(!outcome.status().reasons.is_empty());
        let mut two_sources = serve("llama-3.1-8b", 8192);
        two_sources.model.parameters = Some("8B".into());
        assert!(matches!(
            evaluate(&two_sources, "ml", "x", &fleet, &Reservations::none()),
            Outcome::Invalid(_)
        ));
    }

    #[test]
    fn too_big_reports_why_and_a_suggestion() {
        let inventories = [inventory("h100-8x-nvswitch", "dgx-1")];
        let fleet = FleetView::new(inventories.iter(), &BTreeMap::new());
        let mut spec = serve("llama-3.1-405b", 131072);
        spec.constraints = Some(Constraints {
            precision: Some(PrecisionChoice::Bf16),
            ..Constraints::default()
        });
        let outcome = evaluate(&spec, "ml", "big", &fleet, &Reservations::none());
        let Outcome::Unschedulable(status) = outcome else {
            panic!("405B at bf16 does not fit one 8xH100: {outcome:?}");
        };
        assert!(
            !status.reasons.is_empty() && !status.suggestions.is_empty(),
            "{status:?}"
        );
        assert!(status.assignments.is_empty() && status.plan.is_none());
        assert!(status.engine.is_none(), "no engine arguments for a refusal");
        let all = status.reasons.iter().chain(&status.suggestions);
        assert!(
            all.clone().all(|line| !line.contains("--")),
            "spec terms, not CLI flags: {status:?}"
        );
        assert!(
            status
                .suggestions
                .iter()
                .any(|s| s.contains("spec.constraints.precision=fp8")),
            "{:?}",
            status.suggestions
        );
    }

    #[test]
    fn constraints_filter_families_products_and_node_labels() {
        let fleet = fleet();
        let mut spec = serve("llama-3.1-8b", 8192);
        spec.constraints = Some(Constraints {
            products: vec!["no-such-product".into()],
            ..Constraints::default()
        });
        assert!(matches!(
            evaluate(&spec, "ml", "x", &fleet, &Reservations::none()),
            Outcome::Unschedulable(_)
        ));
        let mi = fleet.nodes().iter().find(|n| n.name == "mi-1").unwrap();
        let amd = fleet.product("mi-1", &mi.devices[0].id).unwrap();
        spec.constraints = Some(Constraints {
            products: vec![amd.to_string()],
            ..Constraints::default()
        });
        let Outcome::Planned(status) = evaluate(&spec, "ml", "x", &fleet, &Reservations::none())
        else {
            panic!("the MI300X product is allowed");
        };
        assert!(status.assignments.iter().all(|a| a.node == "mi-1"));
        spec.constraints = Some(Constraints {
            node_selector: BTreeMap::from([("pool".to_string(), "a".to_string())]),
            ..Constraints::default()
        });
        assert!(matches!(
            evaluate(&spec, "ml", "x", &fleet, &Reservations::none()),
            Outcome::Unschedulable(_)
        ));
    }

    /// Issue 28: a placement on a fleet whose only node has no accelerator said "the inventory
    /// has no nodes"; it names the node now.
    #[test]
    fn a_fleet_without_accelerators_names_its_nodes() {
        let inventories = [crate::testing::inventory::fixture_inventory(
            "cpu-only-vm",
            "cpu-1",
        )];
        let fleet = FleetView::new(inventories.iter(), &BTreeMap::new());
        let mut spec = serve("llama-3.1-8b", 8192);
        for constraints in [
            None,
            Some(Constraints {
                families: vec!["gpu".into()],
                ..Constraints::default()
            }),
        ] {
            spec.constraints = constraints;
            let Outcome::Unschedulable(status) =
                evaluate(&spec, "ml", "x", &fleet, &Reservations::none())
            else {
                panic!("nothing to plan on");
            };
            let reasons = status.reasons.join("; ");
            assert!(
                reasons.contains("with no usable accelerator: cpu-1"),
                "{reasons}"
            );
            assert!(!reasons.contains("has no nodes"), "{reasons}");
        }
    }

    /// Issue 27: a selector or product that can never match is Invalid, saying which, not
    /// "the inventory has no nodes"; a well-formed one that matches nothing says why.
    #[test]
    fn impossible_constraints_are_invalid_and_unmatched_ones_say_why() {
        let fleet = fleet();
        let mut spec = serve("llama-3.1-8b", 8192);
        spec.constraints = Some(Constraints {
            node_selector: BTreeMap::from([("bad key".to_string(), "a".to_string())]),
            ..Constraints::default()
        });
        let Outcome::Invalid(status) = evaluate(&spec, "ml", "x", &fleet, &Reservations::none())
        else {
            panic!("an invalid selector is Invalid");
        };
        assert!(
            status.reasons[0].contains("not a valid label key"),
            "{status:?}"
        );
        spec.constraints = Some(Constraints {
            products: vec!["NVIDIA H100 80GB HBM3".into()],
            ..Constraints::default()
        });
        let Outcome::Invalid(status) = evaluate(&spec, "ml", "x", &fleet, &Reservations::none())
        else {
            panic!("a product that is no slug is Invalid");
        };
        assert!(
            status.reasons[0].contains("did you mean \"nvidia-h100-80gb-hbm3\"?"),
            "{status:?}"
        );
        spec.constraints = Some(Constraints {
            node_selector: BTreeMap::from([("pool".to_string(), "nowhere".to_string())]),
            ..Constraints::default()
        });
        let Outcome::Unschedulable(status) =
            evaluate(&spec, "ml", "x", &fleet, &Reservations::none())
        else {
            panic!("a well-formed selector may match later");
        };
        assert!(
            status.reasons[0].contains("nodeSelector {pool=nowhere} matches none of the"),
            "{status:?}"
        );
        spec.constraints = Some(Constraints {
            products: vec!["acme-x1".into()],
            ..Constraints::default()
        });
        let Outcome::Unschedulable(status) =
            evaluate(&spec, "ml", "x", &fleet, &Reservations::none())
        else {
            panic!("a product may join the fleet later");
        };
        assert!(
            status.reasons[0].contains("products acme-x1; products there: "),
            "{status:?}"
        );
    }
}
