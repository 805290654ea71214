//! Nodes for cluster tests: a kwok Node the scheduler can place pods on, and the Events
//! recorded about a Node.

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use super::{TEST_LABEL, TestCluster};

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
