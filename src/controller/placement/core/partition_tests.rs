//! Issue 39: placements that hold their own claims take MIG devices of GPUs their driver
//! publishes through counter sets (`fixtures/dra/nvidia-h100-dynamic-mig.yaml`: two H100s,
//! each with two 3g.40gb placements). The ledger applies the counter sets to what it holds, so
//! the four 3g.40gb devices go to four placements, never overlapping, a fifth is refused with
//! the counter set named, and one freed goes to it; the claims name the MIG class.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceSlice;

use super::*;
use crate::api::placement::PrecisionChoice;
use crate::controller::core::claim_holdings::held_outside;
use crate::controller::core::fleet_view::{FleetView, NodePart};
use crate::controller::core::ledger::{Ledger, PlacementKey};
use crate::controller::placement::core::decide::decide;
use crate::controller::placement::core::decide::tests::candidate;
use crate::controller::placement::core::outcome::Outcome;
use crate::dra::slices::published_devices;
use crate::testing::PlacementBuilder;
use crate::testing::dra::fixture_slices;

const NODE: &str = "h100-mig-node";

fn mig_fleet() -> (FleetView, Vec<ResourceSlice>) {
    let slices = fixture_slices(&["nvidia-h100-dynamic-mig.yaml"]);
    let published = published_devices(&slices);
    let part = NodePart::with_published(NODE, None, published.node(NODE));
    (
        FleetView::from_parts([Arc::new(part)], &BTreeMap::new()).with_counters(&slices),
        slices,
    )
}

/// An 8B model at 8k context and bf16, held by its own claims: a 3g.40gb MIG device.
fn small() -> crate::api::placement::ModelPlacementSpec {
    let mut spec = PlacementBuilder::serve("llama-3.1-8b")
        .context(8192)
        .precision(PrecisionChoice::Bf16)
        .spec();
    spec.allocation = Some(AllocationMode::Claims);
    spec
}

/// The one device `name` holds.
fn held_by(ledger: &Ledger, name: &str) -> String {
    let holding = ledger.get(&PlacementKey::new("ml", name)).expect("held");
    let devices: Vec<&str> = holding.devices().map(|(_, d)| d).collect();
    assert_eq!(devices.len(), 1, "one replica, one device");
    devices[0].to_string()
}

#[test]
fn claims_placements_take_the_mig_devices_that_fit_and_never_overlapping_ones() {
    let (fleet, slices) = mig_fleet();
    let slices: Vec<&ResourceSlice> = slices.iter().collect();
    let mut ledger = Ledger::new();
    ledger.set_external(held_outside(&[], &slices, &ledger, &fleet));
    let spec = small();
    let mut taken = Vec::new();
    for i in 0..4 {
        let name = format!("p{i}");
        let decision = decide(&mut ledger, &candidate(&name, i, &spec), &[], &fleet);
        let Outcome::Planned(status) = &decision.outcome else {
            panic!("{name}: {:?}", decision.outcome)
        };
        let fraction = status.plan.as_ref().and_then(|p| p.fraction.clone());
        assert_eq!(
            fraction
                .as_ref()
                .map(|f| (f.kind.as_str(), f.profile.as_deref())),
            Some(("partition", Some("3g.40gb"))),
            "{name}"
        );
        let device = held_by(&ledger, &name);
        assert!(device.contains("-mig-3g40gb-"), "{name}: {device}");
        assert!(!taken.contains(&device), "{device} handed out twice");
        // The claim names the MIG class and the MIG device.
        let Holding::Claims(plans) = holding("ml", &name, AllocationMode::Claims, status, &fleet)
        else {
            panic!("held by claims")
        };
        assert_eq!(plans[0].device_class(), "mig.nvidia.com");
        assert!(plans[0].devices[0].device.contains("-mig-3g40gb-"));
        taken.push(device);
    }
    assert_eq!(ledger.index_mismatch(), None);
    // Two on each GPU.
    let on_gpu0 = taken.iter().filter(|d| d.contains("gpu-0-mig")).count();
    assert_eq!(on_gpu0, 2, "{taken:?}");

    // Nothing is left: a fifth is refused, and the refusal names the counter sets.
    let fifth = decide(&mut ledger, &candidate("p4", 4, &spec), &[], &fleet);
    let Outcome::Unschedulable(status) = &fifth.outcome else {
        panic!("{:?}", fifth.outcome)
    };
    let said = format!("{status:?}");
    assert!(said.contains("counter set gpu-0-counter-set"), "{said}");
    // A 70B model gets no GPU either: both are held in part.
    let mut big = small();
    big.model = PlacementBuilder::serve("llama-3.1-70b").spec().model;
    let big = decide(&mut ledger, &candidate("big", 5, &big), &[], &fleet);
    assert!(!matches!(big.outcome, Outcome::Planned(_)), "{big:?}");

    // One freed: the fifth takes exactly that MIG device.
    let freed = held_by(&ledger, "p1");
    ledger.forget(&PlacementKey::new("ml", "p1"));
    let again = decide(&mut ledger, &candidate("p4", 4, &spec), &[], &fleet);
    assert!(
        matches!(again.outcome, Outcome::Planned(_)),
        "{:?}",
        again.outcome
    );
    assert_eq!(held_by(&ledger, "p4"), freed);

    // A planned placement reconciled again keeps its MIG device: its own holding blocks
    // nothing it needs.
    let kept = held_by(&ledger, "p0");
    let again = decide(&mut ledger, &candidate("p0", 0, &spec), &[], &fleet);
    assert!(
        matches!(again.outcome, Outcome::Planned(_)),
        "{:?}",
        again.outcome
    );
    assert_eq!(held_by(&ledger, "p0"), kept);
    assert_eq!(ledger.index_mismatch(), None);
}

/// The same slices as an apiserver without partitionable devices keeps them (Kubernetes 1.35:
/// `sharedCounters` and `consumesCounters` dropped): nothing says how MIG devices share their
/// GPU, so the GPU and its MIG devices are kept apart (never the GPU beside one of its MIG
/// devices), while MIG devices may be held side by side, as the scheduler would allocate them.
#[test]
fn without_counters_a_gpu_is_never_held_beside_its_mig_devices() {
    let mut slices = fixture_slices(&["nvidia-h100-dynamic-mig.yaml"]);
    slices.retain(|slice| slice.spec.devices.as_ref().is_some_and(|d| !d.is_empty()));
    for slice in &mut slices {
        slice.spec.shared_counters = None;
        for device in slice.spec.devices.iter_mut().flatten() {
            device.consumes_counters = None;
        }
        slice.spec.pool.resource_slice_count = 1;
    }
    let published = published_devices(&slices);
    let part = NodePart::with_published(NODE, None, published.node(NODE));
    let fleet = FleetView::from_parts([Arc::new(part)], &BTreeMap::new()).with_counters(&slices);
    assert!(
        !fleet.counters().is_empty(),
        "the GPUs and their MIG devices are kept apart"
    );
    let slices: Vec<&ResourceSlice> = slices.iter().collect();

    // A pod's MIG device on GPU 0 (allocated by the scheduler): GPU 0 is no whole device.
    let pod_claim: k8s_openapi::api::resource::v1::ResourceClaim =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pod-mig", "namespace": "team"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [{
                "request": "r", "driver": "gpu.nvidia.com", "pool": NODE,
                "device": "gpu-0-mig-3g40gb-9-0",
            }]}}},
        }))
        .unwrap();
    let mut ledger = Ledger::new();
    ledger.set_external(held_outside(&[&pod_claim], &slices, &ledger, &fleet));
    let gpu0 = fleet
        .dra_devices()
        .find(|(_, _, r)| r.device == "gpu-0")
        .map(|(_, id, _)| id.to_string())
        .unwrap();
    assert!(
        ledger
            .reserved_by_others(&PlacementKey::new("ml", "any"))
            .contains(NODE, &gpu0)
    );

    let spec = small();
    let mut taken = Vec::new();
    for i in 0..3 {
        let name = format!("p{i}");
        let decision = decide(&mut ledger, &candidate(&name, i, &spec), &[], &fleet);
        let Outcome::Planned(status) = &decision.outcome else {
            panic!("{name}: {:?}", decision.outcome)
        };
        let kind = status
            .plan
            .as_ref()
            .and_then(|p| p.fraction.clone())
            .map(|f| f.kind);
        assert_eq!(kind.as_deref(), Some("partition"), "{name}: {status:?}");
        let device = held_by(&ledger, &name);
        assert!(device.contains("-mig-3g40gb-"), "{device}");
        assert!(!taken.contains(&device));
        taken.push(device);
    }
    // Every GPU holds MIG devices now: a model that needs whole GPUs gets none.
    let mut whole = small();
    whole
        .constraints
        .get_or_insert_with(Default::default)
        .whole_devices = Some(true);
    let refused = decide(&mut ledger, &candidate("whole", 9, &whole), &[], &fleet);
    assert!(
        !matches!(refused.outcome, Outcome::Planned(_)),
        "{:?}",
        refused.outcome
    );
}

/// AMD's partitions (`fixtures/dra/amd-mi300x-2026.yaml`: one GPU partitioned on the node,
/// two DPX partitions and no whole entry, beside whole MI300X): placements holding their own
/// claims take the two partitions first, one each, through the driver's own class; the next
/// gets a whole MI300X; a pod's allocation of a partition counts as the GPU's (it is held),
/// and a placement freed gives its partition to the next.
#[test]
fn claims_placements_take_the_partitions_of_a_gpu_partitioned_on_its_node() {
    const AMD_NODE: &str = "mi300x-2026";
    let slices = fixture_slices(&["amd-mi300x-2026.yaml"]);
    let published = published_devices(&slices);
    let part = NodePart::with_published(AMD_NODE, None, published.node(AMD_NODE));
    let fleet = FleetView::from_parts([Arc::new(part)], &BTreeMap::new()).with_counters(&slices);
    let slices: Vec<&ResourceSlice> = slices.iter().collect();
    let mut ledger = Ledger::new();
    ledger.set_external(held_outside(&[], &slices, &ledger, &fleet));
    let spec = small();
    let mut taken = Vec::new();
    for i in 0..2 {
        let name = format!("p{i}");
        let decision = decide(&mut ledger, &candidate(&name, i, &spec), &[], &fleet);
        let Outcome::Planned(status) = &decision.outcome else {
            panic!("{name}: {:?}", decision.outcome)
        };
        let fraction = status.plan.as_ref().and_then(|p| p.fraction.clone());
        assert_eq!(
            fraction
                .as_ref()
                .map(|f| (f.kind.as_str(), f.profile.as_deref())),
            Some(("partition", Some("dpx_nps2"))),
            "{name}: {status:?}"
        );
        let Holding::Claims(plans) = holding("ml", &name, AllocationMode::Claims, status, &fleet)
        else {
            panic!("held by claims")
        };
        assert_eq!(plans[0].device_class(), "gpu.amd.com");
        let device = plans[0].devices[0].device.clone();
        assert!(
            ["gpu-3-130", "gpu-9-136"].contains(&device.as_str()),
            "{device}"
        );
        assert!(!taken.contains(&device), "{device} handed out twice");
        taken.push(device);
    }
    // Both partitions held: the GPU counts as held by them, and the next goes whole.
    let parent = fleet
        .nodes()
        .iter()
        .flat_map(|n| &n.devices)
        .find(|d| d.partitions_only)
        .map(|d| d.id.clone())
        .expect("the partitioned GPU");
    assert!(
        ledger
            .reserved_by_others(&PlacementKey::new("ml", "any"))
            .contains(AMD_NODE, &parent)
    );
    let third = decide(&mut ledger, &candidate("p2", 2, &spec), &[], &fleet);
    let Outcome::Planned(status) = &third.outcome else {
        panic!("{:?}", third.outcome)
    };
    assert!(
        status.plan.as_ref().unwrap().fraction.is_none(),
        "{status:?}"
    );
    assert!(
        held_by(&ledger, "p2").contains("gpu-1-128")
            || held_by(&ledger, "p2").contains("gpu-4-131")
    );

    // One freed: the next small placement takes that partition, not another whole GPU.
    let freed = held_by(&ledger, "p0");
    ledger.forget(&PlacementKey::new("ml", "p0"));
    let again = decide(&mut ledger, &candidate("p3", 3, &spec), &[], &fleet);
    assert!(
        matches!(again.outcome, Outcome::Planned(_)),
        "{:?}",
        again.outcome
    );
    assert_eq!(held_by(&ledger, "p3"), freed);
    assert_eq!(ledger.index_mismatch(), None);

    // A pod's claim on a partition (allocated by the scheduler) takes that partition only.
    let pod_claim: k8s_openapi::api::resource::v1::ResourceClaim =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pod-part", "namespace": "team"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [{
                "request": "r", "driver": "gpu.amd.com", "pool": AMD_NODE,
                "device": "gpu-9-136",
            }]}}},
        }))
        .unwrap();
    let mut ledger = Ledger::new();
    ledger.set_external(held_outside(&[&pod_claim], &slices, &ledger, &fleet));
    let decision = decide(&mut ledger, &candidate("p5", 5, &spec), &[], &fleet);
    assert!(
        matches!(decision.outcome, Outcome::Planned(_)),
        "{:?}",
        decision.outcome
    );
    let held = held_by(&ledger, "p5");
    let on = fleet.dra_device(AMD_NODE, &held).map(|r| r.device.clone());
    assert_eq!(on.as_deref(), Some("gpu-3-130"), "the partition left");
}

/// The same with the node's inventory (8 MI300X, the first two published only in
/// partitions, `fixtures/dra/amd-mi300x-partitioned.yaml`): a held partition counts its GPU,
/// by its inventory name, as held by the placements.
#[test]
fn a_held_amd_partition_counts_its_inventory_gpu_as_held() {
    const AMD_NODE: &str = "mi300x-partitioned-node";
    let inventory = crate::testing::inventory::fixture_inventory("mi300x-8x", AMD_NODE);
    let slices = fixture_slices(&["amd-mi300x-partitioned.yaml"]);
    let published = published_devices(&slices);
    let part = NodePart::with_published(AMD_NODE, Some(&inventory), published.node(AMD_NODE));
    let fleet = FleetView::from_parts([Arc::new(part)], &BTreeMap::new()).with_counters(&slices);
    let split: Vec<String> = fleet.nodes()[0]
        .devices
        .iter()
        .filter(|d| d.partitions_only)
        .map(|d| d.id.clone())
        .collect();
    assert_eq!(split.len(), 2, "{:?}", fleet.nodes());
    let slices: Vec<&ResourceSlice> = slices.iter().collect();
    let mut ledger = Ledger::new();
    ledger.set_external(held_outside(&[], &slices, &ledger, &fleet));
    let decision = decide(&mut ledger, &candidate("p0", 0, &small()), &[], &fleet);
    assert!(
        matches!(decision.outcome, Outcome::Planned(_)),
        "{:?}",
        decision.outcome
    );
    let held: Vec<(&str, &str)> = ledger.held_through_counters().collect();
    assert_eq!(
        held,
        [(AMD_NODE, split[0].as_str())],
        "{:?}",
        ledger.get(&PlacementKey::new("ml", "p0"))
    );
    // Counted as the fleet pass counts: the GPU is held, the rest free.
    let mut ours = crate::plan::Reservations::none();
    for (_, holding) in ledger.iter() {
        for (node, device) in holding.devices() {
            ours.insert(node, device);
        }
    }
    for (node, device) in ledger.held_through_counters() {
        ours.insert(node, device);
    }
    let before = crate::controller::core::fleet_figures::NodeStats::of(
        &inventory,
        &crate::fleet::health::Holdings {
            placements: &crate::plan::Reservations::none(),
            claims: None,
        },
        fleet.unplannable_on(AMD_NODE),
    );
    let after = crate::controller::core::fleet_figures::NodeStats::of(
        &inventory,
        &crate::fleet::health::Holdings {
            placements: &ours,
            claims: None,
        },
        fleet.unplannable_on(AMD_NODE),
    );
    assert_eq!(after.free_devices() + 1, before.free_devices(), "{ours:?}");

    // A pod's claim on a partition of the other GPU (allocated by the scheduler): that GPU
    // is held by a claim, for the counts and every plan, though no counter is published.
    let pod_claim: k8s_openapi::api::resource::v1::ResourceClaim =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pod-part", "namespace": "team"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [{
                "request": "r", "driver": "gpu.amd.com", "pool": AMD_NODE,
                "device": "gpu-9-136",
            }]}}},
        }))
        .unwrap();
    let outside = held_outside(&[&pod_claim], &slices, &ledger, &fleet);
    assert!(
        outside.devices.contains(AMD_NODE, &split[1]),
        "{:?}",
        outside.devices
    );
    assert!(
        !outside.devices.contains(AMD_NODE, &split[0]),
        "the placement's own GPU"
    );
}
