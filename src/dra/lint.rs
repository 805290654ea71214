//! What is wrong with a set of ResourceSlices: the apiserver's own rules (a slice it refuses
//! publishes nothing, while the driver's plugin looks healthy), slices that publish no device,
//! and per known driver the attribute dictionary of [`super::drivers`]: the facts a whole
//! device should carry, values that stand for "unknown", driver-scoped copies of DRA's
//! standard names and names the driver has dropped.
//!
//! `hwaccel lint-slices` prints these for files on a laptop; the same findings are what a
//! publication audit reports per node. Pure: slices in, findings out.
//!
//! The apiserver's rules are those of `pkg/apis/resource/validation/validation.go` and the
//! limits in `pkg/apis/resource/types.go` of Kubernetes v1.37.2 (`validateResourceSliceSpec`,
//! `validateDevice`, `validateDeviceAttribute`, `validateQualifiedName`); only the ones a
//! driver can get wrong without noticing are repeated here, each with the field it names.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceSlice};
use serde::Serialize;

use super::drivers::{self, KnownDriver, ProductSource, STANDARD_PCI_BUS_ID, STANDARD_PCIE_ROOT};
use super::slices::{attribute, published_devices};
use crate::api::attribute::NUMA_NODE;
use crate::names::{is_valid_dns_label, is_valid_dns_subdomain, truncate_at_char_boundary};

/// `ResourceSliceMaxDevices`: devices in one slice.
const MAX_DEVICES: usize = 128;
/// `ResourceSliceMaxDevicesWithAdvancedFeatures`: devices in one slice when any has taints or
/// consumes counters.
const MAX_DEVICES_ADVANCED: usize = 64;
/// `ResourceSliceMaxAttributesAndCapacitiesPerDevice`.
const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// `DeviceAttributeMaxValueLength`: a string or version value.
const MAX_VALUE_LENGTH: usize = 64;
/// `DeviceMaxDomainLength` and `DriverNameMaxLength`.
const MAX_DOMAIN_LENGTH: usize = 63;
/// `DeviceMaxIDLength`: the name part of an attribute or capacity name.
const MAX_ID_LENGTH: usize = 32;
/// `PoolNameMaxLength`.
const MAX_POOL_NAME_LENGTH: usize = 253;
/// `DeviceTaintsMaxLength`.
const MAX_TAINTS: usize = 16;
/// `ResourceSliceMaxDeviceCounterConsumptionsPerDevice`.
const MAX_COUNTER_CONSUMPTIONS: usize = 2;
/// Findings kept per slice: a slice with thousands of bad devices says what it needs to in
/// the first few dozen, and the output stays bounded by the input's count of slices.
const MAX_FINDINGS_PER_SLICE: usize = 32;
/// Texts copied from a slice into a message are cut to this many bytes.
const MAX_SHOWN: usize = 80;

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The slice is refused (or publishes nothing): its devices are not in DRA at all.
    Error,
    /// The devices are published, but a fact about them is wrong or missing: they are
    /// mismatched, counted twice, or invisible to selectors that should find them.
    Warning,
    /// Works today; worth changing.
    Info,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Error => "error",
            Self::Warning => "warning",
            Self::Info => "info",
        })
    }
}

/// What kind of thing is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Class {
    /// The apiserver refuses the slice as written (create or update fails; the plugin keeps
    /// retrying, the devices stay out of DRA).
    Refused,
    /// A slice of devices that holds none (and no shared counters).
    EmptySlice,
    /// A value that stands for "unknown": memory `0`, a placeholder product or serial, a
    /// negative NUMA node.
    Sentinel,
    /// A whole device without a fact its driver publishes (product, PCI bus id or UUID,
    /// memory): it cannot be matched to the hardware, or planned on.
    MissingFact,
    /// A name the driver has dropped or replaced.
    Deprecated,
    /// A driver-scoped copy of a name DRA standardises (`numaNode` next to, or instead of,
    /// `resource.kubernetes.io/numaNode`): selectors written against the standard name miss it.
    DriverScoped,
    /// A driver this operator has no dictionary for: only the apiserver's rules were checked.
    UnknownDriver,
}

impl Class {
    /// How much this class matters.
    pub fn severity(self) -> Severity {
        match self {
            Self::Refused | Self::EmptySlice => Severity::Error,
            Self::Sentinel | Self::MissingFact => Severity::Warning,
            Self::Deprecated | Self::DriverScoped | Self::UnknownDriver => Severity::Info,
        }
    }

    /// The reason of the inventory's `DRAPublished` condition this class feeds: devices that
    /// are not in DRA, or devices whose published facts contradict the hardware.
    pub fn audit_reason(self) -> &'static str {
        match self {
            Self::Refused | Self::EmptySlice => "DriverSliceMissing",
            Self::Sentinel | Self::MissingFact | Self::Deprecated | Self::DriverScoped => {
                "AttributeAnomaly"
            }
            Self::UnknownDriver => "UnknownDriver",
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One thing wrong with one slice or device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// The slice's `metadata.name` (`<unnamed>` when it has none).
    pub slice: String,
    /// `spec.driver`.
    pub driver: String,
    /// The device, when the finding is about one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// What kind of thing is wrong.
    pub class: Class,
    /// How much it matters (the class's).
    pub severity: Severity,
    /// What is wrong, naming the field and value.
    pub message: String,
    /// How many more devices of the same slice have the same finding.
    #[serde(skip_serializing_if = "is_zero")]
    pub repeats: usize,
}

fn is_zero(count: &usize) -> bool {
    *count == 0
}

/// Every finding for `slices`, sorted by severity, then slice, device and class.
pub fn lint(slices: &[ResourceSlice]) -> Vec<Finding> {
    let mut findings = Vec::new();
    for slice in slices {
        let mut found = SliceFindings::new(slice);
        check_slice_spec(slice, &mut found);
        match drivers::known(&slice.spec.driver) {
            Some(driver) => check_known_driver(driver, slice, &mut found),
            None => found.push(
                None,
                Class::UnknownDriver,
                format!(
                    "driver {} is not in the operator's attribute dictionary; only the \
                     apiserver's rules were checked",
                    shown(&slice.spec.driver)
                ),
            ),
        }
        findings.extend(found.finish());
    }
    findings.sort_by(|a, b| {
        (a.severity, &a.slice, &a.device, a.class).cmp(&(b.severity, &b.slice, &b.device, b.class))
    });
    findings
}

/// Findings of one slice, capped at [`MAX_FINDINGS_PER_SLICE`] with a count of the rest.
struct SliceFindings {
    slice: String,
    driver: String,
    kept: Vec<Finding>,
    dropped: usize,
}

impl SliceFindings {
    fn new(slice: &ResourceSlice) -> Self {
        Self {
            slice: slice
                .metadata
                .name
                .as_deref()
                .map_or_else(|| "<unnamed>".to_string(), clip),
            driver: clip(&slice.spec.driver),
            kept: Vec::new(),
            dropped: 0,
        }
    }

    fn push(&mut self, device: Option<&str>, class: Class, message: String) {
        // The same finding on several devices of the slice (a driver's layout repeats itself
        // per device) is one row naming the first device and how many more.
        if let Some(same) = self
            .kept
            .iter_mut()
            .find(|f| f.class == class && f.message == message && f.device.is_some())
            && device.is_some()
        {
            same.repeats += 1;
            return;
        }
        if self.kept.len() >= MAX_FINDINGS_PER_SLICE {
            self.dropped += 1;
            return;
        }
        self.kept.push(Finding {
            slice: self.slice.clone(),
            driver: self.driver.clone(),
            device: device.map(clip),
            class,
            severity: class.severity(),
            message,
            repeats: 0,
        });
    }

    fn finish(mut self) -> Vec<Finding> {
        if self.dropped > 0
            && let Some(last) = self.kept.last_mut()
        {
            last.message.push_str(&format!(
                " ({} more findings in this slice not shown)",
                self.dropped
            ));
        }
        self.kept
    }
}

/// The apiserver's rules for the slice as a whole and for each device.
fn check_slice_spec(slice: &ResourceSlice, found: &mut SliceFindings) {
    let spec = &slice.spec;
    let refuse = |found: &mut SliceFindings, device: Option<&str>, why: String| {
        found.push(
            device,
            Class::Refused,
            format!("the apiserver refuses this slice: {why}"),
        );
    };
    if spec.driver.len() > MAX_DOMAIN_LENGTH || !is_valid_dns_subdomain(&spec.driver) {
        refuse(
            found,
            None,
            format!(
                "spec.driver {} is not a DNS subdomain of at most {MAX_DOMAIN_LENGTH} characters",
                shown(&spec.driver)
            ),
        );
    }
    let pool = &spec.pool;
    if pool.name.is_empty()
        || pool.name.len() > MAX_POOL_NAME_LENGTH
        || !pool.name.split('/').all(is_valid_dns_subdomain)
    {
        refuse(
            found,
            None,
            format!(
                "spec.pool.name {} is not '/'-separated DNS subdomains of at most \
                 {MAX_POOL_NAME_LENGTH} characters",
                shown(&pool.name)
            ),
        );
    }
    if pool.resource_slice_count <= 0 {
        refuse(
            found,
            None,
            format!(
                "spec.pool.resourceSliceCount {} must be greater than zero",
                pool.resource_slice_count
            ),
        );
    }
    if pool.generation < 0 {
        refuse(
            found,
            None,
            format!(
                "spec.pool.generation {} must not be negative",
                pool.generation
            ),
        );
    }
    let node_selection = [
        spec.node_name.as_ref().map(|_| "nodeName"),
        spec.node_selector.as_ref().map(|_| "nodeSelector"),
        spec.all_nodes.filter(|&all| all).map(|_| "allNodes"),
        spec.per_device_node_selection
            .filter(|&per| per)
            .map(|_| "perDeviceNodeSelection"),
    ];
    let set: Vec<&str> = node_selection.into_iter().flatten().collect();
    if set.len() != 1 {
        refuse(
            found,
            None,
            format!(
                "exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection must be \
                 set; {}",
                if set.is_empty() {
                    "none is".to_string()
                } else {
                    format!("{} are", set.join(", "))
                }
            ),
        );
    }
    if spec.node_name.as_deref() == Some("") {
        refuse(
            found,
            None,
            "spec.nodeName must be unset or a node's name, not empty".to_string(),
        );
    }
    let devices = spec.devices.as_deref().unwrap_or(&[]);
    let counter_sets = spec.shared_counters.as_deref().unwrap_or(&[]);
    if !devices.is_empty() && !counter_sets.is_empty() {
        refuse(
            found,
            None,
            "a slice holds devices or shared counters, not both (resource.k8s.io/v1 since 1.36)"
                .to_string(),
        );
    }
    let advanced = devices.iter().any(|d| {
        d.taints.as_ref().is_some_and(|t| !t.is_empty())
            || d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
    });
    let max_devices = if advanced {
        MAX_DEVICES_ADVANCED
    } else {
        MAX_DEVICES
    };
    if devices.len() > max_devices {
        refuse(
            found,
            None,
            format!(
                "{} devices, more than the {max_devices} a slice may hold{}",
                devices.len(),
                if advanced {
                    " when its devices have taints or consume counters"
                } else {
                    ""
                }
            ),
        );
    }
    let mut names = BTreeSet::new();
    for device in devices {
        let name = Some(device.name.as_str());
        if !is_valid_dns_label(&device.name) {
            refuse(
                found,
                name,
                format!("device name {} is not a DNS label", shown(&device.name)),
            );
        }
        if !names.insert(device.name.as_str()) {
            refuse(
                found,
                name,
                format!("device name {} appears twice", shown(&device.name)),
            );
        }
        for why in device_refusals(device) {
            refuse(found, name, why);
        }
    }
}

/// Why the apiserver refuses one device, if it does.
fn device_refusals(device: &Device) -> Vec<String> {
    let mut why = Vec::new();
    let attributes = device.attributes.as_ref();
    let capacity = device.capacity.as_ref();
    let count = attributes.map_or(0, BTreeMap::len) + capacity.map_or(0, BTreeMap::len);
    if count > MAX_ATTRIBUTES_AND_CAPACITIES {
        why.push(format!(
            "{count} attributes and capacities, more than {MAX_ATTRIBUTES_AND_CAPACITIES}"
        ));
    }
    for (name, value) in attributes.into_iter().flatten() {
        if let Some(bad) = qualified_name_problem(name) {
            why.push(format!("attribute name {}: {bad}", shown(name)));
        }
        if let Some(bad) = attribute_value_problem(value) {
            why.push(format!("attribute {}: {bad}", shown(name)));
        }
    }
    for (name, value) in capacity.into_iter().flatten() {
        if let Some(bad) = qualified_name_problem(name) {
            why.push(format!("capacity name {}: {bad}", shown(name)));
        }
        if !is_quantity(&value.value.0) {
            why.push(format!(
                "capacity {} value {} is not a quantity",
                shown(name),
                shown(&value.value.0)
            ));
        }
    }
    let taints = device.taints.as_deref().unwrap_or(&[]);
    if taints.len() > MAX_TAINTS {
        why.push(format!("{} taints, more than {MAX_TAINTS}", taints.len()));
    }
    for taint in taints {
        if !matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute" | "None") {
            why.push(format!(
                "taint {} has effect {}; NoSchedule, NoExecute or None",
                shown(&taint.key),
                shown(&taint.effect)
            ));
        }
    }
    let consumes = device.consumes_counters.as_deref().unwrap_or(&[]);
    if consumes.len() > MAX_COUNTER_CONSUMPTIONS {
        why.push(format!(
            "consumes {} counter sets, more than {MAX_COUNTER_CONSUMPTIONS}",
            consumes.len()
        ));
    }
    why
}

/// What is wrong with an attribute or capacity name (`[domain/]identifier`), if anything.
fn qualified_name_problem(name: &str) -> Option<String> {
    let (domain, id) = match name.split_once('/') {
        Some((domain, id)) => (Some(domain), id),
        None => (None, name),
    };
    if let Some(domain) = domain
        && (domain.len() > MAX_DOMAIN_LENGTH || !is_valid_dns_subdomain(domain))
    {
        return Some(format!(
            "the domain is not a DNS subdomain of at most {MAX_DOMAIN_LENGTH} characters"
        ));
    }
    if id.is_empty() || id.len() > MAX_ID_LENGTH || !is_c_identifier(id) {
        return Some(format!(
            "the name is not a C identifier of at most {MAX_ID_LENGTH} characters"
        ));
    }
    None
}

/// `[A-Za-z_][A-Za-z0-9_]*`.
fn is_c_identifier(id: &str) -> bool {
    let mut bytes = id.bytes();
    bytes
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// What is wrong with an attribute's value, if anything: exactly one of its kinds set, a
/// string of at most 64 bytes, a version that is semantic versioning 2.0.0.
fn attribute_value_problem(value: &DeviceAttribute) -> Option<String> {
    let kinds = usize::from(value.bool.is_some())
        + usize::from(value.int.is_some())
        + usize::from(value.string.is_some())
        + usize::from(value.version.is_some());
    if kinds != 1 {
        return Some(format!("{kinds} values set; exactly one must be"));
    }
    if let Some(text) = &value.string
        && text.len() > MAX_VALUE_LENGTH
    {
        return Some(format!(
            "string of {} bytes, longer than {MAX_VALUE_LENGTH}",
            text.len()
        ));
    }
    if let Some(version) = &value.version {
        if version.len() > MAX_VALUE_LENGTH {
            return Some(format!(
                "version of {} bytes, longer than {MAX_VALUE_LENGTH}",
                version.len()
            ));
        }
        if !is_semver(version) {
            return Some(format!(
                "version {} is not semantic versioning 2.0.0 (MAJOR.MINOR.PATCH, no leading \
                 zeros; publish it as a string instead)",
                shown(version)
            ));
        }
    }
    None
}

/// Semantic versioning 2.0.0 exactly as the apiserver's `semverRe` reads it: three numeric
/// identifiers without leading zeros, an optional `-` pre-release of dot-separated
/// identifiers (numeric ones without leading zeros), an optional `+` build of dot-separated
/// `[0-9A-Za-z-]+`.
pub fn is_semver(text: &str) -> bool {
    let (rest, build) = match text.split_once('+') {
        Some((rest, build)) => (rest, Some(build)),
        None => (text, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (rest, None),
    };
    let numeric = |part: &str| {
        !part.is_empty()
            && part.bytes().all(|b| b.is_ascii_digit())
            && (part == "0" || !part.starts_with('0'))
    };
    let core_parts: Vec<&str> = core.split('.').collect();
    if core_parts.len() != 3 || !core_parts.iter().all(|p| numeric(p)) {
        return false;
    }
    let pre_ok = pre.is_none_or(|pre| {
        pre.split('.').all(|id| {
            !id.is_empty()
                && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && (numeric(id) || !id.bytes().all(|b| b.is_ascii_digit()))
        })
    });
    let build_ok = build.is_none_or(|build| {
        build
            .split('.')
            .all(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    });
    pre_ok && build_ok
}

/// Kubernetes' quantity syntax: a signed decimal number, then a binary or decimal SI suffix
/// or a decimal exponent (`81559Mi`, `1.5G`, `1e3`, `500m`).
fn is_quantity(text: &str) -> bool {
    let body = text.strip_prefix(['+', '-']).unwrap_or(text);
    let digits_end = body
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(digits_end);
    let dots = number.matches('.').count();
    if number.is_empty() || number == "." || dots > 1 {
        return false;
    }
    const SUFFIXES: &[&str] = &[
        "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E",
    ];
    if SUFFIXES.contains(&suffix) {
        return true;
    }
    suffix
        .strip_prefix(['e', 'E'])
        .map(|exp| exp.strip_prefix(['+', '-']).unwrap_or(exp))
        .is_some_and(|exp| !exp.is_empty() && exp.bytes().all(|b| b.is_ascii_digit()))
}

/// The dictionary's checks for a slice of a known driver.
fn check_known_driver(driver: &KnownDriver, slice: &ResourceSlice, found: &mut SliceFindings) {
    let devices = slice.spec.devices.as_deref().unwrap_or(&[]);
    let counters = slice.spec.shared_counters.as_deref().unwrap_or(&[]);
    if devices.is_empty() && counters.is_empty() {
        found.push(
            None,
            Class::EmptySlice,
            format!(
                "{} publishes no device in this slice{}",
                driver.name,
                slice
                    .spec
                    .node_name
                    .as_deref()
                    .map(|node| format!(" for node {}", shown(node)))
                    .unwrap_or_default()
            ),
        );
    }
    for device in devices {
        let name = Some(device.name.as_str());
        for deprecated in driver.deprecated {
            if has_attribute(driver, device, deprecated.name) {
                found.push(
                    name,
                    Class::Deprecated,
                    format!(
                        "attribute {} is deprecated by {}; read {} instead",
                        deprecated.name, driver.name, deprecated.instead
                    ),
                );
            }
        }
        for (scoped, standard) in [
            ("pciBusID", STANDARD_PCI_BUS_ID),
            ("pcieRoot", STANDARD_PCIE_ROOT),
            ("numaNode", NUMA_NODE),
        ] {
            if has_attribute(driver, device, scoped) && !has_attribute(driver, device, standard) {
                found.push(
                    name,
                    Class::DriverScoped,
                    format!(
                        "{}/{scoped} without DRA's standard {standard}: selectors and \
                         matchAttribute constraints across drivers use the standard name",
                        driver.name
                    ),
                );
            }
        }
        if let Some(numa) = int_attribute(driver, device, NUMA_NODE)
            .or_else(|| int_attribute(driver, device, "numaNode"))
            && numa < 0
        {
            found.push(
                name,
                Class::Sentinel,
                format!("NUMA node {numa}: the driver could not read the device's NUMA affinity"),
            );
        }
    }
    // The per-device facts as the planner reads them: one reading, one rule. The slice is
    // read as a pool of its own, so a pool split over several slices (counters in one,
    // devices in another) or a file holding only part of a pool is still checked; what is
    // read here does not depend on the other slices (counters only add "cannot be met").
    let mut alone = slice.clone();
    alone.spec.pool.resource_slice_count = 1;
    let read = published_devices(std::slice::from_ref(&alone));
    let by_name: BTreeMap<&str, &Device> = devices.iter().map(|d| (d.name.as_str(), d)).collect();
    for published in read.nodes.values().flatten() {
        let Some(device) = by_name.get(published.reference.device.as_str()) else {
            continue;
        };
        let name = Some(device.name.as_str());
        if let Some(why) = &published.memory_unknown {
            found.push(
                name,
                Class::Sentinel,
                format!("{why}: the device's memory is unknown, so it is not planned on"),
            );
        }
        // Partitions, aggregates and VFIO siblings are not whole devices: their identity is
        // their parent's, and what they lack says nothing about the publisher.
        let whole = published.parent_bus_id.is_none()
            && published
                .unusable
                .as_deref()
                .is_none_or(|why| !why.starts_with("a partition") && !why.starts_with("an entry"));
        if !whole {
            continue;
        }
        // Only where the driver's layout has an identity to publish (the Neuron driver
        // documents neither).
        let publishes_identity =
            driver.uuid.is_some() || driver.pci_address.is_some() || driver.whole_device.is_some();
        if publishes_identity && published.pci_bus_id.is_none() && published.uuid.is_none() {
            found.push(
                name,
                Class::MissingFact,
                "no PCI bus id and no UUID: it cannot be matched to a detected device, so it is \
                 counted apart from the node's inventory"
                    .to_string(),
            );
        }
        if published.product.is_none()
            && let ProductSource::Attribute(attribute) = driver.product
        {
            let placeholder = string_attribute(driver, device, attribute);
            found.push(
                name,
                if placeholder.is_some() {
                    Class::Sentinel
                } else {
                    Class::MissingFact
                },
                match placeholder {
                    Some(text) => format!("product {attribute} is {text}, a placeholder"),
                    None => format!("no product name ({attribute})"),
                },
            );
        }
        if let Some(memory) = driver.memory
            && published.memory_bytes.is_none()
            && published.memory_unknown.is_none()
        {
            found.push(
                name,
                Class::MissingFact,
                format!("no {memory} capacity: the device's memory comes from the product table or nowhere"),
            );
        }
    }
}

/// True when the device has `name` as written or in the driver's own domain.
fn has_attribute(driver: &KnownDriver, device: &Device, name: &str) -> bool {
    attribute(driver, device, name).is_some()
}

fn int_attribute(driver: &KnownDriver, device: &Device, name: &str) -> Option<i64> {
    attribute(driver, device, name)?.int
}

fn string_attribute(driver: &KnownDriver, device: &Device, name: &str) -> Option<String> {
    attribute(driver, device, name)?
        .string
        .as_deref()
        .map(shown)
}

/// A name from a slice as a finding's field holds it: cut to [`MAX_SHOWN`] bytes.
fn clip(text: &str) -> String {
    truncate_at_char_boundary(text, MAX_SHOWN).to_string()
}

/// A text from a slice as a message shows it: quoted, cut to [`MAX_SHOWN`] bytes.
fn shown(text: &str) -> String {
    let cut = truncate_at_char_boundary(text, MAX_SHOWN);
    if cut.len() < text.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

#[cfg(test)]
mod tests;
