//! Events on Nodes, and the span of work on one node: shared by every loop that reports about
//! a node (the fleet pass's `DevicesMissing`, the health taints' reports), so no loop imports
//! another for them.

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::runtime::events::Event;
use kube::runtime::reflector::ObjectRef;
use tracing::Instrument;

use crate::controller::context::Context;

/// The reference of Node `name` (with its uid when the cache knows it, so `kubectl
/// describe node` shows the Event).
pub(crate) fn node_reference(ctx: &Context, name: &str) -> ObjectReference {
    let uid = ctx
        .nodes
        .get(&ObjectRef::<kube::api::PartialObjectMeta<Node>>::new(name))
        .and_then(|node| node.metadata.uid.clone());
    ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("Node".to_string()),
        name: Some(name.to_string()),
        uid,
        ..ObjectReference::default()
    }
}

/// Publishes an Event on a Node in the background (Events are informational).
pub(crate) fn publish_node_event(ctx: &Context, node: &str, event: Event) {
    let reference = node_reference(ctx, node);
    let recorder = ctx.recorder.clone();
    let metrics = ctx.metrics.clone();
    let publish = async move {
        if let Err(err) = recorder.publish(&event, &reference).await {
            metrics.failed("event");
            tracing::warn!(error = %err, "publishing a Node event failed");
        }
    };
    tokio::spawn(publish.instrument(node_span(node)));
}

/// The span of work on one node: every line logged in it names the node.
pub(crate) fn node_span(node: &str) -> tracing::Span {
    tracing::info_span!("node", node = %node)
}

/// An Event note cut to the API's limit.
pub(crate) fn cut(text: &str) -> String {
    text.chars().take(1000).collect()
}
