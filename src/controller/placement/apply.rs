//! Apply, the writing step of a reconcile: every Node whose set of placements changed gets
//! its complete set of `placement.hwaccel.io/*` labels by server-side apply, so labels of
//! placements that are gone disappear by omission and labels we never set stay untouched.
//!
//! Writes only on change: a Node whose cached labels already match is not written, and one
//! written moments ago whose cache has not caught up yet is trusted to be in flight.
//!
//! The writes happen outside the state lock, under the Nodes' own write locks
//! ([`NodeWriteLocks`](crate::controller::context::NodeWriteLocks)): a slow Node write holds
//! up only writers to the same Nodes, never planning or other placements' status writes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;

use super::core::decide::Decision;
use super::core::labels::{is_placement_label, labels_by_node, placement_label_key};
use crate::controller::context::{Context, FIELD_MANAGER, State};
use crate::controller::core::ledger::HeldNodes;
use crate::controller::core::ledger::PlacementKey;

/// How long the Node watch cache may lag behind a label write of ours before a difference
/// means someone else changed the labels.
pub const CACHE_LAG: Duration = Duration::from_secs(10);
/// Node label writes one reconcile has in flight at once.
const PARALLEL_NODE_WRITES: usize = 16;

/// A placement label write the apiserver refused or never answered.
#[derive(Debug, thiserror::Error)]
#[error("kubernetes API: {0}")]
pub struct ApplyError(#[from] kube::Error);

/// The Nodes a decision's labels must be checked on: those whose placements changed, and for
/// a kept plan its own Nodes too (no write unless a label went missing).
pub fn nodes_to_check(decision: &Decision) -> BTreeSet<String> {
    let mut nodes = decision.changed_nodes.clone();
    if decision.kept {
        nodes.extend(
            decision
                .outcome
                .status()
                .assignments
                .iter()
                .map(|a| a.node.clone()),
        );
    }
    nodes
}

/// Applies, to each of `nodes`, the complete set of placement labels it should carry, as
/// the ledger says once this writer holds the Nodes' write locks. Returns the Nodes whose
/// cached labels still differ from a write made within [`CACHE_LAG`], which were trusted to
/// be in flight rather than written again. The caller must not hold the state lock.
pub async fn sync_node_labels(
    ctx: &Context,
    nodes: &BTreeSet<String>,
) -> Result<Vec<String>, ApplyError> {
    if nodes.is_empty() {
        return Ok(Vec::new());
    }
    let _writing = ctx.node_writes.lock(nodes).await;
    let (writes, unconfirmed) = label_writes(ctx, &mut *ctx.state.lock().await, nodes);
    // One placement can span many Nodes (and planning older placements on this turn adds
    // more): the writes go out together, so a reconcile costs one apiserver round trip rather
    // than one per Node. Each Node gets at most one write, so their order does not matter.
    let api: Api<Node> = Api::all(ctx.client.clone());
    let results: Vec<LabelWrite> = futures::stream::iter(writes)
        .map(|(node, labels)| {
            let api = api.clone();
            async move {
                let result = apply_node_labels(&api, ctx, &node, &labels).await;
                (node, labels, result)
            }
        })
        .buffer_unordered(PARALLEL_NODE_WRITES)
        .collect()
        .await;
    let mut state = ctx.state.lock().await;
    let mut first_error = None;
    for (node, labels, result) in results {
        match result {
            Ok(()) => {
                state.refused_labels.remove(&node);
                state.applied_labels.insert(node, (labels, Instant::now()));
            }
            Err(err) => {
                state.refused_labels.insert(node);
                first_error.get_or_insert(err);
            }
        }
    }
    first_error.map_or(Ok(unconfirmed), |err| Err(ApplyError(err)))
}

/// The label writes `nodes` need by the ledger and the Node cache, and the Nodes trusted to
/// have a write in flight.
fn label_writes(
    ctx: &Context,
    state: &mut State,
    nodes: &BTreeSet<String>,
) -> (Vec<NodeLabels>, Vec<String>) {
    let mut unconfirmed = Vec::new();
    // Only the placements holding devices on these Nodes, found through the ledger's device
    // index: walking every holding made each reconcile cost O(placements) (37 % of the
    // controller's CPU at 10,000 nodes and 3,000 placements, docs/benchmarks.md).
    let holders: BTreeSet<PlacementKey> = nodes
        .iter()
        .flat_map(|node| state.ledger.holders_on(node))
        .collect();
    let holdings: Vec<(PlacementKey, HeldNodes)> = holders
        .into_iter()
        .filter_map(|key| {
            let held = state.ledger.get(&key)?.held_nodes();
            Some((key, held))
        })
        .collect();
    let desired = labels_by_node(
        holdings
            .iter()
            .map(|(key, held)| (key.namespace.as_str(), key.name.as_str(), held)),
    );
    let mut writes: Vec<NodeLabels> = Vec::new();
    for node in nodes {
        let labels = desired.get(node).cloned().unwrap_or_default();
        // Server-side apply creates missing objects: never apply to a Node that is gone.
        let Some(cached) = ctx.nodes.get(&ObjectRef::new(node)) else {
            state.applied_labels.remove(node);
            state.refused_labels.remove(node);
            continue;
        };
        let on_node: BTreeMap<String, String> = cached
            .labels()
            .iter()
            .filter(|(k, _)| is_placement_label(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let just_written = state
            .applied_labels
            .get(node)
            .is_some_and(|(sent, at)| *sent == labels && at.elapsed() < CACHE_LAG);
        if on_node == labels {
            continue;
        }
        if just_written {
            unconfirmed.push(node.clone());
        } else {
            writes.push((node.clone(), labels));
        }
    }
    (writes, unconfirmed)
}

/// The Nodes that carry `key`'s placement label, by the Node cache or by our own last write
/// (which the cache may not show yet): where a deleted placement's labels must go.
pub fn nodes_labelled_for(ctx: &Context, state: &State, key: &PlacementKey) -> BTreeSet<String> {
    let label = placement_label_key(&key.namespace, &key.name);
    let mut nodes: BTreeSet<String> = ctx
        .nodes
        .state()
        .iter()
        .filter(|node| node.labels().contains_key(&label))
        .map(|node| node.name_any())
        .collect();
    nodes.extend(
        state
            .applied_labels
            .iter()
            .filter(|(_, (labels, _))| labels.contains_key(&label))
            .map(|(node, _)| node.clone()),
    );
    nodes
}

/// A Node and the complete set of placement labels it should carry.
type NodeLabels = (String, BTreeMap<String, String>);

/// A Node, the placement labels sent to it, and how the write went.
type LabelWrite = (String, BTreeMap<String, String>, Result<(), kube::Error>);

/// Sets the complete set of placement labels on one Node.
async fn apply_node_labels(
    api: &Api<Node>,
    ctx: &Context,
    node: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    let writing = Instant::now();
    let patch = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": node, "labels": labels },
    });
    // Forced: every key under `placement.hwaccel.io/` is the controller's by design. Without
    // force, a label someone edited by hand (kubectl label --overwrite) becomes theirs, and
    // every later apply of ours to that Node fails with a 409 conflict: new placements there
    // never get labelled and deleted ones hang on their finalizer.
    api.patch(
        node,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .inspect_err(|_| ctx.metrics.failed("node_labels"))?;
    ctx.metrics.wrote("node_labels", writing.elapsed());
    Ok(())
}
