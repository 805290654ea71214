//! Alternatives for a claim template, on vendor-shaped slices from `fixtures/dra/` (an
//! 8x H100 80GB node and an 8x MI300X node; provenance in `fixtures/dra/PROVENANCE.md`).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::api::placement::PrecisionChoice;
use crate::controller::core::fleet_view::NodePart;
use crate::controller::core::ledger::Ledger;
use crate::controller::placement::core::decide::decide;
use crate::controller::placement::core::decide::tests::candidate;
use crate::controller::placement::core::evaluate::evaluate;
use crate::dra::slices::published_devices;
use crate::testing::PlacementBuilder;
use crate::testing::dra::fixture_slices;

const NVIDIA: &str = "h100-8x-nvswitch";
const AMD: &str = "mi300x-8x";

/// The two fixture nodes, known from their slices alone (a DRA-only cluster).
fn fleet(files: &[&str]) -> FleetView {
    let slices = fixture_slices(files);
    let published = published_devices(&slices);
    let parts = [NVIDIA, AMD]
        .iter()
        .map(|node| Arc::new(NodePart::with_published(node, None, published.node(node))));
    FleetView::from_parts(parts, &BTreeMap::new())
}

fn both() -> FleetView {
    fleet(&["nvidia-h100-8x.yaml", "amd-mi300x-8x.yaml"])
}

/// 70B at bf16: two 80 GB H100s or one 192 GB MI300X hold it.
fn spec(mode: AllocationMode) -> ModelPlacementSpec {
    let mut spec = PlacementBuilder::serve("llama-3.1-70b")
        .context(8192)
        .precision(PrecisionChoice::Bf16)
        .spec();
    spec.allocation = Some(mode);
    spec
}

fn drivers(choices: &[Choice]) -> Vec<&str> {
    choices
        .iter()
        .map(|c| c.alternative.driver.as_str())
        .collect()
}

#[test]
fn the_first_alternative_is_the_planners_choice_and_the_next_another_product() {
    let fleet = both();
    let template = spec(AllocationMode::ClaimTemplate);
    let choices = alternatives(&template, "ml", "llama", &fleet);
    assert_eq!(choices.len(), 2, "one per product: {choices:?}");
    // What the planner picks with every device free is alternative 1, exactly.
    let Outcome::Planned(claims) = evaluate(
        &spec(AllocationMode::Claims),
        "ml",
        "llama",
        &fleet,
        &Reservations::none(),
    ) else {
        panic!("70B fits");
    };
    let group = &claims.assignments[0];
    let chosen = fleet.dra_device(&group.node, &group.devices[0]).unwrap();
    let first = &choices[0].alternative;
    assert_eq!(first.driver, chosen.driver);
    assert_eq!(first.count as usize, group.devices.len());
    let plan = claims.plan.as_ref().unwrap();
    assert_eq!(first.count, plan.tensor_parallel);
    assert_eq!(first.min_memory_bytes, Some(plan.memory_per_device.total));
    // The other vendor comes second, planned on its own devices.
    let other = if chosen.driver == "gpu.nvidia.com" {
        "gpu.amd.com"
    } else {
        "gpu.nvidia.com"
    };
    assert_eq!(drivers(&choices), [chosen.driver.as_str(), other]);
    let Outcome::Planned(second) = evaluate(
        &with_product_of(
            &spec(AllocationMode::Claims),
            &fleet,
            if other == "gpu.amd.com" { AMD } else { NVIDIA },
        ),
        "ml",
        "llama",
        &fleet,
        &Reservations::none(),
    ) else {
        panic!("70B fits the other node alone");
    };
    let second_plan = second.plan.as_ref().unwrap();
    assert_eq!(choices[1].alternative.count, second_plan.tensor_parallel);
    assert_eq!(
        choices[1].alternative.min_memory_bytes,
        Some(second_plan.memory_per_device.total)
    );
    for choice in &choices {
        assert_eq!(choice.alternative.product, None);
        assert_eq!(choice.alternative.same_domain_attribute, None);
        assert!(choice.alternative.name.starts_with('a'), "{choice:?}");
    }
    assert_ne!(choices[0].alternative.name, choices[1].alternative.name);
}

/// `spec` allowed only the product of `node`'s first device (`spec.constraints.products`).
fn with_product_of(spec: &ModelPlacementSpec, fleet: &FleetView, node: &str) -> ModelPlacementSpec {
    let device = &fleet
        .nodes()
        .iter()
        .find(|n| n.name == node)
        .unwrap()
        .devices[0];
    let product = fleet.product(node, &device.id).unwrap().to_string();
    let mut spec = spec.clone();
    let mut constraints = spec.constraints.clone().unwrap_or_default();
    constraints.products = vec![product];
    spec.constraints = Some(constraints);
    spec
}

#[test]
fn the_status_names_the_template_and_holds_nothing() {
    let fleet = both();
    let template = spec(AllocationMode::ClaimTemplate);
    let Outcome::Planned(status) =
        evaluate(&template, "ml", "llama", &fleet, &Reservations::none())
    else {
        panic!("70B fits");
    };
    assert!(status.assignments.is_empty() && status.node_selector.is_empty());
    assert_eq!(status.node_names, None);
    assert_eq!(status.claim_template.as_deref(), Some("llama"));
    assert_eq!(status.allocation.as_deref(), Some("claimTemplate"));
    let choices = alternatives(&template, "ml", "llama", &fleet);
    let summaries: Vec<String> = choices.iter().map(|c| c.summary.clone()).collect();
    assert_eq!(status.alternatives, summaries);
    let first = &choices[0].alternative;
    let gib = first.min_memory_bytes.unwrap().div_ceil(1 << 30);
    assert_eq!(
        status.alternatives[0],
        format!("{}x {} >={gib}Gi", first.count, first.driver)
    );
    let fragment = status.pod_template.as_ref().unwrap();
    assert_eq!(fragment.resource_claims[0].name, "accelerators");
    assert_eq!(
        fragment.resource_claims[0].resource_claim_template_name,
        "llama"
    );
    // Every alternative makes a valid template.
    let alternatives: Vec<Alternative> = choices.into_iter().map(|c| c.alternative).collect();
    crate::dra::claim_template::claim_template("ml", "llama", None, &alternatives).unwrap();

    // In the ledger it holds nothing: a labels placement can still have every device.
    let mut ledger = Ledger::new();
    let me = candidate("llama", 1, &template);
    let decision = decide(&mut ledger, &me, &[], &fleet);
    assert!(matches!(decision.outcome, Outcome::Planned(_)));
    assert!(
        ledger.get(&me.precedence.key).is_some(),
        "entered, so not waiting"
    );
    assert_eq!(ledger.devices_reserved(), 0);
    let releases = ledger.releases();
    let again = decide(&mut ledger, &me, &[], &fleet);
    assert!(again.kept && !again.freed);
    assert_eq!(
        ledger.releases(),
        releases,
        "an empty holding frees nothing"
    );
    let mut big = spec(AllocationMode::Labels);
    big.replicas = Some(6);
    let other = candidate("other", 2, &big);
    let decided = decide(&mut ledger, &other, &[], &fleet);
    assert!(
        matches!(decided.outcome, Outcome::Planned(_)),
        "the template reserved nothing: {:?}",
        decided.outcome
    );
}

#[test]
fn one_vendor_gives_one_alternative_and_no_dra_devices_no_plan() {
    let fleet = fleet(&["nvidia-h100-8x.yaml"]);
    let template = spec(AllocationMode::ClaimTemplate);
    let choices = alternatives(&template, "ml", "llama", &fleet);
    assert_eq!(drivers(&choices), ["gpu.nvidia.com"]);
    // Inventories without slices: nothing a template could ask the scheduler for.
    let inventories = [crate::testing::inventory::fixture_inventory(
        "h100-8x-nvswitch",
        "dgx-1",
    )];
    let plain = FleetView::new(inventories.iter(), &BTreeMap::new());
    let outcome = evaluate(&template, "ml", "llama", &plain, &Reservations::none());
    assert!(matches!(outcome, Outcome::Unschedulable(_)), "{outcome:?}");
    assert!(alternatives(&template, "ml", "llama", &plain).is_empty());
    // Other modes have no alternatives.
    assert!(alternatives(&spec(AllocationMode::Claims), "ml", "llama", &fleet).is_empty());
}

#[test]
fn subrequest_names_are_dns_labels() {
    assert_eq!(
        subrequest_name(1, Some("nvidia-h100-80gb-hbm3")),
        "a1-nvidia-h100-80gb-hbm3"
    );
    assert_eq!(subrequest_name(2, None), "a2");
    let long = "x".repeat(80);
    let name = subrequest_name(3, Some(&long));
    assert!(name.len() <= 63 && name.starts_with("a3-"));
    assert_eq!(
        subrequest_name(4, Some("AMD Instinct MI300X")),
        "a4-amd-instinct-mi300x"
    );
}

/// The one node of `fixtures/dra/<fixture>`, known from its slices alone.
fn one_node_fleet(fixture: &str, node: &str) -> FleetView {
    let published = published_devices(&fixture_slices(&[fixture]));
    let part = NodePart::with_published(node, None, published.node(node));
    FleetView::from_parts([Arc::new(part)], &BTreeMap::new())
}

/// An 8B model at 8k context and bf16, held in `mode`: less than one H100.
fn small(mode: AllocationMode) -> ModelPlacementSpec {
    let mut spec = PlacementBuilder::serve("llama-3.1-8b")
        .context(8192)
        .precision(PrecisionChoice::Bf16)
        .spec();
    spec.allocation = Some(mode);
    spec
}

/// Issue 39: on GPUs published shareable by memory (`fixtures/dra/nvidia-h100-shareable.yaml`)
/// a claim-template placement of a small model asks the scheduler for a share sized to it
/// (the status says which), one that asks for whole devices asks for all of a GPU, a
/// placement holding its own claims plans the same share, and one held by node labels alone
/// cannot plan there at all.
#[test]
fn a_template_asks_for_a_share_of_a_shareable_gpu_and_labels_cannot_hold_one() {
    let fleet = one_node_fleet("nvidia-h100-shareable.yaml", "h100-2x-shared");
    let template = small(AllocationMode::ClaimTemplate);
    let Outcome::Planned(status) = evaluate(&template, "ml", "chat", &fleet, &Reservations::none())
    else {
        panic!("an 8B model fits a share");
    };
    let fraction = status
        .plan
        .as_ref()
        .and_then(|p| p.fraction.clone())
        .expect("a fraction");
    assert_eq!(fraction.kind, "share");
    assert_eq!(
        fraction.bytes % (8 << 30),
        0,
        "a multiple of the policy's step"
    );
    assert!(fraction.bytes < fraction.device_bytes);
    let choices = alternatives(&template, "ml", "chat", &fleet);
    assert_eq!(choices[0].alternative.memory_request, Some(fraction.bytes));
    assert!(
        choices[0].summary.contains("memory="),
        "{}",
        choices[0].summary
    );
    crate::dra::claim_template::claim_template(
        "ml",
        "chat",
        None,
        &[choices[0].alternative.clone()],
    )
    .expect("a valid template");

    // Whole devices asked for: all of the GPU's memory, so no share lands beside it.
    let mut whole = template.clone();
    whole
        .constraints
        .get_or_insert_with(Default::default)
        .whole_devices = Some(true);
    let choices = alternatives(&whole, "ml", "chat", &fleet);
    assert_eq!(choices[0].alternative.memory_request, Some(80 << 30));

    // The controller's own claims hold the same share (the ledger counts it); node labels
    // cannot keep others' shares off a device, so a labels placement plans none.
    let claims = evaluate(
        &small(AllocationMode::Claims),
        "ml",
        "chat",
        &fleet,
        &Reservations::none(),
    );
    let Outcome::Planned(status) = &claims else {
        panic!("{claims:?}")
    };
    let share = status.plan.as_ref().and_then(|p| p.fraction.as_ref());
    assert_eq!(share, Some(&fraction));
    let labels = evaluate(
        &small(AllocationMode::Labels),
        "ml",
        "chat",
        &fleet,
        &Reservations::none(),
    );
    assert!(!matches!(labels, Outcome::Planned(_)), "{labels:?}");
}

/// Issue 39: on GPUs whose driver publishes MIG partitions (dynamic MIG,
/// `fixtures/dra/nvidia-h100-dynamic-mig.yaml`), a template's first choice is the smallest
/// profile that holds the model, through the driver's MIG DeviceClass, and its next the same
/// GPUs whole; a placement holding its own claims takes the same profile's MIG device.
#[test]
fn a_template_asks_for_the_smallest_mig_profile_then_the_whole_gpu() {
    let fleet = one_node_fleet("nvidia-h100-dynamic-mig.yaml", "h100-mig-node");
    let template = small(AllocationMode::ClaimTemplate);
    let choices = alternatives(&template, "ml", "chat", &fleet);
    assert!(choices.len() >= 2, "{choices:?}");
    let first = &choices[0].alternative;
    assert_eq!(first.partition_profile.as_deref(), Some("3g.40gb"));
    assert!(
        choices[0].summary.ends_with("profile=3g.40gb"),
        "{}",
        choices[0].summary
    );
    let second = &choices[1].alternative;
    assert_eq!(second.partition_profile, None, "then the whole GPU");
    let built =
        crate::dra::claim_template::claim_template("ml", "chat", None, std::slice::from_ref(first))
            .unwrap();
    let subrequest = &built.spec.spec.devices.unwrap().requests.unwrap()[0]
        .first_available
        .clone()
        .unwrap()[0];
    assert_eq!(subrequest.device_class_name, "mig.nvidia.com");

    let Outcome::Planned(status) = evaluate(
        &small(AllocationMode::Claims),
        "ml",
        "chat",
        &fleet,
        &Reservations::none(),
    ) else {
        panic!("a MIG device of an H100 holds an 8B model");
    };
    let fraction = status.plan.and_then(|p| p.fraction).expect("a fraction");
    assert_eq!(fraction.kind, "partition");
    assert_eq!(fraction.profile.as_deref(), Some("3g.40gb"));
    assert!(
        status.assignments[0].devices[0].contains("-mig-3g40gb-"),
        "{:?}",
        status.assignments
    );
}
