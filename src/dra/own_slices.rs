//! The agent's own ResourceSlice for hardware no vendor DRA driver covers.
//!
//! Some accelerators have no DRA driver (Qualcomm Cloud AI 100, AMD XDNA NPUs, GPUs only
//! Vulkan sees). For the families an operator opts in to, the agent publishes one slice per
//! node under our driver name [`OWN_DRIVER`], one device per inventory device, so the
//! scheduler can count and allocate them. Inventory devices are already DRA-shaped (DNS-label
//! names, typed attributes, ≤32 attributes and capacities), so they are copied as they are,
//! the NUMA node under DRA's standard `resource.kubernetes.io/numaNode`.
//!
//! The rule that matters: a device is never published twice. A device that another driver's
//! slice on the node already names (same PCI bus id or UUID), or whose vendor's device plugin
//! advertises an extended resource in `node.status.allocatable`, is left out; otherwise one
//! card could be handed to two pods by two allocators.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute as DraAttribute, DeviceCapacity, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::drivers::STANDARD_PCI_BUS_ID;
use super::slices::published_devices;
use crate::api::{DeviceAttribute, InventoryDevice, attribute};
use crate::detect::pci::canonical_bus_id;
use crate::names::shorten_with_hash;

/// Our driver name in `spec.driver` of the slices the agent writes.
pub const OWN_DRIVER: &str = crate::names::keys::DOMAIN;

/// DRA's limit on devices in one slice (1.36, devices without taints or counters).
pub const MAX_DEVICES_PER_SLICE: usize = 128;

/// Kubernetes' limit on an object name (DNS subdomain).
const MAX_NAME: usize = 253;

/// A family of driverless hardware an operator can opt in to (`dra.ownSlices.families`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OwnFamily {
    /// Qualcomm Cloud AI 100 cards (vendor `qualcomm`, family `asic`).
    QualcommAi100,
    /// AMD XDNA NPUs (vendor `amd`, family `npu`).
    Xdna,
    /// GPUs found only by the Vulkan backend (backend `vulkan`).
    Vulkan,
}

impl OwnFamily {
    /// Every family, in the order of their names.
    pub const ALL: [Self; 3] = [Self::QualcommAi100, Self::Xdna, Self::Vulkan];

    /// The name used in the chart value and the agent flag.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::QualcommAi100 => "qualcomm-ai100",
            Self::Xdna => "xdna",
            Self::Vulkan => "vulkan",
        }
    }

    /// Whether an inventory device belongs to this family, by its attributes.
    fn matches(self, device: &InventoryDevice) -> bool {
        let text = |name: &str| {
            device
                .attributes
                .get(name)
                .and_then(DeviceAttribute::as_str)
        };
        match self {
            Self::QualcommAi100 => {
                text(attribute::VENDOR) == Some("qualcomm")
                    && text(attribute::FAMILY) == Some("asic")
            }
            Self::Xdna => {
                text(attribute::VENDOR) == Some("amd") && text(attribute::FAMILY) == Some("npu")
            }
            Self::Vulkan => text(attribute::BACKEND) == Some("vulkan"),
        }
    }
}

impl fmt::Display for OwnFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A family name that is not one of [`OwnFamily::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown own-slice family {0:?} (known: qualcomm-ai100, xdna, vulkan)")]
pub struct UnknownFamily(pub String);

impl FromStr for OwnFamily {
    type Err = UnknownFamily;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|family| family.as_str() == name.trim())
            .ok_or_else(|| UnknownFamily(name.chars().take(63).collect()))
    }
}

/// Extended resources that vendor device plugins advertise, by `(vendor, family)` attribute
/// values of the devices they expose. A node whose allocatable has one of these (non-zero)
/// has a device plugin handing out that vendor's devices of that kind.
///
/// Sources: Qualcomm's Cloud AI device plugin advertises `qualcomm.com/qaic`; the AMD GPU
/// device plugin `amd.com/gpu`; Intel's GPU plugin `gpu.intel.com/i915` and `.../xe`; the
/// NVIDIA device plugin `nvidia.com/gpu` (and `nvidia.com/mig-*`, caught by the prefix). The
/// XDNA name `amd.com/npu` follows the AMD naming; no upstream XDNA plugin was found.
pub const DEVICE_PLUGIN_RESOURCES: &[(&str, &str, &str)] = &[
    ("qualcomm", "asic", "qualcomm.com/qaic"),
    ("amd", "npu", "amd.com/npu"),
    ("amd", "gpu", "amd.com/gpu"),
    ("intel", "gpu", "gpu.intel.com/i915"),
    ("intel", "gpu", "gpu.intel.com/xe"),
    ("nvidia", "gpu", "nvidia.com/gpu"),
    ("nvidia", "gpu", "nvidia.com/mig-"),
];

/// What already exposes devices on a node: other drivers' slices and device plugins.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposed {
    /// Canonical PCI bus ids other drivers publish on the node.
    pub pci_bus_ids: BTreeSet<String>,
    /// UUIDs or serials other drivers publish on the node.
    pub uuids: BTreeSet<String>,
    /// `(vendor, family)` of devices other drivers publish on the node, to leave out devices
    /// of ours that carry neither a PCI bus id nor a UUID to match by.
    pub kinds: BTreeSet<(String, String)>,
    /// Extended resources in the node's allocatable with a non-zero quantity.
    pub allocatable: BTreeSet<String>,
}

impl Exposed {
    /// What `slices` (of any drivers but ours) and the Node's `allocatable` expose on `node`.
    pub fn on_node(
        node: &str,
        slices: &[ResourceSlice],
        allocatable: &BTreeMap<String, Quantity>,
    ) -> Self {
        let others: Vec<ResourceSlice> = slices
            .iter()
            .filter(|s| s.spec.driver != OWN_DRIVER && s.spec.node_name.as_deref() == Some(node))
            .cloned()
            .collect();
        let mut exposed = Self::default();
        // Known drivers: their vendor-specific PCI and UUID attributes, read by `slices`.
        for device in published_devices(&others).node(node) {
            exposed.pci_bus_ids.extend(device.pci_bus_id.clone());
            exposed.uuids.extend(device.uuid.clone());
            exposed
                .kinds
                .insert((enum_text(device.vendor), device.family.as_str().to_string()));
        }
        // Any driver: the standard PCI address, which unknown drivers publish too.
        for device in others.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
            let standard = device
                .attributes
                .as_ref()
                .and_then(|a| a.get(STANDARD_PCI_BUS_ID))
                .and_then(|a| a.string.as_deref())
                .and_then(canonical_bus_id);
            exposed.pci_bus_ids.extend(standard);
        }
        exposed.allocatable = allocatable
            .iter()
            .filter(|(_, quantity)| !is_zero(quantity))
            .map(|(name, _)| name.clone())
            .collect();
        exposed
    }

    /// Why `device` is already exposed, or `None` when it is free to publish.
    fn reason(&self, device: &InventoryDevice) -> Option<String> {
        let text = |name: &str| {
            device
                .attributes
                .get(name)
                .and_then(DeviceAttribute::as_str)
        };
        let pci = text(attribute::PCI_BUS_ID).and_then(canonical_bus_id);
        if let Some(pci) = pci.as_ref().filter(|id| self.pci_bus_ids.contains(*id)) {
            return Some(format!("another driver publishes PCI {pci}"));
        }
        let uuid = text(attribute::UUID);
        if let Some(uuid) = uuid.filter(|id| self.uuids.contains(*id)) {
            return Some(format!("another driver publishes uuid {uuid}"));
        }
        let vendor = text(attribute::VENDOR).unwrap_or_default();
        let family = text(attribute::FAMILY).unwrap_or_default();
        if let Some(resource) = DEVICE_PLUGIN_RESOURCES
            .iter()
            .filter(|(v, f, _)| *v == vendor && *f == family)
            .find_map(|(_, _, prefix)| self.allocatable.iter().find(|r| r.starts_with(prefix)))
        {
            return Some(format!("a device plugin advertises {resource}"));
        }
        let kind = (vendor.to_string(), family.to_string());
        if pci.is_none() && uuid.is_none() && self.kinds.contains(&kind) {
            return Some(format!(
                "no PCI id or uuid to match, and another driver publishes {vendor} {family} devices"
            ));
        }
        None
    }
}

/// The slice the agent publishes for `node`, and the devices it left out with why.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnSlice {
    /// The slice, or `None` when no device qualifies (an existing one is to be deleted).
    pub slice: Option<ResourceSlice>,
    /// `device name: reason` for each opted-in device that was left out.
    pub skipped: Vec<String>,
}

/// The name of `node`'s own slice: `<node>-hwaccel.io`, shortened with a hash when long.
pub fn own_slice_name(node: &str) -> String {
    let name = format!("{node}{}", crate::names::keys::OWN_SLICE_SUFFIX);
    if name.len() <= MAX_NAME {
        name
    } else {
        shorten_with_hash(&name, &name, MAX_NAME)
    }
}

/// The slice for `node`'s `devices` of the opted-in `families` that nothing in `exposed`
/// already exposes, at pool `generation`; `None` when no device qualifies.
pub fn own_slice(
    node: &str,
    devices: &[InventoryDevice],
    families: &BTreeSet<OwnFamily>,
    exposed: &Exposed,
    generation: i64,
) -> Option<ResourceSlice> {
    own_slice_with_notes(node, devices, families, exposed, generation).slice
}

/// [`own_slice`], with the devices left out and why.
pub fn own_slice_with_notes(
    node: &str,
    devices: &[InventoryDevice],
    families: &BTreeSet<OwnFamily>,
    exposed: &Exposed,
    generation: i64,
) -> OwnSlice {
    let mut skipped = Vec::new();
    let mut published = Vec::new();
    for device in devices {
        if !families.iter().any(|family| family.matches(device)) {
            continue;
        }
        if let Some(reason) = exposed.reason(device) {
            skipped.push(format!("{}: {reason}", device.name));
            continue;
        }
        if published.len() >= MAX_DEVICES_PER_SLICE {
            skipped.push(format!(
                "{}: more than {MAX_DEVICES_PER_SLICE} devices",
                device.name
            ));
            continue;
        }
        published.push(dra_device(device));
    }
    if published.is_empty() {
        return OwnSlice {
            slice: None,
            skipped,
        };
    }
    let slice = ResourceSlice {
        metadata: ObjectMeta {
            name: Some(own_slice_name(node)),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: OWN_DRIVER.to_string(),
            node_name: Some(node.to_string()),
            pool: ResourcePool {
                name: node.to_string(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(published),
            ..ResourceSliceSpec::default()
        },
    };
    OwnSlice {
        slice: Some(slice),
        skipped,
    }
}

/// Whether two slices publish the same thing (name, node, devices), generation aside: the
/// agent writes only when this is false, and bumps the generation then.
pub fn same_content(a: &ResourceSlice, b: &ResourceSlice) -> bool {
    a.metadata.name == b.metadata.name
        && a.spec.driver == b.spec.driver
        && a.spec.node_name == b.spec.node_name
        && a.spec.pool.name == b.spec.pool.name
        && a.spec.devices.as_deref().unwrap_or_default()
            == b.spec.devices.as_deref().unwrap_or_default()
}

/// One inventory device as a DRA device: same name, attributes and capacities, except that
/// the NUMA node always goes out under DRA's standard name (an inventory written before it
/// has only `numaNode`), so `matchAttribute: resource.kubernetes.io/numaNode` aligns our
/// devices with other drivers'.
fn dra_device(device: &InventoryDevice) -> Device {
    let mut attributes: BTreeMap<String, DraAttribute> = device
        .attributes
        .iter()
        .map(|(name, value)| (name.clone(), dra_attribute(value)))
        .collect();
    if let Some(numa) = attributes.remove(attribute::LEGACY_NUMA_NODE) {
        attributes
            .entry(attribute::NUMA_NODE.to_string())
            .or_insert(numa);
    }
    let capacity: BTreeMap<String, DeviceCapacity> = device
        .capacity
        .iter()
        .map(|(name, value)| {
            (
                name.clone(),
                DeviceCapacity {
                    value: value.clone(),
                    request_policy: None,
                },
            )
        })
        .collect();
    Device {
        name: device.name.clone(),
        attributes: (!attributes.is_empty()).then_some(attributes),
        capacity: (!capacity.is_empty()).then_some(capacity),
        ..Device::default()
    }
}

fn dra_attribute(value: &DeviceAttribute) -> DraAttribute {
    match value {
        DeviceAttribute::Int(i) => DraAttribute {
            int: Some(*i),
            ..DraAttribute::default()
        },
        DeviceAttribute::Bool(b) => DraAttribute {
            bool: Some(*b),
            ..DraAttribute::default()
        },
        DeviceAttribute::String(s) => DraAttribute {
            string: Some(s.clone()),
            ..DraAttribute::default()
        },
        DeviceAttribute::Version(v) => DraAttribute {
            version: Some(v.clone()),
            ..DraAttribute::default()
        },
    }
}

/// Whether a quantity is zero (`0`, `0Gi`...): a plugin that registered but has no devices.
fn is_zero(quantity: &Quantity) -> bool {
    quantity
        .0
        .trim()
        .trim_start_matches(['0', '.'])
        .chars()
        .next()
        .is_none_or(|c| !c.is_ascii_digit())
}

/// The serde name of a unit enum (`qualcomm`), as the inventory's `vendor` attribute holds it.
fn enum_text<T: serde::Serialize>(value: T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
