//! The fast tier for ResourceClaims nobody plans by (issue 27), across the placement loop
//! and the fleet loop (which is why it sits above both): an allocated claim takes its
//! devices, whoever holds it, in planning and in the fleet's numbers, and a claim kept past
//! its placement is reported. On the fake apiserver, with `n1`'s GPUs published by the
//! NVIDIA driver's vendor-shaped slice.

use std::time::Duration;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::Resource;
use kube::runtime::watcher;
use prometheus_client::encoding::text::encode;

use crate::api::placement::AllocationMode;
use crate::api::{ModelPlacement, attribute};
use crate::controller::cache::fleet_view;
use crate::controller::fleet::pass::Memory;
use crate::controller::fleet_loop::fleet_and_taints;
use crate::controller::placement::reconcile_tests::{Harness, placement, status_writes_of};
use crate::controller::taints::core::HealthTaints;
use crate::controller::taints::sync::Taints;
use crate::dra::claims::ClaimPlan;

const INVENTORY_STATUS: &str = "/apis/hwaccel.io/v1alpha1/acceleratorinventories/n1/status";

/// A claim of placement `ml/<placement>` owned by `owner_uid`, allocated to the planner
/// devices `devices` of `n1`, as the controller writes one.
async fn allocated_claim(
    harness: &Harness,
    placement: &str,
    owner_uid: &str,
    devices: &[String],
) -> ResourceClaim {
    let fleet = {
        let mut state = harness.ctx.state.lock().await;
        fleet_view(&harness.ctx, &mut state)
    };
    let plan = ClaimPlan::new("ml", placement, (0, 0, "n1"), devices, |node, device| {
        fleet.dra_device(node, device).cloned()
    })
    .expect("the slice publishes n1's GPUs");
    let owner = OwnerReference {
        api_version: "hwaccel.io/v1alpha1".into(),
        kind: "ModelPlacement".into(),
        name: placement.into(),
        uid: owner_uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let mut claim = plan.claim(Some(owner));
    claim.metadata.uid = Some(format!("uid-{}", plan.name));
    claim.status = Some(ResourceClaimStatus {
        allocation: Some(plan.allocation(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))),
        ..ResourceClaimStatus::default()
    });
    claim
}

/// `n1`'s GPUs as the planner names them.
async fn gpus(harness: &Harness) -> Vec<String> {
    let mut state = harness.ctx.state.lock().await;
    let fleet = fleet_view(&harness.ctx, &mut state);
    let node = fleet.nodes().iter().find(|n| n.name == "n1").expect("n1");
    let ids: Vec<String> = node
        .devices
        .iter()
        .filter(|d| fleet.dra_device("n1", &d.id).is_some())
        .map(|d| d.id.clone())
        .collect();
    assert_eq!(ids.len(), 8, "every GPU is published: {ids:?}");
    ids
}

/// The value of the gauge line that starts with `series` in the text exposition.
fn gauge(harness: &Harness, series: &str) -> Option<i64> {
    let mut text = String::new();
    encode(&mut text, &harness.registry).expect("encode");
    text.lines()
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

#[tokio::test]
async fn a_claim_kept_past_its_placement_is_reserved_in_the_gauges_and_reported() {
    let mut harness = Harness::with_dra();
    // The fixture has a GPU that is not healthy: count the plannable ones (the one
    // device-state rule: every health but `unhealthy`), and claim one of those.
    let healthy: Vec<String> = harness
        .ctx
        .inventories
        .state()
        .iter()
        .filter_map(|i| i.decoded().cloned())
        .flat_map(|i| i.spec.devices)
        .filter(|d| {
            crate::hardware::device_state::plannable_health(
                crate::hardware::device_state::parse_health(d.text(attribute::HEALTH).as_deref()),
            )
        })
        .filter(|d| d.text(attribute::FAMILY).as_deref() != Some("cpu"))
        .map(|d| d.name)
        .collect();
    assert!(gpus(&harness).await.contains(&healthy[0]), "{healthy:?}");
    let free_before = healthy.len() as u64;
    // Placement ml/gone was deleted; its tenant kept the claim (a finalizer of its own, or
    // the ownerReference taken off), so it stays allocated with no pod and no placement.
    let kept = allocated_claim(&harness, "gone", "uid-gone", &healthy[..1]).await;
    harness
        .claims
        .apply_watcher_event(&watcher::Event::Apply(kept));
    let mut taints = Taints::new(
        &harness.ctx,
        HealthTaints::None,
        None,
        Duration::from_secs(60),
    )
    .await;
    let mut memory = Memory::default();
    fleet_and_taints(&harness.ctx, &mut memory, &mut taints).await;

    let free: Vec<_> = harness
        .fake
        .patches()
        .into_iter()
        .filter(|r| r.path == INVENTORY_STATUS)
        .map(|r| r.body["status"]["freeDevices"].clone())
        .collect();
    assert_eq!(
        free,
        [serde_json::json!(free_before - 1)],
        "{free_before} plannable GPUs, one kept by the claim"
    );
    let product = "{product=\"nvidia-h100-80gb-hbm3\",vendor=\"nvidia\"}";
    assert_eq!(
        gauge(&harness, &format!("hwaccel_fleet_devices_free{product}")),
        Some(free_before as i64 - 1)
    );
    assert_eq!(
        gauge(
            &harness,
            &format!("hwaccel_fleet_devices_reserved{product}")
        ),
        Some(1)
    );
    assert_eq!(gauge(&harness, "hwaccel_fleet_outlived_claims "), Some(1));
    let events = harness.fake.events(1).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].body["reason"], "PlacementGone");
    assert_eq!(events[0].body["regarding"]["kind"], "ResourceClaim");

    // Reported once, not on every pass.
    harness.fake.clear();
    fleet_and_taints(&harness.ctx, &mut memory, &mut taints).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        harness.fake.requests().iter().all(|r| r.method != "POST"),
        "{:?}",
        harness.fake.requests()
    );
}

#[tokio::test]
async fn a_stale_claim_of_a_live_placement_keeps_its_device_from_the_next_placement() {
    let mut harness = Harness::with_dra();
    let gpus = gpus(&harness).await;
    let mut p = placement();
    p.spec.allocation = Some(AllocationMode::Labels);
    harness.store(&p);
    harness.reconcile(&p).await.expect("reconcile p");
    let p_path = "/apis/hwaccel.io/v1alpha1/namespaces/ml/modelplacements/p";
    let held: Vec<String> = status_writes_of(&harness.fake, p_path)
        .pop()
        .expect("p's status")
        .assignments
        .into_iter()
        .flat_map(|a| a.devices)
        .collect();
    assert_eq!(held.len(), 4, "half of n1: {held:?}");
    // A claim from p's older plan, stuck terminating (a tenant's finalizer), still holds one
    // of the four GPUs p's current plan left.
    let left: Vec<String> = gpus.iter().filter(|g| !held.contains(g)).cloned().collect();
    let stale = allocated_claim(&harness, "p", "uid-p", &left[..1]).await;
    harness
        .claims
        .apply_watcher_event(&watcher::Event::Apply(stale));

    // q asks for the same half of n1: three GPUs are free, not four.
    let mut q: ModelPlacement = placement();
    let meta = q.meta_mut();
    meta.name = Some("q".into());
    meta.uid = Some("uid-q".into());
    meta.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(60).expect("a time"),
    ));
    q.spec.allocation = Some(AllocationMode::Labels);
    harness.store(&q);
    harness.reconcile(&q).await.expect("reconcile q");
    let q_path = "/apis/hwaccel.io/v1alpha1/namespaces/ml/modelplacements/q";
    let status = status_writes_of(&harness.fake, q_path)
        .pop()
        .expect("q's status");
    let planned: Vec<&String> = status.assignments.iter().flat_map(|a| &a.devices).collect();
    assert!(
        !planned.contains(&&left[0]),
        "q got {} which the stale claim holds: {planned:?}",
        left[0]
    );
    assert_eq!(status.state.as_deref(), Some("Pending"), "{status:?}");
}
