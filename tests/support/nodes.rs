//! Nodes for cluster tests: a plain Node for an agent to describe, a kwok Node the
//! scheduler can place pods on, a node's inventory written as its agent writes it, and the
//! Events recorded about a Node.

use anyhow::{Context, Result};
use hwaccel::api::AcceleratorInventory;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::{TEST_LABEL, TestCluster};

/// A plain Node (no kubelet, not schedulable) with its hostname label and `annotations`.
pub async fn create_node(client: &Client, name: &str, annotations: &[(&str, &str)]) -> Result<()> {
    let annotations: serde_json::Map<String, serde_json::Value> = annotations
        .iter()
        .map(|(key, value)| ((*key).to_string(), json!(value)))
        .collect();
    let node: Node = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name},
            "annotations": annotations,
        },
    }))?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await?;
    Ok(())
}

/// A Node kwok makes Ready (so kube-scheduler can place pods on it), labelled for this test
/// and with its hostname label.
pub async fn create_kwok_node(cluster: &TestCluster, name: &str) -> Result<()> {
    let node: Node = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {TEST_LABEL: cluster.prefix(), "kubernetes.io/hostname": name},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
    }))?;
    Api::<Node>::all(cluster.client())
        .create(&PostParams::default(), &node)
        .await?;
    Ok(())
}

/// `type|reason|message` of every Event about Node `node` (they live in `default`).
pub async fn node_events(cluster: &TestCluster, node: &str) -> Result<Vec<String>> {
    let out = cluster
        .kubectl_ok(&[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            &format!("involvedObject.kind=Node,involvedObject.name={node}"),
            "-o",
            "jsonpath={range .items[*]}{.type}|{.reason}|{.message}{\"\\n\"}{end}",
        ])
        .await?;
    Ok(out.lines().map(str::to_string).collect())
}

/// Writes `inventory` as the node's agent does: server-side apply under the agent's field
/// manager, so the controller's own status fields stay the controller's.
pub async fn apply_inventory(client: &Client, inventory: &AcceleratorInventory) -> Result<()> {
    let name = inventory
        .metadata
        .name
        .as_deref()
        .context("an inventory without a name")?;
    Api::<AcceleratorInventory>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply("hwaccel-agent").force(),
            &Patch::Apply(inventory),
        )
        .await?;
    Ok(())
}

/// Waits for an Event about Node `node` whose `type|reason|message` starts with `prefix`;
/// returns it.
pub async fn wait_node_event(cluster: &TestCluster, node: &str, prefix: &str) -> Result<String> {
    super::wait_for(
        super::DEFAULT_TIMEOUT,
        &format!("{prefix} on {node}"),
        || async move {
            Ok(node_events(cluster, node)
                .await?
                .into_iter()
                .find(|e| e.starts_with(prefix)))
        },
    )
    .await
}
