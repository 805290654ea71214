//! One node's AcceleratorInventory and the devices DRA drivers publish for it → one planner
//! node, each physical device once.
//!
//! The same device seen by our agent and by a vendor driver is matched by PCI bus id, else
//! by UUID (case-insensitively). A match keeps the inventory's device (its name, topology
//! and measured facts) and gains its DRA name; a match the driver marks unusable leaves the
//! planner node. A published device nobody else saw becomes a planner device of its own,
//! which is how a DRA-only node (no agent, or an agent without vendor tools) gets planned.
//!
//! Every published entry stays one device: a second entry that names an inventory device
//! already matched (two whole-GPU entries with one PCI address) is kept as a device of its
//! own that nobody plans on, never folded into the first. A slice-only device is planned only
//! when the driver says what it is (a product name) and its memory is known (published, or
//! the product table's); the driver's "unknown" values (`memory: 0`, placeholder names) never
//! become facts the planner uses.

use std::collections::{BTreeMap, BTreeSet};

use super::inventory_node::{PlannerDeviceIds, planner_node};
use super::{DeviceRef, ParentRef, PublishedDevice};
use crate::api::{AcceleratorInventory, InventoryDevice, attribute};
use crate::detect::pci::canonical_bus_id;
use crate::names::{MAX_LABEL_LENGTH, shorten_with_hash, slugify};
use crate::plan::products::{self};
use crate::plan::share::Partition;
use crate::plan::units::Bytes;
use crate::plan::{DeviceSpec, NodeSpec};

/// One node as the planner sees it after merging.
#[derive(Debug, Clone, PartialEq)]
pub struct MergedNode {
    /// The planner's node: inventory devices by inventory name, slice-only devices by a
    /// name derived from their DRA name. Labels are not filled in.
    pub node: NodeSpec,
    /// DRA name by planner device id, for every planner device a driver publishes.
    pub dra: BTreeMap<String, DeviceRef>,
    /// Product slug by planner device id (`nvidia-h100-80gb-hbm3`).
    pub products: BTreeMap<String, String>,
    /// Devices present but not plannable, by planner device id, with why.
    pub unusable: BTreeMap<String, String>,
    /// Every device id on the node, plannable or not.
    pub present: BTreeSet<String>,
    /// NUMA node by planner device id, where known: the inventory's (detection read sysfs),
    /// else what the device's driver publishes.
    pub numa: BTreeMap<String, u32>,
    /// What was merged away or skipped, one line each.
    pub notes: Vec<String>,
    /// Devices their driver flags with an informational taint, by planner device id, with
    /// the taint: plannable, shown degraded.
    pub notices: BTreeMap<String, String>,
}

/// Merges `node`'s inventory (if any) with the devices drivers publish for it.
pub fn merge_node(
    node: &str,
    inventory: Option<&AcceleratorInventory>,
    published: &[PublishedDevice],
) -> MergedNode {
    let mut merged = MergedNode {
        node: NodeSpec {
            name: node.to_string(),
            devices: Vec::new(),
            fabric: None,
            labels: BTreeMap::new(),
        },
        dra: BTreeMap::new(),
        products: BTreeMap::new(),
        unusable: BTreeMap::new(),
        present: BTreeSet::new(),
        numa: BTreeMap::new(),
        notes: Vec::new(),
        notices: BTreeMap::new(),
    };
    let mut by_bus = BTreeMap::new();
    let mut by_uuid = BTreeMap::new();
    if let Some(inventory) = inventory {
        merged.node = planner_node(inventory, PlannerDeviceIds::InventoryNames).0;
        merged.node.name = node.to_string();
        for entry in &inventory.spec.devices {
            merged.present.insert(entry.name.clone());
            if let Some(product) = entry.text(attribute::PRODUCT) {
                merged.products.insert(entry.name.clone(), product);
            }
            if let Some(numa) = inventory_numa_node(entry) {
                merged.numa.insert(entry.name.clone(), numa);
            }
            let bus = entry
                .text(attribute::PCI_BUS_ID)
                .or_else(|| entry.text(attribute::ID))
                .and_then(|id| canonical_bus_id(&id));
            if let Some(bus) = bus {
                by_bus.insert(bus, entry.name.clone());
            }
            if let Some(uuid) = entry.text(attribute::UUID) {
                by_uuid.insert(uuid.to_ascii_lowercase(), entry.name.clone());
            }
        }
    }

    let mut matched = BTreeSet::new();
    for device in published {
        let found = device
            .pci_bus_id
            .as_ref()
            .and_then(|bus| by_bus.get(bus))
            .or_else(|| {
                let uuid = device.uuid.as_ref()?.to_ascii_lowercase();
                by_uuid.get(&uuid)
            })
            .cloned();
        match found {
            Some(name) if matched.contains(&name) => add_shadow(&mut merged, &name, device),
            Some(name) => merge_matched(&mut merged, &mut matched, name, device),
            None => add_published(&mut merged, device),
        }
    }
    published_only_in_parts(&mut merged, &matched, &by_bus, published);
    unpublished_parents(&mut merged, &mut by_bus, published);
    attach_partitions(&mut merged, (by_uuid, &by_bus), published);
    merged
}

/// Devices no inventory and no whole entry stands for, published only as partitions that
/// name them by PCI bus id (an AMD GPU partitioned on a node without our agent): one planner
/// device per such bus id, [`DeviceSpec::partitions_only`], whose memory is its partitions'
/// sum, so a replica may take one of them. Its id is derived from the driver and the bus id;
/// `by_bus` gains it, so the partitions find it.
fn unpublished_parents(
    merged: &mut MergedNode,
    by_bus: &mut BTreeMap<String, String>,
    published: &[PublishedDevice],
) {
    let whole_buses: BTreeSet<&String> = published
        .iter()
        .filter(|d| d.whole)
        .filter_map(|d| d.pci_bus_id.as_ref())
        .collect();
    let mut groups: BTreeMap<&str, Vec<&PublishedDevice>> = BTreeMap::new();
    for device in published {
        let Some(ParentRef::PciBusId(bus)) = device.partition.as_ref().map(|p| &p.parent) else {
            continue;
        };
        if by_bus.contains_key(bus) || whole_buses.contains(bus) {
            continue;
        }
        groups.entry(bus.as_str()).or_default().push(device);
    }
    for (bus, parts) in groups {
        let first = parts[0];
        if first.product.is_none() {
            // What it is cannot be told: its partitions stay unplanned, as any such device.
            continue;
        }
        let memory = parts
            .iter()
            .filter_map(|p| p.memory_bytes)
            .fold(0u64, u64::saturating_add);
        let name = first.product.as_deref().unwrap_or("");
        let parent = DeviceRef {
            driver: first.reference.driver.clone(),
            pool: first.reference.pool.clone(),
            device: bus.to_string(),
        };
        let id = unique_id(&merged.present, &parent);
        let mut spec = match products::lookup_sized(name, Some(Bytes(memory))) {
            Some(product) => DeviceSpec::of_product(product, id.clone(), Some(Bytes(memory))),
            None => DeviceSpec::of_unknown_product(
                id.clone(),
                name,
                first.vendor,
                first.family,
                Bytes(memory),
            ),
        };
        spec.partitions_only = true;
        spec.aliases.push(bus.to_string());
        merged.present.insert(id.clone());
        merged.products.insert(
            id.clone(),
            product_slug(first.vendor.as_str(), first.family.as_str(), &spec.product),
        );
        if let Some(numa) = first.numa_node {
            merged.numa.insert(id.clone(), numa);
        }
        merged.notes.push(format!(
            "{id}: the device at {bus}, published only as {} partition(s) of {}",
            parts.len(),
            first.reference.driver
        ));
        merged.node.devices.push(spec);
        by_bus.insert(bus.to_string(), id);
    }
}

/// Partitions a driver publishes of a plannable device (MIG devices, matched to their parent
/// by its UUID; AMD's partitions, by the PCI bus id they carry) are listed on that device,
/// smallest first, so a replica may take one instead of the whole device; each stays
/// unusable as a device of its own.
fn attach_partitions(
    merged: &mut MergedNode,
    (mut by_uuid, by_bus): (BTreeMap<String, String>, &BTreeMap<String, String>),
    published: &[PublishedDevice],
) {
    let id_of: BTreeMap<&DeviceRef, &String> = merged
        .dra
        .iter()
        .map(|(id, reference)| (reference, id))
        .collect();
    for device in published.iter().filter(|d| d.partition.is_none()) {
        if let (Some(uuid), Some(id)) = (&device.uuid, id_of.get(&device.reference)) {
            by_uuid
                .entry(uuid.to_ascii_lowercase())
                .or_insert_with(|| (*id).clone());
        }
    }
    let mut found: Vec<(String, Partition)> = Vec::new();
    for device in published {
        let (Some(part), Some(memory), Some(id)) = (
            &device.partition,
            device.memory_bytes,
            id_of.get(&device.reference),
        ) else {
            continue;
        };
        let parent = match &part.parent {
            ParentRef::Uuid(uuid) => by_uuid.get(&uuid.to_ascii_lowercase()),
            ParentRef::PciBusId(bus) => by_bus.get(bus),
        };
        if let Some(parent) = parent {
            found.push((
                parent.clone(),
                Partition {
                    id: (*id).clone(),
                    profile: part.profile.clone(),
                    memory: Bytes(memory),
                },
            ));
        }
    }
    let mut attached = BTreeSet::new();
    for (parent, partition) in found {
        if let Some(spec) = merged.node.devices.iter_mut().find(|d| d.id == parent) {
            attached.insert(partition.id.clone());
            spec.partitions.push(partition);
        }
    }
    // A partition planned as a fraction of its device is no device left out: no note.
    let attached_refs: Vec<String> = merged
        .dra
        .iter()
        .filter(|(id, _)| attached.contains(*id))
        .map(|(_, reference)| format!("{reference} not planned: "))
        .collect();
    merged
        .notes
        .retain(|note| !attached_refs.iter().any(|prefix| note.starts_with(prefix)));
    for spec in &mut merged.node.devices {
        spec.partitions
            .sort_by(|a, b| (a.memory, &a.id).cmp(&(b.memory, &b.id)));
    }
    // A device published only in parts whose parts are no partitions to plan on (VFIO
    // siblings, blocked partitions) cannot be held at all.
    let stranded: Vec<String> = merged
        .node
        .devices
        .iter()
        .filter(|d| d.partitions_only && d.partitions.is_empty())
        .map(|d| d.id.clone())
        .collect();
    for name in stranded {
        let why = "published only in parts, none of them a partition to plan on".to_string();
        merged.node.devices.retain(|d| d.id != name);
        merged.notes.push(format!("{name} not planned: {why}"));
        merged.unusable.insert(name, why);
    }
}

/// Inventory devices a driver publishes only as partitions (no whole-device entry, but
/// partitions or siblings carrying their PCI address): the scheduler cannot allocate them
/// whole, so neither may the planner plan them whole. One some of whose parts are partitions
/// to plan on (AMD's GPUs partitioned on the node) stays, marked
/// [`DeviceSpec::partitions_only`]: a replica may take one of them; any other is unusable.
fn published_only_in_parts(
    merged: &mut MergedNode,
    matched: &BTreeSet<String>,
    by_bus: &BTreeMap<String, String>,
    published: &[PublishedDevice],
) {
    let mut parts: BTreeMap<&str, (&PublishedDevice, bool)> = BTreeMap::new();
    for device in published {
        let Some(name) = device
            .parent_bus_id
            .as_ref()
            .and_then(|bus| by_bus.get(bus))
        else {
            continue;
        };
        if matched.contains(name) {
            continue;
        }
        let plannable = device
            .partition
            .as_ref()
            .is_some_and(|part| matches!(part.parent, ParentRef::PciBusId(_)));
        let entry = parts.entry(name.as_str()).or_insert((device, false));
        entry.1 |= plannable;
    }
    for (name, (part, plannable)) in parts {
        if plannable && let Some(spec) = merged.node.devices.iter_mut().find(|d| d.id == name) {
            spec.partitions_only = true;
            continue;
        }
        let why = format!(
            "published only in parts ({} and its siblings), not as a whole device",
            part.reference
        );
        merged.node.devices.retain(|d| d.id != name);
        merged.notes.push(format!("{name} not planned: {why}"));
        merged.unusable.insert(name.to_string(), why);
    }
}

/// A published device the inventory also has: one device, the inventory's name.
fn merge_matched(
    merged: &mut MergedNode,
    matched: &mut BTreeSet<String>,
    name: String,
    device: &PublishedDevice,
) {
    matched.insert(name.clone());
    if let Some(why) = &device.unusable {
        merged.node.devices.retain(|d| d.id != name);
        merged.notes.push(format!(
            "{name} not planned: {} publishes it as {why}",
            device.reference
        ));
        merged.unusable.insert(name.clone(), why.clone());
    }
    if let Some(numa) = device.numa_node {
        merged.numa.entry(name.clone()).or_insert(numa);
    }
    if let Some(spec) = merged.node.devices.iter_mut().find(|d| d.id == name) {
        spec.share = device.shareable();
    }
    if let Some(notice) = &device.notice {
        merged.notices.insert(name.clone(), notice.clone());
    }
    merged.dra.insert(name, device.reference.clone());
}

/// An inventory device's NUMA node: the standard attribute, else the name agents wrote
/// before it.
fn inventory_numa_node(entry: &InventoryDevice) -> Option<u32> {
    [attribute::NUMA_NODE, attribute::LEGACY_NUMA_NODE]
        .iter()
        .find_map(|name| entry.attributes.get(*name)?.as_int())
        .and_then(|node| u32::try_from(node).ok())
}

/// A published entry whose PCI address or UUID names an inventory device another entry
/// already matched: present under a name of its own, never planned, so neither the device
/// is counted twice nor the entry lost.
fn add_shadow(merged: &mut MergedNode, matched_name: &str, device: &PublishedDevice) {
    let why = format!("another published entry already stands for {matched_name}");
    let shadow = PublishedDevice {
        unusable: Some(device.unusable.clone().unwrap_or(why)),
        ..device.clone()
    };
    add_published(merged, &shadow);
}

/// A published device the inventory lacks, present under `id` but never planned, with why.
fn not_planned(merged: &mut MergedNode, id: String, device: &PublishedDevice, why: String) {
    merged
        .notes
        .push(format!("{} not planned: {why}", device.reference));
    merged.unusable.insert(id.clone(), why);
    merged.dra.insert(id, device.reference.clone());
}

/// A published device the inventory lacks: a planner device of its own, when what it is
/// can be told.
fn add_published(merged: &mut MergedNode, device: &PublishedDevice) {
    let id = unique_id(&merged.present, &device.reference);
    merged.present.insert(id.clone());
    if let Some(numa) = device.numa_node {
        merged.numa.insert(id.clone(), numa);
    }
    if let Some(notice) = &device.notice {
        merged.notices.insert(id.clone(), notice.clone());
    }
    if let Some(why) = not_plannable(device) {
        not_planned(merged, id, device, why);
        return;
    }
    let memory = device.memory_bytes.map(Bytes);
    let name = device.product.as_deref().unwrap_or("");
    let mut spec = match (products::lookup_sized(name, memory), memory) {
        (Some(product), _) => DeviceSpec::of_product(product, id.clone(), memory),
        (None, Some(memory)) => {
            DeviceSpec::of_unknown_product(id.clone(), name, device.vendor, device.family, memory)
        }
        (None, None) => {
            let why = format!("an unknown product ({name}) without a memory capacity");
            not_planned(merged, id, device, why);
            return;
        }
    };
    spec.domain = device.domain.clone();
    spec.share = device.shareable();
    merged.products.insert(
        id.clone(),
        product_slug(
            device.vendor.as_str(),
            device.family.as_str(),
            &spec.product,
        ),
    );
    merged.node.devices.push(spec);
    merged.dra.insert(id, device.reference.clone());
}

/// Why a device known only from its slice cannot be planned on: what the driver marks
/// unusable, a device it names no product for, or a memory size it publishes as unknown.
fn not_plannable(device: &PublishedDevice) -> Option<String> {
    if let Some(why) = &device.unusable {
        return Some(why.clone());
    }
    if device.product.is_none() {
        return Some("the driver publishes no product name".to_string());
    }
    device
        .memory_unknown
        .as_ref()
        .map(|why| format!("memory size unknown ({why})"))
}

/// A DNS label for a slice-only device, from its driver and device name, not yet used on
/// the node (`gpu-nvidia-com-gpu-0`).
fn unique_id(used: &BTreeSet<String>, reference: &DeviceRef) -> String {
    let full = format!("{}-{}", reference.driver, reference.device);
    let base = fit(&slugify(&full), &full);
    let mut id = base.clone();
    let mut attempt = 2u32;
    while used.contains(&id) {
        let identity = format!("{full}#{attempt}");
        id = shorten_with_hash(&base, &identity, MAX_LABEL_LENGTH);
        attempt += 1;
    }
    id
}

/// The product slug the labels use for the same product: the model as a slug, prefixed
/// by the vendor unless it already starts with it; never empty; at most 63 characters.
fn product_slug(vendor: &str, family: &str, model: &str) -> String {
    let model_slug = slugify(model);
    let slug = if model_slug.is_empty() {
        format!("{vendor}-{family}")
    } else if model_slug == vendor || model_slug.starts_with(&format!("{vendor}-")) {
        model_slug
    } else {
        format!("{vendor}-{model_slug}")
    };
    fit(&slug, &slug)
}

/// `text` when it fits a label, else shortened with a hash of `identity`.
fn fit(text: &str, identity: &str) -> String {
    if text.is_empty() {
        return shorten_with_hash("device", identity, MAX_LABEL_LENGTH);
    }
    if text.len() <= MAX_LABEL_LENGTH {
        text.to_string()
    } else {
        shorten_with_hash(text, identity, MAX_LABEL_LENGTH)
    }
}

#[cfg(test)]
mod tests;
