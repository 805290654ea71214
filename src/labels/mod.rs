//! Turns a detection report into node labels under `hwaccel.io/`. Pure: no I/O, no `kube`.
//!
//! The scheme (every key, with examples and reasons, is in `docs/labels.md`) is built to avoid
//! what goes wrong with existing labelers:
//! - **Mixed nodes are deterministic.** Single-valued labels (`product`, `memory-gib`,
//!   `architecture`...) appear only when every accelerator agrees; per-product counts
//!   (`count.<product-slug>`) always appear, so a node with 2× L4 and 1× A100 says exactly that.
//! - **Every key and value is valid.** Values are sanitised; long ones are shortened to 63
//!   characters with a hash suffix (the full text stays in the AcceleratorInventory); a value
//!   that cannot be saved is dropped *alone* and reported in [`Labels::dropped`], so one bad
//!   value never fails the whole patch.
//! - **No churn.** Nothing time-dependent or health-dependent is a label; the same report
//!   gives the same labels, byte for byte, whatever the order devices were found in.

pub mod compat;

use std::collections::{BTreeMap, BTreeSet};

use crate::hardware::Report;
use crate::hardware::{Device, GIB, Precision};
use crate::names::{
    MAX_LABEL_LENGTH, is_valid_label_key, sanitize_value_noting_shortening, shorten_with_hash,
    slugify,
};

/// The prefix of every label this crate owns (and the only one the agent ever writes).
pub use crate::names::keys::LABEL_PREFIX;

/// The labels for one node, and what could not become a label.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels {
    /// Key to value, every pair valid for Kubernetes.
    pub labels: BTreeMap<String, String>,
    /// Labels left out, as (key, reason): a value with nothing usable in it, an invalid key.
    pub dropped: Vec<(String, String)>,
    /// Labels whose value or key name was shortened with a hash suffix, as (key, full text).
    pub shortened: Vec<(String, String)>,
}

impl Labels {
    /// Adds `hwaccel.io/<name>=<value>`, sanitising and shortening as needed; a pair that
    /// cannot be made valid is dropped and recorded, never an error.
    fn put(&mut self, name: &str, raw_value: &str) {
        let (key, key_shortened) = key_for(name);
        if !is_valid_label_key(&key) {
            self.dropped.push((key, "invalid label key".to_string()));
            return;
        }
        if key_shortened {
            self.shortened
                .push((key.clone(), format!("{LABEL_PREFIX}{name}")));
        }
        let Some((value, shortened)) = sanitize_value_noting_shortening(raw_value) else {
            let reason = format!("value {raw_value:?} has no characters a label value allows");
            self.dropped.push((key, reason));
            return;
        };
        if shortened {
            self.shortened.push((key.clone(), raw_value.to_string()));
        }
        self.labels.insert(key, value);
    }

    fn flag(&mut self, name: &str) {
        self.put(name, "true");
    }

    /// Adds [`DEVICES_MISSING_LABEL`] when `missing` is above zero. Not part of
    /// [`labels_for`]: the count compares detection with what the node should have, which the
    /// agent learns from the Node, not from the report.
    pub fn set_devices_missing(&mut self, missing: u32) {
        if missing > 0 {
            self.put(DEVICES_MISSING_NAME, &missing.to_string());
        }
    }
}

const DEVICES_MISSING_NAME: &str = "devices-missing";
/// Accelerators the node should have but the last detection did not see; absent when none.
pub use crate::names::keys::DEVICES_MISSING_LABEL;

/// The full key for a name under our prefix; a name over 63 characters keeps a readable head
/// and a hash suffix. The flag says whether it was shortened.
fn key_for(name: &str) -> (String, bool) {
    if name.len() <= MAX_LABEL_LENGTH {
        return (format!("{LABEL_PREFIX}{name}"), false);
    }
    let short = shorten_with_hash(name, name, MAX_LABEL_LENGTH);
    (format!("{LABEL_PREFIX}{short}"), true)
}

/// The readable product slug of a device: its model as a lowercase slug, prefixed by the
/// vendor when the model does not already start with it (`NVIDIA H100 80GB HBM3` →
/// `nvidia-h100-80gb-hbm3`, TPU `v5e` → `google-v5e`). Never empty.
///
/// Not length-limited: callers that put it in a label shorten it to fit.
pub fn product_slug(device: &Device) -> String {
    let vendor = device.vendor.as_str();
    let model = slugify(&device.model);
    if model.is_empty() {
        format!("{vendor}-{}", device.family.as_str())
    } else if model == vendor || model.starts_with(&format!("{vendor}-")) {
        model
    } else {
        format!("{vendor}-{model}")
    }
}

/// The product as a label value: the [`product_slug`], shortened to 63 characters with a
/// hash suffix when longer. The inventory's `product` attribute holds the same text, so a
/// node's `hwaccel.io/product` label can be matched against its devices.
pub fn product_label_value(device: &Device) -> String {
    fit_with_hash(&product_slug(device), MAX_LABEL_LENGTH)
}

/// `text` unchanged when it fits in `max` bytes, otherwise its head and a hash of the whole.
/// The hash is of `text` alone, so a product's shortened label value and its shortened
/// `count.` key end in the same ten hex digits.
fn fit_with_hash(text: &str, max: usize) -> String {
    if text.len() <= max {
        text.to_string()
    } else {
        shorten_with_hash(text, text, max)
    }
}

/// The labels for the node a report describes.
pub fn labels_for(report: &Report) -> Labels {
    let mut labels = Labels::default();
    let accelerators: Vec<&Device> = report.accelerators().collect();
    labels.put(
        "present",
        if accelerators.is_empty() {
            "false"
        } else {
            "true"
        },
    );
    if !accelerators.is_empty() {
        accelerator_labels(&mut labels, report, &accelerators);
    }
    cpu_labels(&mut labels, &report.node.cpu.ai_flags);
    labels.dropped.sort();
    labels.dropped.dedup();
    labels.shortened.sort();
    labels.shortened.dedup();
    labels
}

/// Everything about the accelerators; called only when there is at least one.
fn accelerator_labels(labels: &mut Labels, report: &Report, accelerators: &[&Device]) {
    labels.put("count", &accelerators.len().to_string());
    identity_labels(labels, accelerators);
    memory_labels(labels, accelerators);
    precision_labels(labels, accelerators);
    driver_labels(labels, accelerators);
    interconnect_labels(labels, report);
    partition_labels(labels, accelerators);
}

/// Per-product counts always; vendor, family, product, architecture and compute capability
/// only when every accelerator has the same one.
fn identity_labels(labels: &mut Labels, accelerators: &[&Device]) {
    let mut per_product: BTreeMap<String, usize> = BTreeMap::new();
    for device in accelerators {
        *per_product.entry(product_slug(device)).or_default() += 1;
    }
    const COUNT: &str = "count.";
    for (slug, count) in &per_product {
        let part = fit_with_hash(slug, MAX_LABEL_LENGTH - COUNT.len());
        if part != *slug {
            labels.shortened.push((
                format!("{LABEL_PREFIX}{COUNT}{part}"),
                format!("{LABEL_PREFIX}{COUNT}{slug}"),
            ));
        }
        labels.put(&format!("{COUNT}{part}"), &count.to_string());
    }
    if let Some(vendor) = common(accelerators, |d| Some(d.vendor.as_str().to_string())) {
        labels.put("vendor", &vendor);
    }
    if let Some(family) = common(accelerators, |d| Some(d.family.as_str().to_string())) {
        labels.put("family", &family);
    }
    if let Some(product) = common(accelerators, |d| Some(product_slug(d))) {
        if product.len() > MAX_LABEL_LENGTH {
            labels
                .shortened
                .push((format!("{LABEL_PREFIX}product"), product.clone()));
        }
        labels.put("product", &fit_with_hash(&product, MAX_LABEL_LENGTH));
    }
    if let Some(arch) = common(accelerators, |d| d.architecture.clone()) {
        labels.put("architecture", &arch);
    }
    if let Some(cc) = common(accelerators, |d| d.compute_capability.clone()) {
        labels.put("compute-capability", &cc);
    }
}

/// Per-device memory (GiB, rounded to nearest) when all devices are one product with one
/// memory size; the node's total whenever any device reports its memory.
fn memory_labels(labels: &mut Labels, accelerators: &[&Device]) {
    let one_product = common(accelerators, |d| Some(product_slug(d))).is_some();
    if one_product && let Some(bytes) = common(accelerators, |d| d.memory_bytes) {
        labels.put("memory-gib", &rounded_gib(bytes).to_string());
    }
    let known: Vec<u64> = accelerators.iter().filter_map(|d| d.memory_bytes).collect();
    if !known.is_empty() {
        let total = known
            .iter()
            .fold(0u64, |sum, bytes| sum.saturating_add(*bytes));
        labels.put("memory-total-gib", &rounded_gib(total).to_string());
    }
}

/// Bytes to whole GiB, rounded to nearest: an H100's 81559 MiB reads 80, as sold.
fn rounded_gib(bytes: u64) -> u64 {
    bytes / GIB + u64::from(bytes % GIB >= GIB / 2)
}

/// One `precision.<p>=true` per precision that *every* accelerator supports, so a pod that
/// selects on it runs whichever device it gets; a device with unknown precisions makes the
/// set empty rather than guessed.
fn precision_labels(labels: &mut Labels, accelerators: &[&Device]) {
    let mut shared: Option<BTreeSet<Precision>> = None;
    for device in accelerators {
        shared = Some(match shared {
            None => device.precisions.clone(),
            Some(set) => set.intersection(&device.precisions).copied().collect(),
        });
    }
    for precision in shared.unwrap_or_default() {
        labels.flag(&format!("precision.{precision}"));
    }
}

/// Driver version per vendor (full and major), when that vendor's devices agree on it.
fn driver_labels(labels: &mut Labels, accelerators: &[&Device]) {
    let mut by_vendor: BTreeMap<&str, Vec<&Device>> = BTreeMap::new();
    for device in accelerators {
        by_vendor
            .entry(device.vendor.as_str())
            .or_default()
            .push(device);
    }
    for (vendor, devices) in by_vendor {
        let Some(version) = common(&devices, |d| d.driver_version.clone()) else {
            continue;
        };
        labels.put(&format!("driver.{vendor}.version"), &version);
        if let Some(major) = version_major(&version) {
            labels.put(&format!("driver.{vendor}.major"), major);
        }
    }
}

/// The leading run of digits of a version (`550.54.15` → `550`), if any.
fn version_major(version: &str) -> Option<&str> {
    let trimmed = version.trim().trim_start_matches(['v', 'V']);
    let end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    (end > 0).then(|| &trimmed[..end])
}

/// The fabrics on the node: one flag per kind, the kind alone when there is only one, and the
/// size of the largest group (how many devices can do tensor parallelism over the fabric).
fn interconnect_labels(labels: &mut Labels, report: &Report) {
    let kinds: BTreeSet<&str> = report
        .interconnects
        .iter()
        .map(|group| group.kind.as_str())
        .collect();
    for kind in &kinds {
        labels.flag(&format!("interconnect.{kind}"));
    }
    if kinds.len() == 1
        && let Some(kind) = kinds.first()
    {
        labels.put("interconnect", kind);
    }
    if let Some(largest) = report.interconnects.iter().map(|g| g.devices.len()).max() {
        labels.put("interconnect-group-size", &largest.to_string());
    }
}

/// Whether any accelerator is partitioned (MIG, AMD compute/memory modes), and which schemes.
fn partition_labels(labels: &mut Labels, accelerators: &[&Device]) {
    let kinds: BTreeSet<String> = accelerators
        .iter()
        .flat_map(|d| d.partitions.iter().map(|p| slugify(&p.kind)))
        .collect();
    labels.put(
        "partitioned",
        if kinds.is_empty() { "false" } else { "true" },
    );
    for kind in kinds.iter().filter(|k| !k.is_empty()) {
        labels.flag(&format!("partition.{kind}"));
    }
}

/// One `cpu.<flag>=true` per AI-relevant ISA extension, plus `cpu.avx512` and `cpu.amx`
/// rollups so a selector need not know every sub-flag.
fn cpu_labels(labels: &mut Labels, ai_flags: &[String]) {
    let flags: BTreeSet<String> = ai_flags
        .iter()
        .map(|f| f.trim().to_ascii_lowercase())
        .collect();
    for flag in &flags {
        labels.flag(&format!("cpu.{flag}"));
    }
    if flags.iter().any(|f| f.starts_with("avx512")) {
        labels.flag("cpu.avx512");
    }
    if flags.iter().any(|f| f.starts_with("amx")) {
        labels.flag("cpu.amx");
    }
}

/// The value every device has for `field`, when all have one and they agree.
fn common<T: PartialEq>(devices: &[&Device], field: impl Fn(&Device) -> Option<T>) -> Option<T> {
    let mut values = devices.iter().map(|d| field(d));
    let first = values.next()??;
    values.all(|v| v.as_ref() == Some(&first)).then_some(first)
}

#[cfg(test)]
mod tests;
