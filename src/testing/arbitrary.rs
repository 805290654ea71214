//! A proptest strategy for arbitrary detection reports shaped like `merge` output, for the
//! properties of the label scheme and the CRD conversion.
//!
//! Unit tests only: proptest is a dev-dependency, which the library itself cannot use when an
//! integration test or bench builds it with the `test-support` feature.

use proptest::prelude::*;

use super::report::report_with;
use crate::hardware::{
    Device, Family, Health, HealthStatus, InterconnectGroup, InterconnectKind, Partition,
    Precision, Vendor,
};
use crate::hardware::{Report, Warning};

fn arb_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9 ._-]{0,24}",
        ".{0,80}",
        "[A-Za-z0-9]{60,120}",
        Just(String::new()),
    ]
}

fn arb_vendor() -> impl Strategy<Value = Vendor> {
    prop_oneof![
        Just(Vendor::Nvidia),
        Just(Vendor::Amd),
        Just(Vendor::Intel),
        Just(Vendor::Google),
        Just(Vendor::Aws),
        Just(Vendor::Other),
    ]
}

fn arb_family() -> impl Strategy<Value = Family> {
    prop_oneof![
        Just(Family::Gpu),
        Just(Family::Tpu),
        Just(Family::Npu),
        Just(Family::Asic),
        Just(Family::Cpu),
    ]
}

fn arb_health() -> impl Strategy<Value = Health> {
    (
        prop_oneof![
            Just(HealthStatus::Unknown),
            Just(HealthStatus::Healthy),
            Just(HealthStatus::Degraded),
            Just(HealthStatus::Unhealthy),
        ],
        proptest::option::of(any::<bool>()),
        proptest::option::of(0u64..1 << 40),
        proptest::collection::vec("[a-z ]{1,30}", 0..3),
    )
        .prop_map(|(status, ecc_enabled, ecc_corrected, mut reasons)| {
            reasons.sort();
            Health {
                status,
                ecc_enabled,
                ecc_corrected,
                ecc_uncorrected: ecc_corrected.map(|c| c / 7),
                retired_pages: None,
                reasons,
            }
        })
}

prop_compose! {
    fn arb_device()(
        bus in 0u8..=255,
        vendor in arb_vendor(),
        family in arb_family(),
        model in arb_text(),
        memory in proptest::option::of(0u64..(1 << 45)),
        arch in proptest::option::of(arb_text()),
        cc in proptest::option::of("[0-9]{1,2}\\.[0-9]"),
        driver in proptest::option::of(arb_text()),
        precisions in proptest::collection::btree_set(proptest::sample::select(Precision::ALL.to_vec()), 0..6),
        numa in proptest::option::of(0u32..8),
        units in proptest::option::of(0u32..20000),
        partitions in proptest::collection::vec(("[a-z-]{0,12}", arb_text()), 0..3),
        health in arb_health(),
        attributes in proptest::collection::btree_map("[a-z_]{1,12}", arb_text(), 0..4),
    ) -> Device {
        let mut device = Device::new(format!("0000:{bus:02x}:00.0"), vendor, family, model, "test");
        device.memory_bytes = memory;
        device.architecture = arch;
        device.compute_capability = cc;
        device.driver_version = driver;
        device.precisions = precisions;
        device.numa_node = numa;
        device.compute_units = units;
        device.partitions = partitions
            .into_iter()
            .enumerate()
            .map(|(i, (kind, profile))| Partition {
                kind,
                profile,
                id: Some(i.to_string()),
                memory_bytes: None,
            })
            .collect();
        device.partitions.sort_by(|a, b| (&a.kind, &a.id, &a.profile).cmp(&(&b.kind, &b.id, &b.profile)));
        device.health = health;
        device.attributes = attributes;
        device
    }
}

prop_compose! {
    /// An arbitrary report shaped like `merge` output: devices sorted and unique by id, groups
    /// over those devices, sorted flags.
    pub fn arb_report()(
        devices in proptest::collection::vec(arb_device(), 0..10),
        group_kinds in proptest::collection::vec(prop_oneof![
            Just(InterconnectKind::Nvlink),
            Just(InterconnectKind::Nvswitch),
            Just(InterconnectKind::Xgmi),
            Just(InterconnectKind::Ici),
        ], 0..3),
        ai_flags in proptest::collection::btree_set(prop_oneof![
            Just("avx2".to_string()),
            Just("avx512f".to_string()),
            Just("amx_tile".to_string()),
            "[a-z0-9_]{1,10}",
            ".{0,12}",
        ], 0..5),
        memory in proptest::option::of(0u64..(1 << 44)),
        warnings in proptest::collection::vec(("[a-z]{2,8}", arb_text()), 0..3),
    ) -> Report {
        let mut devices = devices;
        devices.sort_by(|a, b| a.id.cmp(&b.id));
        devices.dedup_by(|a, b| a.id == b.id);
        let ids: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
        let mut report = report_with(devices);
        report.interconnects = group_kinds
            .into_iter()
            .enumerate()
            .map(|(i, kind)| InterconnectGroup {
                kind,
                id: format!("group-{i}"),
                devices: ids.iter().skip(i).cloned().collect(),
                links_per_device: None,
                bandwidth_gbps: None,
                topology: None,
            })
            .collect();
        report.interconnects.sort_by(|a, b| (a.kind, &a.id).cmp(&(b.kind, &b.id)));
        report.node.cpu.ai_flags = ai_flags.into_iter().collect();
        report.node.cpu.memory_bytes = memory;
        report.warnings = warnings
            .into_iter()
            .map(|(backend, message)| Warning { backend, message })
            .collect();
        report.warnings.sort();
        report.warnings.dedup();
        report
    }
}
