//! Disaggregated serving against a real kube-apiserver: a ModelPlacement with
//! `goal.serve.disaggregated: true` on kwok nodes gets a decode pool (the top-level status)
//! and a prefill pool (`status.prefill`) on disjoint devices; the role labels
//! `prefill.placement.hwaccel.io/<slug>` and `decode.placement.hwaccel.io/<slug>` sit on
//! exactly each pool's nodes, the placement label on all of them; switching
//! `disaggregated` off takes the role labels and `status.prefill` away. With
//! `allocation: claims` the placement is refused with a reason that says so.
//!
//! Run with the cluster up: `tests/cluster/up.sh --full && cargo test --test
//! cluster_tier -- --ignored cluster_disaggregated:: --test-threads=1`.

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, Result};
use hwaccel::api::ModelPlacement;
use hwaccel::api::placement::{AllocationMode, ModelPlacementStatus, PrecisionChoice};
use hwaccel::controller::HealthTaints;
use hwaccel::testing::{InventoryBuilder, PlacementBuilder};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::controller::start_controller;
use support::nodes::{apply_inventory, create_kwok_node};
use support::{DEFAULT_TIMEOUT, TEST_LABEL, TestCluster, install_crds, wait_for};

/// A kwok node with an 8x H100 inventory, labelled for this test.
async fn add_node(cluster: &TestCluster, what: &str) -> Result<String> {
    let name = cluster.unique_name(what);
    create_kwok_node(cluster, &name).await?;
    let inventory = InventoryBuilder::fixture("h100-8x-nvswitch")
        .node(&name)
        .label(TEST_LABEL, cluster.prefix())
        .build();
    apply_inventory(&cluster.client(), &inventory).await?;
    Ok(name)
}

/// The placement's status once `check` accepts it for the current generation.
async fn wait_status(
    cluster: &TestCluster,
    name: &str,
    what: &str,
    check: impl Fn(&ModelPlacementStatus) -> bool,
) -> Result<ModelPlacementStatus> {
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    wait_for(DEFAULT_TIMEOUT, what, || {
        let api = api.clone();
        let check = &check;
        async move {
            let placement = api.get(name).await?;
            let generation = placement.metadata.generation;
            Ok(placement
                .status
                .filter(|s| s.observed_generation == generation && check(s)))
        }
    })
    .await
}

/// The nodes a `key=true` label selects, among this test's.
async fn nodes_with(cluster: &TestCluster, key: &str) -> Result<BTreeSet<String>> {
    let out = cluster
        .kubectl_ok(&[
            "get",
            "nodes",
            "-l",
            &format!("{key}=true,{TEST_LABEL}={}", cluster.prefix()),
            "-o",
            "name",
        ])
        .await?;
    Ok(out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("node/"))
        .map(str::to_string)
        .collect())
}

/// Waits until each selector selects exactly its expected nodes.
async fn wait_labels(cluster: &TestCluster, expected: &[(String, BTreeSet<String>)]) -> Result<()> {
    wait_for(Duration::from_secs(30), "role labels", || async move {
        for (key, nodes) in expected {
            if nodes_with(cluster, key).await? != *nodes {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await
}

fn selector_key(selector: &BTreeMap<String, String>) -> Result<String> {
    let (key, value) = selector.iter().next().context("a selector")?;
    assert_eq!(value, "true");
    assert_eq!(selector.len(), 1, "{selector:?}");
    Ok(key.clone())
}

fn devices(assignments: &[hwaccel::api::placement::Assignment]) -> BTreeSet<(String, String)> {
    assignments
        .iter()
        .flat_map(|a| a.devices.iter().map(|d| (a.node.clone(), d.clone())))
        .collect()
}

fn nodes_of(assignments: &[hwaccel::api::placement::Assignment]) -> BTreeSet<String> {
    assignments.iter().map(|a| a.node.clone()).collect()
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn role_labels_follow_the_pools_and_go_when_disaggregation_is_switched_off() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let first = add_node(&cluster, "h100-a").await?;
    let second = add_node(&cluster, "h100-b").await?;
    let (_controller, _registry) = start_controller(&cluster, HealthTaints::None);
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    // 70B in bf16 for 32 full 8k requests: the decode pool takes most of one node or more;
    // one prefill replica goes on what is left.
    let spec = PlacementBuilder::serve("llama-3.1-70b")
        .precision(PrecisionChoice::Bf16)
        .concurrency(32)
        .disaggregated(Some(1))
        .spec();
    api.create(&PostParams::default(), &ModelPlacement::new("pd", spec))
        .await?;
    let status = wait_status(&cluster, "pd", "Planned with a prefill pool", |s| {
        s.state.as_deref() == Some("Planned") && s.prefill.is_some()
    })
    .await?;
    let prefill = status.prefill.as_ref().context("status.prefill")?;
    let decode = status.decode.as_ref().context("status.decode")?;
    // Disjoint devices, both on this test's nodes; same precision in both pools.
    let decode_devices = devices(&status.assignments);
    let prefill_devices = devices(&prefill.assignments);
    assert!(!decode_devices.is_empty() && !prefill_devices.is_empty());
    assert!(decode_devices.is_disjoint(&prefill_devices));
    let ours: BTreeSet<String> = [first.clone(), second.clone()].into();
    let decode_nodes = nodes_of(&status.assignments);
    let prefill_nodes = nodes_of(&prefill.assignments);
    assert!(decode_nodes.is_subset(&ours) && prefill_nodes.is_subset(&ours));
    assert_eq!(
        prefill.plan.as_ref().map(|p| p.precision.as_str()),
        status.plan.as_ref().map(|p| p.precision.as_str())
    );
    let sglang = &prefill.engine.as_ref().context("prefill engine")?.sglang;
    assert!(
        sglang
            .windows(2)
            .any(|w| w == ["--disaggregation-mode", "prefill"]),
        "{sglang:?}"
    );
    // Labels: the whole placement on every node, each role on its pool's nodes.
    let whole = selector_key(&status.node_selector)?;
    let prefill_key = selector_key(&prefill.node_selector)?;
    let decode_key = selector_key(&decode.node_selector)?;
    assert!(
        prefill_key.starts_with("prefill.placement.hwaccel.io/"),
        "{prefill_key}"
    );
    assert!(
        decode_key.starts_with("decode.placement.hwaccel.io/"),
        "{decode_key}"
    );
    let all: BTreeSet<String> = decode_nodes.union(&prefill_nodes).cloned().collect();
    wait_labels(
        &cluster,
        &[
            (whole.clone(), all.clone()),
            (prefill_key.clone(), prefill_nodes.clone()),
            (decode_key.clone(), decode_nodes.clone()),
        ],
    )
    .await?;
    assert_eq!(
        prefill.node_names.as_deref(),
        Some(
            prefill_nodes
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(",")
                .as_str()
        )
    );
    // Switching disaggregation off (prefillReplicas must go with it: the CRD allows it only
    // with disaggregated) gives one pool: the role labels go, the placement label stays.
    let kept = api
        .patch(
            "pd",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"goal": {"serve": {"disaggregated": false}}}})),
        )
        .await;
    assert!(
        kept.is_err(),
        "prefillReplicas without disaggregated was accepted"
    );
    api.patch(
        "pd",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"goal": {"serve": {"disaggregated": false, "prefillReplicas": null}}}}),
        ),
    )
    .await?;
    let single = wait_status(&cluster, "pd", "Planned without a prefill pool", |s| {
        s.state.as_deref() == Some("Planned") && s.prefill.is_none() && s.decode.is_none()
    })
    .await?;
    let nodes = nodes_of(&single.assignments);
    wait_labels(
        &cluster,
        &[
            (whole, nodes),
            (prefill_key, BTreeSet::new()),
            (decode_key, BTreeSet::new()),
        ],
    )
    .await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn claims_allocation_with_disaggregation_is_refused_with_a_reason() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    add_node(&cluster, "h100-c").await?;
    let (_controller, _registry) = start_controller(&cluster, HealthTaints::None);
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    let mut spec = PlacementBuilder::serve("llama-3.1-8b")
        .disaggregated(None)
        .spec();
    spec.allocation = Some(AllocationMode::Claims);
    api.create(
        &PostParams::default(),
        &ModelPlacement::new("pd-claims", spec),
    )
    .await?;
    let status = wait_status(&cluster, "pd-claims", "refused", |s| {
        s.state.as_deref() == Some("Invalid")
    })
    .await?;
    assert!(
        status
            .reasons
            .iter()
            .any(|r| r.contains("disaggregated serving supports allocation: labels")),
        "{:?}",
        status.reasons
    );
    assert!(status.prefill.is_none() && status.assignments.is_empty());
    // The CRD refuses prefillReplicas without disaggregated.
    let mut bad = PlacementBuilder::serve("llama-3.1-8b").spec();
    if let Some(serve) = bad.goal.serve.as_mut() {
        serve.prefill_replicas = Some(2);
    }
    let refused = api
        .create(&PostParams::default(), &ModelPlacement::new("pd-bad", bad))
        .await;
    let message = format!("{refused:?}");
    assert!(
        message.contains("prefillReplicas needs disaggregated"),
        "{message}"
    );
    Ok(())
}
