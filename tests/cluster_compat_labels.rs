//! The agent's opt-in compatibility labels against a real kube-apiserver: written from the
//! merged view (detection, or this node's DRA slices when detection sees nothing) in the
//! vendors' formats under their own field manager; never on keys another manager holds, and
//! given up whole when another labeler arrives later; released when turned off and by the
//! uninstall cleanup.
//!
//! Run with the cluster up: `tests/cluster/up.sh --full && cargo test --test
//! cluster_tier -- --ignored cluster_compat_labels::`.

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use hwaccel::agent::compat_labels::FIELD_MANAGER as COMPAT_MANAGER;
use hwaccel::agent::node_labels::LabelOwnership;
use hwaccel::cleanup::{Options, release_labels};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::agent::{agent_for, node_seen};
use support::hosts::copy_fixture;
use support::nodes::create_node;
use support::{TestCluster, install_crds};

const ONE_MISS: u32 = 1;

/// What GPU Feature Discovery's label writer looks like to the apiserver: a plain update
/// (not an apply) by a manager of its own.
const OTHER_LABELER: &str = "gpu-feature-discovery";

const NVIDIA_KEYS: [&str; 4] = [
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.family",
];

async fn node_of(client: &Client, name: &str) -> Result<Node> {
    Ok(Api::<Node>::all(client.clone()).get(name).await?)
}

fn labels(node: &Node) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

/// The label keys `manager` owns on `node`, from its managedFields.
fn owned_by(node: &Node, manager: &str) -> Vec<String> {
    let mut keys: Vec<String> = node
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|entry| entry.manager.as_deref() == Some(manager))
        .filter_map(|entry| entry.fields_v1.as_ref())
        .filter_map(|fields| {
            fields
                .0
                .pointer("/f:metadata/f:labels")?
                .as_object()
                .cloned()
        })
        .flat_map(|labels| labels.into_iter().map(|(k, _)| k))
        .filter_map(|key| key.strip_prefix("f:").map(str::to_string))
        .collect();
    keys.sort();
    keys
}

/// Sets `labels` on `node` the way another labeler does: a merge patch as its own manager.
async fn other_labeler_sets(client: &Client, node: &str, labels: &[(&str, &str)]) -> Result<()> {
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let params = PatchParams {
        field_manager: Some(OTHER_LABELER.to_string()),
        ..PatchParams::default()
    };
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &params,
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn compat_labels_are_written_in_gfd_format_and_released_off_and_on_uninstall() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("compat");
    create_node(&client, &node, &[]).await?;
    let host = copy_fixture("h100-8x-nvswitch")?;

    // Off by default: nothing under the vendors' prefixes.
    agent_for(&client, &node, host.path(), ONE_MISS)
        .cycle()
        .await?;
    assert!(owned_by(&node_of(&client, &node).await?, COMPAT_MANAGER).is_empty());

    let mut agent = agent_for(&client, &node, host.path(), ONE_MISS).with_compat_labels(true);
    agent.cycle().await?;
    let written = node_of(&client, &node).await?;
    let got = labels(&written);
    let label = |key: &str| got.get(key).map(String::as_str);
    assert_eq!(
        label("nvidia.com/gpu.product"),
        Some("NVIDIA-H100-80GB-HBM3")
    );
    assert_eq!(label("nvidia.com/gpu.count"), Some("8"));
    assert_eq!(label("nvidia.com/gpu.memory"), Some("81559"));
    assert_eq!(label("nvidia.com/gpu.family"), Some("hopper"));
    assert_eq!(label("amd.com/gpu.product-name"), None);
    let mut want: Vec<String> = NVIDIA_KEYS.iter().map(|k| k.to_string()).collect();
    want.sort();
    assert_eq!(owned_by(&written, COMPAT_MANAGER), want);
    // Our own labels stay with the agent's manager.
    assert!(
        owned_by(&written, hwaccel::agent::FIELD_MANAGER)
            .iter()
            .all(|k| k.starts_with("hwaccel.io/"))
    );

    // A steady node: no write.
    let version = written.metadata.resource_version.clone();
    agent.cycle().await?;
    assert_eq!(
        node_of(&client, &node).await?.metadata.resource_version,
        version
    );

    // Uninstall: the cleanup releases them with ours.
    let summary = release_labels(
        &Api::<Node>::all(client.clone()),
        std::slice::from_ref(&node),
        &Options::default(),
    )
    .await?;
    assert!(summary.is_clean(), "{summary:?}");
    let cleaned = labels(&node_of(&client, &node).await?);
    assert!(
        !cleaned
            .keys()
            .any(|k| k.starts_with("nvidia.com/") || k.starts_with("hwaccel.io/")),
        "{cleaned:#?}"
    );

    // Written again, then turned off: an agent without the option releases them.
    agent_for(&client, &node, host.path(), ONE_MISS)
        .with_compat_labels(true)
        .cycle()
        .await?;
    assert!(labels(&node_of(&client, &node).await?).contains_key("nvidia.com/gpu.count"));
    agent_for(&client, &node, host.path(), ONE_MISS)
        .cycle()
        .await?;
    let off = node_of(&client, &node).await?;
    assert!(owned_by(&off, COMPAT_MANAGER).is_empty());
    assert!(!labels(&off).keys().any(|k| k.starts_with("nvidia.com/")));
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_node_another_labeler_serves_gets_none_of_its_keys() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let host = copy_fixture("h100-8x-nvswitch")?;

    // GFD was there first, with a value of its own (time-slicing renames the product).
    let served = cluster.unique_name("gfd-first");
    create_node(&client, &served, &[]).await?;
    other_labeler_sets(
        &client,
        &served,
        &[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3-SHARED")],
    )
    .await?;
    agent_for(&client, &served, host.path(), ONE_MISS)
        .with_compat_labels(true)
        .cycle()
        .await?;
    let node = node_of(&client, &served).await?;
    let got = labels(&node);
    assert_eq!(
        got.get("nvidia.com/gpu.product").map(String::as_str),
        Some("NVIDIA-H100-80GB-HBM3-SHARED")
    );
    for key in &NVIDIA_KEYS[1..] {
        assert!(
            !got.contains_key(*key),
            "{key} written beside GFD: {got:#?}"
        );
    }
    assert!(owned_by(&node, COMPAT_MANAGER).is_empty());
    assert_eq!(owned_by(&node, OTHER_LABELER), ["nvidia.com/gpu.product"]);
    // Our own labels still go out.
    assert_eq!(
        got.get("hwaccel.io/count").map(String::as_str),
        Some("8"),
        "{got:#?}"
    );

    // GFD arrives after us: it takes one key, and we give up the whole group.
    let later = cluster.unique_name("gfd-later");
    create_node(&client, &later, &[]).await?;
    let mut agent = agent_for(&client, &later, host.path(), ONE_MISS).with_compat_labels(true);
    agent.cycle().await?;
    assert_eq!(
        owned_by(&node_of(&client, &later).await?, COMPAT_MANAGER).len(),
        4
    );
    other_labeler_sets(
        &client,
        &later,
        &[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3-SHARED")],
    )
    .await?;
    // The agent acts on the first cycle after its Node watch shows the other labeler's key.
    node_seen(&agent, "the other labeler's key", |node| {
        LabelOwnership::of_meta(node, COMPAT_MANAGER).held_by_others(node, "nvidia.com/gpu.product")
    })
    .await?;
    agent.cycle().await?;
    let node = node_of(&client, &later).await?;
    let got = labels(&node);
    assert!(owned_by(&node, COMPAT_MANAGER).is_empty(), "{got:#?}");
    assert_eq!(
        got.get("nvidia.com/gpu.product").map(String::as_str),
        Some("NVIDIA-H100-80GB-HBM3-SHARED"),
        "GFD's value stays"
    );
    for key in &NVIDIA_KEYS[1..] {
        assert!(!got.contains_key(*key), "{key} left beside GFD: {got:#?}");
    }
    Ok(())
}

/// Publishes the NVIDIA fixture slices for `node`, named after it.
async fn publish_nvidia_slices(client: &Client, node: &str) -> Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/dra/nvidia-h100-8x.yaml");
    let slices = hwaccel::cli::plan_dra::load_resource_slices(&[path])?;
    let api: Api<ResourceSlice> = Api::all(client.clone());
    for (index, mut slice) in slices.into_iter().enumerate() {
        slice.metadata = ObjectMeta {
            name: Some(format!("{node}-gpu.nvidia.com-{index}")),
            ..ObjectMeta::default()
        };
        slice.spec.node_name = Some(node.to_string());
        slice.spec.pool.name = node.to_string();
        api.create(&PostParams::default(), &slice).await?;
    }
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_dra_only_node_gets_compat_labels_from_its_vendor_slices() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("compat-dra");
    create_node(&client, &node, &[]).await?;
    // The driver publishes eight H100s and one MIG device; detection (a VM without the
    // vendor tools) sees nothing.
    publish_nvidia_slices(&client, &node).await?;
    let host = copy_fixture("cpu-only-vm")?;
    agent_for(&client, &node, host.path(), ONE_MISS)
        .with_compat_labels(true)
        .cycle()
        .await?;
    let got = labels(&node_of(&client, &node).await?);
    let label = |key: &str| got.get(key).map(String::as_str);
    assert_eq!(
        label("nvidia.com/gpu.product"),
        Some("NVIDIA-H100-80GB-HBM3")
    );
    assert_eq!(
        label("nvidia.com/gpu.count"),
        Some("8"),
        "the MIG device is no GPU"
    );
    assert_eq!(label("nvidia.com/gpu.memory"), Some("81559"));
    // The slice-filled devices carry no compute capability: no family is guessed.
    assert_eq!(label("nvidia.com/gpu.family"), None);
    Ok(())
}
