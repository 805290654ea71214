//! The publication audit against the real apiserver: what an inventory says a node has, what
//! DRA drivers publish for it and what its device plugins advertise, held side by side by the
//! controller into the inventory's `DRAPublished` condition, `hwaccel_dra_unpublished_devices`
//! and Node Events (docs/dra.md, "Publication audit").
//!
//! `tests/cluster/up.sh --full && cargo test --test cluster_tier -- --ignored cluster_dra_audit::`

// Test helpers panic on setup failures by design; clippy only exempts `#[test]` bodies.
#![allow(clippy::expect_used)]

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use hwaccel::api::{AcceleratorInventory, conditions};
use hwaccel::cli::plan_dra::load_resource_slices;
use hwaccel::controller::HealthTaints;
use hwaccel::testing::inventory::InventoryBuilder;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use prometheus_client::registry::Registry;
use serde_json::json;

use crate::cluster_dra::SLICES;
use crate::support::agent::{agent_for, cycle_until, watches_current};
use crate::support::controller::{scrape, start_controller};
use crate::support::hosts::copy_fixture;
use crate::support::nodes::{apply_inventory, create_kwok_node, wait_node_event};
use crate::support::process::hwaccel_json;
use crate::support::{DEFAULT_TIMEOUT, TEST_LABEL, TestCluster, install_crds, wait_for};

/// The fixture's slices, re-pointed at `node` (names, pool, owner dropped), as a driver on
/// that node would write them.
fn slices_for(file: &str, node: &str) -> Result<Vec<ResourceSlice>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/dra")
        .join(file);
    let mut slices = load_resource_slices(&[path])?;
    for (index, slice) in slices.iter_mut().enumerate() {
        slice.metadata = Default::default();
        slice.metadata.name = Some(format!("{node}-{}-{index}", slice.spec.driver));
        slice.spec.node_name = Some(node.to_string());
        slice.spec.pool.name = node.to_string();
    }
    Ok(slices)
}

async fn create_slices(cluster: &TestCluster, slices: &[ResourceSlice]) -> Result<()> {
    let api: Api<ResourceSlice> = Api::all(cluster.client());
    for slice in slices {
        api.create(&PostParams::default(), slice).await?;
    }
    Ok(())
}

async fn delete_slices(cluster: &TestCluster, slices: &[ResourceSlice]) {
    let api: Api<ResourceSlice> = Api::all(cluster.client());
    for slice in slices {
        if let Some(name) = &slice.metadata.name {
            let _ = api.delete(name, &DeleteParams::default()).await;
        }
    }
}

/// A kwok Node with the fixture host's inventory, as its agent would write it.
async fn add_node(cluster: &TestCluster, scenario: &str) -> Result<String> {
    let name = cluster.unique_name(scenario);
    create_kwok_node(cluster, &name).await?;
    let inventory = InventoryBuilder::fixture(scenario)
        .node(&name)
        .label(TEST_LABEL, cluster.prefix())
        .build();
    apply_inventory(&cluster.client(), &inventory).await?;
    Ok(name)
}

async fn published_condition(cluster: &TestCluster, node: &str) -> Result<Option<Condition>> {
    let inventory = Api::<AcceleratorInventory>::all(cluster.client())
        .get(node)
        .await?;
    Ok(inventory
        .status
        .and_then(|status| conditions::find(&status.conditions, "DRAPublished").cloned()))
}

/// Waits until the node's `DRAPublished` condition has `status` and `reason`.
async fn wait_condition(
    cluster: &TestCluster,
    node: &str,
    status: &str,
    reason: &str,
) -> Result<Condition> {
    wait_for(
        DEFAULT_TIMEOUT,
        &format!("DRAPublished={status} {reason} on {node}"),
        || async move {
            Ok(published_condition(cluster, node)
                .await?
                .filter(|c| c.status == status && c.reason == reason))
        },
    )
    .await
}

/// The value of `hwaccel_dra_unpublished_devices` for one node, driver and reason.
fn unpublished(registry: &Registry, node: &str, driver: &str, reason: &str) -> Option<i64> {
    let series = format!(
        "hwaccel_dra_unpublished_devices{{node=\"{node}\",driver=\"{driver}\",reason=\"{reason}\"}}"
    );
    scrape(registry)
        .lines()
        .find_map(|line| line.strip_prefix(&series)?.trim().parse().ok())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_slice_the_apiserver_refuses_leaves_the_gpus_missing_from_dra_until_a_valid_one_lands()
-> Result<()> {
    let _turn = SLICES.lock().await;
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        eprintln!("skipped: needs the full tier (kwok)");
        return Ok(());
    }
    install_crds(&cluster.client()).await?;
    // Two 8×MI300X nodes: the AMD driver publishes on one (so it runs in the cluster), and
    // its slice for the other carries a driverVersion that is not semantic versioning.
    let broken = add_node(&cluster, "mi300x-8x").await?;
    let working = add_node(&cluster, "mi300x-8x").await?;
    let good = slices_for("amd-mi300x-8x.yaml", &working)?;
    create_slices(&cluster, &good).await?;
    let mut refused = slices_for("amd-mi300x-8x.yaml", &broken)?;
    for slice in &mut refused {
        for device in slice.spec.devices.iter_mut().flatten() {
            let attributes = device.attributes.get_or_insert_with(Default::default);
            attributes.insert(
                "driverVersion".to_string(),
                serde_json::from_value(json!({"version": "6.10"}))?,
            );
        }
    }
    let api: Api<ResourceSlice> = Api::all(cluster.client());
    match api.create(&PostParams::default(), &refused[0]).await {
        Err(kube::Error::Api(status)) if status.code == 422 => {
            assert!(
                status.message.contains("driverVersion") || status.message.contains("version"),
                "{}",
                status.message
            );
        }
        other => bail!("the apiserver took a non-semver driverVersion: {other:?}"),
    }

    let (_controller, registry) = start_controller(&cluster, HealthTaints::None);
    let missing = wait_condition(&cluster, &broken, "False", "DriverSliceMissing").await?;
    assert_eq!(
        missing.message, "8 AMD GPUs detected, gpu.amd.com publishes 0",
        "{missing:?}"
    );
    let fine = wait_condition(&cluster, &working, "True", "Consistent").await?;
    assert_eq!(fine.message, "8 AMD GPUs detected, gpu.amd.com publishes 8");
    wait_for(DEFAULT_TIMEOUT, "the unpublished series", || async {
        Ok(
            unpublished(&registry, &broken, "gpu.amd.com", "DriverSliceMissing")
                .filter(|v| *v == 8),
        )
    })
    .await?;
    assert_eq!(
        unpublished(&registry, &working, "gpu.amd.com", "DriverSliceMissing"),
        None
    );
    let warning = wait_node_event(&cluster, &broken, "Warning|DRANotPublished|").await?;
    assert!(warning.contains("gpu.amd.com publishes 0"), "{warning}");
    // `hwaccel fleet` holds the same truths on its own, without the controller's condition.
    let report = hwaccel_json(
        &cluster,
        &["fleet", "--model", "llama-3.1-8b", "-o", "json"],
    )
    .await?;
    let rows = report["publication"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let row = rows
        .iter()
        .find(|row| row["node"] == broken.as_str())
        .with_context(|| format!("no publication row for {broken}: {rows:?}"))?;
    assert_eq!(row["reason"], "DriverSliceMissing", "{row}");
    assert_eq!(row["devices"], 8, "{row}");
    assert!(
        !rows.iter().any(|row| row["node"] == working.as_str()),
        "{rows:?}"
    );

    // The agent's own conditions are untouched by the controller's apply, and the
    // controller's condition by the agent's next one.
    let inventory = Api::<AcceleratorInventory>::all(cluster.client())
        .get(&broken)
        .await?;
    let fields = inventory
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f.subresource.as_deref() == Some("status"))
        .map(|f| f.manager.unwrap_or_default())
        .collect::<Vec<_>>();
    assert!(
        fields.iter().any(|m| m == "hwaccel-controller"),
        "{fields:?}"
    );

    // The driver's valid slice clears it within a pass.
    let valid = slices_for("amd-mi300x-8x.yaml", &broken)?;
    create_slices(&cluster, &valid).await?;
    let cleared = wait_condition(&cluster, &broken, "True", "Consistent").await?;
    assert_eq!(
        cleared.message,
        "8 AMD GPUs detected, gpu.amd.com publishes 8"
    );
    wait_for(DEFAULT_TIMEOUT, "the series to go", || async {
        Ok(
            unpublished(&registry, &broken, "gpu.amd.com", "DriverSliceMissing")
                .is_none()
                .then_some(()),
        )
    })
    .await?;
    wait_node_event(&cluster, &broken, "Normal|DRAPublished|").await?;
    delete_slices(&cluster, &good).await;
    delete_slices(&cluster, &valid).await;
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn gpus_a_device_plugin_and_a_dra_driver_both_advertise_are_double_advertised() -> Result<()>
{
    let _turn = SLICES.lock().await;
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        eprintln!("skipped: needs the full tier (kwok)");
        return Ok(());
    }
    install_crds(&cluster.client()).await?;
    let client = cluster.client();
    let node = cluster.unique_name("h100-8x-nvswitch");
    create_kwok_node(&cluster, &node).await?;
    // The NVIDIA device plugin's resource, as the kubelet reports it once the plugin
    // registered.
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for(DEFAULT_TIMEOUT, "kwok to initialise the Node", || {
        let nodes = nodes.clone();
        let node = node.clone();
        async move {
            Ok(nodes
                .get_status(&node)
                .await?
                .status
                .and_then(|s| s.allocatable)
                .filter(|a| a.contains_key("pods")))
        }
    })
    .await?;
    let mut allocatable = nodes
        .get_status(&node)
        .await?
        .status
        .and_then(|s| s.allocatable)
        .context("allocatable")?;
    allocatable.insert(
        "nvidia.com/gpu".to_string(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("8".into()),
    );
    nodes
        .patch_status(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocatable": allocatable, "capacity": allocatable}})),
        )
        .await?;

    // The agent, on the 8×H100 fixture host, reads the allocatable from its Node watch.
    let host = copy_fixture("h100-8x-nvswitch")?;
    let mut agent = agent_for(&client, &node, host.path(), 3);
    agent.cycle().await?;
    watches_current(&agent).await?;
    let inventories: Api<AcceleratorInventory> = Api::all(client.clone());
    cycle_until(&mut agent, "the plugin resource in the inventory", |_| true).await?;
    let advertised = wait_for(DEFAULT_TIMEOUT, "devicePluginResources", || {
        let inventories = inventories.clone();
        let node = node.clone();
        async move {
            Ok(inventories
                .get(&node)
                .await?
                .status
                .and_then(|s| s.device_plugin_resources)
                .filter(|r| !r.is_empty()))
        }
    })
    .await?;
    assert_eq!(
        advertised,
        std::collections::BTreeMap::from([("nvidia.com/gpu".to_string(), 8)])
    );
    // Into the test controller's view.
    inventories
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {TEST_LABEL: cluster.prefix()}}})),
        )
        .await?;

    let slices = slices_for("nvidia-h100-8x.yaml", &node)?;
    create_slices(&cluster, &slices).await?;
    let (_controller, registry) = start_controller(&cluster, HealthTaints::None);
    let double = wait_condition(&cluster, &node, "False", "DoubleAdvertised").await?;
    assert!(
        double.message.starts_with(
            "gpu.nvidia.com publishes 8 and the device plugin advertises nvidia.com/gpu: 8"
        ),
        "{double:?}"
    );
    wait_for(DEFAULT_TIMEOUT, "the double-advertised series", || async {
        Ok(unpublished(&registry, &node, "gpu.nvidia.com", "DoubleAdvertised").filter(|v| *v == 8))
    })
    .await?;
    // The agent's next apply keeps the controller's condition.
    cycle_until(&mut agent, "another cycle", |_| true).await?;
    let kept = published_condition(&cluster, &node)
        .await?
        .context("the condition")?;
    assert_eq!(kept.reason, "DoubleAdvertised");
    delete_slices(&cluster, &slices).await;
    Ok(())
}
