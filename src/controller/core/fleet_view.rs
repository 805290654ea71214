//! The fleet as the planner sees it: the live AcceleratorInventories turned into planner
//! nodes, with device names as in the inventories, plus what placement filters and plan
//! checks need (products, presence, usability).
//!
//! Turning one inventory into a planner node is the costly step (tens of microseconds, so
//! tens of milliseconds for a 1,000-node fleet), and a fleet changes one node at a time. So
//! the view is assembled from [`NodePart`]s, one per inventory, which the controller keeps
//! across rebuilds and converts again only when that inventory's resourceVersion changed.
//!
//! A part may also carry the devices DRA drivers publish for its node
//! ([`NodePart::with_published`]): the same device seen by both is one device, and each
//! device a driver publishes keeps its DRA name ([`FleetView::dra_device`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::api::{AcceleratorInventory, attribute};
use crate::dra::inventory_node::{PlannerDeviceIds, planner_node};
use crate::dra::merge::merge_node;
use crate::dra::{DeviceRef, PublishedDevice};
use crate::plan::{FleetIndex, NodeSpec};
use k8s_openapi::api::resource::v1::ResourceSlice;

use super::counter_book::{CounterIndex, DeviceKey};
use crate::dra::counters::published_counters;

use crate::api::placement::Assignment;

/// Which devices and nodes a placement may use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceFilter {
    /// Allowed families (`gpu`...); empty means any.
    pub families: BTreeSet<String>,
    /// Allowed product slugs; empty means any.
    pub products: BTreeSet<String>,
    /// Labels a node must carry.
    pub node_selector: BTreeMap<String, String>,
    /// Only devices a DRA driver publishes (`allocation: claims` and `claimTemplate`); these
    /// placements also see the devices a driver publishes shareable by memory, since their
    /// claims can ask for a share of one or for all of its memory.
    pub dra_only: bool,
    /// Also the published partitions of whole devices (`allocation: claimTemplate`, whose
    /// claims ask the scheduler for a partition by its profile, and `claims`, whose claims
    /// the controller allocates a partition device in).
    pub fractions: bool,
}

impl DeviceFilter {
    /// True when `node` carries every label of the node selector: the one node test of the
    /// planner's view and of the explanation when nothing is left.
    pub fn selects_node(&self, node: &NodeSpec) -> bool {
        self.node_selector
            .iter()
            .all(|(key, value)| node.labels.get(key) == Some(value))
    }
}

/// One inventory as the planner sees it.
#[derive(Debug, Clone)]
pub struct NodePart {
    /// The planner's node, devices named as in the inventory (labels not yet filled in).
    pub node: NodeSpec,
    /// Product slug by device name.
    products: BTreeMap<String, String>,
    /// Every device name in the inventory, usable or not.
    present: BTreeSet<String>,
    /// Devices present but not plannable now, with the reason.
    unusable: BTreeMap<String, String>,
    /// DRA name by planner device id, for the devices a DRA driver publishes.
    dra: BTreeMap<String, DeviceRef>,
    /// What merging published devices left out, one line each.
    notes: Vec<String>,
    /// Devices a driver publishes shareable by memory: not in `node` (a placement held by
    /// node labels alone could not keep others' shares off it), offered to placements held
    /// by claims ([`DeviceFilter::dra_only`]).
    shareable: Vec<crate::plan::DeviceSpec>,
    /// The partitions a driver publishes of each device, by device id: offered as fractions
    /// to placements held by claims.
    partitions: BTreeMap<String, Vec<crate::plan::share::Partition>>,
    /// Plannable devices their DRA driver flags with an informational taint, with it.
    notices: BTreeMap<String, String>,
}

impl NodePart {
    /// Converts one inventory.
    pub fn new(inventory: &AcceleratorInventory) -> Self {
        let mut products = BTreeMap::new();
        let mut present = BTreeSet::new();
        let mut unusable = BTreeMap::new();
        for entry in &inventory.spec.devices {
            if let Some(product) = entry.text(attribute::PRODUCT) {
                products.insert(entry.name.clone(), product);
            }
            present.insert(entry.name.clone());
        }
        let (node, _skipped) = planner_node(inventory, PlannerDeviceIds::InventoryNames);
        let usable: BTreeSet<&str> = node.devices.iter().map(|d| d.id.as_str()).collect();
        // Why, from the one device-state rule (a healthy GPU split into MIG instances used to
        // read "not plannable, health healthy").
        let reasons: BTreeMap<String, String> = inventory
            .device_facts()
            .into_iter()
            .filter_map(|facts| Some((facts.name, facts.unplannable?)))
            .collect();
        for entry in &inventory.spec.devices {
            let health = entry
                .attributes
                .get(attribute::HEALTH)
                .and_then(|a| a.as_str())
                .unwrap_or("unknown");
            let family = entry
                .attributes
                .get(attribute::FAMILY)
                .and_then(|a| a.as_str())
                .unwrap_or("");
            if family != "cpu" && !usable.contains(entry.name.as_str()) {
                let why = match reasons.get(&entry.name).map(String::as_str) {
                    Some("unhealthy") | None => format!("not plannable, health {health}"),
                    Some(reason) => format!("not plannable, {reason}"),
                };
                unusable.insert(entry.name.clone(), why);
            }
        }
        Self {
            node,
            products,
            present,
            unusable,
            dra: BTreeMap::new(),
            notes: Vec::new(),
            shareable: Vec::new(),
            partitions: BTreeMap::new(),
            notices: BTreeMap::new(),
        }
    }

    /// `node_name` from its inventory (if any) and the devices DRA drivers publish for it.
    /// Devices published shareable are kept aside for placements held by claims
    /// ([`DeviceFilter::dra_only`]), and published partitions for claim-template placements
    /// ([`DeviceFilter::fractions`]).
    /// Without published devices this is exactly [`NodePart::new`] (or an empty node).
    pub fn with_published(
        node_name: &str,
        inventory: Option<&AcceleratorInventory>,
        published: &[PublishedDevice],
    ) -> Self {
        let mut part = match inventory {
            Some(inventory) => Self::new(inventory),
            None => Self::empty(node_name),
        };
        if published.is_empty() {
            return part;
        }
        // Converting the inventory twice (here and in `new`) costs tens of microseconds on
        // a node with published devices only, and keeps `new`'s health reasons in one place.
        let merged = merge_node(node_name, inventory, published);
        part.node = merged.node;
        part.products.extend(merged.products);
        part.present.extend(merged.present);
        part.unusable.extend(merged.unusable);
        part.dra = merged.dra;
        part.notes = merged.notes;
        part.notices = merged.notices;
        // A shareable device is held through a claim's capacity request (a share, or all of
        // its memory), so only placements held by claims plan on it; the ledger and the
        // claims' `consumedCapacity` say how much of it is taken.
        let (shareable, whole): (Vec<_>, Vec<_>) = std::mem::take(&mut part.node.devices)
            .into_iter()
            .partition(|device| device.share.is_some());
        part.node.devices = whole;
        part.shareable = shareable;
        // Partitions are fractions: only plans held by claims see them.
        for device in &mut part.node.devices {
            let partitions = std::mem::take(&mut device.partitions);
            if !partitions.is_empty() {
                part.partitions.insert(device.id.clone(), partitions);
            }
        }
        part
    }

    /// A node nothing is known about yet.
    fn empty(node_name: &str) -> Self {
        Self {
            node: NodeSpec {
                name: node_name.to_string(),
                devices: Vec::new(),
                fabric: None,
                labels: BTreeMap::new(),
            },
            products: BTreeMap::new(),
            present: BTreeSet::new(),
            unusable: BTreeMap::new(),
            dra: BTreeMap::new(),
            notes: Vec::new(),
            shareable: Vec::new(),
            partitions: BTreeMap::new(),
            notices: BTreeMap::new(),
        }
    }

    /// What merging the node's published devices left out, one line each.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }
}

/// The planner's view of the whole fleet.
#[derive(Debug, Default)]
pub struct FleetView {
    /// Unique per view built in this process, so a plan tried against one view is known
    /// to have been tried against the same fleet.
    id: u64,
    /// Nodes by name, each with its labels for the placements' node selectors.
    nodes: Vec<NodeSpec>,
    /// The parts, by node name.
    parts: BTreeMap<String, Arc<NodePart>>,
    /// Nodes whose inventory disappeared while the Node stayed, with why their plans are
    /// kept: the agent writes it again within an interval, and moving a running workload
    /// for a missing record would be worse than waiting.
    awaiting: BTreeMap<String, String>,
    /// The planner's index of `nodes`, built by the first plan on the whole view and shared
    /// by every later one (a plan then indexes only the nodes something is reserved on).
    planner_index: OnceLock<FleetIndex>,
    /// The DRA counter sets the view's devices consume from ([`FleetView::with_counters`]).
    counters: Arc<CounterIndex>,
}

impl FleetView {
    /// The view of `inventories`; `node_labels` (by node name) fills each node's labels.
    pub fn new<'a>(
        inventories: impl IntoIterator<Item = &'a AcceleratorInventory>,
        node_labels: &BTreeMap<String, BTreeMap<String, String>>,
    ) -> Self {
        Self::from_parts(
            inventories
                .into_iter()
                .map(|inventory| Arc::new(NodePart::new(inventory))),
            node_labels,
        )
    }

    /// The view assembled from converted inventories.
    pub fn from_parts(
        parts: impl IntoIterator<Item = Arc<NodePart>>,
        node_labels: &BTreeMap<String, BTreeMap<String, String>>,
    ) -> Self {
        let parts: BTreeMap<String, Arc<NodePart>> = parts
            .into_iter()
            .map(|part| (part.node.name.clone(), part))
            .collect();
        let nodes = parts
            .values()
            .map(|part| {
                let mut node = part.node.clone();
                node.labels = node_labels.get(&node.name).cloned().unwrap_or_default();
                node
            })
            .collect();
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            nodes,
            parts,
            awaiting: BTreeMap::new(),
            planner_index: OnceLock::new(),
            counters: Arc::default(),
        }
    }

    /// The same view, with the DRA counter sets its devices consume from, as `slices` (the
    /// ones its parts were built from) publish them: what the ledger needs to hold partitions.
    /// A device with partitions none of which consumes counters is kept apart from them
    /// all the same ([`CounterIndex::add_exclusive_parts`]).
    pub fn with_counters<'a>(
        mut self,
        slices: impl IntoIterator<Item = &'a ResourceSlice>,
    ) -> Self {
        let published = published_counters(slices);
        let partitioned = self.parts.values().any(|part| !part.partitions.is_empty());
        if published.consumers.is_empty() && !partitioned {
            return self;
        }
        let index: HashMap<&DeviceRef, (&str, &str)> = self
            .dra_devices()
            .map(|(node, id, reference)| (reference, (node, id)))
            .collect();
        let mut counters = CounterIndex::new(&published, |device| {
            index
                .get(device)
                .map(|(node, id)| (node.to_string(), id.to_string()))
        });
        for (node, part) in &self.parts {
            for (parent, partitions) in &part.partitions {
                let key = |id: &str| (node.clone(), id.to_string());
                // A device published only in partitions has no DRA name of its own.
                let parent_ref = part.dra.get(parent);
                let parts: Vec<(DeviceKey, &DeviceRef)> = partitions
                    .iter()
                    .filter_map(|p| Some((key(&p.id), part.dra.get(&p.id)?)))
                    .collect();
                counters.add_exclusive_parts((key(parent), parent_ref), &parts);
            }
        }
        if !counters.is_empty() {
            self.counters = Arc::new(counters);
        }
        self
    }

    /// The partitions the drivers publish of each device of `node`, by device id.
    pub fn partitions_on(
        &self,
        node: &str,
    ) -> Option<&BTreeMap<String, Vec<crate::plan::share::Partition>>> {
        self.parts.get(node).map(|part| &part.partitions)
    }

    /// The DRA counter sets the view's devices consume from (empty unless built
    /// [`FleetView::with_counters`]).
    pub fn counters(&self) -> &Arc<CounterIndex> {
        &self.counters
    }

    /// The same view, with `awaiting` (node → why) as nodes whose plans are kept although
    /// their inventory is missing.
    pub fn with_awaiting(mut self, awaiting: BTreeMap<String, String>) -> Self {
        self.awaiting = awaiting;
        self
    }

    /// This view's id (unique in this process).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Every node, in name order.
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }

    /// Every node with the planner's index of them ([`crate::plan::plan_indexed`]), the
    /// index built on first use (about one plan's indexing; 10 ms at 10,000 nodes).
    pub fn indexed_nodes(&self) -> (&[NodeSpec], &FleetIndex) {
        let index = self
            .planner_index
            .get_or_init(|| FleetIndex::new(&self.nodes));
        (&self.nodes, index)
    }

    /// The product slug of a device, by node and inventory device name.
    pub fn product(&self, node: &str, device: &str) -> Option<&str> {
        self.parts
            .get(node)?
            .products
            .get(device)
            .map(String::as_str)
    }

    /// The DRA name of a device, by node and planner device id, when a DRA driver
    /// publishes it.
    pub fn dra_device(&self, node: &str, device: &str) -> Option<&DeviceRef> {
        self.parts.get(node)?.dra.get(device)
    }

    /// Every plannable device a DRA driver publishes, shared ones and the partitions of whole
    /// ones included, as `(node, planner device id, DRA name)`.
    pub fn dra_devices(&self) -> impl Iterator<Item = (&str, &str, &DeviceRef)> {
        self.parts.iter().flat_map(|(node, part)| {
            let devices = part
                .node
                .devices
                .iter()
                .chain(&part.shareable)
                .map(|device| device.id.as_str());
            let partitions = part.partitions.values().flatten().map(|p| p.id.as_str());
            devices.chain(partitions).filter_map(move |id| {
                let reference = part.dra.get(id)?;
                Some((node.as_str(), id, reference))
            })
        })
    }

    /// True when a DRA driver publishes some device of the fleet shareable by memory.
    pub fn any_shareable(&self) -> bool {
        self.parts.values().any(|part| !part.shareable.is_empty())
    }

    /// The devices of `node` its DRA drivers publish shareable by memory, with their policy
    /// (empty for a node without any).
    pub fn shareable_on(&self, node: &str) -> &[crate::plan::DeviceSpec] {
        self.parts
            .get(node)
            .map_or(&[][..], |part| part.shareable.as_slice())
    }

    /// The memory capacity of a device its DRA driver publishes shareable by memory, by node
    /// and planner device id (`None` for any other device).
    pub fn shared_capacity(&self, node: &str, device: &str) -> Option<u64> {
        self.parts
            .get(node)?
            .shareable
            .iter()
            .find(|spec| spec.id == device)?
            .share
            .as_ref()
            .map(|share| share.policy.capacity)
    }

    /// The devices of `node` its DRA drivers flag with an informational taint (`effect:
    /// None`), each with the taint: plannable, and counted degraded by every view.
    pub fn notices_on(&self, node: &str) -> Option<&BTreeMap<String, String>> {
        self.parts.get(node).map(|part| &part.notices)
    }

    /// The devices of `node` present but not plannable, each with why (an unhealthy device,
    /// one its DRA driver publishes as shared or only in parts...): the verdicts every count
    /// of the node takes in (`DeviceFacts::with_published_verdict`).
    pub fn unplannable_on(&self, node: &str) -> Option<&BTreeMap<String, String>> {
        self.parts.get(node).map(|part| &part.unusable)
    }

    /// The assigned devices that are still present but no longer plannable, as
    /// `node/device (why)`.
    pub fn degraded(&self, assignments: &[Assignment]) -> Vec<String> {
        assignments
            .iter()
            .flat_map(|a| a.devices.iter().map(move |d| (a.node.as_str(), d.as_str())))
            .filter_map(|(node, device)| {
                let why = match self.parts.get(node) {
                    Some(part) => part.unusable.get(device)?,
                    None => self.awaiting.get(node)?,
                };
                Some(format!("{node}/{device} ({why})"))
            })
            .collect()
    }

    /// The nodes with only the devices `filter` allows; nodes left empty are dropped.
    /// Without a filter that is the whole fleet, borrowed.
    pub fn filtered(&self, filter: &DeviceFilter) -> Cow<'_, [NodeSpec]> {
        if *filter == DeviceFilter::default() {
            return Cow::Borrowed(&self.nodes);
        }
        let nodes = self
            .nodes
            .iter()
            .filter(|node| filter.selects_node(node))
            .filter_map(|node| {
                let part = self.parts.get(&node.name)?;
                let products = &part.products;
                let mut node = node.clone();
                if filter.dra_only || filter.fractions {
                    node.devices.extend(part.shareable.iter().cloned());
                }
                if filter.fractions {
                    for device in &mut node.devices {
                        if let Some(partitions) = part.partitions.get(&device.id) {
                            device.partitions.clone_from(partitions);
                        }
                    }
                }
                node.devices.retain(|device| {
                    let family_ok = filter.families.is_empty()
                        || filter.families.contains(device.family.as_str());
                    let product_ok = filter.products.is_empty()
                        || products
                            .get(&device.id)
                            .is_some_and(|p| filter.products.contains(p));
                    family_ok && product_ok
                });
                (!node.devices.is_empty()).then_some(node)
            })
            .collect();
        Cow::Owned(nodes)
    }

    /// True when every device of `assignments` is still in the inventories (or its node's
    /// inventory is awaited back).
    pub fn holds(&self, assignments: &[Assignment]) -> Result<(), String> {
        for assignment in assignments {
            if !self.parts.contains_key(&assignment.node)
                && self.awaiting.contains_key(&assignment.node)
            {
                continue;
            }
            for device in &assignment.devices {
                let present = self
                    .parts
                    .get(&assignment.node)
                    .is_some_and(|part| part.present.contains(device));
                if !present {
                    return Err(format!(
                        "device {device} on node {} is no longer in its inventory",
                        assignment.node
                    ));
                }
            }
        }
        Ok(())
    }
}

/// True when the inventory describes the Node it is named after. The CRD and the agent's
/// admission policy refuse any other inventory; the controller checks again because the
/// planner places by `spec.nodeName` while write rights are granted by name.
pub fn names_its_node(inventory: &AcceleratorInventory) -> bool {
    inventory.metadata.name.as_deref() == Some(inventory.spec.node_name.as_str())
}

/// Converted inventories kept across fleet changes, keyed by inventory name and
/// resourceVersion; nodes with DRA-published devices are keyed by those devices too.
#[derive(Debug, Default)]
pub struct PartCache {
    parts: HashMap<String, (String, Arc<NodePart>)>,
    published: HashMap<String, PublishedPart>,
}

/// A node part built with published devices, and what it was built from.
#[derive(Debug)]
struct PublishedPart {
    inventory_version: Option<String>,
    devices: Vec<PublishedDevice>,
    part: Arc<NodePart>,
}

impl PartCache {
    /// The names of the inventories converted so far.
    pub fn names(&self) -> BTreeSet<String> {
        self.parts.keys().cloned().collect()
    }

    /// The parts of `inventories`, converting only those that are new or changed; parts of
    /// inventories no longer listed are dropped.
    pub fn refresh<'a>(
        &mut self,
        inventories: impl IntoIterator<Item = &'a AcceleratorInventory>,
    ) -> Vec<Arc<NodePart>> {
        let mut fresh = HashMap::with_capacity(self.parts.len());
        let mut out = Vec::new();
        for inventory in inventories {
            let name = inventory.metadata.name.clone().unwrap_or_default();
            let version = inventory
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default();
            let part = match self.parts.remove(&name) {
                // An object without a resourceVersion (never from the apiserver) is always
                // converted again.
                Some((seen, part)) if seen == version && !version.is_empty() => part,
                _ => Arc::new(NodePart::new(inventory)),
            };
            out.push(part.clone());
            fresh.insert(name, (version, part));
        }
        self.parts = fresh;
        out
    }

    /// Like [`PartCache::refresh`], with the devices DRA drivers publish (by node) merged
    /// in: a node with published devices is converted again only when its inventory or its
    /// published devices changed, and a node that only a DRA driver describes gets a part too.
    pub fn refresh_with_published<'a>(
        &mut self,
        inventories: impl IntoIterator<Item = &'a AcceleratorInventory>,
        published: &BTreeMap<String, Vec<PublishedDevice>>,
    ) -> Vec<Arc<NodePart>> {
        let inventories: Vec<&AcceleratorInventory> = inventories.into_iter().collect();
        let (with_devices, plain): (Vec<&AcceleratorInventory>, Vec<&AcceleratorInventory>) =
            inventories
                .into_iter()
                .partition(|i| published.contains_key(&i.spec.node_name));
        let mut out = self.refresh(plain);
        let mut by_node: BTreeMap<&str, Option<&AcceleratorInventory>> =
            published.keys().map(|node| (node.as_str(), None)).collect();
        for inventory in with_devices {
            by_node.insert(inventory.spec.node_name.as_str(), Some(inventory));
        }
        let mut fresh = HashMap::with_capacity(by_node.len());
        for (node, inventory) in by_node {
            let devices = published.get(node).map(Vec::as_slice).unwrap_or_default();
            let version = inventory.and_then(|i| i.metadata.resource_version.clone());
            let part = match self.published.remove(node) {
                Some(seen)
                    if version.is_some()
                        && seen.inventory_version == version
                        && seen.devices == devices =>
                {
                    seen.part
                }
                _ => Arc::new(NodePart::with_published(node, inventory, devices)),
            };
            out.push(part.clone());
            fresh.insert(
                node.to_string(),
                PublishedPart {
                    inventory_version: version,
                    devices: devices.to_vec(),
                    part,
                },
            );
        }
        self.published = fresh;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::inventory::fixture_inventory;

    fn inventory(scenario: &str, node: &str, version: &str) -> AcceleratorInventory {
        let mut inventory = fixture_inventory(scenario, node);
        inventory.metadata.resource_version = Some(version.to_string());
        inventory
    }

    #[test]
    fn parts_are_converted_again_only_when_their_inventory_changed() {
        let mut cache = PartCache::default();
        let a1 = inventory("h100-8x-nvswitch", "a", "1");
        let b1 = inventory("mi300x-8x", "b", "1");
        let first = cache.refresh([&a1, &b1]);
        let again = cache.refresh([&a1, &b1]);
        assert!(Arc::ptr_eq(&first[0], &again[0]) && Arc::ptr_eq(&first[1], &again[1]));
        let mut a2 = a1.clone();
        a2.spec.devices.truncate(2);
        a2.metadata.resource_version = Some("2".into());
        let changed = cache.refresh([&a2, &b1]);
        assert!(!Arc::ptr_eq(&first[0], &changed[0]), "a changed");
        assert!(Arc::ptr_eq(&first[1], &changed[1]), "b did not");
        assert_eq!(changed[0].present.len(), 2);
        let gone = cache.refresh([&b1]);
        assert_eq!(gone.len(), 1);
        assert_eq!(
            cache.parts.len(),
            1,
            "a's part is dropped with its inventory"
        );
    }

    #[test]
    fn a_device_the_planner_cannot_use_says_why_in_the_rules_words() {
        // A healthy A100 split into MIG instances read "not plannable, health healthy".
        let part = NodePart::new(&inventory("a100-mig", "m", "1"));
        assert!(!part.unusable.is_empty(), "the MIG-split GPU is unusable");
        for why in part.unusable.values() {
            assert_eq!(why, "not plannable, split into MIG instances");
        }
    }

    #[test]
    fn an_unfiltered_view_is_borrowed_and_a_filter_narrows_it() {
        let view = FleetView::new(
            [
                &inventory("h100-8x-nvswitch", "a", "1"),
                &inventory("mi300x-8x", "b", "1"),
            ],
            &BTreeMap::from([(
                "b".to_string(),
                BTreeMap::from([("pool".into(), "x".into())]),
            )]),
        );
        assert!(matches!(
            view.filtered(&DeviceFilter::default()),
            Cow::Borrowed(_)
        ));
        let pool_x = DeviceFilter {
            node_selector: BTreeMap::from([("pool".into(), "x".into())]),
            ..DeviceFilter::default()
        };
        let names: Vec<String> = view
            .filtered(&pool_x)
            .iter()
            .map(|n| n.name.clone())
            .collect();
        assert_eq!(names, vec!["b".to_string()]);
    }

    /// An NVIDIA slice for `node` shaped like dra-driver-nvidia-gpu's, with GPUs at the
    /// h100-8x-nvswitch fixture's bus ids, generation `generation` of `count` slices.
    fn nvidia_slice(
        name: &str,
        node: &str,
        generation: i64,
        count: i64,
        devices: &[(u32, &str, Option<&str>)],
    ) -> k8s_openapi::api::resource::v1::ResourceSlice {
        let devices: Vec<serde_json::Value> = devices
            .iter()
            .map(|(minor, bus, taint)| {
                let mut device = serde_json::json!({
                    "name": format!("gpu-{minor}"),
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": format!("GPU-test-{minor}")},
                        "productName": {"string": "NVIDIA H100 80GB HBM3"},
                        "resource.kubernetes.io/pciBusID": {"string": bus},
                    },
                    "capacity": {"memory": {"value": "81559Mi"}},
                });
                if let Some(effect) = taint {
                    device["taints"] = serde_json::json!([{"key": "gpu.nvidia.com/xid", "value": "79", "effect": effect}]);
                }
                device
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": node,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
                "devices": devices,
            }
        }))
        .expect("test slice")
    }

    fn view_of(
        inventories: &[AcceleratorInventory],
        slices: &[k8s_openapi::api::resource::v1::ResourceSlice],
        nodes: &[&str],
    ) -> FleetView {
        let fleet = crate::dra::slices::published_devices(slices);
        let parts = nodes.iter().map(|node| {
            let inventory = inventories.iter().find(|i| i.spec.node_name == *node);
            Arc::new(NodePart::with_published(node, inventory, fleet.node(node)))
        });
        FleetView::from_parts(parts, &BTreeMap::new())
    }

    /// A GPU published shareable is planned by placements held by claims (a share, or all
    /// of its memory, through the claim's capacity request) and by no placement held by node
    /// labels alone; it is no unplannable device, so the counts see it free or held.
    #[test]
    fn shareable_devices_are_offered_to_placements_held_by_claims_only() {
        let slices = crate::testing::dra::fixture_slices(&["nvidia-h100-shareable.yaml"]);
        let view = view_of(&[], &slices, &["h100-2x-shared"]);
        assert!(view.nodes()[0].devices.is_empty(), "{:?}", view.nodes());
        assert!(
            view.unplannable_on("h100-2x-shared")
                .expect("the node")
                .is_empty()
        );
        let labels = DeviceFilter {
            families: BTreeSet::from(["gpu".to_string()]),
            ..DeviceFilter::default()
        };
        assert!(view.filtered(&labels).is_empty());
        let claims = DeviceFilter {
            dra_only: true,
            ..DeviceFilter::default()
        };
        let nodes = view.filtered(&claims);
        assert_eq!(nodes[0].devices.len(), 2);
        assert!(nodes[0].devices.iter().all(|d| d.share.is_some()));
        let id = &nodes[0].devices[0].id;
        assert_eq!(
            view.shared_capacity("h100-2x-shared", id),
            Some(80 << 30),
            "the policy's capacity"
        );
        assert_eq!(view.dra_devices().count(), 2, "indexed by their DRA names");
    }

    #[test]
    fn a_device_in_the_inventory_and_a_slice_is_one_device_with_a_dra_name() {
        let a = inventory("h100-8x-nvswitch", "a", "1");
        let slice = nvidia_slice(
            "a-gpu",
            "a",
            1,
            1,
            &[(0, "0000:1b:00.0", None), (1, "0000:43:00.0", None)],
        );
        let view = view_of(std::slice::from_ref(&a), &[slice], &["a"]);
        assert_eq!(view.nodes()[0].devices.len(), 8, "not ten");
        assert_eq!(
            view.dra_device("a", "gpu-0000-43-00-0")
                .map(ToString::to_string)
                .as_deref(),
            Some("gpu.nvidia.com/a/gpu-1")
        );
        assert_eq!(
            view.dra_device("a", "gpu-0000-52-00-0"),
            None,
            "not published"
        );
        assert_eq!(
            view.product("a", "gpu-0000-1b-00-0"),
            Some("nvidia-h100-80gb-hbm3")
        );
        // Nothing published: exactly the inventory-only part.
        let plain = NodePart::with_published("a", Some(&a), &[]);
        let new = NodePart::new(&a);
        assert_eq!(plain.node, new.node);
        assert_eq!(plain.unusable, new.unusable);
        assert!(plain.dra.is_empty());
    }

    #[test]
    fn a_slice_only_node_is_planned_and_its_devices_are_held() {
        let slice = nvidia_slice(
            "b-gpu",
            "b",
            3,
            1,
            &[(0, "0000:1b:00.0", None), (1, "0000:43:00.0", None)],
        );
        let view = view_of(&[], &[slice], &["b"]);
        let node = &view.nodes()[0];
        assert_eq!(node.devices.len(), 2);
        let id = node.devices[0].id.clone();
        assert_eq!(
            view.dra_device("b", &id).map(|r| r.device.as_str()),
            Some("gpu-0")
        );
        assert_eq!(view.product("b", &id), Some("nvidia-h100-80gb-hbm3"));
        let assignment = Assignment {
            replica: 0,
            stage: 0,
            node: "b".into(),
            devices: vec![id],
        };
        assert!(view.holds(std::slice::from_ref(&assignment)).is_ok());
    }

    #[test]
    fn a_tainted_device_is_not_planned_and_is_reported_degraded() {
        let a = inventory("h100-8x-nvswitch", "a", "1");
        let slice = nvidia_slice(
            "a-gpu",
            "a",
            1,
            1,
            &[(0, "0000:1b:00.0", Some("NoExecute"))],
        );
        let view = view_of(&[a], &[slice], &["a"]);
        assert_eq!(view.nodes()[0].devices.len(), 7);
        let assignment = Assignment {
            replica: 0,
            stage: 0,
            node: "a".into(),
            devices: vec!["gpu-0000-1b-00-0".into()],
        };
        let degraded = view.degraded(std::slice::from_ref(&assignment));
        assert_eq!(degraded.len(), 1);
        assert!(degraded[0].contains("NoExecute"), "{degraded:?}");
    }

    /// Issue 39 item 4: an informational taint (`effect: None`, NVIDIA's XID events) keeps
    /// the GPU plannable and names it among the node's notices (the counts' test is in
    /// `fleet_figures`).
    #[test]
    fn an_informational_taint_leaves_the_gpu_plannable_with_a_notice() {
        let a = inventory("h100-8x-nvswitch", "a", "1");
        let slice = nvidia_slice("a-gpu", "a", 1, 1, &[(0, "0000:1b:00.0", Some("None"))]);
        let view = view_of(std::slice::from_ref(&a), &[slice], &["a"]);
        assert_eq!(view.nodes()[0].devices.len(), 8, "still plannable");
        let notices = view.notices_on("a").expect("the node");
        let notice = notices.get("gpu-0000-1b-00-0").expect("a notice");
        assert!(notice.contains("gpu.nvidia.com/xid=79"), "{notice}");
    }

    #[test]
    fn an_incomplete_pool_adds_nothing() {
        let a = inventory("h100-8x-nvswitch", "a", "1");
        // Generation 2 is being written: one of its two slices is there, and it taints gpu-0.
        let old = nvidia_slice("a-1", "a", 1, 1, &[(0, "0000:1b:00.0", None)]);
        let half = nvidia_slice("a-2", "a", 2, 2, &[(0, "0000:1b:00.0", Some("NoSchedule"))]);
        let view = view_of(&[a], &[old, half], &["a"]);
        assert_eq!(
            view.nodes()[0].devices.len(),
            8,
            "the half-written taint is not read"
        );
        assert_eq!(
            view.dra_device("a", "gpu-0000-1b-00-0"),
            None,
            "nor generation 1"
        );
        let slice_only = view_of(
            &[],
            &[nvidia_slice("c-2", "c", 2, 2, &[(0, "0000:1b:00.0", None)])],
            &["c"],
        );
        assert!(slice_only.nodes()[0].devices.is_empty());
    }
}
