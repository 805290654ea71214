//! Label scheme tests: table-style cases on hand-built reports, and properties over arbitrary
//! reports (every label valid, same input same labels, device order irrelevant).

use proptest::prelude::*;

use super::*;
use crate::hardware::{Family, InterconnectGroup, InterconnectKind, Partition, Vendor};
use crate::names::{hash_hex, is_valid_label_value};
use crate::testing::arbitrary::arb_report;
use crate::testing::golden::assert_golden;
use crate::testing::report::{
    cpu_only, h100_x8, mixed_l4_a100, nvidia_gpu, overlong_product, report_with, scenarios,
};

fn get<'a>(labels: &'a Labels, name: &str) -> Option<&'a str> {
    labels
        .labels
        .get(&format!("{LABEL_PREFIX}{name}"))
        .map(String::as_str)
}

#[test]
fn homogeneous_h100_node() {
    let labels = labels_for(&h100_x8());
    let expected = [
        ("present", "true"),
        ("count", "8"),
        ("count.nvidia-h100-80gb-hbm3", "8"),
        ("vendor", "nvidia"),
        ("family", "gpu"),
        ("product", "nvidia-h100-80gb-hbm3"),
        ("architecture", "hopper"),
        ("compute-capability", "9.0"),
        ("memory-gib", "80"),
        ("memory-total-gib", "637"),
        ("driver.nvidia.version", "550.54.15"),
        ("driver.nvidia.major", "550"),
        ("interconnect", "nvswitch"),
        ("interconnect.nvswitch", "true"),
        ("interconnect-group-size", "8"),
        ("partitioned", "false"),
        ("precision.fp8", "true"),
        ("precision.bf16", "true"),
        ("cpu.amx", "true"),
        ("cpu.amx_tile", "true"),
        ("cpu.avx512", "true"),
    ];
    for (name, value) in expected {
        assert_eq!(get(&labels, name), Some(value), "{name}");
    }
    assert_eq!(get(&labels, "precision.nvfp4"), None);
    assert!(labels.dropped.is_empty(), "{:?}", labels.dropped);
    assert!(labels.shortened.is_empty());
}

#[test]
fn mixed_node_has_counts_but_no_single_product() {
    let labels = labels_for(&mixed_l4_a100());
    assert_eq!(get(&labels, "count"), Some("3"));
    assert_eq!(get(&labels, "count.nvidia-l4"), Some("2"));
    assert_eq!(get(&labels, "count.nvidia-a100-sxm4-40gb"), Some("1"));
    // Shared facts still appear; facts that differ do not.
    assert_eq!(get(&labels, "vendor"), Some("nvidia"));
    assert_eq!(get(&labels, "family"), Some("gpu"));
    assert_eq!(get(&labels, "driver.nvidia.major"), Some("550"));
    for absent in [
        "product",
        "memory-gib",
        "architecture",
        "compute-capability",
    ] {
        assert_eq!(get(&labels, absent), None, "{absent}");
    }
    // 2 × 22.5 GiB + 40 GiB.
    assert_eq!(get(&labels, "memory-total-gib"), Some("85"));
    // A100 has no FP8, so the node does not promise it; both have BF16.
    assert_eq!(get(&labels, "precision.fp8"), None);
    assert_eq!(get(&labels, "precision.bf16"), Some("true"));
}

#[test]
fn mixed_node_labels_do_not_depend_on_device_order() {
    let report = mixed_l4_a100();
    let mut reversed = report.clone();
    reversed.devices.reverse();
    assert_eq!(labels_for(&report), labels_for(&reversed));
}

#[test]
fn overlong_product_gives_valid_shortened_labels() {
    let report = overlong_product();
    let labels = labels_for(&report);
    let product = get(&labels, "product").expect("product label");
    assert_eq!(product.len(), MAX_LABEL_LENGTH);
    assert!(product.starts_with("other-contoso-hyperscale-inference-accelerator-modul"));
    assert!(is_valid_label_value(product));
    let count_key = labels
        .labels
        .keys()
        .find(|k| k.starts_with("hwaccel.io/count.other-contoso"))
        .expect("count label");
    assert!(is_valid_label_key(count_key), "{count_key}");
    assert_eq!(labels.labels[count_key], "1");
    let full = product_slug(&report.devices[0]);
    let full_entry = ("hwaccel.io/product".to_string(), full.clone());
    assert!(labels.shortened.contains(&full_entry));
    assert!(labels.shortened.iter().any(|(key, _)| key == count_key));
    // Value and count key end in the same hash, that of the full slug.
    assert!(product.ends_with(&hash_hex(&full)));
    assert!(count_key.ends_with(&hash_hex(&full)));
    assert_eq!(product, product_label_value(&report.devices[0]));
    assert!(labels.dropped.is_empty());
}

#[test]
fn cpu_only_node() {
    let labels = labels_for(&cpu_only());
    assert_eq!(get(&labels, "present"), Some("false"));
    assert_eq!(get(&labels, "cpu.avx512"), Some("true"));
    assert_eq!(get(&labels, "cpu.avx512_bf16"), Some("true"));
    assert_eq!(get(&labels, "cpu.amx"), None);
    for absent in [
        "count",
        "product",
        "family",
        "partitioned",
        "memory-total-gib",
    ] {
        assert_eq!(get(&labels, absent), None, "{absent}");
    }
    assert!(labels.labels.keys().all(|k| k.starts_with(LABEL_PREFIX)));
}

#[test]
fn one_bad_value_is_dropped_alone() {
    let mut gpu = nvidia_gpu("0000:18:00.0", "NVIDIA H100", 81559, "hopper", "9.0");
    gpu.driver_version = Some("???".to_string());
    let labels = labels_for(&report_with(vec![gpu]));
    assert_eq!(get(&labels, "driver.nvidia.version"), None);
    assert_eq!(labels.dropped.len(), 1, "{:?}", labels.dropped);
    assert_eq!(labels.dropped[0].0, "hwaccel.io/driver.nvidia.version");
    assert_eq!(get(&labels, "product"), Some("nvidia-h100"));
}

#[test]
fn partitions_and_multiple_fabrics() {
    let mut report = h100_x8();
    report.devices[0].partitions.push(Partition {
        kind: "mig".into(),
        profile: "1g.10gb".into(),
        id: Some("1".into()),
        memory_bytes: None,
    });
    report.interconnects.push(InterconnectGroup {
        kind: InterconnectKind::Nvlink,
        id: "pair".into(),
        devices: vec!["0000:18:00.0".into(), "0000:2a:00.0".into()],
        links_per_device: None,
        bandwidth_gbps: None,
        topology: None,
    });
    let labels = labels_for(&report);
    assert_eq!(get(&labels, "partitioned"), Some("true"));
    assert_eq!(get(&labels, "partition.mig"), Some("true"));
    assert_eq!(get(&labels, "interconnect"), None);
    assert_eq!(get(&labels, "interconnect.nvlink"), Some("true"));
    assert_eq!(get(&labels, "interconnect.nvswitch"), Some("true"));
    assert_eq!(get(&labels, "interconnect-group-size"), Some("8"));
}

#[test]
fn product_slugs_read_well() {
    let slug = |vendor, family, model: &str| {
        product_slug(&crate::hardware::Device::new(
            "x", vendor, family, model, "t",
        ))
    };
    assert_eq!(
        slug(Vendor::Nvidia, Family::Gpu, "NVIDIA H100 80GB HBM3"),
        "nvidia-h100-80gb-hbm3"
    );
    assert_eq!(
        slug(Vendor::Nvidia, Family::Gpu, "Tesla T4"),
        "nvidia-tesla-t4"
    );
    assert_eq!(
        slug(Vendor::Amd, Family::Gpu, "AMD Instinct MI300X"),
        "amd-instinct-mi300x"
    );
    assert_eq!(slug(Vendor::Google, Family::Tpu, "v5e"), "google-v5e");
    assert_eq!(slug(Vendor::Aws, Family::Asic, ""), "aws-asic");
    assert_eq!(slug(Vendor::Other, Family::Asic, "???"), "other-asic");
}

#[test]
fn version_majors() {
    assert_eq!(version_major("550.54.15"), Some("550"));
    assert_eq!(version_major("v6.7.0"), Some("6"));
    assert_eq!(version_major("1.18.0-22"), Some("1"));
    assert_eq!(version_major("unknown"), None);
}

#[test]
fn gib_rounds_to_nearest() {
    assert_eq!(rounded_gib(81559 * crate::hardware::MIB), 80);
    assert_eq!(rounded_gib(crate::hardware::GIB / 2 - 1), 0);
    assert_eq!(rounded_gib(crate::hardware::GIB / 2), 1);
    assert_eq!(rounded_gib(u64::MAX), u64::MAX / crate::hardware::GIB + 1);
}

#[test]
fn golden_labels() {
    for (name, report) in scenarios() {
        let labels = labels_for(&report);
        let text: String = labels
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect();
        assert_golden(&format!("{name}.labels"), &text);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn every_label_is_valid(report in arb_report()) {
        let labels = labels_for(&report);
        prop_assert!(labels.labels.contains_key("hwaccel.io/present"));
        for (key, value) in &labels.labels {
            prop_assert!(key.starts_with(LABEL_PREFIX), "{key}");
            prop_assert!(is_valid_label_key(key), "{key:?}");
            prop_assert!(!value.is_empty(), "{key} is empty");
            prop_assert!(is_valid_label_value(value), "{key}={value:?}");
        }
        for (key, reason) in &labels.dropped {
            prop_assert!(!labels.labels.contains_key(key), "{key} both kept and dropped");
            prop_assert!(!reason.is_empty());
        }
    }

    #[test]
    fn same_report_same_labels(report in arb_report()) {
        prop_assert_eq!(labels_for(&report), labels_for(&report.clone()));
        let mut shuffled = report.clone();
        shuffled.devices.reverse();
        shuffled.interconnects.reverse();
        prop_assert_eq!(labels_for(&report).labels, labels_for(&shuffled).labels);
    }
}

#[test]
fn devices_missing_is_labelled_only_while_above_zero() {
    let mut labels = Labels::default();
    labels.set_devices_missing(0);
    assert!(!labels.labels.contains_key(DEVICES_MISSING_LABEL));
    labels.set_devices_missing(2);
    assert_eq!(
        labels.labels.get(DEVICES_MISSING_LABEL).map(String::as_str),
        Some("2")
    );
}
