//! One placement per device, against a real kube-apiserver (issue 35):
//!
//! - a spec edit of a placement that holds a device, while older placements wait for one,
//!   never hands that device to two placements (the ledger's commit freed the re-planned
//!   holding after placing the older one and dropped the older one's owner entry, so the
//!   next plan took the device again: two placements Ready on one H100 in labels mode, a
//!   placement stuck behind another's claim in claims mode);
//! - a Planned placement deleted after a tenant removed its cleanup finalizer frees its
//!   devices (nothing ever did: no reconcile runs for an object that left the cache);
//! - a placement deleted before its own first reconcile added the finalizer holds nothing
//!   afterwards (a younger placement's reconcile used to plan it as an "older waiting" one).
//!
//! The devices coming back free is shown by `status.freeDevices` of the inventory and by a
//! later placement becoming Planned. Run with the cluster up: `tests/cluster/up.sh --full &&
//! cargo test --test cluster_tier -- --ignored cluster_controller_holdings::` (the claims
//! variant needs the full tier and is skipped without it).

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use hwaccel::api::placement::{
    AllocationMode, ModelPlacementSpec, ModelPlacementStatus, PrecisionChoice,
};
use hwaccel::api::{AcceleratorInventory, ModelPlacement, conditions};
use hwaccel::controller;
use hwaccel::testing::PlacementBuilder;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::cluster_controller::{
    Running, add_node, create_placement, devices_of, metrics, scoped_config, start_controller,
    wait_state,
};
use crate::support::{DEFAULT_TIMEOUT, TestCluster, install_crds, wait_for};

/// Waiting placements in the spec-edit test, as many as the live reproduction had.
const WAITING: usize = 20;
/// How long the spec-edit test keeps watching for a device named twice once things settled.
const WATCH_AFTER: Duration = Duration::from_secs(8);

/// One replica of an 8B model: one H100.
fn one_gpu(concurrency: u32, allocation: AllocationMode) -> ModelPlacementSpec {
    let mut spec = PlacementBuilder::serve("llama-3.1-8b")
        .concurrency(concurrency)
        .spec();
    spec.allocation = Some(allocation);
    spec
}

/// 70B at bf16 for 40 concurrent requests: 4 of an 8 x H100 node's GPUs per replica.
fn half_node(replicas: u32) -> ModelPlacementSpec {
    PlacementBuilder::serve("llama-3.1-70b")
        .precision(PrecisionChoice::Bf16)
        .concurrency(40)
        .replicas(replicas)
        .spec()
}

fn api(cluster: &TestCluster) -> Api<ModelPlacement> {
    Api::namespaced(cluster.client(), cluster.namespace())
}

fn is_ready(status: &ModelPlacementStatus) -> bool {
    conditions::find(&status.conditions, "Ready").is_some_and(|c| c.status == "True")
}

/// Every device named by a placement whose status is Ready for its current generation, by
/// device: two names for one device is the failure this file is about.
async fn ready_holders(cluster: &TestCluster) -> Result<BTreeMap<(String, String), Vec<String>>> {
    let mut holders: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for placement in api(cluster).list(&ListParams::default()).await?.items {
        let name = placement.metadata.name.clone().unwrap_or_default();
        let generation = placement.metadata.generation;
        let Some(status) = placement.status else {
            continue;
        };
        if status.observed_generation != generation || !is_ready(&status) {
            continue;
        }
        for device in devices_of(&status) {
            holders.entry(device).or_default().push(name.clone());
        }
    }
    Ok(holders)
}

/// Fails when a device is named by two Ready placements.
async fn assert_no_device_twice(cluster: &TestCluster) -> Result<usize> {
    let holders = ready_holders(cluster).await?;
    for (device, names) in &holders {
        if names.len() > 1 {
            bail!("{}/{} is held by {names:?}", device.0, device.1);
        }
    }
    Ok(holders.len())
}

/// `status.freeDevices` of the inventory of `node` (`None` until the controller wrote it).
async fn free_devices(cluster: &TestCluster, node: &str) -> Result<Option<u32>> {
    let inventories: Api<AcceleratorInventory> = Api::all(cluster.client());
    Ok(inventories
        .get(node)
        .await?
        .status
        .and_then(|s| s.free_devices))
}

async fn wait_free_devices(cluster: &TestCluster, node: &str, free: u32) -> Result<()> {
    wait_for(
        DEFAULT_TIMEOUT,
        &format!("{node} freeDevices {free}"),
        || async { Ok((free_devices(cluster, node).await? == Some(free)).then_some(())) },
    )
    .await
}

/// Placement labels on `node`, by key.
async fn placement_labels(cluster: &TestCluster, node: &str) -> Result<BTreeSet<String>> {
    let node = Api::<Node>::all(cluster.client()).get(node).await?;
    Ok(node
        .metadata
        .labels
        .unwrap_or_default()
        .into_keys()
        .filter(|k| controller::placement::core::labels::is_placement_label(k))
        .collect())
}

/// The live collision: an H100 node fully held by 1-GPU placements `z-0`..`z-7`, twenty
/// 1-GPU placements `a-00`..`a-19` older than them waiting, then `z-7`'s concurrency goes
/// from 1 to 2. Its re-plan frees its GPU and gives it to `a-00` first (older), whose key
/// sorts before `z-7`'s. The waiting ones are made older by creating them first with a node
/// selector nothing matches, then editing it away once the holders have the node.
async fn a_spec_edit_never_hands_a_device_out_twice(
    cluster: &TestCluster,
    node: &str,
    allocation: AllocationMode,
) -> Result<()> {
    let api = api(cluster);
    let waiting: Vec<String> = (0..WAITING).map(|i| format!("a-{i:02}")).collect();
    for name in &waiting {
        let mut spec = one_gpu(1, allocation);
        spec.constraints
            .get_or_insert_with(Default::default)
            .node_selector =
            BTreeMap::from([("hwaccel.io/test-nowhere".to_string(), "x".to_string())]);
        create_placement(cluster, name, spec).await?;
    }
    for name in &waiting {
        wait_state(cluster, name, "Pending").await?;
    }
    let holders: Vec<String> = (0..8).map(|i| format!("z-{i}")).collect();
    let mut held = BTreeSet::new();
    for name in &holders {
        create_placement(cluster, name, one_gpu(1, allocation)).await?;
        let status = wait_state(cluster, name, "Planned").await?;
        held.extend(devices_of(&status));
    }
    assert_eq!(held.len(), 8, "the node is fully held: {held:?}");
    // The waiting placements now fit anywhere, but nothing is free.
    for name in &waiting {
        let patch = json!({"spec": {"constraints": {"nodeSelector": null}}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    for name in &waiting {
        wait_state(cluster, name, "Pending").await?;
    }
    assert_no_device_twice(cluster).await?;
    // The spec edit.
    let patch = json!({"spec": {"goal": {"serve": {"concurrency": 2}}}});
    api.patch("z-7", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    // Watch while it settles: z-7's GPU goes to a-00 and z-7 waits.
    let settled = wait_for(DEFAULT_TIMEOUT, "a-00 Ready on z-7's GPU", || async {
        assert_no_device_twice(cluster).await?;
        let a00 = api.get("a-00").await?;
        let ready = a00
            .status
            .filter(|s| is_ready(s) && s.observed_generation == a00.metadata.generation);
        Ok(ready)
    })
    .await?;
    assert!(
        devices_of(&settled).is_subset(&held),
        "a-00 got a GPU of the node: {settled:?}"
    );
    // Where the commit lost the owner entry, the next plan took the GPU again within a
    // pass or two; keep looking for a while.
    let until = Instant::now() + WATCH_AFTER;
    while Instant::now() < until {
        let ready = assert_no_device_twice(cluster).await?;
        assert!(ready <= 8, "{ready} Ready devices on an 8-GPU node");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Exactly eight placements hold the node, each Ready (in claims mode, a placement
    // planned on a GPU another's claim holds would stay not Ready), and the Node carries
    // exactly their labels.
    let mut planned = BTreeSet::new();
    for placement in api.list(&ListParams::default()).await?.items {
        let name = placement.metadata.name.clone().unwrap_or_default();
        let status = placement.status.unwrap_or_default();
        if status.state.as_deref() == Some("Planned") {
            assert!(
                is_ready(&status),
                "{name} is Planned but not Ready: {status:?}"
            );
            planned.insert(name);
        }
    }
    assert_eq!(planned.len(), 8, "{planned:?}");
    assert!(
        planned.contains("a-00") && !planned.contains("z-7"),
        "{planned:?}"
    );
    if allocation == AllocationMode::Labels {
        let labels = placement_labels(cluster, node).await?;
        assert_eq!(labels.len(), 8, "{labels:?}");
    }
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_spec_edit_of_a_holding_placement_never_hands_a_device_out_twice() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let node = add_node(&cluster, "h100-8x-nvswitch").await?;
    let _controller = start_controller(&cluster);
    a_spec_edit_never_hands_a_device_out_twice(&cluster, &node, AllocationMode::Labels).await
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_spec_edit_of_a_holding_placement_never_hands_a_device_out_twice_in_claims_mode()
-> Result<()> {
    let Some((_turn, cluster, node, gpus)) = crate::cluster_dra::h100_dra_node().await? else {
        return Ok(());
    };
    assert_eq!(gpus, 8, "the fixture publishes 8 GPUs");
    let _controller = start_controller(&cluster);
    a_spec_edit_never_hands_a_device_out_twice(&cluster, &node, AllocationMode::Claims).await
}

/// High 2 (a): a tenant removes the cleanup finalizer of a Planned placement holding all
/// eight H100s and deletes it at once, before the controller puts the finalizer back. The
/// object is gone without a cleanup; the prune pass frees its devices and its label.
#[tokio::test]
#[ignore = "needs cluster"]
async fn a_placement_deleted_without_its_finalizer_frees_its_devices() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let node = add_node(&cluster, "h100-8x-nvswitch").await?;
    let _controller = start_controller(&cluster);
    let api = api(&cluster);
    create_placement(&cluster, "holder", half_node(2)).await?;
    let holder = wait_state(&cluster, "holder", "Planned").await?;
    assert_eq!(devices_of(&holder).len(), 8, "{holder:?}");
    create_placement(&cluster, "waiter", half_node(1)).await?;
    wait_state(&cluster, "waiter", "Pending").await?;
    wait_free_devices(&cluster, &node, 0).await?;
    let label =
        controller::placement::core::labels::placement_label_key(cluster.namespace(), "holder");
    assert!(placement_labels(&cluster, &node).await?.contains(&label));
    // The controller debounces the finalizer's removal for 200 ms; the delete lands first.
    let patch = json!({"metadata": {"finalizers": null}});
    api.patch("holder", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    api.delete("holder", &DeleteParams::default()).await?;
    if api.get_opt("holder").await?.is_some() {
        bail!("setup: the controller put its finalizer back before the delete landed");
    }
    let waiter = wait_state(&cluster, "waiter", "Planned").await?;
    assert_eq!(devices_of(&waiter).len(), 4, "{waiter:?}");
    wait_free_devices(&cluster, &node, 4).await?;
    wait_for(DEFAULT_TIMEOUT, "holder's label removed", || async {
        Ok((!placement_labels(&cluster, &node).await?.contains(&label)).then_some(()))
    })
    .await?;
    create_placement(&cluster, "later", half_node(1)).await?;
    let later = wait_state(&cluster, "later", "Planned").await?;
    assert!(devices_of(&later).is_disjoint(&devices_of(&waiter)));
    wait_free_devices(&cluster, &node, 0).await?;
    Ok(())
}

/// High 2 (b): a placement whose own reconcile is kept debounced (annotated every 100 ms
/// against a 1 s debounce) has no finalizer yet while a younger placement's reconcile runs;
/// it used to be planned there as an "older waiting" placement, and deleting it then left
/// its four GPUs held for good. It is no longer planned by another's reconcile, and once it
/// is deleted the node's free GPUs go to the next placement.
#[tokio::test]
#[ignore = "needs cluster"]
async fn a_placement_deleted_before_its_first_reconcile_keeps_nothing() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let node = add_node(&cluster, "h100-8x-nvswitch").await?;
    let mut config = scoped_config(&cluster, "test-controller");
    config.debounce = Duration::from_secs(1);
    let _controller = Running(tokio::spawn(controller::run(
        cluster.client(),
        config,
        metrics(),
        std::future::pending(),
    )));
    let api = api(&cluster);
    create_placement(&cluster, "old", half_node(1)).await?;
    let annotating = {
        let api = api.clone();
        tokio::spawn(async move {
            for round in 0u32.. {
                let patch =
                    json!({"metadata": {"annotations": {"example.com/round": round.to_string()}}});
                if api
                    .patch("old", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    create_placement(&cluster, "young", half_node(1)).await?;
    let young = wait_state(&cluster, "young", "Planned").await;
    let old = api.get("old").await?;
    annotating.abort();
    let young = young?;
    if !old.metadata.finalizers.unwrap_or_default().is_empty() {
        bail!("setup: old's own reconcile ran (it has the finalizer) despite the annotations");
    }
    api.delete("old", &DeleteParams::default()).await?;
    if api.get_opt("old").await?.is_some() {
        bail!("setup: old is still there after its delete");
    }
    // Nothing but young holds the node's GPUs.
    wait_free_devices(&cluster, &node, 4).await?;
    create_placement(&cluster, "later", half_node(1)).await?;
    let later = wait_state(&cluster, "later", "Planned").await?;
    assert!(devices_of(&later).is_disjoint(&devices_of(&young)));
    wait_free_devices(&cluster, &node, 0).await?;
    Ok(())
}
