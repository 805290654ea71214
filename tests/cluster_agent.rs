//! The node agent against a real kube-apiserver: labels and inventory appear, a steady node
//! causes no writes, devices leave only after the configured misses, a failing detector keeps
//! the last good state and sets Degraded, foreign labels are untouched, long product names
//! stay valid, a deleted Node takes its inventory with it, and the controller's `freeDevices`
//! write costs the agent no write.
//!
//! Run with the cluster up: `tests/cluster/up.sh --full && cargo test --test cluster_tier --
//! --ignored cluster_agent::`.

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use hwaccel::agent::PublishOutcome;
use hwaccel::api::{AcceleratorInventory, conditions};
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use support::agent::{agent_for, cycle_until, watches_current};
use support::hosts::{captures_under, copy_fixture, remove_gpu};
use support::{DEFAULT_TIMEOUT, TestCluster, install_crds, wait_for};

/// Creates a Node carrying a label of its own and one under our prefix owned by someone else.
async fn create_node(client: &Client, name: &str) -> Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), name.to_string()),
                ("team".to_string(), "ml-platform".to_string()),
            ])),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    nodes.create(&PostParams::default(), &node).await?;
    // An administrator pins one of our keys with kubectl's field manager.
    let pinned = serde_json::json!({
        "metadata": { "labels": { "hwaccel.io/pinned-by-admin": "yes" } }
    });
    Ok(nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&pinned))
        .await?)
}

async fn node_labels(client: &Client, node: &str) -> Result<BTreeMap<String, String>> {
    let node: Node = Api::all(client.clone()).get(node).await?;
    Ok(node.metadata.labels.unwrap_or_default())
}

fn ours(labels: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    labels
        .iter()
        .filter(|(k, _)| k.starts_with("hwaccel.io/") && *k != "hwaccel.io/pinned-by-admin")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn labels_and_inventory_appear_and_a_steady_node_writes_nothing() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("h100");
    create_node(&client, &node).await?;
    let host = copy_fixture("h100-8x-nvswitch")?;
    let mut agent = agent_for(&client, &node, host.path(), 3);

    let first = agent.cycle().await?;
    assert_eq!(
        first,
        PublishOutcome {
            labels_written: true,
            inventory_written: true,
            status_written: true
        }
    );
    let labels = node_labels(&client, &node).await?;
    assert_eq!(
        labels.get("hwaccel.io/present").map(String::as_str),
        Some("true")
    );
    assert_eq!(
        labels.get("hwaccel.io/count").map(String::as_str),
        Some("8")
    );
    assert_eq!(labels.get("team").map(String::as_str), Some("ml-platform"));
    assert_eq!(
        labels.get("hwaccel.io/pinned-by-admin").map(String::as_str),
        Some("yes")
    );

    let inventories: Api<AcceleratorInventory> = Api::all(client.clone());
    let inventory = inventories.get(&node).await?;
    let accelerators: Vec<_> = inventory
        .spec
        .devices
        .iter()
        .filter(|d| d.name.starts_with("gpu-"))
        .collect();
    assert_eq!(accelerators.len(), 8, "{:#?}", inventory.spec.devices);
    let owner = &inventory
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Node", node.as_str())
    );
    let status = inventory.status.clone().unwrap_or_default();
    assert!(conditions::is_true(&status.conditions, conditions::READY));

    let table = cluster.kubectl_ok(&["get", "accinv", &node]).await?;
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "NODE",
            "ACCELERATORS",
            "PRODUCT",
            "MEMORY",
            "HEALTHY",
            "DEGRADED",
            "FREE",
            "AGE"
        ],
        "{table}"
    );
    assert!(table.contains("NVIDIA H100 80GB HBM3"), "{table}");

    // Ten more cycles on the unchanged host: nothing is written, so nothing moves.
    let node_rv = Api::<Node>::all(client.clone())
        .get(&node)
        .await?
        .metadata
        .resource_version;
    let inventory_rv = inventory.metadata.resource_version.clone();
    for _ in 0..10 {
        assert_eq!(agent.cycle().await?, PublishOutcome::default());
    }
    // A fresh agent (a restart) reads what is there and still writes nothing.
    let mut restarted = agent_for(&client, &node, host.path(), 3);
    assert_eq!(restarted.cycle().await?, PublishOutcome::default());
    let after = Api::<Node>::all(client.clone()).get(&node).await?;
    assert_eq!(after.metadata.resource_version, node_rv);
    assert_eq!(
        inventories.get(&node).await?.metadata.resource_version,
        inventory_rv
    );
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_deleted_or_edited_inventory_is_written_again_once_the_agent_sees_it() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("gone");
    create_node(&client, &node).await?;
    let host = copy_fixture("h100-8x-nvswitch")?;
    let mut agent = agent_for(&client, &node, host.path(), 3);
    agent.cycle().await?;
    let inventories: Api<AcceleratorInventory> = Api::all(client.clone());
    let original = inventories.get(&node).await?;

    // Deleted by hand (or by a careless cleanup): the same running agent, without a
    // restart, writes it again on its next cycle.
    inventories.delete(&node, &DeleteParams::default()).await?;
    wait_for(DEFAULT_TIMEOUT, "the inventory gone", || {
        let inventories = inventories.clone();
        let node = node.clone();
        async move { Ok(inventories.get_opt(&node).await?.is_none().then_some(())) }
    })
    .await?;
    // Seen on the first cycle after the agent's inventory watch delivers the deletion.
    let again = cycle_until(&mut agent, "the deleted inventory written again", |o| {
        o.inventory_written
    })
    .await?;
    assert!(again.inventory_written && again.status_written, "{again:?}");
    let recreated = inventories.get(&node).await?;
    assert_eq!(recreated.spec, original.spec);
    let status = recreated.status.clone().unwrap_or_default();
    assert!(conditions::is_true(&status.conditions, conditions::READY));

    // Edited by someone else: put back on the next cycle.
    let edit = serde_json::json!({"spec": {"summary": {"accelerators": 0}}});
    inventories
        .patch(&node, &PatchParams::default(), &Patch::Merge(&edit))
        .await?;
    let repaired = cycle_until(&mut agent, "the edited inventory repaired", |o| {
        o.inventory_written
    })
    .await?;
    assert!(repaired.inventory_written, "{repaired:?}");
    assert_eq!(inventories.get(&node).await?.spec.summary.accelerators, 8);

    // And steady again: reads only.
    assert_eq!(agent.cycle().await?, PublishOutcome::default());
    Ok(())
}

/// Issue 28: the controller's `status.freeDevices` write (its own field manager) made the
/// next agent cycle rewrite the inventory and reset every condition's transition time. Now
/// the agent reads what is stored, finds its own fields unchanged, and writes nothing.
#[tokio::test]
#[ignore = "needs cluster"]
async fn the_controllers_free_devices_write_causes_no_agent_write() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("free");
    create_node(&client, &node).await?;
    let host = copy_fixture("h100-8x-nvswitch")?;
    let mut agent = agent_for(&client, &node, host.path(), 3);
    agent.cycle().await?;
    let inventories: Api<AcceleratorInventory> = Api::all(client.clone());
    // Transition times have whole seconds: let a reset show.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;

    let patch = serde_json::json!({
        "apiVersion": "hwaccel.io/v1alpha1",
        "kind": "AcceleratorInventory",
        "status": {"freeDevices": 3},
    });
    let params = PatchParams::apply("hwaccel-controller").force();
    inventories
        .patch_status(&node, &params, &Patch::Apply(&patch))
        .await?;
    let written = inventories.get(&node).await?;
    let times = |inventory: &AcceleratorInventory| -> Vec<(String, String)> {
        let status = inventory.status.clone().unwrap_or_default();
        status
            .conditions
            .iter()
            .map(|c| (c.type_.clone(), format!("{:?}", c.last_transition_time)))
            .collect()
    };
    assert!(times(&written).len() >= 4, "{:?}", written.status);

    for cycle in 0..5 {
        assert_eq!(
            agent.cycle().await?,
            PublishOutcome::default(),
            "cycle {cycle}"
        );
    }
    let after = inventories.get(&node).await?;
    assert_eq!(
        after.metadata.resource_version,
        written.metadata.resource_version
    );
    assert_eq!(times(&after), times(&written));
    assert_eq!(after.status.unwrap_or_default().free_devices, Some(3));
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_removed_device_goes_only_after_the_misses_and_a_failing_detector_keeps_labels()
-> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("a100");
    create_node(&client, &node).await?;
    let host = copy_fixture("h100-8x-nvswitch")?;
    let misses = 2;
    let mut agent = agent_for(&client, &node, host.path(), misses);
    agent.cycle().await?;
    let before = node_labels(&client, &node).await?;
    assert_eq!(
        before.get("hwaccel.io/count").map(String::as_str),
        Some("8")
    );

    // The tool stops listing a GPU and sysfs loses its PCI function.
    remove_gpu(host.path(), "0000:df:00.0")?;
    agent.cycle().await?;
    assert_eq!(
        node_labels(&client, &node).await?.get("hwaccel.io/count"),
        before.get("hwaccel.io/count")
    );
    agent.cycle().await?;
    let after = node_labels(&client, &node).await?;
    assert_eq!(
        after.get("hwaccel.io/count").map(String::as_str),
        Some("7"),
        "{after:?}"
    );

    // Now the vendor tool breaks: labels stay as they were and Degraded is raised.
    let tool = host.path().join("commands/nvidia-smi");
    std::fs::write(
        &tool,
        "#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch' >&2\nexit 18\n",
    )?;
    for _ in 0..(misses + 2) {
        agent.cycle().await?;
    }
    let during = node_labels(&client, &node).await?;
    assert_eq!(ours(&during), ours(&after));
    let status = Api::<AcceleratorInventory>::all(client.clone())
        .get(&node)
        .await?
        .status
        .unwrap_or_default();
    let degraded =
        conditions::find(&status.conditions, conditions::DEGRADED).context("no Degraded")?;
    assert_eq!(degraded.status, "True");
    assert_eq!(degraded.reason, "DetectorFailed");
    assert!(degraded.message.contains("nvidia"), "{}", degraded.message);
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_product_name_over_63_characters_gives_valid_labels_and_the_full_name_is_kept()
-> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("long");
    create_node(&client, &node).await?;
    let host = copy_fixture("h100-8x-nvswitch")?;
    let long_name = "NVIDIA H100 80GB HBM3 Engineering Sample Revision B with an extraordinarily long marketing name";
    for capture in captures_under(&host.path().join("commands"))? {
        let text = std::fs::read_to_string(&capture).unwrap_or_default();
        if text.contains("NVIDIA H100 80GB HBM3") {
            std::fs::write(&capture, text.replace("NVIDIA H100 80GB HBM3", long_name))?;
        }
    }
    let mut agent = agent_for(&client, &node, host.path(), 3);
    agent.cycle().await?;

    let labels = node_labels(&client, &node).await?;
    let product = labels
        .get("hwaccel.io/product")
        .context("no product label")?;
    assert!(product.len() <= 63, "{product}");
    assert!(
        product.starts_with("nvidia-h100-80gb-hbm3-engineering"),
        "{product}"
    );
    let inventory = Api::<AcceleratorInventory>::all(client.clone())
        .get(&node)
        .await?;
    let text = serde_json::to_string(&inventory.spec)?;
    assert!(
        text.contains(long_name),
        "full name missing from the inventory"
    );
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn deleting_the_node_deletes_its_inventory() -> Result<()> {
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        eprintln!("skipped: needs the full tier (kube-controller-manager's garbage collector)");
        return Ok(());
    }
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("gone");
    create_node(&client, &node).await?;
    let host = copy_fixture("cpu-only-vm").or_else(|_| copy_fixture("h100-8x-nvswitch"))?;
    agent_for(&client, &node, host.path(), 3).cycle().await?;
    let inventories: Api<AcceleratorInventory> = Api::all(client.clone());
    inventories.get(&node).await?;

    Api::<Node>::all(client.clone())
        .delete(&node, &DeleteParams::default())
        .await?;
    wait_for(DEFAULT_TIMEOUT, "inventory garbage-collected", || {
        let inventories = inventories.clone();
        let node = node.clone();
        async move { Ok(inventories.get_opt(&node).await?.is_none().then_some(())) }
    })
    .await?;
    Ok(())
}

/// A Node deleted and created again under the same name (a re-provisioned machine) while its
/// agent runs: the agent sees the new uid (from its Node watch), writes the inventory again
/// owned by the new Node (the old one went with the old Node) and puts its labels back on it.
#[tokio::test]
#[ignore = "needs cluster"]
async fn a_node_recreated_under_its_name_gets_its_inventory_and_labels_back() -> Result<()> {
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        eprintln!("skipped: needs the full tier (kube-controller-manager's garbage collector)");
        return Ok(());
    }
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("reborn");
    let old = create_node(&client, &node).await?;
    let host = copy_fixture("h100-8x-nvswitch")?;
    let mut agent = agent_for(&client, &node, host.path(), 3);
    agent.cycle().await?;
    watches_current(&agent).await?;
    let inventories: Api<AcceleratorInventory> = Api::all(client.clone());

    Api::<Node>::all(client.clone())
        .delete(&node, &DeleteParams::default())
        .await?;
    wait_for(DEFAULT_TIMEOUT, "inventory garbage-collected", || {
        let inventories = inventories.clone();
        let node = node.clone();
        async move { Ok(inventories.get_opt(&node).await?.is_none().then_some(())) }
    })
    .await?;
    let new = create_node(&client, &node).await?;
    assert_ne!(new.metadata.uid, old.metadata.uid);

    let again = cycle_until(&mut agent, "the inventory of the new Node", |o| {
        o.inventory_written
    })
    .await?;
    assert!(again.labels_written, "{again:?}");
    let owner = inventories
        .get(&node)
        .await?
        .metadata
        .owner_references
        .unwrap_or_default();
    assert_eq!(owner.len(), 1, "{owner:?}");
    assert_eq!(Some(&owner[0].uid), new.metadata.uid.as_ref());
    assert_eq!(
        node_labels(&client, &node)
            .await?
            .get("hwaccel.io/count")
            .map(String::as_str),
        Some("8")
    );
    Ok(())
}
