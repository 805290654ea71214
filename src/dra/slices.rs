//! ResourceSlices → the devices each node's known DRA drivers publish.
//!
//! Follows DRA's consumer rules: per `(driver, pool)` only the highest `pool.generation`
//! counts, and only once all `resourceSliceCount` slices of it are seen (a pool being
//! rewritten is skipped, not half-read). Only node-local slices (`spec.nodeName`) are read,
//! and only for the drivers in [`super::drivers`]. A shareable device (`allowMultipleAllocations`)
//! carries its memory share policy ([`super::share`]) and is planned on whole or in shares; one
//! that cannot be shared by memory, and one whose counters its pool can never give
//! ([`super::counters`]), are published but not plannable. Slices are written by other parties, so
//! every count and string is bounded and nothing in them can make this panic.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceSlice};

use super::counters::PoolCounters;
use super::drivers::{
    self, HealthSource, KnownDriver, PartitionParent, ProductSource, STANDARD_PCI_BUS_ID,
};
use super::pools::complete_generation;
use super::share::share_policy;
use super::{DeviceRef, ParentRef, PublishedDevice, PublishedPartition};
use crate::api::quantity;
use crate::detect::pci::canonical_bus_id;
use crate::hardware::HealthStatus;
use crate::hardware::device_state::plannable_health;
use crate::names::truncate_at_char_boundary;
use crate::plan::share::SharePolicy;

/// At most this many devices are kept per node; a real node has tens (MIG and partitions
/// included), so more means a runaway or hostile publisher.
pub const MAX_DEVICES_PER_NODE: usize = 1024;

/// Strings copied from a slice are cut to this many bytes. DRA itself allows 64 for
/// attribute values; a file read by the CLI is not validated by an apiserver.
const MAX_TEXT: usize = 253;

/// DRA's standard NUMA node attribute (the same name the inventory uses).
const STANDARD_NUMA_NODE: &str = crate::api::attribute::NUMA_NODE;
/// The NUMA node attribute in a driver's own domain, for drivers that predate the standard
/// one or keep it (AMD's `gpu.amd.com/numaNode`).
const DRIVER_NUMA_NODE: &str = "numaNode";
/// Highest NUMA node id taken as real (Linux's `CONFIG_NODES_SHIFT` allows at most 1024
/// nodes); a larger value is a publisher's error.
const MAX_NUMA_NODE: u32 = 1023;

/// The largest device memory taken as a size: 16 TiB, over twenty times the largest single
/// accelerator sold (2026); a larger published value is a unit or overflow mistake, not a
/// device to plan on.
pub const MAX_DEVICE_MEMORY: u64 = 16 << 40;

/// Texts drivers and vendor tools print for "no value", compared case-insensitively after
/// trimming; such a product name or serial is treated as absent.
const PLACEHOLDERS: &[&str] = &[
    "unknown",
    "n/a",
    "na",
    "none",
    "null",
    "nil",
    "undefined",
    "not available",
    "not supported",
    "[not supported]",
    "default",
    "0",
];

/// Taint effects that keep the scheduler from allocating a device.
const BLOCKING_EFFECTS: &[&str] = &["NoSchedule", "NoExecute"];

/// The devices the known drivers publish, by node, and what was left out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PublishedFleet {
    /// Devices by node name; within a node in (driver, pool, device) order.
    pub nodes: BTreeMap<String, Vec<PublishedDevice>>,
    /// What was skipped and why, one line each, in a stable order.
    pub notes: Vec<String>,
}

impl PublishedFleet {
    /// The devices published for `node` (empty when none).
    pub fn node(&self, node: &str) -> &[PublishedDevice] {
        self.nodes.get(node).map(Vec::as_slice).unwrap_or(&[])
    }
}

/// The devices that `slices` publish, following DRA's pool rules.
pub fn published_devices(slices: &[ResourceSlice]) -> PublishedFleet {
    let mut notes = Vec::new();
    let mut unknown_drivers = BTreeSet::new();
    let mut unknown_count = 0usize;
    let mut not_node_local = 0usize;
    // (driver, pool) → the slices of that pool read so far.
    let mut pools: BTreeMap<(String, String), Vec<&ResourceSlice>> = BTreeMap::new();
    for slice in slices {
        let spec = &slice.spec;
        if drivers::known(&spec.driver).is_none() {
            unknown_count += 1;
            if unknown_drivers.len() < 8 {
                unknown_drivers.insert(truncate_at_char_boundary(&spec.driver, 63).to_string());
            }
            continue;
        }
        if spec.node_name.as_deref().is_none_or(str::is_empty) {
            not_node_local += 1;
            continue;
        }
        pools
            .entry((spec.driver.clone(), spec.pool.name.clone()))
            .or_default()
            .push(slice);
    }
    if unknown_count > 0 {
        let names: Vec<String> = unknown_drivers.into_iter().collect();
        notes.push(format!(
            "{unknown_count} ResourceSlice(s) of drivers this operator does not read ignored ({})",
            names.join(", ")
        ));
    }
    if not_node_local > 0 {
        notes.push(format!(
            "{not_node_local} ResourceSlice(s) without spec.nodeName ignored (network-attached or \
             multi-node pools are not planned on)"
        ));
    }

    let mut nodes: BTreeMap<String, Vec<PublishedDevice>> = BTreeMap::new();
    let mut capped = BTreeSet::new();
    for ((driver_name, pool), pool_slices) in &pools {
        let Some(driver) = drivers::known(driver_name) else {
            continue;
        };
        let Some(current) = complete_generation(driver_name, pool, pool_slices, &mut notes) else {
            continue;
        };
        // What a device's counters cannot give even with nothing allocated (a set the pool
        // does not publish, a quantity that is not one) keeps it out for good; what claims
        // use up is the controller's to add (`counters::blocked_by_counters`).
        let counters = PoolCounters::new(driver_name, pool, &current).blocked(&BTreeMap::new());
        for slice in current {
            let Some(node) = slice.spec.node_name.as_deref() else {
                continue;
            };
            let devices = nodes.entry(node.to_string()).or_default();
            for device in slice.spec.devices.iter().flatten() {
                if devices.len() >= MAX_DEVICES_PER_NODE {
                    capped.insert(node.to_string());
                    break;
                }
                let mut found = published(driver, pool, node, device);
                if let Some(why) = counters.get(&device.name) {
                    // A partition stays one (not a whole device); it is only no fraction.
                    found.partition = None;
                    if found.unusable.is_none() {
                        found.unusable = Some(format!("its DRA counters cannot be met: {why}"));
                    }
                }
                devices.push(found);
            }
        }
    }
    for node in capped {
        notes.push(format!(
            "node {node}: more than {MAX_DEVICES_PER_NODE} published devices, the rest ignored"
        ));
    }
    for devices in nodes.values_mut() {
        devices.sort_by(|a, b| a.reference.cmp(&b.reference));
        devices.dedup_by(|a, b| a.reference == b.reference);
    }
    PublishedFleet { nodes, notes }
}

/// One device of a known driver, reduced.
fn published(driver: &KnownDriver, pool: &str, node: &str, device: &Device) -> PublishedDevice {
    let text = |name: &str| string_attribute(driver, device, name);
    let partition = driver.whole_device.and_then(|(name, whole)| {
        let kind = text(name)?;
        (kind != whole).then(|| format!("a partition ({name}={kind}), not a whole device"))
    });
    let aggregate = driver.aggregate.and_then(|(name, value)| {
        let kind = text(name)?;
        (kind == value).then(|| format!("an entry for several devices ({name}={kind})"))
    });
    // A partition's (and a VFIO sibling's) PCI address is its parent's: matching by it
    // would make the parent look like the partition, so such an entry is matched by its
    // own UUID only.
    let bus_id = text(STANDARD_PCI_BUS_ID)
        .and_then(|id| canonical_bus_id(&id))
        .or_else(|| {
            driver
                .pci_address
                .and_then(text)
                .and_then(|id| canonical_bus_id(&id))
        });
    let whole = partition.is_none() && aggregate.is_none();
    let (pci_bus_id, parent_bus_id) = if !whole {
        (None, bus_id)
    } else {
        (bus_id, None)
    };
    let health = driver.health.map_or(HealthStatus::Unknown, |source| {
        health(driver, device, source)
    });
    // The one plannability rule of `hardware::device_state`, applied to what the driver says.
    let unhealthy =
        (!plannable_health(health)).then(|| "the driver reports it unhealthy".to_string());
    let product = match driver.product {
        ProductSource::Attribute(name) => text(name).filter(|p| !is_placeholder(p)),
        ProductSource::AwsInstanceType(name) => text(name)
            .and_then(|instance| drivers::aws_accelerator(&instance))
            .map(str::to_string),
    };
    let (memory_bytes, memory_unknown) = match driver.memory {
        Some(name) => memory(driver, device, name),
        None => (None, None),
    };
    let (share, not_shareable) = shareable(driver, device);
    let domain = driver
        .interconnect_group
        .and_then(|name| group_attribute(driver, device, name))
        .map(|group| format!("neuronlink:{group}"));
    let blocked = aggregate
        .or_else(|| blocking_taint(device))
        .or(unhealthy)
        .or(not_shareable);
    let part_of = match (&partition, driver.partition, &blocked, memory_bytes) {
        (Some(_), Some(source), None, Some(_)) => {
            let parent = match source.parent {
                PartitionParent::Uuid(name) => text(name).map(ParentRef::Uuid),
                PartitionParent::PciBusId => parent_bus_id.clone().map(ParentRef::PciBusId),
            };
            text(source.profile)
                .filter(|profile| !is_placeholder(profile))
                .zip(parent)
                .map(|(profile, parent)| PublishedPartition { profile, parent })
        }
        _ => None,
    };
    let unusable = partition.or(blocked);
    PublishedDevice {
        node: node.to_string(),
        reference: DeviceRef {
            driver: driver.name.to_string(),
            pool: bounded(pool),
            device: bounded(&device.name),
        },
        pci_bus_id,
        parent_bus_id,
        uuid: driver
            .uuid
            .and_then(text)
            .filter(|uuid| !is_placeholder(uuid)),
        product,
        memory_bytes,
        memory_unknown,
        health,
        domain,
        numa_node: numa_node(driver, device),
        whole,
        vendor: driver.vendor,
        family: driver.family,
        // Only a device a placement may take is one to take a share of.
        share: share.filter(|_| unusable.is_none()),
        unusable,
        partition: part_of,
        notice: informational_taint(device),
    }
}

/// The health a driver publishes through `source`; anything it does not state plainly is
/// `Unknown` (which the one rule plans on: absence of evidence is not sickness).
fn health(driver: &KnownDriver, device: &Device, source: HealthSource) -> HealthStatus {
    match source {
        HealthSource::Bool(name) => match bool_attribute(driver, device, name) {
            Some(true) => HealthStatus::Healthy,
            Some(false) => HealthStatus::Unhealthy,
            None => HealthStatus::Unknown,
        },
        HealthSource::Text(name) => crate::hardware::device_state::parse_health(
            string_attribute(driver, device, name).as_deref(),
        ),
    }
}

/// True for a text that says "no value" rather than naming something: a known placeholder,
/// or a text without a single letter or digit.
fn is_placeholder(text: &str) -> bool {
    let trimmed = text.trim();
    !trimmed.chars().any(char::is_alphanumeric)
        || PLACEHOLDERS.iter().any(|p| trimmed.eq_ignore_ascii_case(p))
}

/// A scale-up group id: a string or a non-negative int attribute, as a DNS-label-safe text.
fn group_attribute(driver: &KnownDriver, device: &Device, name: &str) -> Option<String> {
    let value = attribute(driver, device, name)?;
    let text = match (&value.string, value.int) {
        (Some(text), _) => text.trim().to_string(),
        (None, Some(n)) if n >= 0 => n.to_string(),
        _ => return None,
    };
    let valid = !text.is_empty()
        && text.len() <= 63
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    valid.then_some(text)
}

/// Why a device that may be allocated to many claims at once (`allowMultipleAllocations`)
/// is not one to plan on when it cannot be shared by memory: no `memory` capacity to take a
/// share of, a policy the API would refuse, or another capacity that one allocation uses up
/// (AMD's `partitions`, whose default request is all of it).
pub const SHARED: &str = "shared (allowMultipleAllocations), but not by memory: a placement can hold neither all of it nor a share";

/// A device's memory share policy when it is published shareable (`allowMultipleAllocations`),
/// or why such a device is not plannable; `(None, None)` for a device one claim holds whole.
/// Only the `memory` capacity is requested by a share's claim, so every other capacity gives
/// each allocation its policy's default (or all of it, without a policy): one that cannot
/// give two allocations makes the device exclusive in practice, and it stays out.
fn shareable(driver: &KnownDriver, device: &Device) -> (Option<SharePolicy>, Option<String>) {
    if device.allow_multiple_allocations != Some(true) {
        return (None, None);
    }
    let Some(capacities) = device.capacity.as_ref() else {
        return (None, Some(SHARED.to_string()));
    };
    let memory_name = driver.memory.unwrap_or("memory");
    let is_memory = |name: &str| {
        name == memory_name
            || name
                .strip_prefix(driver.name)
                .and_then(|n| n.strip_prefix('/'))
                == Some(memory_name)
    };
    let Some((_, memory)) = capacities.iter().find(|(name, _)| is_memory(name)) else {
        return (None, Some(SHARED.to_string()));
    };
    for (name, other) in capacities.iter().filter(|(name, _)| !is_memory(name)) {
        let Ok(policy) = share_policy(other) else {
            return (
                None,
                Some(format!(
                    "{SHARED} (its {} capacity is not a valid one)",
                    bounded(name)
                )),
            );
        };
        if policy.default.saturating_mul(2) > policy.capacity {
            return (
                None,
                Some(format!(
                    "{SHARED} (each allocation takes all of its {} capacity)",
                    bounded(name)
                )),
            );
        }
    }
    match share_policy(memory) {
        Ok(policy) if policy.capacity > 0 && policy.capacity <= MAX_DEVICE_MEMORY => {
            (Some(policy), None)
        }
        Ok(_) => (
            None,
            Some(format!(
                "{SHARED} (its memory capacity is not a plausible size)"
            )),
        ),
        Err(why) => (
            None,
            Some(format!(
                "shared, but its memory capacity's requestPolicy is not valid: {why}"
            )),
        ),
    }
}

/// The first informational taint (`effect: None`: the driver reports something about the
/// device without keeping anything off it, as NVIDIA's driver does for XID events), as a
/// reason. The API says consumers treat an effect they do not know like `None`.
fn informational_taint(device: &Device) -> Option<String> {
    let (taint, effect) = first_taint(device, false)?;
    Some(format!(
        "tainted {taint} by its DRA driver (effect {effect}: informational)"
    ))
}

/// The first NoSchedule/NoExecute taint, as a reason.
fn blocking_taint(device: &Device) -> Option<String> {
    let (taint, effect) = first_taint(device, true)?;
    Some(format!("tainted {taint}:{effect}"))
}

/// The first taint whose effect blocks allocation (`blocking`) or does not, as
/// `(key[=value], effect)`, bounded.
fn first_taint(device: &Device, blocking: bool) -> Option<(String, String)> {
    let taint = device
        .taints
        .iter()
        .flatten()
        .find(|t| BLOCKING_EFFECTS.contains(&t.effect.as_str()) == blocking)?;
    let value = taint
        .value
        .as_deref()
        .map(|v| format!("={}", bounded(v)))
        .unwrap_or_default();
    Some((
        format!("{}{value}", bounded(&taint.key)),
        bounded(&taint.effect),
    ))
}

/// An attribute by name: `name` as written (standard names are fully qualified), else
/// qualified with the driver's domain, which is what an unqualified name means. The one
/// lookup of a device's attribute by name: the merge and the linter both read through it.
pub(super) fn attribute<'a>(
    driver: &KnownDriver,
    device: &'a Device,
    name: &str,
) -> Option<&'a DeviceAttribute> {
    let attributes = device.attributes.as_ref()?;
    attributes
        .get(name)
        .or_else(|| attributes.get(&format!("{}/{name}", driver.name)))
}

/// A string (or version) attribute, trimmed and bounded; `None` when empty.
fn string_attribute(driver: &KnownDriver, device: &Device, name: &str) -> Option<String> {
    let value = attribute(driver, device, name)?;
    let text = value.string.as_deref().or(value.version.as_deref())?.trim();
    (!text.is_empty()).then(|| bounded(text))
}

/// A bool attribute.
fn bool_attribute(driver: &KnownDriver, device: &Device, name: &str) -> Option<bool> {
    attribute(driver, device, name)?.bool
}

/// The NUMA node: the standard attribute first, then the driver's own `numaNode` (AMD's
/// driver publishes `gpu.amd.com/numaNode`). Negative (sysfs's `-1`, "no affinity") or
/// beyond [`MAX_NUMA_NODE`] is unknown, not a node.
fn numa_node(driver: &KnownDriver, device: &Device) -> Option<u32> {
    let int = |name: &str| attribute(driver, device, name).and_then(|value| value.int);
    int(STANDARD_NUMA_NODE)
        .or_else(|| int(DRIVER_NUMA_NODE))
        .and_then(|node| u32::try_from(node).ok())
        .filter(|&node| node <= MAX_NUMA_NODE)
}

/// A memory capacity: `(Some(bytes), None)` for a usable size, `(None, Some(why))` for a
/// published value that is not one (`0` is the AMD driver's "unreadable", and no device has
/// no memory), `(None, None)` when none is published.
fn memory(driver: &KnownDriver, device: &Device, name: &str) -> (Option<u64>, Option<String>) {
    let Some(capacity) = device.capacity.as_ref() else {
        return (None, None);
    };
    let Some(entry) = capacity
        .get(name)
        .or_else(|| capacity.get(&format!("{}/{name}", driver.name)))
    else {
        return (None, None);
    };
    let shown = bounded(&entry.value.0);
    match quantity::parse_whole(&entry.value) {
        Some(0) => (
            None,
            Some(format!("memory capacity {shown} (the driver's unknown)")),
        ),
        Some(bytes) if bytes <= MAX_DEVICE_MEMORY => (Some(bytes), None),
        Some(_) => (
            None,
            Some(format!("memory capacity {shown} is implausibly large")),
        ),
        None => (
            None,
            Some(format!("memory capacity {shown} is not a whole size")),
        ),
    }
}

fn bounded(text: &str) -> String {
    truncate_at_char_boundary(text, MAX_TEXT).to_string()
}

#[cfg(test)]
mod tests;
