//! `hwaccel cleanup`: the uninstall path that removes our labels from Nodes.
//!
//! Server-side apply makes this exact: applying an empty label set as a field manager releases
//! every label that manager owns, and the apiserver deletes a released label nobody else owns.
//! Labels other managers set, including ones under our prefixes, stay. The Helm chart runs
//! this as a pre-delete hook; it can also be run by hand.

use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::agent::node_labels::LabelOwnership;

/// The field managers whose labels cleanup releases.
pub const FIELD_MANAGERS: [&str; 2] = ["hwaccel-agent", "hwaccel-controller"];

/// What cleanup did to one Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCleanup {
    /// The Node's name.
    pub node: String,
    /// Field managers whose labels were released.
    pub released: Vec<String>,
}

/// Releases our labels from the named Nodes, or from every Node when `nodes` is empty.
pub async fn release_labels(
    client: Client,
    nodes: &[String],
    dry_run: bool,
) -> Result<Vec<NodeCleanup>, kube::Error> {
    let api: Api<Node> = Api::all(client);
    let targets: Vec<Node> = if nodes.is_empty() {
        api.list(&ListParams::default()).await?.items
    } else {
        let mut found = Vec::new();
        for name in nodes {
            found.push(api.get(name).await?);
        }
        found
    };
    let mut done = Vec::new();
    for node in targets {
        let Some(name) = node.metadata.name.clone() else {
            continue;
        };
        let mut released = Vec::new();
        for manager in FIELD_MANAGERS {
            if !LabelOwnership::of(&node, manager).owns_any() {
                continue;
            }
            let mut params = PatchParams::apply(manager);
            if dry_run {
                params = params.dry_run();
            }
            let patch = json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": { "name": name, "labels": {} },
            });
            api.patch(&name, &params, &Patch::Apply(&patch)).await?;
            released.push(manager.to_string());
        }
        if !released.is_empty() {
            done.push(NodeCleanup {
                node: name,
                released,
            });
        }
    }
    Ok(done)
}
