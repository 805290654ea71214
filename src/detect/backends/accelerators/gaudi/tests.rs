//! Tests of the Gaudi backend against the `gaudi2-8x` fixture host (an HLS-Gaudi2 class
//! server with eight HL-225), without hl-smi, with a broken hl-smi, and on small hand-built
//! hosts for the legacy `habanalabs` class layout and unhealthy devices.

use proptest::prelude::*;

use super::*;
use crate::detect::testing::write_host_file as write;
use crate::detect::testing::{context_at as context, detect_on, fixture_dir, tool_dir};
use crate::hardware::HealthStatus;

const SCENARIO: &str = "gaudi2-8x";

#[test]
fn finds_eight_gaudi2_with_hl_smi_facts() {
    let findings = detect_on(&Gaudi, SCENARIO);
    assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
    assert_eq!(findings.devices.len(), 8);
    let ids: Vec<_> = findings.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "0000:33:00.0",
            "0000:34:00.0",
            "0000:4d:00.0",
            "0000:4e:00.0",
            "0000:9a:00.0",
            "0000:9b:00.0",
            "0000:b3:00.0",
            "0000:b4:00.0"
        ]
    );
    // 0000:4d:00.0 is hl-smi's device 7 and the driver's accel2.
    let device = &findings.devices[2];
    assert_eq!(device.model, "Intel Gaudi 2");
    assert_eq!(device.vendor, Vendor::Intel);
    assert_eq!(device.family, Family::Asic);
    assert_eq!(device.index, Some(7));
    assert_eq!(device.memory_bytes, Some(96 * GIB));
    assert_eq!(device.architecture.as_deref(), Some("gaudi2"));
    assert_eq!(device.compute_units, Some(24));
    assert_eq!(device.driver_version.as_deref(), Some("1.21.1-bfcec49"));
    assert_eq!(
        device.firmware_version.as_deref(),
        Some("hl-gaudi2-1.21.1-fw-59.2.3-sec-9")
    );
    assert_eq!(
        device.uuid.as_deref(),
        Some("01P0-HL2080A0-15-TNP7U6-14-07-12")
    );
    assert_eq!(device.numa_node, Some(0));
    assert_eq!(device.pcie.and_then(|l| l.generation), Some(4));
    assert_eq!(device.health.status, HealthStatus::Healthy);
    assert!(device.precisions.contains(&Precision::Fp8));
    assert!(!device.precisions.contains(&Precision::Mxfp4));
    let attributes = &device.attributes;
    assert_eq!(attributes["board"], "HL-225");
    assert_eq!(attributes["module_id"], "7");
    assert_eq!(attributes["class_device"], "accel2");
    assert_eq!(attributes["device_type"], "GAUDI2");
    assert_eq!(attributes["form_factor"], "oam");
    assert_eq!(attributes["memory_source"], "hl-smi");
    assert_eq!(attributes["serial"], "AN46010241");
    assert_eq!(findings.devices[7].numa_node, Some(1));
}

#[test]
fn the_serial_hl_smi_could_not_read_comes_from_sysfs() {
    let findings = detect_on(&Gaudi, SCENARIO);
    let device = findings
        .devices
        .iter()
        .find(|d| d.index == Some(6))
        .unwrap();
    assert_eq!(device.attributes["serial"], "AN46010257");
}

#[test]
fn one_all_to_all_group_over_the_baseboard() {
    let findings = detect_on(&Gaudi, SCENARIO);
    assert_eq!(findings.interconnects.len(), 1);
    let group = &findings.interconnects[0];
    assert_eq!(group.kind, InterconnectKind::Gaudilink);
    let ids: Vec<_> = findings.devices.iter().map(|d| d.id.clone()).collect();
    assert_eq!(group.devices, ids);
    assert_eq!(group.id, format!("gaudilink-{}", ids[0]));
    assert_eq!(group.links_per_device, Some(21));
    assert_eq!(group.bandwidth_gbps, Some(262.5));
    assert_eq!(group.topology.as_deref(), Some("all-to-all"));
}

#[test]
fn without_hl_smi_memory_comes_from_the_generation() {
    let findings = Gaudi.detect(&context(&fixture_dir(SCENARIO), None));
    assert!(findings.warnings.is_empty());
    assert_eq!(findings.devices.len(), 8);
    let device = &findings.devices[0];
    assert_eq!(device.memory_bytes, Some(96 * GIB));
    assert_eq!(device.attributes["memory_source"], "catalog");
    assert_eq!(device.index, None);
    assert_eq!(device.driver_version.as_deref(), Some("1.21.1-bfcec49"));
    assert!(!device.attributes.contains_key("board"));
    assert_eq!(findings.interconnects.len(), 1);
}

#[test]
fn a_failing_hl_smi_is_a_warning() {
    let tools = tool_dir(
        "hl-smi",
        "#!/bin/sh\necho 'hl-smi: failed to initialize' >&2\nexit 3\n",
    );
    let findings = Gaudi.detect(&context(&fixture_dir(SCENARIO), Some(tools.path())));
    assert_eq!(findings.devices.len(), 8);
    assert_eq!(findings.warnings.len(), 1);
    assert!(findings.warnings[0].contains("hl-smi failed"));
}

#[test]
fn garbage_from_hl_smi_is_a_warning() {
    let tools = tool_dir(
        "hl-smi",
        "#!/bin/sh\necho 'Failed to open device: Permission denied'\n",
    );
    let findings = Gaudi.detect(&context(&fixture_dir(SCENARIO), Some(tools.path())));
    assert_eq!(findings.devices.len(), 8);
    assert_eq!(findings.warnings.len(), 1);
    assert!(findings.warnings[0].contains("unusable output"));
}

#[test]
fn legacy_class_layout_pcie_cards_and_bad_status() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for (bdf, device, hl) in [
        ("0000:19:00.0", "0x1063", "hl0"),
        ("0000:1a:00.0", "0x1063", "hl1"),
    ] {
        let pci = format!("sys/bus/pci/devices/{bdf}");
        write(root, &format!("{pci}/vendor"), "0x1da3\n");
        write(root, &format!("{pci}/device"), &format!("{device}\n"));
        write(root, &format!("{pci}/class"), "0x120000\n");
        write(
            root,
            &format!("{pci}/uevent"),
            &format!("DRIVER=habanalabs\nPCI_SLOT_NAME={bdf}\n"),
        );
        let class = format!("sys/class/habanalabs/{hl}");
        write(root, &format!("{class}/pci_addr"), &format!("{bdf}\n"));
        write(root, &format!("{class}/device_type"), "GAUDI3\n");
        let status = if hl == "hl1" {
            "needs reset\n"
        } else {
            "operational\n"
        };
        write(root, &format!("{class}/status"), status);
    }
    let findings = Gaudi.detect(&context(root, None));
    assert_eq!(findings.devices.len(), 2);
    let first = &findings.devices[0];
    assert_eq!(first.model, "Intel Gaudi 3");
    assert_eq!(first.memory_bytes, Some(128 * GIB));
    assert_eq!(first.attributes["class_device"], "hl0");
    assert_eq!(first.attributes["form_factor"], "pcie");
    let second = &findings.devices[1];
    assert_eq!(second.health.status, HealthStatus::Unhealthy);
    assert_eq!(second.health.reasons, ["driver status: needs reset"]);
    // PCIe cards have no baseboard all-to-all.
    assert!(findings.interconnects.is_empty());
}

#[test]
fn generations_by_id_and_by_type() {
    assert_eq!(generation(Some(0x1020), None), Some(GAUDI2));
    assert_eq!(generation(Some(0x1060), None).unwrap().name, "gaudi3");
    assert_eq!(generation(None, Some("GAUDI2B")), Some(GAUDI2));
    assert_eq!(generation(None, Some("GAUDI SEC")), Some(GAUDI));
    assert_eq!(generation(Some(0x0001), Some("GOYA")), None);
}

#[test]
fn a_partial_baseboard_has_fewer_links() {
    let device = |id: &str| {
        (
            Device::new(id, Vendor::Intel, Family::Asic, "Intel Gaudi 3", "gaudi"),
            Some(GAUDI3),
            false,
        )
    };
    let groups = scale_up_groups(&[
        device("0000:01:00.0"),
        device("0000:02:00.0"),
        device("0000:03:00.0"),
        device("0000:04:00.0"),
    ]);
    assert_eq!(groups[0].links_per_device, Some(9));
    assert_eq!(groups[0].bandwidth_gbps, Some(225.0));
    assert!(scale_up_groups(&[device("0000:01:00.0")]).is_empty());
}

proptest! {
    #[test]
    fn parsers_never_panic_on_text(s in ".*") {
        let _ = hl_smi::parse_query(&s);
        let _ = hl_smi::parse_firmware_version(&s);
        let _ = hl_smi::status_health(&s);
    }

    #[test]
    fn parsers_never_panic_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let s = String::from_utf8_lossy(&bytes);
        let _ = hl_smi::parse_query(&s);
        let _ = hl_smi::parse_firmware_version(&s);
    }

    #[test]
    fn query_rows_never_panic(fields in proptest::collection::vec("[ -~]{0,20}", 8)) {
        let _ = hl_smi::parse_query(&fields.join(", "));
    }
}
