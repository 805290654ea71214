//! Tests of the Intel GPU backend against the `intel-gpu` fixture host (four Data Center GPU
//! Max 1550 on Intel's out-of-tree i915), without tools, with broken tools, and on small
//! hand-built hosts for integrated graphics and the xe driver.

use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::detect::testing::write_host_file as write;
use crate::detect::testing::{context_at as context, detect_on, fixture_dir, tool_dir};
use crate::hardware::{GIB, Precision};

const SCENARIO: &str = "intel-gpu";

/// A PCI function with a driver named in its uevent (the directory form fixtures may use).
fn pci_function(root: &Path, bdf: &str, device: &str, class: &str, driver: &str) {
    let dir = format!("sys/bus/pci/devices/{bdf}");
    write(root, &format!("{dir}/vendor"), "0x8086\n");
    write(root, &format!("{dir}/device"), &format!("{device}\n"));
    write(root, &format!("{dir}/class"), &format!("{class}\n"));
    write(
        root,
        &format!("{dir}/uevent"),
        &format!("DRIVER={driver}\nPCI_SLOT_NAME={bdf}\n"),
    );
}

#[test]
fn finds_four_max_1550_with_xpu_smi_facts() {
    let findings = detect_on(&IntelGpu, SCENARIO);
    assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
    assert_eq!(findings.devices.len(), 4);
    let gpu = &findings.devices[0];
    assert_eq!(gpu.id, "0000:4b:00.0");
    assert_eq!(gpu.model, "Intel(R) Data Center GPU Max 1550");
    assert_eq!(gpu.vendor, Vendor::Intel);
    assert_eq!(gpu.family, Family::Gpu);
    assert_eq!(gpu.index, Some(0));
    assert_eq!(gpu.memory_bytes, Some(128 * GIB));
    assert_eq!(gpu.attributes["memory_source"], "xpu-smi");
    assert_eq!(gpu.architecture.as_deref(), Some("xe-hpc"));
    assert_eq!(gpu.compute_units, Some(128));
    assert_eq!(
        gpu.driver_version.as_deref(),
        Some("I915_23.10.32_PSB_231129.32")
    );
    assert_eq!(gpu.firmware_version.as_deref(), Some("PVC2_1.23263"));
    assert_eq!(
        gpu.uuid.as_deref(),
        Some("00000000-0000-004b-0000-00000bd58086")
    );
    assert_eq!(gpu.numa_node, Some(0));
    assert_eq!(gpu.pcie.and_then(|l| l.generation), Some(5));
    assert!(gpu.precisions.contains(&Precision::Tf32));
    assert!(gpu.precisions.contains(&Precision::Bf16));
    assert!(!gpu.precisions.contains(&Precision::Fp8));
    assert_eq!(gpu.attributes["driver"], "i915");
    assert_eq!(gpu.attributes["tiles"], "2");
    assert_eq!(gpu.attributes["drm_card"], "card0");
    assert_eq!(gpu.attributes["pci_device_id"], "0x0bd5");
    assert!(!gpu.attributes.contains_key("integrated"));
    // xpu-smi could not read the third card's firmware version.
    assert_eq!(findings.devices[2].firmware_version, None);
    assert_eq!(findings.devices[3].numa_node, Some(1));
}

#[test]
fn xe_link_joins_the_four_cards() {
    let findings = detect_on(&IntelGpu, SCENARIO);
    assert_eq!(findings.interconnects.len(), 1);
    let group = &findings.interconnects[0];
    assert_eq!(group.kind, InterconnectKind::Xelink);
    assert_eq!(
        group.devices,
        [
            "0000:4b:00.0",
            "0000:5c:00.0",
            "0000:9a:00.0",
            "0000:ca:00.0"
        ]
    );
    assert_eq!(group.topology.as_deref(), Some("all-to-all"));
}

#[test]
fn without_xpu_smi_memory_comes_from_sysfs() {
    let findings = IntelGpu.detect(&context(&fixture_dir(SCENARIO), None));
    assert!(findings.warnings.is_empty());
    assert_eq!(findings.devices.len(), 4);
    let gpu = &findings.devices[1];
    assert_eq!(gpu.model, "Intel(R) Data Center GPU Max 1550");
    assert_eq!(gpu.memory_bytes, Some(128 * GIB));
    assert_eq!(gpu.attributes["memory_source"], "sysfs");
    assert_eq!(gpu.index, None);
    assert_eq!(gpu.compute_units, None);
    assert!(findings.interconnects.is_empty());
}

#[test]
fn a_failing_xpu_smi_is_a_warning() {
    let tools = tool_dir(
        "xpu-smi",
        "#!/bin/sh\necho 'Level Zero Initialization Error' >&2\nexit 1\n",
    );
    let findings = IntelGpu.detect(&context(&fixture_dir(SCENARIO), Some(tools.path())));
    assert_eq!(findings.devices.len(), 4);
    assert_eq!(findings.warnings.len(), 1);
    assert!(findings.warnings[0].contains("xpu-smi failed"));
}

#[test]
fn garbage_from_xpu_smi_is_a_warning() {
    let tools = tool_dir(
        "xpu-smi",
        "#!/bin/sh\nprintf '\\033[31mSegmentation fault\\033[0m\\n'\n",
    );
    let findings = IntelGpu.detect(&context(&fixture_dir(SCENARIO), Some(tools.path())));
    assert_eq!(findings.devices.len(), 4);
    assert_eq!(findings.warnings.len(), 1);
    assert!(findings.warnings[0].contains("unusable output"));
    assert_eq!(findings.devices[0].attributes["memory_source"], "sysfs");
}

#[test]
fn integrated_graphics_have_no_memory_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    pci_function(root, "0000:00:02.0", "0x46a6", "0x030000", "i915");
    // A discrete Arc B580 on xe with its VRAM in the tile directory.
    pci_function(root, "0000:03:00.0", "0xe20b", "0x030000", "xe");
    write(
        root,
        "sys/bus/pci/devices/0000:03:00.0/tile0/physical_vram_size_bytes",
        "12884901888\n",
    );
    // Intel's audio controller is not a GPU.
    pci_function(root, "0000:00:1f.3", "0x51c8", "0x040380", "snd_hda_intel");
    let findings = IntelGpu.detect(&context(root, None));
    assert_eq!(findings.devices.len(), 2);
    let igpu = &findings.devices[0];
    assert_eq!(igpu.id, "0000:00:02.0");
    assert_eq!(igpu.model, "Intel(R) Graphics [0x46a6]");
    assert_eq!(igpu.memory_bytes, None);
    assert_eq!(igpu.attributes["integrated"], "true");
    assert_eq!(igpu.architecture, None);
    let baseline: Vec<_> = igpu.precisions.iter().copied().collect();
    assert_eq!(baseline, [Precision::Fp32, Precision::Fp16]);
    let arc = &findings.devices[1];
    assert_eq!(arc.model, "Intel(R) Arc(TM) B580 Graphics");
    assert_eq!(arc.memory_bytes, Some(12 * GIB));
    assert_eq!(arc.attributes["driver"], "xe");
    assert_eq!(arc.attributes["tiles"], "1");
    assert_eq!(arc.architecture.as_deref(), Some("xe2-hpg"));
}

#[test]
fn gpus_on_other_drivers_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    pci_function(dir.path(), "0000:4b:00.0", "0x0bd5", "0x038000", "vfio-pci");
    let findings = IntelGpu.detect(&context(dir.path(), None));
    assert_eq!(findings, Findings::default());
}

#[test]
fn components_merge_chains() {
    let links: BTreeSet<(String, String)> = [("a", "b"), ("c", "d"), ("b", "c"), ("x", "y")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let groups = components(&links);
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0].len(), 4);
}

proptest! {
    #[test]
    fn parsers_never_panic_on_text(s in ".*") {
        let _ = xpu_smi::parse_discovery_dump(&s);
        let _ = xpu_smi::parse_topology_matrix(&s);
    }

    #[test]
    fn parsers_never_panic_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let s = String::from_utf8_lossy(&bytes);
        let _ = xpu_smi::parse_discovery_dump(&s);
        let _ = xpu_smi::parse_topology_matrix(&s);
    }

    #[test]
    fn dump_lines_never_panic(fields in proptest::collection::vec("[ -~]{0,24}", 0..10)) {
        let text = format!(
            "Device ID,Device Name,PCI BDF Address,Memory Physical Size\n{}\n",
            fields.join(",")
        );
        let _ = xpu_smi::parse_discovery_dump(&text);
    }
}
