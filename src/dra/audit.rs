//! The publication audit: one node's three truths side by side — the accelerators its agent
//! detected (the inventory), the devices DRA drivers publish for it (its ResourceSlices) and
//! the extended resources its device plugins advertise (the Node's allocatable, which the
//! agent copies into `status.devicePluginResources`) — and every gap between them that
//! leaves a device idle or double-booked.
//!
//! Each gap has a reason, the driver or label source it concerns, and how many devices it
//! covers; the controller turns them into the inventory's `DRAPublished` condition, a Node
//! Event and `hwaccel_dra_unpublished_devices` (`docs/dra.md`, "Publication audit"):
//!
//! | reason | when |
//! |---|---|
//! | `DriverSliceMissing` | a DRA driver for the node's devices runs in the cluster (it publishes on some node) but publishes fewer whole devices here than were detected, and no device plugin offers them instead: a slice the apiserver refused, an empty slice, a plugin not scheduled on the node |
//! | `DoubleAdvertised` | a DRA driver publishes devices a device plugin also advertises: a pod of each kind can be given the same device |
//! | `AttributeAnomaly` | the slices carry values that stand for "unknown", lack facts, use dropped names ([`super::lint`]), or publish a memory size far from what detection read |
//! | `StaleVendorLabels` | a vendor's discovery labels on the Node say devices the agent does not detect (their writer is gone, or the devices are) |
//! | `NotAdvertised` | devices are detected, the agent read the Node's allocatable, and neither a DRA driver nor a device plugin offers them |
//!
//! Pure and deterministic; every count and text it copies from a slice or a label is bounded.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::resource::v1::ResourceSlice;
use serde::de::value::{Error as ValueError, StrDeserializer};

use super::PublishedDevice;
use super::device_plugins::devices_of;
use super::drivers::KNOWN_DRIVERS;
use super::lint::{Class, Finding};
use crate::api::{AcceleratorInventory, attribute, quantity};
use crate::detect::pci::canonical_bus_id;
use crate::hardware::{Family, Vendor};
use crate::names::truncate_at_char_boundary;

/// Why devices fall between the truths, most urgent first (the condition's reason is the
/// first present).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// A driver that runs in the cluster publishes fewer devices here than were detected.
    DriverSliceMissing,
    /// A driver and a device plugin both offer the same devices.
    DoubleAdvertised,
    /// Detected devices that nothing offers to pods.
    NotAdvertised,
    /// Slice attributes that contradict the hardware or say nothing.
    AttributeAnomaly,
    /// Vendor labels that describe devices the node does not have.
    StaleVendorLabels,
}

impl Reason {
    /// The reason as the condition and the metric spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DriverSliceMissing => "DriverSliceMissing",
            Self::DoubleAdvertised => "DoubleAdvertised",
            Self::NotAdvertised => "NotAdvertised",
            Self::AttributeAnomaly => "AttributeAnomaly",
            Self::StaleVendorLabels => "StaleVendorLabels",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One gap between the truths.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Gap {
    /// Why.
    pub reason: Reason,
    /// The DRA driver it concerns (`gpu.amd.com`), or for a gap no driver owns the device
    /// plugin's resource or the label's vendor (`nvidia.com/gpu`, `nvidia`).
    pub source: String,
    /// How many devices it covers (at least 1).
    pub devices: u32,
    /// What is wrong, with the counts.
    pub message: String,
}

/// The audit of one node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Audit {
    /// Every gap, most urgent first.
    pub gaps: Vec<Gap>,
    /// What agrees, one phrase per kind of device (`8 NVIDIA GPUs detected, gpu.nvidia.com
    /// publishes 8`); empty on a node without accelerators.
    pub agreed: Vec<String>,
}

/// The condition's reason when nothing is wrong and the node has accelerators.
pub const CONSISTENT: &str = "Consistent";
/// The condition's reason on a node without accelerators or published devices.
pub const NO_ACCELERATORS: &str = "NoAccelerators";
/// Longest message kept, as the condition keeps it.
const MAX_MESSAGE: usize = 1024;
/// Gaps named per reason before "and N more".
const SHOWN_PER_REASON: usize = 4;

impl Audit {
    /// True when nothing falls between the truths.
    pub fn published(&self) -> bool {
        self.gaps.is_empty()
    }

    /// The condition's reason: the most urgent gap's, else [`CONSISTENT`] or
    /// [`NO_ACCELERATORS`].
    pub fn reason(&self) -> &'static str {
        match self.gaps.first() {
            Some(gap) => gap.reason.as_str(),
            None if self.agreed.is_empty() => NO_ACCELERATORS,
            None => CONSISTENT,
        }
    }

    /// The condition's message: every gap (a few per reason), else what agrees.
    pub fn message(&self) -> String {
        let text = if self.gaps.is_empty() {
            if self.agreed.is_empty() {
                "no accelerators detected and none published".to_string()
            } else {
                self.agreed.join("; ")
            }
        } else {
            let mut parts = Vec::new();
            let mut by_reason: BTreeMap<Reason, Vec<&Gap>> = BTreeMap::new();
            for gap in &self.gaps {
                by_reason.entry(gap.reason).or_default().push(gap);
            }
            for gaps in by_reason.values() {
                parts.extend(
                    gaps.iter()
                        .take(SHOWN_PER_REASON)
                        .map(|g| g.message.clone()),
                );
                if gaps.len() > SHOWN_PER_REASON {
                    parts.push(format!("and {} more", gaps.len() - SHOWN_PER_REASON));
                }
            }
            parts.join("; ")
        };
        truncate_at_char_boundary(&text, MAX_MESSAGE).to_string()
    }

    /// Devices per (source, reason): the figures of `hwaccel_dra_unpublished_devices`.
    pub fn devices_by_source(&self) -> BTreeMap<(String, Reason), u32> {
        let mut out: BTreeMap<(String, Reason), u32> = BTreeMap::new();
        for gap in &self.gaps {
            let entry = out.entry((gap.source.clone(), gap.reason)).or_default();
            *entry = entry.saturating_add(gap.devices);
        }
        out
    }
}

/// What the audit of one node reads.
#[derive(Debug, Clone, Copy)]
pub struct NodeTruths<'a> {
    /// The node's inventory, when its agent wrote one.
    pub inventory: Option<&'a AcceleratorInventory>,
    /// The devices the known drivers publish for the node ([`super::slices::published_devices`]
    /// of its slices).
    pub published: &'a [PublishedDevice],
    /// [`super::lint::lint`] of the node's slices.
    pub findings: &'a [Finding],
    /// The Node's labels.
    pub labels: &'a BTreeMap<String, String>,
    /// The DRA drivers that publish devices on any node of the cluster: a driver that does is
    /// deployed, and missing from a node only by mistake.
    pub drivers_in_cluster: &'a BTreeSet<String>,
}

/// The gaps on one node.
pub fn audit(truths: &NodeTruths<'_>) -> Audit {
    let mut audit = Audit::default();
    let detected = detected_by_kind(truths.inventory);
    let advertised = truths
        .inventory
        .and_then(|inventory| inventory.status.as_ref())
        .and_then(|status| status.device_plugin_resources.as_ref());
    let mut kinds: BTreeSet<(Vendor, Family)> = detected.keys().copied().collect();
    kinds.extend(truths.published.iter().map(|d| (d.vendor, d.family)));
    for (vendor, family) in kinds {
        let found = detected.get(&(vendor, family)).copied().unwrap_or(0);
        compare_kind(&mut audit, truths, vendor, family, found, advertised);
    }
    memory_contradictions(&mut audit, truths);
    lint_anomalies(&mut audit, truths.findings);
    if truths.inventory.is_some() {
        stale_labels(&mut audit, truths.labels, &detected);
    }
    audit.gaps.sort();
    audit
}

/// The audit of every inventory's node against `slices` (all of the cluster's), with each
/// node's labels where known: what `hwaccel fleet` shows without a controller. Only nodes with
/// a gap are returned.
pub fn audit_fleet(
    inventories: &[AcceleratorInventory],
    slices: &[ResourceSlice],
    labels: &BTreeMap<String, BTreeMap<String, String>>,
) -> BTreeMap<String, Audit> {
    let (by_node, drivers_in_cluster) = slices_by_node(slices.iter());
    let no_labels = BTreeMap::new();
    let mut out = BTreeMap::new();
    for inventory in inventories {
        let node = inventory.spec.node_name.as_str();
        let own: Vec<ResourceSlice> = by_node
            .get(node)
            .map(|own| own.iter().map(|s| (*s).clone()).collect())
            .unwrap_or_default();
        let published = super::slices::published_devices(&own);
        let findings = super::lint::lint(&own);
        let audited = audit(&NodeTruths {
            inventory: Some(inventory),
            published: published.node(node),
            findings: &findings,
            labels: labels.get(node).unwrap_or(&no_labels),
            drivers_in_cluster: &drivers_in_cluster,
        });
        if !audited.published() {
            out.insert(node.to_string(), audited);
        }
    }
    out
}

/// Node-local slices grouped by their node, and the drivers that publish devices anywhere in
/// the cluster (what `DriverSliceMissing` holds a node to). Slices of no node (network-attached
/// pools) are left out.
pub fn slices_by_node<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
) -> (BTreeMap<&'a str, Vec<&'a ResourceSlice>>, BTreeSet<String>) {
    let mut by_node: BTreeMap<&str, Vec<&ResourceSlice>> = BTreeMap::new();
    let mut drivers_in_cluster = BTreeSet::new();
    for slice in slices {
        let Some(node) = slice.spec.node_name.as_deref().filter(|n| !n.is_empty()) else {
            continue;
        };
        if slice.spec.devices.as_ref().is_some_and(|d| !d.is_empty()) {
            drivers_in_cluster.insert(slice.spec.driver.clone());
        }
        by_node.entry(node).or_default().push(slice);
    }
    (by_node, drivers_in_cluster)
}

/// Detected accelerators (not the host CPU) by vendor and family.
fn detected_by_kind(inventory: Option<&AcceleratorInventory>) -> BTreeMap<(Vendor, Family), u32> {
    let mut out: BTreeMap<(Vendor, Family), u32> = BTreeMap::new();
    let Some(inventory) = inventory else {
        return out;
    };
    for device in &inventory.spec.devices {
        let text = |name: &str| device.attributes.get(name).and_then(|a| a.as_str());
        let (Some(vendor), Some(family)) = (
            text(attribute::VENDOR).and_then(parse_vendor),
            text(attribute::FAMILY).and_then(parse_family),
        ) else {
            continue;
        };
        if family == Family::Cpu {
            continue;
        }
        *out.entry((vendor, family)).or_default() += 1;
    }
    out
}

/// The vendor an inventory's `vendor` attribute names (its serde spelling).
fn parse_vendor(text: &str) -> Option<Vendor> {
    use serde::Deserialize as _;
    Vendor::deserialize(StrDeserializer::<ValueError>::new(text)).ok()
}

/// The family an inventory's `family` attribute names (its serde spelling).
fn parse_family(text: &str) -> Option<Family> {
    use serde::Deserialize as _;
    Family::deserialize(StrDeserializer::<ValueError>::new(text)).ok()
}

/// One kind of device: detection against each of its drivers and its plugins.
fn compare_kind(
    audit: &mut Audit,
    truths: &NodeTruths<'_>,
    vendor: Vendor,
    family: Family,
    found: u32,
    advertised: Option<&BTreeMap<String, u32>>,
) {
    let kind = kind_name(vendor, family, found);
    let gaps_before = audit.gaps.len();
    let agreed_before = audit.agreed.len();
    let (plugin_devices, plugin_present) = advertised
        .map(|advertised| devices_of(advertised, vendor, family))
        .unwrap_or((None, false));
    let plugin_names = advertised
        .map(|advertised| plugin_resources(advertised, vendor, family))
        .unwrap_or_default();
    let mut any_driver_deployed = false;
    let mut published_any = false;
    let mut offered = plugin_present;
    for driver in KNOWN_DRIVERS
        .iter()
        .filter(|d| d.vendor == vendor && d.family == family)
    {
        let published = count_u32(
            truths
                .published
                .iter()
                .filter(|d| d.whole && d.reference.driver == driver.name),
        );
        let deployed = published > 0 || truths.drivers_in_cluster.contains(driver.name);
        any_driver_deployed |= deployed;
        offered |= published > 0;
        published_any |= published > 0;
        if published > 0 && plugin_present {
            let devices = plugin_devices
                .map_or(published, |p| p.min(published))
                .max(1);
            audit.gaps.push(Gap {
                reason: Reason::DoubleAdvertised,
                source: driver.name.to_string(),
                devices,
                message: format!(
                    "{} publishes {published} and the device plugin advertises {plugin_names}: \
                     a DRA claim and a device-plugin pod can be given the same device",
                    driver.name
                ),
            });
        }
        // A node whose devices a plugin offers uses the plugin: a driver absent there is a
        // choice, not a loss. Published in part is a loss either way.
        let plugin_instead = published == 0 && plugin_present;
        if deployed && published < found && !plugin_instead {
            audit.gaps.push(Gap {
                reason: Reason::DriverSliceMissing,
                source: driver.name.to_string(),
                devices: found - published,
                message: format!("{kind} detected, {} publishes {published}", driver.name),
            });
        } else if published > 0 && found > 0 {
            audit.agreed.push(format!(
                "{kind} detected, {} publishes {published}",
                driver.name
            ));
        }
    }
    if found == 0 {
        return;
    }
    if plugin_present && !published_any {
        audit.agreed.push(format!(
            "{kind} detected, the device plugin advertises {plugin_names}"
        ));
    }
    // Only when the agent read the Node: an older agent, or none, says nothing of plugins.
    if advertised.is_some() && !offered && !any_driver_deployed {
        audit.gaps.push(Gap {
            reason: Reason::NotAdvertised,
            source: vendor.as_str().to_string(),
            devices: found,
            message: format!(
                "{kind} detected; no DRA driver publishes them and no device plugin advertises them"
            ),
        });
    }
    // Detected and nothing to hold it against (no driver in the cluster, plugins unread).
    if audit.gaps.len() == gaps_before && audit.agreed.len() == agreed_before {
        audit.agreed.push(format!("{kind} detected"));
    }
}

/// A published whole device whose memory is far from what detection read on the same PCI
/// address: a driver reading the wrong unit or a partitioned mode as the whole device.
fn memory_contradictions(audit: &mut Audit, truths: &NodeTruths<'_>) {
    let Some(inventory) = truths.inventory else {
        return;
    };
    // By PCI address and by UUID (lowercase), as merging matches them.
    let mut detected: BTreeMap<String, (&str, u64)> = BTreeMap::new();
    for device in &inventory.spec.devices {
        let Some(memory) = device
            .capacity
            .get(attribute::MEMORY)
            .and_then(quantity::parse_whole)
        else {
            continue;
        };
        let text = |name: &str| device.attributes.get(name).and_then(|a| a.as_str());
        if let Some(bus) = text(attribute::PCI_BUS_ID).and_then(canonical_bus_id) {
            detected.insert(bus, (device.name.as_str(), memory));
        }
        if let Some(uuid) = text(attribute::UUID) {
            detected.insert(uuid.to_lowercase(), (device.name.as_str(), memory));
        }
    }
    for device in truths.published.iter().filter(|d| d.whole) {
        let Some(published) = device.memory_bytes else {
            continue;
        };
        let by_bus = device.pci_bus_id.as_ref().and_then(|bus| detected.get(bus));
        let by_uuid = || {
            device
                .uuid
                .as_ref()
                .and_then(|uuid| detected.get(&uuid.to_lowercase()))
        };
        let Some((name, read)) = by_bus.or_else(by_uuid) else {
            continue;
        };
        // Drivers round and reserve differently (NVML's total against the driver's); a tenth
        // apart is another size.
        if read.abs_diff(published) * 10 > *read {
            audit.gaps.push(Gap {
                reason: Reason::AttributeAnomaly,
                source: device.reference.driver.clone(),
                devices: 1,
                message: format!(
                    "{} ({name}) publishes memory {} while the agent reads {}",
                    device.reference,
                    gib(published),
                    gib(*read)
                ),
            });
        }
    }
}

/// Lint findings that mislead a selector or the planner: sentinels, missing facts, dropped
/// names. (A driver-scoped name beside no standard one is only informational.)
fn lint_anomalies(audit: &mut Audit, findings: &[Finding]) {
    for finding in findings {
        if !matches!(
            finding.class,
            Class::Sentinel | Class::MissingFact | Class::Deprecated
        ) {
            continue;
        }
        let devices = u32::try_from(finding.repeats.saturating_add(1)).unwrap_or(u32::MAX);
        let device = finding.device.as_deref().unwrap_or("its slice");
        let more = match finding.repeats {
            0 => String::new(),
            n => format!(" (and {n} more devices)"),
        };
        audit.gaps.push(Gap {
            reason: Reason::AttributeAnomaly,
            source: finding.driver.clone(),
            devices,
            message: format!(
                "{} {device} in {}: {}{more}",
                finding.driver, finding.slice, finding.message
            ),
        });
    }
}

/// Discovery labels a vendor's labeller writes on a Node, and what they say.
struct LabelSource {
    /// The label key, or its prefix.
    key: &'static str,
    prefix: bool,
    vendor: Vendor,
    family: Family,
    /// The label's value is the device count (else it says only that devices are there).
    count: bool,
    /// Who writes it.
    writer: &'static str,
}

/// The labels vendors' discovery tools write (their public sources: NVIDIA GPU feature
/// discovery, the AMD GPU node labeller, Intel's GPU plugin NFD rules).
const LABEL_SOURCES: &[LabelSource] = &[
    LabelSource {
        key: "nvidia.com/gpu.count",
        prefix: false,
        vendor: Vendor::Nvidia,
        family: Family::Gpu,
        count: true,
        writer: "NVIDIA GPU feature discovery",
    },
    LabelSource {
        key: "nvidia.com/gpu.present",
        prefix: false,
        vendor: Vendor::Nvidia,
        family: Family::Gpu,
        count: false,
        writer: "NVIDIA GPU feature discovery",
    },
    LabelSource {
        key: "amd.com/gpu.",
        prefix: true,
        vendor: Vendor::Amd,
        family: Family::Gpu,
        count: false,
        writer: "the AMD GPU node labeller",
    },
    LabelSource {
        key: "beta.amd.com/gpu.",
        prefix: true,
        vendor: Vendor::Amd,
        family: Family::Gpu,
        count: false,
        writer: "the AMD GPU node labeller",
    },
    LabelSource {
        key: "gpu.intel.com/device-id.",
        prefix: true,
        vendor: Vendor::Intel,
        family: Family::Gpu,
        count: false,
        writer: "Intel's GPU discovery rules",
    },
];

/// Vendor labels that describe devices the agent does not detect: one gap per vendor.
fn stale_labels(
    audit: &mut Audit,
    labels: &BTreeMap<String, String>,
    detected: &BTreeMap<(Vendor, Family), u32>,
) {
    let mut seen: BTreeSet<(Vendor, Family)> = BTreeSet::new();
    for source in LABEL_SOURCES {
        let found = detected
            .get(&(source.vendor, source.family))
            .copied()
            .unwrap_or(0);
        let matching = labels.iter().find(|(key, value)| {
            let key_matches = if source.prefix {
                key.starts_with(source.key)
            } else {
                key.as_str() == source.key
            };
            key_matches && !value.eq_ignore_ascii_case("false") && value.as_str() != "0"
        });
        let Some((key, value)) = matching else {
            continue;
        };
        let said: Option<u32> = source.count.then(|| value.parse().ok()).flatten();
        let stale = match said {
            Some(count) => count != found,
            None => found == 0,
        };
        if !stale || !seen.insert((source.vendor, source.family)) {
            continue;
        }
        let shown_key = truncate_at_char_boundary(key, 253);
        let shown_value = truncate_at_char_boundary(value, 63);
        audit.gaps.push(Gap {
            reason: Reason::StaleVendorLabels,
            source: source.vendor.as_str().to_string(),
            devices: said.unwrap_or(1).clamp(1, 4096),
            message: format!(
                "Node label {shown_key}={shown_value} (written by {}) but the agent detects {}",
                source.writer,
                kind_name(source.vendor, source.family, found)
            ),
        });
    }
}

/// The plugin resources of one kind of device, as `name: count` pairs.
fn plugin_resources(advertised: &BTreeMap<String, u32>, vendor: Vendor, family: Family) -> String {
    advertised
        .iter()
        .filter(|(name, count)| {
            **count > 0
                && super::device_plugins::known(name)
                    .is_some_and(|r| r.vendor == vendor && r.family == family)
        })
        .map(|(name, count)| format!("{name}: {count}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `8 AMD GPUs`, `1 AWS ASIC`, `0 NVIDIA GPUs`.
fn kind_name(vendor: Vendor, family: Family, count: u32) -> String {
    let vendor = match vendor {
        Vendor::Nvidia | Vendor::Amd | Vendor::Aws => vendor.as_str().to_uppercase(),
        other => {
            let text = other.as_str();
            let mut chars = text.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_uppercase().chain(chars).collect()
            })
        }
    };
    let family = family.as_str().to_uppercase();
    let plural = if count == 1 { "" } else { "s" };
    format!("{count} {vendor} {family}{plural}")
}

fn count_u32<T>(items: impl Iterator<Item = T>) -> u32 {
    u32::try_from(items.count()).unwrap_or(u32::MAX)
}

fn gib(bytes: u64) -> String {
    let gib = bytes as f64 / f64::from(1u32 << 30);
    format!("{gib:.1}Gi")
}

#[cfg(test)]
mod tests;
