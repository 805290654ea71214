//! The agent's three watches, each scoped to its own node: its Node (by `metadata.name`;
//! whole, for the allocatable its device plugins advertise), its inventory's metadata (by
//! `metadata.name`) and its node's ResourceSlices (by `spec.nodeName`). A steady cycle reads them instead of the API; see
//! [`super::watched`] for how they stay bounded and when they are not trusted, and
//! `docs/decisions/0010-the-agent-watches-its-own-objects.md` for the apiserver's side.
//!
//! Each accessor answers only what the cache can vouch for: `None` (or
//! [`Cached::Unknown`]) sends the caller to the API, exactly as before the watches existed.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PartialObjectMeta;
use kube::{Api, Client};

use super::watched::{Cached, Source, Timing, WatchStats, Watched};
use crate::api::AcceleratorInventory;

/// What the cache says about the agent's inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InventoryVersion {
    /// It exists, at this resourceVersion.
    Stored(String),
    /// It does not exist.
    Absent,
    /// The cache cannot say: read the API.
    Unknown,
}

/// The watches of one node's own objects; dropping it stops them.
#[derive(Debug)]
pub struct OwnObjects {
    name: String,
    node: Watched<Node>,
    inventory: Watched<PartialObjectMeta<AcceleratorInventory>>,
    slices: Watched<ResourceSlice>,
}

impl OwnObjects {
    /// Starts the three watches for `node` on the current tokio runtime.
    pub fn start(client: &Client, node: &str, timing: Timing) -> Self {
        let by_name = format!("metadata.name={node}");
        Self {
            name: node.to_string(),
            node: Watched::start(
                Source::objects("node", Api::<Node>::all(client.clone()), by_name.clone()),
                timing,
            ),
            inventory: Watched::start(
                Source::metadata(
                    "inventory",
                    Api::<AcceleratorInventory>::all(client.clone()),
                    by_name,
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

    /// The inventory's resourceVersion as the cache knows it.
    pub fn inventory(&self) -> InventoryVersion {
        match self.inventory.view() {
            Cached::Current(mut stored) => match stored.remove(&self.name) {
                Some(meta) => meta
                    .metadata
                    .resource_version
                    .map_or(InventoryVersion::Unknown, InventoryVersion::Stored),
                None => InventoryVersion::Absent,
            },
            Cached::Refused(_) | Cached::Unknown => InventoryVersion::Unknown,
        }
    }

    /// The node's ResourceSlices as the cache knows them.
    pub fn slices(&self) -> Cached<ResourceSlice> {
        self.slices.view()
    }

    /// True when every watch is current (the Node present, the slices listed or refused): a
    /// steady cycle then makes no request.
    pub fn current(&self) -> bool {
        self.node().is_some()
            && self.inventory() != InventoryVersion::Unknown
            && !matches!(self.slices(), Cached::Unknown)
    }

    /// What each watch did so far, by name.
    pub fn stats(&self) -> [(&'static str, WatchStats); 3] {
        [
            ("node", self.node.stats()),
            ("inventory", self.inventory.stats()),
            ("resourceslices", self.slices.stats()),
        ]
    }
}
