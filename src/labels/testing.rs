//! Test support shared by the label and API tests: hand-built reports for the cases the label
//! scheme is about (homogeneous, mixed, overlong names, CPU-only), a proptest strategy for
//! arbitrary reports, and golden files.

use std::collections::BTreeSet;
use std::path::PathBuf;

use proptest::prelude::*;

use crate::detect::{Report, Warning};
use crate::hardware::{
    CpuInfo, Device, Family, GIB, Health, HealthStatus, InterconnectGroup, InterconnectKind, MIB,
    NetworkAdapter, NicKind, NumaNode, Partition, PcieLink, Precision, RuntimeEnv, Vendor,
};

/// Hopper's precisions (H100 datasheet: FP64/FP32/TF32/BF16/FP16/FP8/INT8 tensor cores).
pub fn hopper() -> BTreeSet<Precision> {
    use Precision::*;
    [Fp32, Tf32, Bf16, Fp16, Fp8, Int8, Int4]
        .into_iter()
        .collect()
}

/// An NVIDIA GPU at a PCI address, with the fields a real nvidia-smi run fills.
pub fn nvidia_gpu(bus: &str, model: &str, memory_mib: u64, arch: &str, cc: &str) -> Device {
    let mut device = Device::new(bus, Vendor::Nvidia, Family::Gpu, model, "nvidia");
    device.memory_bytes = Some(memory_mib * MIB);
    device.architecture = Some(arch.to_string());
    device.compute_capability = Some(cc.to_string());
    device.driver_version = Some("550.54.15".to_string());
    device.health.status = HealthStatus::Healthy;
    device
}

/// A report holding these devices and nothing else, sorted like `merge` sorts.
pub fn report_with(mut devices: Vec<Device>) -> Report {
    devices.sort_by(|a, b| a.id.cmp(&b.id));
    let mut report = Report::empty();
    report.devices = devices;
    report
}

/// 8× H100 SXM on one NVSwitch domain, on a two-socket Sapphire Rapids host.
pub fn h100_x8() -> Report {
    let buses = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"];
    let devices: Vec<Device> = buses
        .iter()
        .enumerate()
        .map(|(index, bus)| {
            let mut gpu = nvidia_gpu(
                &format!("0000:{bus}:00.0"),
                "NVIDIA H100 80GB HBM3",
                81559,
                "hopper",
                "9.0",
            );
            gpu.index = Some(index as u32);
            gpu.precisions = hopper();
            gpu.compute_units = Some(132);
            gpu.numa_node = Some(u32::from(index >= 4));
            gpu.pcie = Some(PcieLink {
                generation: Some(5),
                width: Some(16),
                max_generation: Some(5),
                max_width: Some(16),
            });
            gpu.uuid = Some(format!("GPU-5c2a1e0f-0000-0000-0000-00000000000{index}"));
            gpu
        })
        .collect();
    let ids = devices.iter().map(|d| d.id.clone()).collect();
    let mut report = report_with(devices);
    report.interconnects = vec![InterconnectGroup {
        kind: InterconnectKind::Nvswitch,
        id: "nvlink-domain-0".to_string(),
        devices: ids,
        links_per_device: Some(18),
        bandwidth_gbps: Some(450.0),
        topology: None,
    }];
    report.node.cpu = CpuInfo {
        model: Some("Intel(R) Xeon(R) Platinum 8480+".to_string()),
        vendor: Some("GenuineIntel".to_string()),
        arch: Some("x86_64".to_string()),
        sockets: Some(2),
        cores: Some(112),
        threads: Some(224),
        ai_flags: [
            "amx_bf16",
            "amx_int8",
            "amx_tile",
            "avx2",
            "avx512_bf16",
            "avx512f",
        ]
        .map(String::from)
        .to_vec(),
        memory_bytes: Some(2048 * GIB),
        ..CpuInfo::default()
    };
    report
}

/// 2× L4 and 1× A100 on one node: one vendor, one family, two products.
pub fn mixed_l4_a100() -> Report {
    use Precision::*;
    let mut l4a = nvidia_gpu("0000:3b:00.0", "NVIDIA L4", 23034, "ada", "8.9");
    let mut l4b = nvidia_gpu("0000:5e:00.0", "NVIDIA L4", 23034, "ada", "8.9");
    let mut a100 = nvidia_gpu(
        "0000:af:00.0",
        "NVIDIA A100-SXM4-40GB",
        40960,
        "ampere",
        "8.0",
    );
    let ada: BTreeSet<Precision> = [Fp32, Tf32, Bf16, Fp16, Fp8, Int8, Int4].into();
    l4a.precisions = ada.clone();
    l4b.precisions = ada;
    a100.precisions = [Fp32, Tf32, Bf16, Fp16, Int8, Int4].into();
    report_with(vec![a100, l4b, l4a])
}

/// A node whose only accelerator has a product name far over 63 characters.
pub fn overlong_product() -> Report {
    let model = "Contoso Hyperscale Inference Accelerator Module Gen3 Extreme 192GB HBM3e \
                 Liquid-Cooled OAM";
    let mut device = Device::new("0000:c1:00.0", Vendor::Other, Family::Asic, model, "pci");
    device.memory_bytes = Some(192 * GIB);
    report_with(vec![device])
}

/// A CPU-only node: the CPU backend's device and CPU facts, no accelerator.
pub fn cpu_only() -> Report {
    let cpu = Device::new(
        "cpu:0",
        Vendor::Amd,
        Family::Cpu,
        "AMD EPYC 9654 96-Core Processor",
        "cpu",
    );
    let mut report = report_with(vec![cpu]);
    report.node.cpu = CpuInfo {
        model: Some("AMD EPYC 9654 96-Core Processor".to_string()),
        vendor: Some("AuthenticAMD".to_string()),
        arch: Some("x86_64".to_string()),
        sockets: Some(2),
        cores: Some(192),
        threads: Some(384),
        ai_flags: ["avx2", "avx512_bf16", "avx512f", "avx512_vnni"]
            .map(String::from)
            .to_vec(),
        memory_bytes: Some(1536 * GIB),
        ..CpuInfo::default()
    };
    report
}

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

/// A report with everything node-wide filled in, for conversion tests.
pub fn with_node_facts(mut report: Report) -> Report {
    report.node.numa = vec![
        NumaNode {
            id: 0,
            cpus: Some("0-55,112-167".into()),
            memory_bytes: Some(1024 * GIB),
        },
        NumaNode {
            id: 1,
            cpus: Some("56-111,168-223".into()),
            memory_bytes: Some(1024 * GIB),
        },
    ];
    report.node.runtime = RuntimeEnv {
        container: Some("containerd".into()),
        kubernetes: true,
        cloud: Some("aws".into()),
        instance_type: Some("p5.48xlarge".into()),
        kernel: Some("6.8.0-1015-aws".into()),
        os: Some("Ubuntu 22.04.4 LTS".into()),
    };
    report.nics = vec![NetworkAdapter {
        name: "rdmap16s27/1".into(),
        kind: NicKind::Efa,
        rate_gbps: Some(100),
        state: Some("ACTIVE".into()),
        pci_id: Some("0000:10:1b.0".into()),
        numa_node: Some(0),
        fabric: None,
    }];
    report.backends = vec!["nvidia".into(), "cpu".into(), "topology".into()];
    report.warnings = vec![Warning {
        backend: "nvidia".into(),
        message: "nvidia-smi printed [N/A] for memory.total on 0000:db:00.0".into(),
    }];
    report
}

/// The hand-built reports by scenario name, for golden files.
pub fn scenarios() -> Vec<(&'static str, Report)> {
    vec![
        ("h100-8x-nvswitch", with_node_facts(h100_x8())),
        ("mixed-l4-a100", mixed_l4_a100()),
        ("overlong-product", overlong_product()),
        ("cpu-only", cpu_only()),
    ]
}

/// Compares `actual` with the committed `fixtures/golden/<name>`; with `HWACCEL_BLESS=1` in
/// the environment it rewrites the file instead (review the diff before committing).
pub fn assert_golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/golden")
        .join(name);
    if std::env::var_os("HWACCEL_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        expected == actual,
        "{} differs from the output; if the change is intended, rerun with HWACCEL_BLESS=1\n\
         --- expected\n{expected}\n--- actual\n{actual}",
        path.display()
    );
}
