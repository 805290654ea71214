//! Claims on the vendor-shaped 8x H100 slice of `fixtures/dra/` (a DRA-only node).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaimStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

use super::*;
use crate::api::placement::{Assignment, ModelPlacementStatus};
use crate::controller::core::fleet_view::NodePart;
use crate::controller::core::ledger::Holding;
use crate::dra::claims::ClaimPlan;
use crate::dra::slices::published_devices;
use crate::testing::dra::fixture_slices;

const NODE: &str = "h100-8x-nvswitch";

fn fleet() -> FleetView {
    let slices = fixture_slices(&["nvidia-h100-8x.yaml"]);
    let published = published_devices(&slices);
    let part = Arc::new(NodePart::with_published(NODE, None, published.node(NODE)));
    FleetView::from_parts([part], &BTreeMap::new())
}

/// The fleet's planner ids of the whole GPUs, in order.
fn gpus(fleet: &FleetView) -> Vec<String> {
    let node = fleet.nodes().iter().find(|n| n.name == NODE).expect("node");
    let ids: Vec<String> = node
        .devices
        .iter()
        .filter(|d| fleet.dra_device(NODE, &d.id).is_some())
        .map(|d| d.id.clone())
        .collect();
    assert!(ids.len() >= 4, "{ids:?}");
    ids
}

/// Placement `ml/<name>` (uid `uid-<name>`) holding `devices` in the ledger.
fn hold(ledger: &mut Ledger, name: &str, devices: &[String]) {
    let status = ModelPlacementStatus {
        assignments: vec![Assignment {
            node: NODE.to_string(),
            devices: devices.to_vec(),
            replica: 0,
            stage: 0,
        }],
        ..ModelPlacementStatus::default()
    };
    let holding = Holding {
        created: 0,
        uid: format!("uid-{name}"),
        generation: 1,
        status,
    };
    ledger
        .insert(PlacementKey::new("ml", name), holding)
        .expect("no conflict");
}

/// A claim of placement `ml/<placement>` owned by `owner_uid` (none: taken off), allocated
/// to `devices`, as the controller writes one.
fn claim(
    fleet: &FleetView,
    placement: &str,
    owner_uid: Option<&str>,
    devices: &[String],
) -> ResourceClaim {
    let plan = ClaimPlan::new("ml", placement, (0, 0, NODE), devices, |node, device| {
        fleet.dra_device(node, device).cloned()
    })
    .expect("published devices");
    let owner = owner_uid.map(|uid| OwnerReference {
        api_version: "hwaccel.io/v1alpha1".into(),
        kind: "ModelPlacement".into(),
        name: placement.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    });
    let mut claim = plan.claim(owner);
    claim.metadata.uid = Some(format!("claim-{}", plan.name));
    claim.status = Some(ResourceClaimStatus {
        allocation: Some(plan.allocation(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))),
        ..ResourceClaimStatus::default()
    });
    claim
}

fn taken(reservations: &Reservations) -> Vec<String> {
    reservations.iter().map(|(_, id)| id.to_string()).collect()
}

#[test]
fn a_claims_devices_its_placement_holds_are_counted_once_by_the_ledger() {
    let fleet = fleet();
    let gpus = gpus(&fleet);
    let mut ledger = Ledger::new();
    hold(&mut ledger, "p", &gpus[..2]);
    let ours = claim(&fleet, "p", Some("uid-p"), &gpus[..2]);
    assert!(claimed_devices([&ours], &ledger, &fleet).is_empty());
}

#[test]
fn a_claim_kept_past_its_placement_holds_its_devices() {
    let fleet = fleet();
    let gpus = gpus(&fleet);
    let ledger = Ledger::new();
    // Placement gone (nothing in the ledger); owner kept, or taken off by the tenant.
    let kept = claim(&fleet, "p", Some("uid-p"), &gpus[..1]);
    let unowned = claim(&fleet, "q", None, &gpus[1..2]);
    let claimed = claimed_devices([&kept, &unowned], &ledger, &fleet);
    assert_eq!(taken(&claimed), gpus[..2].to_vec());
}

#[test]
fn a_stale_claim_of_a_live_placement_holds_the_devices_its_plan_left() {
    let fleet = fleet();
    let gpus = gpus(&fleet);
    let mut ledger = Ledger::new();
    hold(&mut ledger, "p", &gpus[..2]);
    // From p's older plan on gpus 1 and 2, stuck terminating: gpu 1 is p's own again, gpu 2
    // is not p's any more but the claim still holds it.
    let stale = claim(&fleet, "p", Some("uid-p"), &gpus[1..3]);
    assert_eq!(
        taken(&claimed_devices([&stale], &ledger, &fleet)),
        [gpus[2].clone()]
    );
}

#[test]
fn a_claim_of_a_placement_made_again_under_its_name_is_not_its_holding() {
    let fleet = fleet();
    let gpus = gpus(&fleet);
    let mut ledger = Ledger::new();
    hold(&mut ledger, "p", &gpus[..1]);
    // Owned by the deleted p, whose namesake (uid-p) now holds the same device.
    let old = claim(&fleet, "p", Some("uid-old-p"), &gpus[..1]);
    assert_eq!(
        taken(&claimed_devices([&old], &ledger, &fleet)),
        [gpus[0].clone()]
    );
    // Another placement's claim on a device p holds: taken as well (a conflict is visible).
    let other = claim(&fleet, "q", Some("uid-q"), &gpus[..1]);
    assert_eq!(taken(&claimed_devices([&other], &ledger, &fleet)).len(), 1);
}

#[test]
fn unallocated_claims_and_unknown_devices_take_nothing() {
    let fleet = fleet();
    let gpus = gpus(&fleet);
    let mut pending = claim(&fleet, "p", None, &gpus[..1]);
    pending.status = None;
    let mut elsewhere = claim(&fleet, "p", None, &gpus[..1]);
    if let Some(result) = elsewhere
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .and_then(|d| d.results.as_mut())
        .and_then(|r| r.first_mut())
    {
        result.pool = "another-node".into();
    }
    let claimed = claimed_devices([&pending, &elsewhere], &Ledger::new(), &fleet);
    assert!(claimed.is_empty(), "{claimed:?}");
}

#[test]
fn claims_whose_placement_is_gone_or_made_again_are_reported_as_outlived() {
    let fleet = fleet();
    let gpus = gpus(&fleet);
    let live = claim(&fleet, "live", Some("uid-live"), &gpus[..1]);
    let gone = claim(&fleet, "gone", Some("uid-gone"), &gpus[1..3]);
    let remade = claim(&fleet, "remade", Some("uid-first"), &gpus[3..4]);
    let unowned = claim(&fleet, "live", None, &gpus[4..5]);
    let mut pending = claim(&fleet, "gone", Some("uid-gone"), &gpus[5..6]);
    pending.status = None;
    let mut foreign = claim(&fleet, "x", None, &gpus[6..7]);
    foreign.metadata.labels = None;
    let uids = BTreeMap::from([
        (("ml", "live"), "uid-live"),
        (("ml", "remade"), "uid-second"),
    ]);
    let all = [&live, &gone, &remade, &unowned, &pending, &foreign];
    let outlived = outlived_claims(all, |ns, name| uids.get(&(ns, name)).copied(), |_| true);
    let names: Vec<(&str, usize)> = outlived
        .iter()
        .map(|c| (c.placement.as_str(), c.devices))
        .collect();
    assert_eq!(names, [("gone", 2), ("live", 1), ("remade", 1)]);
    // A controller scoped to another namespace does not judge these.
    assert!(outlived_claims(all, |_, _| None, |ns| ns == "other").is_empty());
}

/// The dynamic-MIG fixture's node (2x H100, one counter set each), slices only.
const MIG_NODE: &str = "h100-mig-node";

/// An allocated claim `ns/name` naming `device` of the MIG node, as the scheduler writes one.
fn scheduler_claim(name: &str, device: &str) -> ResourceClaim {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "team"},
        "spec": {},
        "status": {"allocation": {"devices": {"results": [{
            "request": "part", "driver": "gpu.nvidia.com", "pool": MIG_NODE, "device": device,
        }]}}},
    }))
    .expect("test claim")
}

#[test]
fn a_mig_slice_the_scheduler_allocated_holds_its_whole_gpu_with_the_counter_set_as_why() {
    let slices = fixture_slices(&["nvidia-h100-dynamic-mig.yaml"]);
    let published = published_devices(&slices);
    let part = Arc::new(NodePart::with_published(
        MIG_NODE,
        None,
        published.node(MIG_NODE),
    ));
    let fleet = FleetView::from_parts([part], &BTreeMap::new()).with_counters(&slices);
    let id_of = |device: &str| {
        fleet.nodes()[0]
            .devices
            .iter()
            .find(|d| {
                fleet
                    .dra_device(MIG_NODE, &d.id)
                    .is_some_and(|r| r.device == device)
            })
            .map(|d| d.id.clone())
            .expect("a whole GPU")
    };
    let (gpu0, gpu1) = (id_of("gpu-0"), id_of("gpu-1"));
    let slice = scheduler_claim("mig", "gpu-0-mig-1g10gb-19-3");
    let slices: Vec<&ResourceSlice> = slices.iter().collect();
    let mut ledger = Ledger::new();
    let held = held_outside(&[&slice], &slices, &ledger, &fleet);
    // The MIG device is taken; the whole GPU 0 and the MIG devices sharing its memory slice
    // are blocked; the other 3g.40gb of GPU 0 and GPU 1 stay free.
    let mig = |name: &str| format!("gpu-nvidia-com-{name}");
    assert_eq!(
        taken(&held.devices),
        [
            gpu0.clone(),
            mig("gpu-0-mig-1g10gb-19-3"),
            mig("gpu-0-mig-3g40gb-9-0"),
            mig("gpu-0-mig-7g80gb-0-0"),
        ]
    );
    assert!(
        !held
            .devices
            .contains(MIG_NODE, &mig("gpu-0-mig-3g40gb-9-4"))
    );
    let why = &held.blocked[&(MIG_NODE.to_string(), gpu0.clone())];
    assert!(
        why.contains("gpu-0-counter-set") && why.contains("team/mig"),
        "{why}"
    );
    assert!(!held.devices.contains(MIG_NODE, &gpu1));
    // The planner's reservations and a refusal's reasons carry it.
    ledger.set_external(held);
    assert!(
        ledger
            .reserved_by_others(&PlacementKey::new("ml", "p"))
            .contains(MIG_NODE, &gpu0)
    );
    let lines = ledger.blocked_by_counters(5);
    assert_eq!(
        lines.len(),
        3,
        "the GPU and its two overlapping MIG devices: {lines:?}"
    );
    assert!(lines[0].starts_with(&format!("{MIG_NODE}/{gpu0} cannot be allocated: ")));
    // Freed: nothing is held, and that counts as a release (waiting placements try again).
    let releases = ledger.releases();
    assert!(ledger.set_external(held_outside(&[], &slices, &ledger, &fleet)));
    assert_eq!(ledger.releases(), releases + 1);
    assert!(ledger.blocked_by_counters(5).is_empty());
}

/// A claim the scheduler allocated `device` of the shareable fixture node, consuming
/// `consumed` of its memory when given (a share), or none recorded (the whole device).
fn share_claim(name: &str, device: &str, consumed: Option<&str>) -> ResourceClaim {
    let mut result = serde_json::json!({
        "request": "gpu", "driver": "gpu.nvidia.com", "pool": "h100-2x-shared", "device": device,
    });
    if let Some(consumed) = consumed {
        result["consumedCapacity"] = serde_json::json!({"memory": consumed});
        result["shareID"] = serde_json::json!("6f1b1d7e-1c0a-4c57-9a58-1d2b3c4d5e6f");
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "team"},
        "spec": {},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }))
    .expect("test claim")
}

/// Issue 39: what other claims consume of a shareable GPU (their allocations'
/// `consumedCapacity`) is summed as bytes, not taken whole, so shares still fit beside them;
/// a claim that records no consumption holds its device whole; the ledger's own share of a
/// device is not counted again.
#[test]
fn shares_other_claims_consume_are_summed_per_device_and_a_whole_allocation_takes_it() {
    const GIB: u64 = 1 << 30;
    let node = "h100-2x-shared";
    let slices = fixture_slices(&["nvidia-h100-shareable.yaml"]);
    let published = published_devices(&slices);
    let part = Arc::new(NodePart::with_published(node, None, published.node(node)));
    let fleet = FleetView::from_parts([part], &BTreeMap::new());
    let id_of = |device: &str| {
        fleet
            .dra_devices()
            .find(|(_, _, r)| r.device == device)
            .map(|(_, id, _)| id.to_string())
            .expect("a shareable GPU")
    };
    let (gpu0, gpu1) = (id_of("gpu-0"), id_of("gpu-1"));
    let a = share_claim("a", "gpu-0", Some("24Gi"));
    let b = share_claim("b", "gpu-0", Some("16Gi"));
    let whole = share_claim("c", "gpu-1", None);
    let ledger = Ledger::new();
    let taken = claimed_devices([&a, &b, &whole], &ledger, &fleet);
    assert_eq!(taken.consumed(node, &gpu0), 40 * GIB);
    assert!(!taken.contains(node, &gpu0), "shares leave room");
    assert!(taken.contains(node, &gpu1));
    // For counts of whole devices, a device with shares on it is not free.
    assert!(taken.clone().with_consumed_taken().contains(node, &gpu0));
}
