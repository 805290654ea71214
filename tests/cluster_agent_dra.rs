//! The node agent's DRA side against a real kube-apiserver: its own `hwaccel.io`
//! ResourceSlice for opted-in driverless devices (written once, unchanged cycles write
//! nothing, a changed device set bumps the pool generation, a device plugin exposing the same
//! hardware or turning the feature off removes it), and node labels filled from the vendor
//! slices of its own node only.
//!
//! Run with the cluster up: `tests/cluster/up.sh --full && cargo test --test
//! cluster_tier -- --ignored cluster_agent_dra::`.

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context as _, Result};
use hwaccel::api::AcceleratorInventory;
use hwaccel::dra::own_slices::{OWN_DRIVER, OwnFamily, own_slice_name};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use support::agent::agent_for;
use support::hosts::copy_fixture;
use support::nodes::create_node;
use support::{TestCluster, install_crds};

/// Agents here remove a device after one clean miss, so a changed host shows in one cycle.
const ONE_MISS: u32 = 1;

/// The Qualcomm card the tests take out of the fixture host: QID 1 in `qaic-util -q`.
const SECOND_CARD: &str = "0000:81:00.0";

/// Takes the second Qualcomm card out of the host copy: its PCI function and its block in the
/// `qaic-util -q` capture (the capture's last block, so the first card's text stays whole).
fn remove_second_card(host: &Path) -> Result<()> {
    std::fs::remove_dir_all(host.join("sys/bus/pci/devices").join(SECOND_CARD))?;
    let capture = host.join("commands/outputs/qaic-util-q.txt");
    let text = std::fs::read_to_string(&capture)?;
    let start = text
        .find("QID 1")
        .context("the capture has a second card")?;
    std::fs::write(&capture, &text[..start])?;
    Ok(())
}

async fn own_slice(client: &Client, node: &str) -> Result<Option<ResourceSlice>> {
    Ok(Api::<ResourceSlice>::all(client.clone())
        .get_opt(&own_slice_name(node))
        .await?)
}

fn generation_and_devices(slice: &ResourceSlice) -> (i64, usize) {
    (
        slice.spec.pool.generation,
        slice.spec.devices.as_ref().map_or(0, Vec::len),
    )
}

fn qualcomm() -> BTreeSet<OwnFamily> {
    BTreeSet::from([OwnFamily::QualcommAi100])
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn the_own_slice_is_written_on_change_only_and_removed_when_not_wanted() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("ai100");
    create_node(&client, &node, &[]).await?;
    let host = copy_fixture("cloud-ai100")?;

    // Off by default: an agent without families publishes nothing.
    agent_for(&client, &node, host.path(), ONE_MISS)
        .cycle()
        .await?;
    assert!(own_slice(&client, &node).await?.is_none());

    let mut agent = agent_for(&client, &node, host.path(), ONE_MISS).with_own_slices(qualcomm());
    agent.cycle().await?;
    let first = own_slice(&client, &node)
        .await?
        .context("the own slice after the first cycle")?;
    assert_eq!(first.spec.driver, OWN_DRIVER);
    assert_eq!(first.spec.node_name.as_deref(), Some(node.as_str()));
    assert_eq!(generation_and_devices(&first), (1, 2), "{first:#?}");

    // Unchanged host: three more cycles write nothing.
    for _ in 0..3 {
        agent.cycle().await?;
    }
    let steady = own_slice(&client, &node).await?.context("still there")?;
    assert_eq!(
        steady.metadata.resource_version,
        first.metadata.resource_version
    );

    // One card leaves: the slice is rewritten with the next pool generation.
    remove_second_card(host.path())?;
    agent.cycle().await?;
    let shrunk = own_slice(&client, &node).await?.context("after removal")?;
    assert_eq!(generation_and_devices(&shrunk), (2, 1), "{shrunk:#?}");

    // A restarted agent finds the slice as it should be and writes nothing.
    let mut restarted =
        agent_for(&client, &node, host.path(), ONE_MISS).with_own_slices(qualcomm());
    restarted.cycle().await?;
    let after_restart = own_slice(&client, &node).await?.context("after restart")?;
    assert_eq!(
        after_restart.metadata.resource_version,
        shrunk.metadata.resource_version
    );

    // A device plugin starts advertising the cards: exposing them twice would let two
    // schedulers hand out one card, so the own slice goes.
    let allocatable = serde_json::json!({
        "status": { "allocatable": { "qualcomm.com/qaic": Quantity("1".into()) } }
    });
    Api::<Node>::all(client.clone())
        .patch_status(&node, &PatchParams::default(), &Patch::Merge(&allocatable))
        .await?;
    restarted.cycle().await?;
    assert!(
        own_slice(&client, &node).await?.is_none(),
        "a device plugin exposes the cards"
    );
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn turning_the_feature_off_removes_the_own_slice() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("ai100-off");
    create_node(&client, &node, &[]).await?;
    let host = copy_fixture("cloud-ai100")?;

    agent_for(&client, &node, host.path(), ONE_MISS)
        .with_own_slices(qualcomm())
        .cycle()
        .await?;
    assert!(own_slice(&client, &node).await?.is_some());

    // The chart value is emptied and the agent restarts without families.
    agent_for(&client, &node, host.path(), ONE_MISS)
        .cycle()
        .await?;
    assert!(own_slice(&client, &node).await?.is_none());
    Ok(())
}

/// Publishes the NVIDIA fixture slices for `node`, named after it.
async fn publish_nvidia_slices(client: &Client, node: &str) -> Result<usize> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/dra/nvidia-h100-8x.yaml");
    let slices = hwaccel::cli::plan_dra::load_resource_slices(&[path])?;
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let mut devices = 0;
    for (index, mut slice) in slices.into_iter().enumerate() {
        slice.metadata = ObjectMeta {
            name: Some(format!("{node}-gpu.nvidia.com-{index}")),
            ..ObjectMeta::default()
        };
        slice.spec.node_name = Some(node.to_string());
        slice.spec.pool.name = node.to_string();
        devices += slice.spec.devices.as_ref().map_or(0, Vec::len);
        api.create(&PostParams::default(), &slice).await?;
    }
    Ok(devices)
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_node_whose_gpus_only_dra_shows_gets_labels_from_its_own_slices() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("dra-only");
    let neighbour = cluster.unique_name("dra-neighbour");
    create_node(&client, &node, &[]).await?;
    create_node(&client, &neighbour, &[]).await?;
    // The node's vendor driver publishes its eight GPUs and one MIG device carved from the
    // last (a partition, not a ninth GPU); the agent's own detection (a VM without the vendor
    // tools) sees none. The neighbour has slices too, which are not ours.
    let published = publish_nvidia_slices(&client, &node).await?;
    publish_nvidia_slices(&client, &neighbour).await?;
    assert_eq!(published, 9);
    let host = copy_fixture("cpu-only-vm")?;

    agent_for(&client, &node, host.path(), ONE_MISS)
        .cycle()
        .await?;

    let labels = Api::<Node>::all(client.clone())
        .get(&node)
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    let label = |key: &str| labels.get(key).map(String::as_str);
    assert_eq!(label("hwaccel.io/count"), Some("8"), "{labels:#?}");
    assert_eq!(label("hwaccel.io/vendor"), Some("nvidia"), "{labels:#?}");
    assert_eq!(
        label("hwaccel.io/product"),
        Some("nvidia-h100-80gb-hbm3"),
        "{labels:#?}"
    );
    assert_eq!(label("hwaccel.io/memory-gib"), Some("80"), "{labels:#?}");
    // The inventory stays what detection saw: the controller merges slices itself.
    let inventory = Api::<AcceleratorInventory>::all(client.clone())
        .get(&node)
        .await?;
    assert_eq!(inventory.spec.summary.accelerators, 0);

    // The neighbour's agent counts its own eight, not sixteen.
    agent_for(&client, &neighbour, host.path(), ONE_MISS)
        .cycle()
        .await?;
    let neighbour_labels = Api::<Node>::all(client.clone())
        .get(&neighbour)
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(
        neighbour_labels.get("hwaccel.io/count").map(String::as_str),
        Some("8")
    );
    Ok(())
}
