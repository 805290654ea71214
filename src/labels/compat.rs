//! Compatibility labels: the few vendor labels other tools still read (`nvidia.com/gpu.product`,
//! `.count`, `.memory`, `.family` as NVIDIA's GPU Feature Discovery writes them, and
//! `amd.com/gpu.product-name` as AMD's node labeller writes it), for clusters where those
//! labelers no longer run (the GPU Operator's DRA-only mode deploys no GFD). Pure: no I/O.
//!
//! Values follow the vendors' own formats, checked against their sources (see
//! `docs/labels.md`): GFD's product is the model with characters outside `[A-Za-z0-9-_. ]`
//! removed and runs of spaces joined by `-` (`NVIDIA-H100-80GB-HBM3`); memory is one GPU's
//! MiB; family is the architecture named from the CUDA compute capability (`hopper`). The AMD
//! labeller's product name has spaces turned into `_` and parentheses removed
//! (`AMD_Instinct_MI300X_OAM`). A value that needs every GPU to agree (product, memory,
//! family) is left out on a node whose GPUs differ; a value that is not a valid label value
//! is left out, never mangled into another.
//!
//! Each vendor's keys form a group that is written whole or not at all: when any key of a
//! group is held by someone else (GFD, the AMD labeller, an administrator), the whole group is
//! left to them ([`without_foreign_groups`]), so the labels on a node never mix two sources.

use std::collections::{BTreeMap, BTreeSet};

use crate::hardware::{Device, Family, Report, Vendor};
use crate::names::is_valid_label_value;

/// GFD's product label.
pub const NVIDIA_PRODUCT: &str = "nvidia.com/gpu.product";
/// GFD's count of full GPUs.
pub const NVIDIA_COUNT: &str = "nvidia.com/gpu.count";
/// GFD's memory of one GPU, in MiB.
pub const NVIDIA_MEMORY: &str = "nvidia.com/gpu.memory";
/// GFD's architecture family.
pub const NVIDIA_FAMILY: &str = "nvidia.com/gpu.family";
/// The AMD node labeller's product name.
pub const AMD_PRODUCT_NAME: &str = "amd.com/gpu.product-name";

/// Every key compatibility labels may write, by group: a group is written whole or not at all.
pub const GROUPS: &[&[&str]] = &[
    &[NVIDIA_PRODUCT, NVIDIA_COUNT, NVIDIA_MEMORY, NVIDIA_FAMILY],
    &[AMD_PRODUCT_NAME],
];

/// The compatibility labels `report` calls for (before any ownership check).
pub fn compat_labels(report: &Report) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let gpus = |vendor: Vendor| -> Vec<&Device> {
        report
            .accelerators()
            .filter(|d| d.vendor == vendor && d.family == Family::Gpu)
            .collect()
    };
    let nvidia = gpus(Vendor::Nvidia);
    if !nvidia.is_empty() {
        labels.insert(NVIDIA_COUNT.to_string(), nvidia.len().to_string());
        put(
            &mut labels,
            NVIDIA_PRODUCT,
            agreed(&nvidia, |d| gfd_product(&d.model)),
        );
        put(
            &mut labels,
            NVIDIA_MEMORY,
            agreed(&nvidia, |d| {
                d.memory_bytes
                    .filter(|&b| b > 0)
                    .map(|b| (b >> 20).to_string())
            }),
        );
        put(&mut labels, NVIDIA_FAMILY, agreed(&nvidia, gfd_family));
    }
    let amd = gpus(Vendor::Amd);
    put(
        &mut labels,
        AMD_PRODUCT_NAME,
        agreed(&amd, |d| amd_product_name(&d.model)),
    );
    labels
}

/// `desired` without every group of which some key is held by someone else (`foreign`
/// says whether a key is).
pub fn without_foreign_groups(
    desired: &BTreeMap<String, String>,
    foreign: impl Fn(&str) -> bool,
) -> (BTreeMap<String, String>, BTreeSet<String>) {
    let mut kept = desired.clone();
    let mut yielded = BTreeSet::new();
    for group in GROUPS {
        if let Some(held) = group.iter().find(|key| foreign(key)) {
            yielded.insert((*held).to_string());
            for key in *group {
                kept.remove(*key);
            }
        }
    }
    (kept, yielded)
}

fn put(labels: &mut BTreeMap<String, String>, key: &str, value: Option<String>) {
    if let Some(value) = value.filter(|v| is_valid_label_value(v)) {
        labels.insert(key.to_string(), value);
    }
}

/// The one value `of` gives for every device, or `None` when any gives none or two differ.
fn agreed(devices: &[&Device], of: impl Fn(&Device) -> Option<String>) -> Option<String> {
    let mut values = devices.iter().map(|d| of(d));
    let first = values.next()??;
    values
        .all(|v| v.as_deref() == Some(&first))
        .then_some(first)
}

/// GFD's product value: characters outside `[A-Za-z0-9-_. ]` removed, whitespace runs
/// joined by `-` (NVIDIA/k8s-device-plugin `internal/lm/resource.go`, `sanitise`).
pub fn gfd_product(model: &str) -> Option<String> {
    let kept: String = model
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' '))
        .collect();
    let joined = kept.split_whitespace().collect::<Vec<_>>().join("-");
    (!joined.is_empty()).then_some(joined)
}

/// GFD's family value: the architecture named from the compute capability (`getArchFamily`
/// in the same file); a capability it does not name, or none, gives nothing (GFD writes
/// `undefined`, which no tool matches on).
pub fn gfd_family(device: &Device) -> Option<String> {
    let capability = device.compute_capability.as_deref()?;
    let (major, minor) = capability
        .trim()
        .split_once('.')
        .unwrap_or((capability, "0"));
    let major: u32 = major.trim().parse().ok()?;
    let minor: u32 = minor.trim().split('.').next()?.parse().ok()?;
    let family = match (major, minor) {
        (1, _) => "tesla",
        (2, _) => "fermi",
        (3, _) => "kepler",
        (5, _) => "maxwell",
        (6, _) => "pascal",
        (7, m) if m < 5 => "volta",
        (7, _) => "turing",
        (8, m) if m < 9 => "ampere",
        (8, _) => "ada-lovelace",
        (9, _) => "hopper",
        (10 | 12, _) => "blackwell",
        (13, _) => "rubin",
        _ => return None,
    };
    Some(family.to_string())
}

/// The AMD labeller's product-name value: spaces to `_`, parentheses removed
/// (ROCm/k8s-device-plugin `cmd/k8s-node-labeller/main.go`, `product-name`).
pub fn amd_product_name(model: &str) -> Option<String> {
    let name: String = model
        .trim()
        .chars()
        .filter(|c| !matches!(c, '(' | ')'))
        .map(|c| if c == ' ' { '_' } else { c })
        .collect();
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Device;

    fn gpu(vendor: Vendor, model: &str, mib: Option<u64>, cc: Option<&str>) -> Device {
        let mut device = Device::new("0000:01:00.0", vendor, Family::Gpu, model, "test");
        device.memory_bytes = mib.map(|m| m << 20);
        device.compute_capability = cc.map(str::to_string);
        device
    }

    fn report(devices: Vec<Device>) -> Report {
        let mut report = Report::empty();
        report.devices = devices;
        report
    }

    #[test]
    fn an_h100_node_gets_gfds_own_values() {
        let h100 = gpu(
            Vendor::Nvidia,
            "NVIDIA H100 80GB HBM3",
            Some(81_559),
            Some("9.0"),
        );
        let labels = compat_labels(&report(vec![h100; 8]));
        let want: BTreeMap<String, String> = [
            (NVIDIA_PRODUCT, "NVIDIA-H100-80GB-HBM3"),
            (NVIDIA_COUNT, "8"),
            (NVIDIA_MEMORY, "81559"),
            (NVIDIA_FAMILY, "hopper"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(labels, want);
    }

    #[test]
    fn values_follow_the_vendors_formats() {
        assert_eq!(
            gfd_product("NVIDIA  A100-SXM4-40GB (rev a1)").as_deref(),
            Some("NVIDIA-A100-SXM4-40GB-rev-a1")
        );
        assert_eq!(gfd_product("@@@"), None);
        assert_eq!(
            amd_product_name("AMD Instinct MI300X OAM").as_deref(),
            Some("AMD_Instinct_MI300X_OAM")
        );
        assert_eq!(
            amd_product_name("AMD Radeon (TM) PRO W7900").as_deref(),
            Some("AMD_Radeon_TM_PRO_W7900")
        );
        for (cc, family) in [
            ("8.0", Some("ampere")),
            ("8.9", Some("ada-lovelace")),
            ("7.5", Some("turing")),
            ("7.0", Some("volta")),
            ("10.0", Some("blackwell")),
            ("12.0", Some("blackwell")),
            ("11.0", None),
            ("nine", None),
        ] {
            let device = gpu(Vendor::Nvidia, "x", None, Some(cc));
            assert_eq!(gfd_family(&device).as_deref(), family, "{cc}");
        }
    }

    #[test]
    fn disagreeing_or_unknown_values_are_left_out_and_count_stays() {
        let labels = compat_labels(&report(vec![
            gpu(Vendor::Nvidia, "NVIDIA L4", Some(23_034), Some("8.9")),
            gpu(Vendor::Nvidia, "NVIDIA A100-SXM4-80GB", None, Some("8.0")),
            gpu(Vendor::Amd, "AMD Instinct MI300X", Some(196_592), None),
        ]));
        assert_eq!(labels.get(NVIDIA_COUNT).map(String::as_str), Some("2"));
        assert!(!labels.contains_key(NVIDIA_PRODUCT));
        assert!(!labels.contains_key(NVIDIA_MEMORY), "one size unknown");
        assert!(!labels.contains_key(NVIDIA_FAMILY));
        assert_eq!(
            labels.get(AMD_PRODUCT_NAME).map(String::as_str),
            Some("AMD_Instinct_MI300X")
        );
        // A product name too long for a label value is left out, not cut.
        let long = gpu(Vendor::Amd, &"X".repeat(70), None, None);
        assert!(compat_labels(&report(vec![long])).is_empty());
        assert!(compat_labels(&report(Vec::new())).is_empty());
    }

    #[test]
    fn a_group_held_by_someone_else_is_left_whole() {
        let h100 = gpu(Vendor::Nvidia, "NVIDIA H100", Some(81_559), Some("9.0"));
        let amd = gpu(Vendor::Amd, "AMD Instinct MI300X", None, None);
        let desired = compat_labels(&report(vec![h100, amd]));
        let (kept, yielded) = without_foreign_groups(&desired, |k| k == NVIDIA_PRODUCT);
        assert_eq!(kept.keys().collect::<Vec<_>>(), [AMD_PRODUCT_NAME]);
        assert_eq!(yielded.into_iter().collect::<Vec<_>>(), [NVIDIA_PRODUCT]);
        // A held key of the group we would not even write still yields the group.
        let (kept, _) = without_foreign_groups(&desired, |k| k == NVIDIA_FAMILY);
        assert!(!kept.keys().any(|k| k.starts_with("nvidia.com/")));
        let (kept, yielded) = without_foreign_groups(&desired, |_| false);
        assert_eq!(kept, desired);
        assert!(yielded.is_empty());
    }
}
