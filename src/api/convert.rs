//! Conversions between the CRD types and the core types: a detection [`Report`] to and from
//! an [`AcceleratorInventory`], and an inventory's devices as the device-state rule's facts.
//! An inventory as the planner's node is `dra::inventory_node`, a ModelPlacement spec as the
//! planner's input `controller::placement::core::plan_input`: the API names nothing of the
//! planner.
//!
//! `from_report` is a pure function of the report: the same report gives the same object,
//! byte for byte, because every map is a `BTreeMap`, every list is sorted, and nothing
//! time-dependent goes into the spec. That is what lets the agent compare before it writes.
//! `to_report` / `to_devices` read an inventory back into the core types the planner works
//! on; for reports within the limits (strings up to 64 bytes are kept whole, longer ones come
//! back from `fullValues`), `to_report(from_report(r))` is `r` again.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::inventory::{
    AcceleratorInventory, AcceleratorInventorySpec, DeviceAttribute, InventoryCpu, InventoryDevice,
    InventoryNodeFacts, InventoryNumaNode, InventoryPartition, InventorySummary,
    MAX_ATTRIBUTE_STRING_LENGTH, attribute,
};
use super::{bounds, quantity};
use crate::detect::pci::canonical_bus_id;
use crate::fleet::health::UNKNOWN_PRODUCT;
use crate::hardware::Report;
use crate::hardware::device_state::{Counts, DeviceFacts, DeviceState};
use crate::hardware::{
    CpuInfo, Device, Family, Health, HealthStatus, InterconnectGroup, NodeFacts, NumaNode,
    Partition, PcieLink, Precision, Vendor,
};
use crate::labels::{product_label_value, product_slug};
use crate::names::{hash_hex, shorten_with_hash, slugify, truncate_at_char_boundary};

/// The longest DNS label, the limit on a device name.
const MAX_DEVICE_NAME_LENGTH: usize = 63;

impl AcceleratorInventory {
    /// The inventory of `node_name` from its detection report (no owner, no status).
    pub fn from_report(node_name: &str, report: &Report) -> Self {
        Self::new(
            node_name,
            AcceleratorInventorySpec::from_report(node_name, report),
        )
    }

    /// The report this inventory was built from, as far as it can be recovered.
    pub fn to_report(&self) -> Report {
        self.spec.to_report()
    }

    /// The devices of this inventory as core types, sorted by id.
    pub fn to_devices(&self) -> Vec<Device> {
        self.spec.to_devices()
    }
}

impl AcceleratorInventory {
    /// Every accelerator's facts (never the host CPU), named as in the inventory, for the one
    /// device-state rule; the cheap half of `dra::inventory_node::fleet_node`, for a
    /// caller that counts without planning (the controller's fleet pass).
    pub fn device_facts(&self) -> Vec<DeviceFacts> {
        self.spec
            .devices
            .iter()
            .filter(|entry| entry.text(attribute::FAMILY).as_deref() != Some("cpu"))
            .map(|entry| {
                let mut facts = DeviceFacts::from_device(&device_from(entry), &entry.name);
                if facts.product.trim().is_empty() {
                    facts.product = entry
                        .text(attribute::PRODUCT)
                        .unwrap_or_else(|| UNKNOWN_PRODUCT.to_string());
                }
                facts
            })
            .collect()
    }
}

impl InventoryDevice {
    /// A string attribute's full text (kept in `fullValues` when the attribute was cut).
    pub fn text(&self, name: &str) -> Option<String> {
        self.full_values
            .get(name)
            .cloned()
            .or_else(|| self.attributes.get(name)?.as_str().map(str::to_string))
    }
}

impl AcceleratorInventorySpec {
    /// The spec for `node_name` from its detection report.
    pub fn from_report(node_name: &str, report: &Report) -> Self {
        let mut groups = report.interconnects.clone();
        groups.sort_by(|a, b| (a.kind, &a.id).cmp(&(b.kind, &b.id)));
        let mut devices: Vec<&Device> = report.devices.iter().collect();
        devices.sort_by(|a, b| a.id.cmp(&b.id));
        let names = device_names(&devices);
        let mut entries: Vec<InventoryDevice> = devices
            .iter()
            .zip(names)
            .map(|(device, name)| device_entry(device, name, &groups))
            .collect();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Self {
            node_name: node_name.to_string(),
            schema_version: report.schema_version,
            detector_version: env!("CARGO_PKG_VERSION").to_string(),
            summary: summary(report),
            devices: entries,
            interconnects: groups,
            node: node_facts(report),
            backends: report.backends.clone(),
            warnings: report.warnings.clone(),
        }
        .fitted()
    }

    /// This spec cut to the CRD's size bounds, so that writing it is never refused for size
    /// (which would lose the whole update); what was cut is named in a warning. Real nodes
    /// are far inside the bounds: this only bites a host, or a tool, that reports nonsense.
    pub fn fitted(self) -> Self {
        let Some(schema) = crate::api::crds::field_schema("AcceleratorInventory", "spec") else {
            return self;
        };
        let (mut fitted, cut) = bounds::fit_typed(self, schema, "spec");
        if !cut.is_empty() {
            fitted
                .warnings
                .truncate(bounds::room_for_one_more(schema, "warnings"));
            fitted.warnings.push(crate::hardware::Warning {
                backend: "inventory".to_string(),
                message: format!(
                    "cut to fit the AcceleratorInventory size limits: {}",
                    bounds::describe_cut(&cut)
                ),
            });
        }
        fitted
    }

    /// The report this spec was built from, as far as it can be recovered.
    pub fn to_report(&self) -> Report {
        let mut report = Report::empty();
        report.schema_version = self.schema_version;
        report.devices = self.to_devices();
        report.interconnects = self.interconnects.clone();
        report.nics = self.node.nics.clone();
        report.backends = self.backends.clone();
        report.warnings = self.warnings.clone();
        report.node = NodeFacts {
            cpu: cpu_from(&self.node.cpu),
            numa: self.node.numa.iter().map(numa_from).collect(),
            runtime: self.node.runtime.clone(),
        };
        report
    }

    /// The devices as core types, sorted by id.
    pub fn to_devices(&self) -> Vec<Device> {
        let mut devices: Vec<Device> = self.devices.iter().map(device_from).collect();
        devices.sort_by(|a, b| a.id.cmp(&b.id));
        devices
    }
}

/// The totals for the printer columns.
fn summary(report: &Report) -> InventorySummary {
    let accelerators: Vec<&Device> = report.accelerators().collect();
    // Health counted by the one device-state rule, as every view of the fleet counts it.
    let counts = Counts::of(
        &accelerators
            .iter()
            .map(|d| DeviceState::of(&DeviceFacts::from_device(d, &d.id), None))
            .collect::<Vec<_>>(),
    );
    let products: BTreeSet<String> = accelerators
        .iter()
        .map(|d| {
            if d.model.trim().is_empty() {
                product_slug(d)
            } else {
                d.model.trim().to_string()
            }
        })
        .collect();
    let product = match products.len() {
        0 => None,
        1 | 2 => Some(products.into_iter().collect::<Vec<_>>().join("+")),
        _ => Some("mixed".to_string()),
    };
    let known: Vec<u64> = accelerators.iter().filter_map(|d| d.memory_bytes).collect();
    let memory = (!known.is_empty())
        .then(|| quantity::bytes(known.iter().fold(0u64, |sum, b| sum.saturating_add(*b))));
    InventorySummary {
        accelerators: u32::try_from(accelerators.len()).unwrap_or(u32::MAX),
        product,
        memory,
        memory_layout: memory_layout(&accelerators),
        healthy: Some(counts.healthy),
        degraded: Some(counts.degraded),
    }
}

/// The `memoryLayout` column's longest value (the CRD's bound).
const MAX_MEMORY_LAYOUT_LENGTH: usize = 128;

/// Device memory as people say it: `8×80Gi`, `4×80Gi+2×48Gi` on a mixed node (largest first),
/// `2×?` for devices that report no memory. Sizes are rounded to the nearest whole GiB, which
/// is how the parts are sold (an H100's 79.6 GiB reads `80Gi`); below half a GiB, whole MiB.
/// `None` when the node has no accelerators.
fn memory_layout(accelerators: &[&Device]) -> Option<String> {
    if accelerators.is_empty() {
        return None;
    }
    // Keyed by (bytes rounded to the unit, unit is GiB); unknown memory sorts last.
    let mut groups: BTreeMap<std::cmp::Reverse<Option<(u64, bool)>>, usize> = BTreeMap::new();
    for device in accelerators {
        let size = device.memory_bytes.map(|bytes| {
            let gib = rounded(bytes, crate::hardware::GIB);
            if gib > 0 {
                (gib * crate::hardware::GIB, true)
            } else {
                (rounded(bytes, 1 << 20) << 20, false)
            }
        });
        *groups.entry(std::cmp::Reverse(size)).or_default() += 1;
    }
    let mut layout = String::new();
    for (std::cmp::Reverse(size), count) in groups {
        let part = match size {
            Some((bytes, true)) => format!("{count}×{}Gi", bytes / crate::hardware::GIB),
            Some((bytes, false)) => format!("{count}×{}Mi", bytes >> 20),
            None => format!("{count}×?"),
        };
        let separator = if layout.is_empty() { "" } else { "+" };
        // Room for the part and a final `+…` should more groups follow.
        if layout.len() + separator.len() + part.len() + "+…".len() > MAX_MEMORY_LAYOUT_LENGTH {
            layout.push_str("+…");
            break;
        }
        layout.push_str(separator);
        layout.push_str(&part);
    }
    Some(layout)
}

/// `value / unit`, rounded to the nearest whole number.
fn rounded(value: u64, unit: u64) -> u64 {
    value / unit + u64::from(value % unit >= unit / 2)
}

/// A DNS-label name per device (`gpu-0000-18-00-0`), in the order given (sorted by id).
///
/// The name is a function of the device's own family and id, so it never changes while the
/// device is there. Two ids that slug alike (`a:b`, `a.b`) are told apart by a hash of the
/// id on the later one; ids are sorted, so which one is later is fixed too.
fn device_names(devices: &[&Device]) -> Vec<String> {
    let mut used = BTreeSet::new();
    devices
        .iter()
        .map(|device| {
            let base = format!("{}-{}", device.family.as_str(), slugify(&device.id));
            let base = base.trim_end_matches('-').to_string();
            let mut name = if base.len() > MAX_DEVICE_NAME_LENGTH {
                shorten_with_hash(&base, &device.id, MAX_DEVICE_NAME_LENGTH)
            } else {
                base
            };
            let mut attempt = 0u32;
            while used.contains(&name) {
                let identity = format!("{}#{attempt}", device.id);
                name = shorten_with_hash(&name, &identity, MAX_DEVICE_NAME_LENGTH);
                attempt += 1;
            }
            used.insert(name.clone());
            name
        })
        .collect()
}

/// Collects typed attributes, shortening over-long strings and keeping their full text.
#[derive(Default)]
struct Attributes {
    values: BTreeMap<String, DeviceAttribute>,
    full_values: BTreeMap<String, String>,
}

impl Attributes {
    fn string(&mut self, name: &str, value: &str) {
        let stored = if value.len() > MAX_ATTRIBUTE_STRING_LENGTH {
            self.full_values.insert(name.to_string(), value.to_string());
            shorten_attribute(value)
        } else {
            value.to_string()
        };
        self.values
            .insert(name.to_string(), DeviceAttribute::String(stored));
    }

    fn opt_string(&mut self, name: &str, value: Option<&str>) {
        if let Some(value) = value {
            self.string(name, value);
        }
    }

    fn int(&mut self, name: &str, value: Option<impl Into<u64>>) {
        if let Some(value) = value {
            let value = i64::try_from(value.into()).unwrap_or(i64::MAX);
            self.values
                .insert(name.to_string(), DeviceAttribute::Int(value));
        }
    }

    fn bool(&mut self, name: &str, value: Option<bool>) {
        if let Some(value) = value {
            self.values
                .insert(name.to_string(), DeviceAttribute::Bool(value));
        }
    }
}

/// A string cut to 64 bytes: its head, `-`, and 10 hex digits of its SHA-256, so two long
/// values sharing a head stay distinct.
fn shorten_attribute(value: &str) -> String {
    let head = truncate_at_char_boundary(value, MAX_ATTRIBUTE_STRING_LENGTH - 11);
    format!("{head}-{}", hash_hex(value))
}

/// The lowercase serde name of a unit enum (`nvidia`, `healthy`).
fn enum_name<T: Serialize>(value: T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The unit enum whose serde name is `name`.
fn enum_from<T: DeserializeOwned>(name: &str) -> Option<T> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).ok()
}

fn device_entry(device: &Device, name: String, groups: &[InterconnectGroup]) -> InventoryDevice {
    let mut attrs = Attributes::default();
    identity_attributes(&mut attrs, device);
    placement_attributes(&mut attrs, device, groups);
    health_attributes(&mut attrs, &device.health);
    let mut capacity = BTreeMap::new();
    if let Some(bytes) = device.memory_bytes {
        capacity.insert(attribute::MEMORY.to_string(), quantity::bytes(bytes));
    }
    if let Some(units) = device.compute_units {
        capacity.insert(
            attribute::COMPUTE_UNITS.to_string(),
            quantity::decimal(u64::from(units)),
        );
    }
    InventoryDevice {
        name,
        attributes: attrs.values,
        capacity,
        partitions: device.partitions.iter().map(partition_entry).collect(),
        health_reasons: device.health.reasons.clone(),
        details: device.attributes.clone(),
        full_values: attrs.full_values,
    }
}

/// What the device is: id, vendor, family, model, versions, precisions.
fn identity_attributes(attrs: &mut Attributes, device: &Device) {
    attrs.string(attribute::ID, &device.id);
    if canonical_bus_id(&device.id).as_deref() == Some(device.id.as_str()) {
        attrs.string(attribute::PCI_BUS_ID, &device.id);
    }
    attrs.int(attribute::INDEX, device.index);
    attrs.string(attribute::VENDOR, device.vendor.as_str());
    attrs.string(attribute::FAMILY, device.family.as_str());
    attrs.string(attribute::MODEL, &device.model);
    // The label form of the product (≤63), so devices match the node's `product` label.
    let product = product_label_value(device);
    let full_product = product_slug(device);
    if product != full_product {
        attrs
            .full_values
            .insert(attribute::PRODUCT.to_string(), full_product);
    }
    attrs.string(attribute::PRODUCT, &product);
    attrs.string(attribute::BACKEND, &device.backend);
    attrs.opt_string(attribute::ARCHITECTURE, device.architecture.as_deref());
    attrs.opt_string(
        attribute::COMPUTE_CAPABILITY,
        device.compute_capability.as_deref(),
    );
    attrs.opt_string(attribute::DRIVER_VERSION, device.driver_version.as_deref());
    attrs.opt_string(
        attribute::FIRMWARE_VERSION,
        device.firmware_version.as_deref(),
    );
    attrs.opt_string(attribute::UUID, device.uuid.as_deref());
    if !device.precisions.is_empty() {
        let list: Vec<&str> = device.precisions.iter().map(|p| p.as_str()).collect();
        attrs.string(attribute::PRECISIONS, &list.join(","));
    }
}

/// Where the device sits: NUMA node, PCIe link, interconnect group.
fn placement_attributes(attrs: &mut Attributes, device: &Device, groups: &[InterconnectGroup]) {
    attrs.int(attribute::NUMA_NODE, device.numa_node);
    if let Some(link) = &device.pcie {
        attrs.int(attribute::PCIE_GENERATION, link.generation);
        attrs.int(attribute::PCIE_WIDTH, link.width);
        attrs.int(attribute::PCIE_MAX_GENERATION, link.max_generation);
        attrs.int(attribute::PCIE_MAX_WIDTH, link.max_width);
    }
    // Groups are sorted by (kind, id): a device in two groups reports the first, and the
    // full membership is in `spec.interconnects`.
    if let Some(group) = groups.iter().find(|g| g.devices.contains(&device.id)) {
        attrs.string(attribute::INTERCONNECT, group.kind.as_str());
        attrs.string(attribute::INTERCONNECT_GROUP, &group.id);
    }
}

fn health_attributes(attrs: &mut Attributes, health: &Health) {
    attrs.string(attribute::HEALTH, &enum_name(health.status));
    attrs.bool(attribute::ECC_ENABLED, health.ecc_enabled);
    attrs.int(attribute::ECC_CORRECTED, health.ecc_corrected);
    attrs.int(attribute::ECC_UNCORRECTED, health.ecc_uncorrected);
    attrs.int(attribute::RETIRED_PAGES, health.retired_pages);
}

fn partition_entry(partition: &Partition) -> InventoryPartition {
    InventoryPartition {
        kind: partition.kind.clone(),
        profile: partition.profile.clone(),
        id: partition.id.clone(),
        memory: partition.memory_bytes.map(quantity::bytes),
    }
}

fn node_facts(report: &Report) -> InventoryNodeFacts {
    let cpu = &report.node.cpu;
    InventoryNodeFacts {
        cpu: InventoryCpu {
            model: cpu.model.clone(),
            vendor: cpu.vendor.clone(),
            arch: cpu.arch.clone(),
            sockets: cpu.sockets,
            cores: cpu.cores,
            threads: cpu.threads,
            ai_flags: cpu.ai_flags.clone(),
            memory: cpu.memory_bytes.map(quantity::bytes),
            cgroup_memory_limit: cpu.cgroup_memory_limit_bytes.map(quantity::bytes),
            cgroup_cpu_limit: cpu.cgroup_cpu_limit_millis.map(quantity::millis),
        },
        numa: report
            .node
            .numa
            .iter()
            .map(|n| InventoryNumaNode {
                id: n.id,
                cpus: n.cpus.clone(),
                memory: n.memory_bytes.map(quantity::bytes),
            })
            .collect(),
        runtime: report.node.runtime.clone(),
        nics: report.nics.clone(),
    }
}

/// Reads one device back. Unknown or missing values come back as `None` (or `Other` for the
/// vendor, `Asic` for an unrecognised family) rather than failing the whole inventory.
fn device_from(entry: &InventoryDevice) -> Device {
    let text = |name: &str| entry.text(name);
    let int = |name: &str| entry.attributes.get(name).and_then(DeviceAttribute::as_int);
    let small = |name: &str| int(name).and_then(|v| u8::try_from(v).ok());
    let count = |name: &str| int(name).and_then(|v| u64::try_from(v).ok());
    let id = text(attribute::ID).unwrap_or_else(|| entry.name.clone());
    let vendor = text(attribute::VENDOR)
        .and_then(|v| enum_from(&v))
        .unwrap_or(Vendor::Other);
    let family = text(attribute::FAMILY)
        .and_then(|f| enum_from(&f))
        .unwrap_or(Family::Asic);
    let model = text(attribute::MODEL).unwrap_or_default();
    let backend = text(attribute::BACKEND).unwrap_or_default();
    let mut device = Device::new(id, vendor, family, model, &backend);
    device.index = int(attribute::INDEX).and_then(|v| u32::try_from(v).ok());
    device.memory_bytes = entry
        .capacity
        .get(attribute::MEMORY)
        .and_then(quantity::parse_whole);
    device.compute_units = entry
        .capacity
        .get(attribute::COMPUTE_UNITS)
        .and_then(quantity::parse_whole)
        .and_then(|v| u32::try_from(v).ok());
    device.architecture = text(attribute::ARCHITECTURE);
    device.compute_capability = text(attribute::COMPUTE_CAPABILITY);
    device.driver_version = text(attribute::DRIVER_VERSION);
    device.firmware_version = text(attribute::FIRMWARE_VERSION);
    device.uuid = text(attribute::UUID);
    device.precisions = text(attribute::PRECISIONS)
        .map(|list| {
            list.split(',')
                .filter_map(|p| p.parse::<Precision>().ok())
                .collect()
        })
        .unwrap_or_default();
    // Inventories written before the standard name carry only the old one.
    device.numa_node = int(attribute::NUMA_NODE)
        .or_else(|| int(attribute::LEGACY_NUMA_NODE))
        .and_then(|v| u32::try_from(v).ok());
    let link = PcieLink {
        generation: small(attribute::PCIE_GENERATION),
        width: small(attribute::PCIE_WIDTH),
        max_generation: small(attribute::PCIE_MAX_GENERATION),
        max_width: small(attribute::PCIE_MAX_WIDTH),
    };
    device.pcie = (link != PcieLink::default()).then_some(link);
    device.partitions = entry.partitions.iter().map(partition_from).collect();
    device.health = Health {
        status: text(attribute::HEALTH)
            .and_then(|h| enum_from(&h))
            .unwrap_or(HealthStatus::Unknown),
        ecc_enabled: entry
            .attributes
            .get(attribute::ECC_ENABLED)
            .and_then(DeviceAttribute::as_bool),
        ecc_corrected: count(attribute::ECC_CORRECTED),
        ecc_uncorrected: count(attribute::ECC_UNCORRECTED),
        retired_pages: count(attribute::RETIRED_PAGES),
        reasons: entry.health_reasons.clone(),
    };
    device.attributes = entry.details.clone();
    device
}

fn partition_from(entry: &InventoryPartition) -> Partition {
    Partition {
        kind: entry.kind.clone(),
        profile: entry.profile.clone(),
        id: entry.id.clone(),
        memory_bytes: entry.memory.as_ref().and_then(quantity::parse_whole),
    }
}

fn cpu_from(cpu: &InventoryCpu) -> CpuInfo {
    CpuInfo {
        model: cpu.model.clone(),
        vendor: cpu.vendor.clone(),
        arch: cpu.arch.clone(),
        sockets: cpu.sockets,
        cores: cpu.cores,
        threads: cpu.threads,
        ai_flags: cpu.ai_flags.clone(),
        memory_bytes: cpu.memory.as_ref().and_then(quantity::parse_whole),
        cgroup_memory_limit_bytes: cpu
            .cgroup_memory_limit
            .as_ref()
            .and_then(quantity::parse_whole),
        cgroup_cpu_limit_millis: cpu
            .cgroup_cpu_limit
            .as_ref()
            .and_then(quantity::parse_millis)
            .and_then(|m| u64::try_from(m).ok()),
    }
}

fn numa_from(numa: &InventoryNumaNode) -> NumaNode {
    NumaNode {
        id: numa.id,
        cpus: numa.cpus.clone(),
        memory_bytes: numa.memory.as_ref().and_then(quantity::parse_whole),
    }
}

#[cfg(test)]
mod tests;
