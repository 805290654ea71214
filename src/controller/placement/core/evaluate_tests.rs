//! Tests of [`evaluate`](super::evaluate): spec → request → planner → status, on fixture
//! fleets.

use std::collections::BTreeMap;

use super::*;
use std::collections::BTreeSet;

use crate::api::placement::{Assignment, ModelPlacementSpec};
use crate::api::placement::{
    Constraints, Goal as ApiGoal, ModelSource as ApiModel, PrecisionChoice, TrainMethod,
};
use crate::controller::placement::core::labels;
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
    let Outcome::Planned(status) = evaluate(&spec, "ml", "amd", &amd, &Reservations::none()) else {
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
    let Outcome::Planned(status) = evaluate(&spec, "ml", "three", &fleet, &Reservations::none())
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
            optimizer_states: None,
            loss: None,
            adamw: None,
            kernels: None,
        }),
    };
    let request = request_from_spec(&spec).unwrap();
    assert_eq!(request.request.replicas, None);
    assert!(request.notes.iter().any(|n| n.contains("--replicas")));
    let Goal::Train(target) = &request.request.goal else {
        panic!("a training goal");
    };
    assert_eq!(target.lora_rank, 64);
    let Outcome::Planned(status) = evaluate(&spec, "ml", "train", &fleet, &Reservations::none())
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
    let Outcome::Planned(status) = evaluate(&spec, "ml", "x", &fleet, &Reservations::none()) else {
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
    let Outcome::Invalid(status) = evaluate(&spec, "ml", "x", &fleet, &Reservations::none()) else {
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
    let Outcome::Invalid(status) = evaluate(&spec, "ml", "x", &fleet, &Reservations::none()) else {
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
    let Outcome::Unschedulable(status) = evaluate(&spec, "ml", "x", &fleet, &Reservations::none())
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
    let Outcome::Unschedulable(status) = evaluate(&spec, "ml", "x", &fleet, &Reservations::none())
    else {
        panic!("a product may join the fleet later");
    };
    assert!(
        status.reasons[0].contains("products acme-x1; products there: "),
        "{status:?}"
    );
}
