//! The publication audit, driven: each fleet pass holds every inventory against the slices
//! DRA drivers publish for its node and the Node's labels ([`crate::dra::audit`]), and hands
//! the pass each node's `DRAPublished` condition (written with `status.freeDevices`, in one
//! apply), the `hwaccel_dra_unpublished_devices` series and the Node Events of its
//! transitions.
//!
//! A node is audited again only when something it depends on changed — its inventory's
//! resourceVersion, its slices' resourceVersions, its labels, or the set of drivers that
//! publish anywhere — so a steady pass over 10,000 nodes hashes them and lints none.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;

use crate::api::conditions;
use crate::controller::cache::slices_in_cache;
use crate::controller::context::Context;
use crate::controller::core::fleet_view::names_its_node;
use crate::controller::metrics::fleet::UnpublishedLabel;
use crate::controller::node_events::{cut, publish_node_event};
use crate::dra::audit::{Audit, NodeTruths, audit, slices_by_node};
use crate::dra::lint::lint;
use crate::dra::slices::published_devices;

/// The inventory condition the audit sets (owned by the controller's field manager).
pub const DRA_PUBLISHED: &str = "DRAPublished";

/// One node's audit and what its inventory shows now.
#[derive(Debug, Clone)]
pub(crate) struct NodeAudit {
    /// The audit.
    pub audit: Arc<Audit>,
    /// The condition's message, made once per audit and cut as the condition keeps it.
    message: String,
    /// The inventory's `metadata.generation`, for the condition's `observedGeneration`.
    pub generation: Option<i64>,
    /// The `DRAPublished` condition the inventory carries now, if any.
    pub written: Option<Condition>,
}

impl NodeAudit {
    fn new(audit: Arc<Audit>, inventory: &crate::api::AcceleratorInventory) -> Self {
        Self {
            message: cut_message(&audit.message()),
            audit,
            generation: inventory.metadata.generation,
            written: inventory
                .status
                .as_ref()
                .and_then(|status| conditions::find(&status.conditions, DRA_PUBLISHED))
                .cloned(),
        }
    }

    /// The condition to write, keeping the written one's `lastTransitionTime` while the
    /// status stays.
    pub fn condition(
        &self,
        now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    ) -> Condition {
        let mut list: Vec<Condition> = self.written.iter().cloned().collect();
        conditions::set(
            &mut list,
            conditions::condition(
                DRA_PUBLISHED,
                Some(self.audit.published()),
                self.audit.reason(),
                &self.message,
                self.generation,
                now,
            ),
        );
        list.pop().unwrap_or_else(|| {
            conditions::condition(DRA_PUBLISHED, None, "Unknown", "", self.generation, now)
        })
    }

    /// True when the inventory already carries this audit's condition.
    pub fn is_written(&self) -> bool {
        self.written.as_ref().is_some_and(|c| {
            c.status == conditions::status_text(Some(self.audit.published()))
                && c.reason == self.audit.reason()
                && c.message == self.message
                && c.observed_generation == self.generation
        })
    }
}

fn cut_message(message: &str) -> String {
    message
        .chars()
        .take(conditions::MAX_MESSAGE_CHARS)
        .collect()
}

/// One node's entry in [`Audits`].
#[derive(Debug)]
struct Kept {
    /// The fingerprint of what the audit read (the inventory's and the Node's
    /// resourceVersions, the node's slices, the drivers publishing anywhere).
    fingerprint: u64,
    /// The audit, with what the inventory showed when it was made.
    audited: Arc<NodeAudit>,
    /// Whether it was published and the reason last seen, for the Events on transitions.
    seen: Option<(bool, &'static str)>,
}

/// What the audits remember between passes: per node that has an inventory naming it, its
/// audit, made again only when its fingerprint changes. Kept in place from pass to pass, so
/// a pass over a fleet where nothing changed hashes each node once and allocates nothing.
#[derive(Debug, Default)]
pub(crate) struct Audits {
    by_node: HashMap<String, Kept>,
}

impl Audits {
    /// The node's audit as of the last [`audit_nodes`].
    pub fn get(&self, node: &str) -> Option<&NodeAudit> {
        self.by_node.get(node).map(|kept| &*kept.audited)
    }
}

/// Audits every inventory's node; nodes whose inputs did not change keep their audit. Nodes
/// without an inventory naming them are forgotten.
pub(crate) fn audit_nodes(ctx: &Context, audits: &mut Audits) {
    let slices = slices_in_cache(ctx);
    let (by_node, drivers_in_cluster) = slices_by_node(slices.iter().map(|slice| &**slice));
    let drivers_hash = hash_of(&drivers_in_cluster);
    let no_labels = BTreeMap::new();
    let mut audited = 0usize;
    for object in ctx.inventories.state() {
        let Some(inventory) = object.decoded() else {
            continue;
        };
        if !names_its_node(inventory) {
            continue;
        }
        audited += 1;
        let node = inventory.spec.node_name.as_str();
        let node_object = ctx.nodes.get(&ObjectRef::new(node));
        let own_slices = by_node.get(node).map(Vec::as_slice).unwrap_or(&[]);
        let fingerprint = {
            let mut hasher = DefaultHasher::new();
            inventory.metadata.resource_version.hash(&mut hasher);
            for slice in own_slices {
                slice.metadata.name.hash(&mut hasher);
                slice.metadata.resource_version.hash(&mut hasher);
            }
            // The Node's labels are what the audit reads of it; any change to them is a new
            // resourceVersion, so the version is hashed rather than every label (the labels
            // only for an object without one, which no apiserver serves).
            match node_object.as_ref() {
                Some(node) => match &node.metadata.resource_version {
                    Some(version) => version.hash(&mut hasher),
                    None => node.labels().hash(&mut hasher),
                },
                None => 0u8.hash(&mut hasher),
            }
            drivers_hash.hash(&mut hasher);
            hasher.finish()
        };
        if let Some(kept) = audits.by_node.get(node)
            && kept.fingerprint == fingerprint
        {
            continue;
        }
        let labels = node_object.as_ref().map_or(&no_labels, |n| n.labels());
        let owned: Vec<ResourceSlice> = own_slices.iter().map(|s| (*s).clone()).collect();
        let published = published_devices(&owned);
        let findings = lint(&owned);
        let audit = Arc::new(audit(&NodeTruths {
            inventory: Some(inventory),
            published: published.node(node),
            findings: &findings,
            labels,
            drivers_in_cluster: &drivers_in_cluster,
        }));
        let audited = Arc::new(NodeAudit::new(audit, inventory));
        match audits.by_node.get_mut(node) {
            Some(kept) => {
                kept.fingerprint = fingerprint;
                kept.audited = audited;
            }
            None => {
                audits.by_node.insert(
                    node.to_string(),
                    Kept {
                        fingerprint,
                        audited,
                        seen: None,
                    },
                );
            }
        }
    }
    // Every node audited now has an entry; more entries than that means some node's
    // inventory is gone (or no longer names it).
    if audits.by_node.len() > audited {
        let present: HashSet<String> = ctx
            .inventories
            .state()
            .iter()
            .filter_map(|object| object.decoded())
            .filter(|inventory| names_its_node(inventory))
            .map(|inventory| inventory.spec.node_name.clone())
            .collect();
        audits.by_node.retain(|node, _| present.contains(node));
    }
}

/// Publishes the audit's series and the Node Events of its transitions: a Warning
/// `DRANotPublished` when a node's gaps start or their leading reason changes, a Normal
/// `DRAPublished` when they close. After a restart a node with gaps gets one Warning.
pub(crate) fn publish(ctx: &Context, audits: &mut Audits) {
    let mut series: BTreeMap<UnpublishedLabel, u32> = BTreeMap::new();
    for (node, kept) in &audits.by_node {
        for ((driver, reason), devices) in kept.audited.audit.devices_by_source() {
            series.insert(
                UnpublishedLabel {
                    node: node.clone(),
                    driver: cut(&driver),
                    reason: reason.as_str().to_string(),
                },
                devices,
            );
        }
    }
    ctx.metrics.fleet.publish_unpublished(&series);

    for (node, kept) in &mut audits.by_node {
        let audit = &kept.audited.audit;
        let now = (audit.published(), audit.reason());
        let before = kept.seen.replace(now);
        let event = match (before, now) {
            // Gaps appeared, or their leading reason changed.
            (None | Some((true, _)), (false, _)) => warning(node, audit),
            (Some((false, was)), (false, reason)) if was != reason => warning(node, audit),
            (Some((false, _)), (true, _)) => Event {
                type_: EventType::Normal,
                reason: DRA_PUBLISHED.to_string(),
                note: Some(cut(&kept.audited.message)),
                action: "Audit".to_string(),
                secondary: None,
            },
            _ => continue,
        };
        publish_node_event(ctx, node, event);
    }
}

fn warning(node: &str, audit: &Audit) -> Event {
    Event {
        type_: EventType::Warning,
        reason: "DRANotPublished".to_string(),
        note: Some(cut(&format!(
            "{}: {}; see kubectl describe acceleratorinventory {node}",
            audit.reason(),
            audit.message()
        ))),
        action: "Audit".to_string(),
        secondary: None,
    }
}

fn hash_of(drivers: &BTreeSet<String>) -> u64 {
    let mut hasher = DefaultHasher::new();
    drivers.hash(&mut hasher);
    hasher.finish()
}
