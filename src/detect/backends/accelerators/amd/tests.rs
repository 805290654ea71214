//! Tests of the AMD backend against the `mi300x-8x` fixture host, with and without the tools,
//! and against tools that fail or print garbage.

use std::fs;
use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::detect::testing::write_host_file as write;
use crate::detect::testing::{detect_on, fixture_dir, tool_dir};
use crate::detect::{CommandRunner, Detector};
use crate::hardware::{HealthStatus, InterconnectKind, Precision};

const SCENARIO: &str = "mi300x-8x";

/// A context over the fixture host's files with the given tool directory (or none).
fn context_with_tools(tools: Option<&Path>) -> Context {
    let search_path = tools.map(Path::to_path_buf).into_iter().collect();
    Context::new(
        HostRoot::new(fixture_dir(SCENARIO)),
        CommandRunner::new(search_path),
    )
}

#[test]
fn finds_eight_mi300x_with_sysfs_kfd_and_amd_smi_facts() {
    let findings = detect_on(&Amd, SCENARIO);
    assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
    assert_eq!(findings.devices.len(), 8);
    let ids: Vec<_> = findings.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids[0], "0000:05:00.0");
    assert_eq!(ids[7], "0000:e5:00.0");

    let gpu = &findings.devices[0];
    assert_eq!(gpu.model, "AMD Instinct MI300X");
    assert_eq!(gpu.vendor, Vendor::Amd);
    assert_eq!(gpu.backend, "amd");
    assert_eq!(gpu.index, Some(0));
    assert_eq!(gpu.memory_bytes, Some(206_141_652_992));
    assert_eq!(gpu.architecture.as_deref(), Some("gfx942"));
    assert_eq!(gpu.compute_units, Some(304));
    assert_eq!(gpu.driver_version.as_deref(), Some("6.10.5"));
    assert_eq!(gpu.firmware_version.as_deref(), Some("113-M3000100-102"));
    assert_eq!(gpu.uuid.as_deref(), Some("4a8c2f1d6e3b9075"));
    assert_eq!(gpu.numa_node, Some(0));
    assert_eq!(findings.devices[4].numa_node, Some(1));
    let link = gpu.pcie.unwrap();
    assert_eq!((link.generation, link.width), (Some(5), Some(16)));
    let precisions: Vec<_> = gpu.precisions.iter().copied().collect();
    assert_eq!(
        precisions,
        [
            Precision::Fp32,
            Precision::Bf16,
            Precision::Fp16,
            Precision::Fp8,
            Precision::Int8
        ]
    );
    assert_eq!(gpu.attributes["generation"], "cdna3");
    assert_eq!(gpu.attributes["pci_device_id"], "0x74a1");
    assert_eq!(gpu.attributes["drm_card"], "card0");
    // No FRU serial in sysfs here: the board serial comes from amd-smi.
    assert_eq!(gpu.attributes["serial"], "692323000000");
    assert_eq!(findings.devices[1].attributes["serial"], "692323000001");
    assert_eq!(gpu.attributes["render_nodes"], "renderD128");
    assert_eq!(gpu.attributes["xcc_count"], "8");
    assert_eq!(
        gpu.attributes["compute_partitions_available"],
        "SPX,DPX,QPX,CPX"
    );
}

#[test]
fn partition_modes_become_partitions() {
    let findings = detect_on(&Amd, SCENARIO);
    let partitions = &findings.devices[3].partitions;
    assert_eq!(partitions.len(), 2);
    assert_eq!(
        (partitions[0].kind.as_str(), partitions[0].profile.as_str()),
        ("amd-compute", "SPX")
    );
    assert_eq!(
        (partitions[1].kind.as_str(), partitions[1].profile.as_str()),
        ("amd-memory", "NPS1")
    );
}

#[test]
fn health_comes_from_ras() {
    let findings = detect_on(&Amd, SCENARIO);
    let healthy = &findings.devices[0].health;
    assert_eq!(healthy.status, HealthStatus::Healthy);
    assert_eq!(healthy.ecc_enabled, Some(true));
    assert_eq!(healthy.ecc_uncorrected, Some(0));

    let worn = findings
        .devices
        .iter()
        .find(|d| d.id == "0000:a6:00.0")
        .unwrap();
    assert_eq!(worn.health.status, HealthStatus::Degraded);
    assert_eq!(worn.health.ecc_corrected, Some(14));
    assert_eq!(worn.health.retired_pages, Some(2));
    assert_eq!(worn.health.reasons, ["2 VRAM pages retired"]);
}

#[test]
fn the_xgmi_hive_joins_all_eight() {
    let findings = detect_on(&Amd, SCENARIO);
    assert_eq!(findings.interconnects.len(), 1);
    let hive = &findings.interconnects[0];
    assert_eq!(hive.kind, InterconnectKind::Xgmi);
    assert_eq!(hive.id, "0xe2a3b5c7d9104f61");
    let ids: Vec<_> = findings.devices.iter().map(|d| d.id.clone()).collect();
    assert_eq!(hive.devices, ids);
    assert_eq!(hive.links_per_device, Some(7));
    assert_eq!(hive.bandwidth_gbps, Some(448.0));
    assert_eq!(hive.topology.as_deref(), Some("all-to-all"));
}

#[test]
fn without_tools_sysfs_and_the_device_table_suffice() {
    let findings = Amd.detect(&context_with_tools(None));
    assert!(findings.warnings.is_empty());
    assert_eq!(findings.devices.len(), 8);
    let gpu = &findings.devices[0];
    assert_eq!(gpu.model, "AMD Instinct MI300X");
    assert_eq!(gpu.index, None);
    assert_eq!(gpu.memory_bytes, Some(206_141_652_992));
    assert_eq!(gpu.architecture.as_deref(), Some("gfx942"));
    assert_eq!(gpu.driver_version.as_deref(), Some("6.10.5"));
    assert_eq!(findings.interconnects.len(), 1);
}

#[test]
fn rocm_smi_is_the_fallback_tool() {
    let rocm_smi = fixture_dir(SCENARIO).join("commands/rocm-smi");
    let dir = tempfile::tempdir().unwrap();
    fs::copy(&rocm_smi, dir.path().join("rocm-smi")).unwrap();
    fs::create_dir(dir.path().join("outputs")).unwrap();
    fs::copy(
        fixture_dir(SCENARIO).join("commands/outputs/rocm-smi.json"),
        dir.path().join("outputs/rocm-smi.json"),
    )
    .unwrap();
    let findings = Amd.detect(&context_with_tools(Some(dir.path())));
    assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
    // rocm-smi prints the bus id in capitals; it still matches.
    let worn = findings
        .devices
        .iter()
        .find(|d| d.id == "0000:a6:00.0")
        .unwrap();
    assert_eq!(worn.index, Some(5));
    assert_eq!(worn.model, "AMD Instinct MI300X");
}

#[test]
fn a_failing_tool_is_a_warning_and_sysfs_still_reports() {
    let dir = tool_dir(
        "amd-smi",
        "#!/bin/sh\necho 'AMDSMI_STATUS_DRIVER_NOT_LOADED' >&2\nexit 1\n",
    );
    let findings = Amd.detect(&context_with_tools(Some(dir.path())));
    assert_eq!(findings.devices.len(), 8);
    assert_eq!(findings.warnings.len(), 1);
    assert!(
        findings.warnings[0].contains("amd-smi failed"),
        "{:?}",
        findings.warnings
    );
}

#[test]
fn garbage_from_the_tool_is_a_warning() {
    let dir = tool_dir(
        "amd-smi",
        "#!/bin/sh\necho 'Traceback (most recent call last):'\n",
    );
    let findings = Amd.detect(&context_with_tools(Some(dir.path())));
    assert_eq!(findings.devices.len(), 8);
    assert_eq!(findings.warnings.len(), 1);
    assert!(findings.warnings[0].contains("unusable output"));
    assert_eq!(findings.devices[0].model, "AMD Instinct MI300X");
}

#[test]
fn a_cpx_partitioned_gpu_is_one_device_with_eight_kfd_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let pci = "sys/bus/pci/devices/0000:05:00.0";
    write(root, &format!("{pci}/vendor"), "0x1002\n");
    write(root, &format!("{pci}/device"), "0x74a1\n");
    write(root, &format!("{pci}/class"), "0x120000\n");
    write(
        root,
        &format!("{pci}/uevent"),
        "DRIVER=amdgpu\nPCI_SLOT_NAME=0000:05:00.0\n",
    );
    write(
        root,
        &format!("{pci}/mem_info_vram_total"),
        "206141652992\n",
    );
    write(root, &format!("{pci}/current_compute_partition"), "CPX\n");
    write(root, &format!("{pci}/current_memory_partition"), "NPS4\n");
    // In CPX mode each of the eight XCDs is its own KFD node, all on the same PCI function.
    for xcp in 0..8 {
        write(
            root,
            &format!("sys/class/kfd/kfd/topology/nodes/{}/properties", xcp + 1),
            &format!(
                "cpu_cores_count 0\nsimd_count 152\nsimd_per_cu 4\ngfx_target_version 90402\n\
                 location_id 1280\ndomain 0\ndrm_render_minor {}\nhive_id 0\nnum_xcc 1\n",
                128 + xcp
            ),
        );
    }
    let findings = Amd.detect(&Context::new(
        HostRoot::new(root),
        CommandRunner::new(Vec::new()),
    ));
    assert_eq!(findings.devices.len(), 1);
    let gpu = &findings.devices[0];
    assert_eq!(gpu.compute_units, Some(304));
    assert_eq!(gpu.attributes["kfd_nodes"], "8");
    assert_eq!(gpu.attributes["xcc_count"], "8");
    assert!(gpu.attributes["render_nodes"].ends_with(",renderD135"));
    let profiles: Vec<_> = gpu.partitions.iter().map(|p| p.profile.as_str()).collect();
    assert_eq!(profiles, ["CPX", "NPS4"]);
    // Without RAS files there is no health verdict to give.
    assert_eq!(gpu.health.status, HealthStatus::Unknown);
    assert!(findings.interconnects.is_empty());
}

#[test]
fn a_host_without_amd_gpus_finds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Context::new(HostRoot::new(dir.path()), CommandRunner::new(Vec::new()));
    assert_eq!(Amd.detect(&ctx), Findings::default());
}

#[test]
fn the_detector_run_is_deterministic() {
    let run = || {
        let detector = Detector::with_backends(
            HostRoot::new(fixture_dir(SCENARIO)),
            CommandRunner::new(vec![fixture_dir(SCENARIO).join("commands")]),
            vec![Box::new(Amd)],
        );
        serde_json::to_string(&detector.run(false).0).unwrap()
    };
    assert_eq!(run(), run());
}

proptest! {
    #[test]
    fn parsers_never_panic_on_text(s in ".*") {
        let _ = amd_smi::parse_amd_smi_static(&s);
        let _ = amd_smi::parse_rocm_smi(&s);
        let _ = kfd::parse_properties(&s);
        let _ = kfd::parse_io_link(&s);
        let _ = kfd::parse_mem_bank(&s);
        let _ = amdgpu_sysfs::parse_error_count(&s);
        let _ = amdgpu_sysfs::parse_bad_pages(&s);
        let _ = amdgpu_sysfs::parse_feature_mask(&s);
        let _ = amdgpu_sysfs::parse_mode_list(&s);
    }

    #[test]
    fn parsers_never_panic_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let s = String::from_utf8_lossy(&bytes);
        let _ = amd_smi::parse_amd_smi_static(&s);
        let _ = amd_smi::parse_rocm_smi(&s);
        let _ = kfd::parse_properties(&s);
        let _ = amdgpu_sysfs::parse_bad_pages(&s);
    }

    #[test]
    fn json_prefixes_never_panic(cut in 0usize..20_000) {
        // Truncated tool output, as a killed tool leaves it.
        let text = include_str!("../../../../../fixtures/hosts/mi300x-8x/commands/outputs/amd-smi-static.json");
        let end = text.char_indices().map(|(i, _)| i).find(|&i| i >= cut).unwrap_or(text.len());
        let _ = amd_smi::parse_amd_smi_static(&text[..end]);
    }

    #[test]
    fn kfd_target_versions_never_panic(v in any::<u64>()) {
        if let Some(name) = gfx_catalog::gfx_name(v) {
            prop_assert!(name.starts_with("gfx"));
        }
    }
}

#[test]
fn fru_placeholders_are_not_serials() {
    use super::amdgpu_sysfs::is_known;
    assert!(is_known("692323000000"));
    assert!(is_known(" PCB052715-0071 "));
    for placeholder in ["", "  ", "N/A", "n/a", "0", "0000000000"] {
        assert!(!is_known(placeholder), "{placeholder:?}");
    }
}

#[test]
fn a_bare_bus_names_parts_from_the_device_id_table() {
    // Only vendor, device, class and driver: no KFD topology, no VRAM file, no tool. Names are
    // pci.ids', targets and memory ROCm's specification tables' (Radeon VII gfx906 16 GiB,
    // MI210 gfx90a 64 GiB, Radeon AI PRO R9700 gfx1201 32 GiB; RX 7900 XT/XTX/GRE share an id
    // and differ in memory).
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let parts = [
        ("0000:03:00.0", "0x66af", "0x030000"),
        ("0000:04:00.0", "0x740f", "0x038000"),
        ("0000:05:00.0", "0x744c", "0x030000"),
        ("0000:06:00.0", "0x7551", "0x030000"),
    ];
    for (address, device, class) in parts {
        let pci = format!("sys/bus/pci/devices/{address}");
        write(root, &format!("{pci}/vendor"), "0x1002\n");
        write(root, &format!("{pci}/device"), &format!("{device}\n"));
        write(root, &format!("{pci}/class"), &format!("{class}\n"));
        write(root, &format!("{pci}/uevent"), "DRIVER=amdgpu\n");
    }
    let findings = Amd.detect(&Context::new(
        HostRoot::new(root),
        CommandRunner::new(Vec::new()),
    ));
    assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
    /// Model, gfx target, memory and generation of one device.
    type Seen<'a> = (&'a str, Option<&'a str>, Option<u64>, Option<&'a str>);
    let seen: Vec<Seen> = findings
        .devices
        .iter()
        .map(|d| {
            (
                d.model.as_str(),
                d.architecture.as_deref(),
                d.memory_bytes,
                d.attributes.get("generation").map(String::as_str),
            )
        })
        .collect();
    let gib = 1u64 << 30;
    assert_eq!(
        seen,
        [
            (
                "AMD Radeon VII",
                Some("gfx906"),
                Some(16 * gib),
                Some("gcn5")
            ),
            (
                "AMD Instinct MI210",
                Some("gfx90a"),
                Some(64 * gib),
                Some("cdna2")
            ),
            (
                "AMD Radeon RX 7900 XT/7900 XTX/7900 GRE/7900M",
                Some("gfx1100"),
                None,
                Some("rdna3")
            ),
            (
                "AMD Radeon AI PRO R9700",
                Some("gfx1201"),
                Some(32 * gib),
                Some("rdna4")
            ),
        ]
    );
}

/// Issue 35: a GPU whose VRAM size only KFD's topology publishes (the node's
/// `local_mem_size`: no `mem_info_vram_total`, no memory banks, no tool, a device id whose
/// boards differ in memory) was reported without memory, so nothing was planned on it.
#[test]
fn a_gpu_sized_only_by_kfds_local_mem_size_has_its_memory() {
    let findings = detect_on(&Amd, "rx7900-kfd-memory");
    assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
    assert_eq!(findings.devices.len(), 1);
    let gpu = &findings.devices[0];
    assert_eq!(gpu.id, "0000:03:00.0");
    assert_eq!(gpu.memory_bytes, Some(24 << 30));
    assert_eq!(gpu.architecture.as_deref(), Some("gfx1100"));
    assert_eq!(gpu.compute_units, Some(96));

    // `local_mem_size 0` (what current kernels print) is no size, and the banks come first.
    let dir = tempfile::tempdir().unwrap();
    let node = "sys/class/kfd/kfd/topology/nodes/1";
    let props = "simd_count 192\nsimd_per_cu 2\nlocation_id 768\n";
    write(
        dir.path(),
        &format!("{node}/properties"),
        &format!("{props}local_mem_size 0\n"),
    );
    let memory = |root: &Path| kfd::read(&HostRoot::new(root)).gpus[0].memory_bytes;
    assert_eq!(memory(dir.path()), None);
    write(
        dir.path(),
        &format!("{node}/properties"),
        &format!("{props}local_mem_size 4096\n"),
    );
    assert_eq!(memory(dir.path()), Some(4096));
    write(
        dir.path(),
        &format!("{node}/mem_banks/0/properties"),
        "heap_type 1\nsize_in_bytes 8192\n",
    );
    assert_eq!(memory(dir.path()), Some(8192));
}
