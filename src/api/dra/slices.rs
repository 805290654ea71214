//! ResourceSlices → the devices each node's known DRA drivers publish.
//!
//! Follows DRA's consumer rules: per `(driver, pool)` only the highest `pool.generation`
//! counts, and only once all `resourceSliceCount` slices of it are seen (a pool being
//! rewritten is skipped, not half-read). Only node-local slices (`spec.nodeName`) are read,
//! and only for the drivers in [`super::drivers`]. A shared device (`allowMultipleAllocations`)
//! and one whose counters its pool can never give ([`super::counters`]) are published but not
//! plannable. Slices are written by other parties, so
//! every count and string is bounded and nothing in them can make this panic.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceSlice};

use super::counters::PoolCounters;
use super::drivers::{self, KnownDriver, STANDARD_PCI_BUS_ID};
use super::{DeviceRef, PublishedDevice};
use crate::api::quantity;
use crate::detect::pci::canonical_bus_id;
use crate::names::truncate_at_char_boundary;

/// At most this many devices are kept per node; a real node has tens (MIG and partitions
/// included), so more means a runaway or hostile publisher.
pub const MAX_DEVICES_PER_NODE: usize = 1024;

/// Strings copied from a slice are cut to this many bytes. DRA itself allows 64 for
/// attribute values; a file read by the CLI is not validated by an apiserver.
const MAX_TEXT: usize = 253;

/// A pool claiming more slices than this is treated as malformed (DRA has no hard limit,
/// but one node's pool never needs thousands).
const MAX_SLICES_PER_POOL: i64 = 4096;

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
                if found.unusable.is_none()
                    && let Some(why) = counters.get(&device.name)
                {
                    found.unusable = Some(format!("its DRA counters cannot be met: {why}"));
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

/// The slices of a pool's highest generation when all of them are present, else `None`
/// with a note. Slices are told apart by object name, so a file listing one twice does not
/// complete a pool.
pub(super) fn complete_generation<'a>(
    driver: &str,
    pool: &str,
    slices: &[&'a ResourceSlice],
    notes: &mut Vec<String>,
) -> Option<Vec<&'a ResourceSlice>> {
    let generation = slices.iter().map(|s| s.spec.pool.generation).max()?;
    let current: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.pool.generation == generation)
        .copied()
        .collect();
    let expected = current
        .iter()
        .map(|s| s.spec.pool.resource_slice_count)
        .max()
        .unwrap_or(0);
    if !(1..=MAX_SLICES_PER_POOL).contains(&expected) {
        notes.push(format!(
            "pool {driver}/{pool}: resourceSliceCount {expected} is not usable, pool skipped"
        ));
        return None;
    }
    let mut names = BTreeSet::new();
    let distinct: Vec<&ResourceSlice> = current
        .into_iter()
        .filter(|s| names.insert(s.metadata.name.clone().unwrap_or_default()))
        .collect();
    let seen = i64::try_from(distinct.len()).unwrap_or(i64::MAX);
    if seen < expected {
        notes.push(format!(
            "pool {driver}/{pool}: {seen} of {expected} slices of generation {generation} seen, \
             pool skipped until it is complete"
        ));
        return None;
    }
    Some(distinct)
}

/// One device of a known driver, reduced.
fn published(driver: &KnownDriver, pool: &str, node: &str, device: &Device) -> PublishedDevice {
    let text = |name: &str| string_attribute(driver, device, name);
    let partition = driver.whole_device.and_then(|(name, whole)| {
        let kind = text(name)?;
        (kind != whole).then(|| format!("a partition ({name}={kind}), not a whole device"))
    });
    // A partition's PCI address is its parent's: matching by it would make the parent
    // look like the partition, so a partition is matched by its own UUID only.
    let pci_bus_id = if partition.is_some() {
        None
    } else {
        text(STANDARD_PCI_BUS_ID)
            .and_then(|id| canonical_bus_id(&id))
            .or_else(|| {
                driver
                    .pci_address
                    .and_then(text)
                    .and_then(|id| canonical_bus_id(&id))
            })
    };
    let unhealthy = driver
        .healthy
        .and_then(|name| bool_attribute(driver, device, name))
        .and_then(|healthy| (!healthy).then(|| "the driver reports it unhealthy".to_string()));
    PublishedDevice {
        node: node.to_string(),
        reference: DeviceRef {
            driver: driver.name.to_string(),
            pool: bounded(pool),
            device: bounded(&device.name),
        },
        pci_bus_id,
        uuid: driver.uuid.and_then(text),
        product: text(driver.product),
        memory_bytes: driver.memory.and_then(|name| memory(driver, device, name)),
        vendor: driver.vendor,
        family: driver.family,
        unusable: partition
            .or_else(|| blocking_taint(device))
            .or(unhealthy)
            .or_else(|| shared(device)),
    }
}

/// Why a device that may be allocated to many claims at once (`allowMultipleAllocations`,
/// its capacity consumable in shares) is not one to plan on: a placement's claim could not
/// hold it alone, so it is shared, neither free nor taken.
pub const SHARED: &str = "shared (allowMultipleAllocations: claims take shares of its capacity), not a device one placement can hold";

fn shared(device: &Device) -> Option<String> {
    (device.allow_multiple_allocations == Some(true)).then(|| SHARED.to_string())
}

/// The first NoSchedule/NoExecute taint, as a reason.
fn blocking_taint(device: &Device) -> Option<String> {
    let taint = device
        .taints
        .iter()
        .flatten()
        .find(|t| BLOCKING_EFFECTS.contains(&t.effect.as_str()))?;
    let value = taint
        .value
        .as_deref()
        .map(|v| format!("={}", bounded(v)))
        .unwrap_or_default();
    Some(format!(
        "tainted {}{value}:{}",
        bounded(&taint.key),
        taint.effect
    ))
}

/// An attribute by name: `name` as written (standard names are fully qualified), else
/// qualified with the driver's domain, which is what an unqualified name means.
fn attribute<'a>(
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

/// A capacity in whole units (bytes); `None` when absent or not a plain whole quantity.
fn memory(driver: &KnownDriver, device: &Device, name: &str) -> Option<u64> {
    let capacity = device.capacity.as_ref()?;
    let entry = capacity
        .get(name)
        .or_else(|| capacity.get(&format!("{}/{name}", driver.name)))?;
    quantity::parse_whole(&entry.value).filter(|&bytes| bytes > 0)
}

fn bounded(text: &str) -> String {
    truncate_at_char_boundary(text, MAX_TEXT).to_string()
}

#[cfg(test)]
mod tests;
