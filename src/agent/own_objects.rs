//! The agent's two watches, each scoped to its own node: its Node (by `metadata.name`; whole,
//! for the allocatable its device plugins advertise) and its node's ResourceSlices (by
//! `spec.nodeName`). A steady cycle reads them instead of the API; see [`super::watched`] for
//! how they stay bounded and when they are not trusted, and
//! `docs/decisions/0010-the-agent-watches-its-own-objects.md` for the apiserver's side. Its
//! inventory is not watched: one metadata read a cycle, served from the apiserver's watch
//! cache, costs the apiserver less than a third watch held by every node (issue 41; see
//! `Agent::sync_with_stored`).
//!
//! Each accessor answers only what the cache can vouch for: `None` (or
//! [`Cached::Unknown`]) sends the caller to the API, exactly as before the watches existed.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Api, Client};

use super::watched::{Cached, Source, Timing, WatchStats, Watched};

/// How many watches an agent holds (its Node, its slices): what each node costs the
/// apiserver's memory, measured by `tests/cluster_api_connections.rs`.
pub const WATCHES: usize = 2;

/// The watches of one node's own objects; dropping it stops them.
#[derive(Debug)]
pub struct OwnObjects {
    name: String,
    node: Watched<Node>,
    slices: Watched<ResourceSlice>,
}

impl OwnObjects {
    /// Starts the watches for `node` on the current tokio runtime.
    pub fn start(client: &Client, node: &str, timing: Timing) -> Self {
        Self {
            name: node.to_string(),
            node: Watched::start(
                Source::objects(
                    "node",
                    Api::<Node>::all(client.clone()),
                    format!("metadata.name={node}"),
                ),
                timing,
            ),
            slices: Watched::start(
                Source::objects(
                    "resourceslices",
                    Api::<ResourceSlice>::all(client.clone()),
                    format!("spec.nodeName={node}"),
                ),
                timing,
            ),
        }
    }

    /// The Node's metadata when the cache holds it; `None` when it cannot vouch for it or has
    /// no such Node (the caller's GET then reports what is wrong).
    pub fn node(&self) -> Option<ObjectMeta> {
        self.node_object().map(|node| node.metadata)
    }

    /// The whole Node when the cache holds it (see [`Self::node`]).
    pub fn node_object(&self) -> Option<Node> {
        match self.node.view() {
            Cached::Current(mut nodes) => nodes.remove(&self.name),
            Cached::Refused(_) | Cached::Unknown => None,
        }
    }

    /// The node's ResourceSlices as the cache knows them.
    pub fn slices(&self) -> Cached<ResourceSlice> {
        self.slices.view()
    }

    /// True when every watch is current (the Node present, the slices listed or refused): a
    /// steady cycle then makes no request.
    pub fn current(&self) -> bool {
        self.node().is_some() && !matches!(self.slices(), Cached::Unknown)
    }

    /// What each watch did so far, by name.
    pub fn stats(&self) -> [(&'static str, WatchStats); WATCHES] {
        [
            ("node", self.node.stats()),
            ("resourceslices", self.slices.stats()),
        ]
    }
}
