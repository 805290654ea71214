//! Phantom devices against a real kube-apiserver: a device that no backend the agent runs
//! can see again does not stay in the inventory. Devices of a backend switched off are gone
//! on the restart that switches it off; forged inventory entries (a device of a backend the
//! agent runs but that is not there, one of a backend that does not exist, a real device's
//! attributes rewritten) do not survive a restart beyond the grace for a missing device, and
//! deleting the inventory brings back none of them once that grace is over.
//!
//! Run with the cluster up: `tests/cluster/up.sh --full && cargo test --test
//! cluster_tier -- --include-ignored cluster_agent_phantoms::`.

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use std::collections::BTreeSet;

use anyhow::{Context as _, Result};
use hwaccel::agent::{Agent, metrics::AgentMetrics};
use hwaccel::api::{AcceleratorInventory, DeviceAttribute, InventoryDevice, attribute};
use hwaccel::detect::BackendSelection;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use support::agent::{agent_for, fixture_agent_config};
use support::hosts::copy_fixture;
use support::{DEFAULT_TIMEOUT, TestCluster, install_crds, nodes, wait_for};

/// Clean misses before a missing device goes.
const MISSES: u32 = 3;

/// The detection ids of the inventory's devices (the agent names devices itself, so a forged
/// entry comes back under the agent's name for its id).
async fn device_ids(client: &Client, node: &str) -> Result<BTreeSet<String>> {
    let inventory = Api::<AcceleratorInventory>::all(client.clone())
        .get(node)
        .await?;
    Ok(inventory
        .spec
        .devices
        .into_iter()
        .map(|d| d.text(attribute::ID).unwrap_or(d.name))
        .collect())
}

/// A copy of `real` posing as another device: `name`, PCI id `id`, found by `backend`.
fn forged(real: &InventoryDevice, name: &str, id: &str, backend: &str) -> InventoryDevice {
    let mut device = real.clone();
    device.name = name.to_string();
    device.full_values.clear();
    for (key, value) in [
        (attribute::ID, id),
        (attribute::BACKEND, backend),
        (attribute::MODEL, "NVIDIA H100 80GB HBM3"),
        (attribute::VENDOR, "nvidia"),
    ] {
        device
            .attributes
            .insert(key.to_string(), DeviceAttribute::String(value.to_string()));
    }
    device.attributes.remove(attribute::PCI_BUS_ID);
    device
}

/// An agent on `host` running only the backends of `selection`.
fn agent_with(client: &Client, node: &str, host: &std::path::Path, selection: &str) -> Agent {
    let mut config = fixture_agent_config(node, host, MISSES);
    config.backends = selection
        .parse::<BackendSelection>()
        .expect("valid selection");
    let mut registry = prometheus_client::registry::Registry::default();
    Agent::new(
        config,
        client.clone(),
        AgentMetrics::register(&mut registry),
    )
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn forged_devices_do_not_survive_a_restart_beyond_the_grace() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("phantom");
    nodes::create_node(&client, &node, &[]).await?;
    // A Gaudi node: the NVIDIA backend runs and sees nothing.
    let host = copy_fixture("gaudi2-8x")?;
    let mut agent = agent_for(&client, &node, host.path(), MISSES);
    agent.cycle().await?;
    let real = device_ids(&client, &node).await?;
    assert_eq!(real.len(), 8, "{real:?}");

    // Someone who can write the inventory (an administrator, a stolen agent token) adds an
    // H100 the NVIDIA backend would report, one from a backend that does not exist, and
    // makes a real Gaudi claim 800 GiB.
    let inventories: Api<AcceleratorInventory> = Api::all(client.clone());
    let mut inventory = inventories.get(&node).await?;
    let first = inventory.spec.devices[0].clone();
    inventory
        .spec
        .devices
        .push(forged(&first, "gpu-0000-ee-00-0", "0000:ee:00.0", "nvidia"));
    inventory.spec.devices.push(forged(
        &first,
        "gpu-0000-ef-00-0",
        "0000:ef:00.0",
        "made-up",
    ));
    inventory.spec.devices[0].capacity.insert(
        attribute::MEMORY.to_string(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("800Gi".to_string()),
    );
    // Written as the agent writes (its field manager, server-side apply), as a stolen agent
    // token would: the forged entries are then the agent's own, and only the tracker decides
    // whether they stay. (Entries another field manager owns are the foreign-write handling's
    // business, not this test's.)
    inventory.metadata.managed_fields = None;
    inventory.metadata.resource_version = None;
    inventories
        .patch(
            &node,
            &PatchParams::apply(hwaccel::agent::FIELD_MANAGER).force(),
            &Patch::Apply(&inventory),
        )
        .await
        .context("forging the inventory")?;

    // A restart: the made-up backend's device is not seeded, the forged memory is replaced
    // by what detection sees on the first cycle, the H100 is kept only for the grace.
    let mut restarted = agent_for(&client, &node, host.path(), MISSES);
    restarted.cycle().await?;
    let names = device_ids(&client, &node).await?;
    assert!(!names.contains("0000:ef:00.0"), "{names:?}");
    assert!(
        names.contains("0000:ee:00.0"),
        "within the grace: {names:?}"
    );
    let first_now = inventories
        .get(&node)
        .await?
        .spec
        .devices
        .into_iter()
        .find(|d| d.name == first.name)
        .context("the real device")?;
    assert_eq!(
        first_now.capacity.get(attribute::MEMORY),
        first.capacity.get(attribute::MEMORY),
        "the forged memory survived the restart"
    );

    // Deleting the inventory within the grace writes the phantom back once more...
    inventories.delete(&node, &DeleteParams::default()).await?;
    wait_for(DEFAULT_TIMEOUT, "the inventory gone", || {
        let inventories = inventories.clone();
        let node = node.clone();
        async move { Ok(inventories.get_opt(&node).await?.is_none().then_some(())) }
    })
    .await?;
    for _ in 2..MISSES {
        restarted.cycle().await?;
        let names = device_ids(&client, &node).await?;
        assert!(
            names.contains("0000:ee:00.0"),
            "within the grace: {names:?}"
        );
    }
    // ...but once the grace is over it is gone, and stays gone (before, it stayed for ever
    // while the backend kept failing, and for good when its backend was not one of ours).
    restarted.cycle().await?;
    assert_eq!(device_ids(&client, &node).await?, real);
    for _ in 0..3 {
        restarted.cycle().await?;
    }
    assert_eq!(device_ids(&client, &node).await?, real);
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_switched_off_backends_devices_are_gone_after_the_restart() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("switched");
    nodes::create_node(&client, &node, &[]).await?;
    let host = copy_fixture("gaudi2-8x")?;
    let mut agent = agent_for(&client, &node, host.path(), MISSES);
    agent.cycle().await?;
    assert_eq!(device_ids(&client, &node).await?.len(), 8);

    // The Gaudi backend switched off, and the generic PCI one that would still see the
    // devices (`--backends all,-vulkan,-gaudi,-pci`): before, the restarted agent kept the
    // eight devices for ever, since nothing could miss them.
    let mut restarted = agent_with(&client, &node, host.path(), "all,-vulkan,-gaudi,-pci");
    restarted.cycle().await?;
    let names = device_ids(&client, &node).await?;
    assert!(names.is_empty(), "{names:?}");
    Ok(())
}
