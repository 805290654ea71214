//! AMD XDNA NPUs (Ryzen AI): PCI functions of the `amdxdna` driver, their `/dev/accel/accelN`
//! node, and the driver's sysfs attributes (`vbnv`, `fw_version`).
//!
//! The upstream driver (`drivers/accel/amdxdna/amdxdna_pci_drv.c`) binds PCI 0x1022:0x1502
//! (NPU1: Phoenix and Hawk Point, first-generation XDNA) and 0x1022:0x17f0, whose revision
//! picks the part: 0x00 NPU2 (early XDNA 2), 0x10 NPU4 (Strix Point), 0x11 NPU5 (Strix Halo),
//! 0x20 NPU6 (Krackan Point). The NPU works in system memory; it has none of its own.

use std::collections::BTreeSet;

use crate::detect::{Backend, Context, Findings, HostRoot, PciFunction, pci};
use crate::hardware::{Device, Family, Precision, Vendor};

use crate::detect::backends::shared::accel_node;

/// AMD's PCI vendor id for its CPUs, chipsets and NPUs (GPUs use 0x1002).
const AMD_VENDOR_ID: u16 = 0x1022;
/// The kernel driver's name.
const DRIVER: &str = "amdxdna";

/// The `xdna` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Xdna;

impl Backend for Xdna {
    fn name(&self) -> &'static str {
        "xdna"
    }

    fn detect(&self, ctx: &Context) -> Findings {
        let host = ctx.host();
        let npus: Vec<(&PciFunction, Option<XdnaNpu>)> = ctx
            .pci_by_vendor(AMD_VENDOR_ID)
            // XDNA is a signal-processing controller (0x1180); an EPYC host has a hundred
            // other AMD functions that must not cost a read each.
            .filter(|f| matches!(f.class_code(), 0x1180 | 0x1200))
            .filter_map(|f| {
                let device_id = f.device_id(host)?;
                let revision = host
                    .read_u64(format!("{}/revision", f.sysfs_dir()))
                    .and_then(|r| u8::try_from(r).ok());
                let npu = XdnaNpu::from_ids(device_id, revision);
                let bound = pci::driver(host, &f.address).as_deref() == Some(DRIVER);
                (npu.is_some() || bound).then_some((f, npu))
            })
            .collect();
        accel_node::devices_with_nodes(host, &npus, |function, extra, index, node| {
            xdna_device(host, function, extra, index, node)
        })
    }
}

/// An XDNA NPU, as the driver's device table names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdnaNpu {
    /// NPU1: Phoenix / Hawk Point (XDNA).
    Npu1,
    /// NPU2: early XDNA 2 silicon.
    Npu2,
    /// NPU4: Strix Point (XDNA 2).
    Npu4,
    /// NPU5: Strix Halo (XDNA 2).
    Npu5,
    /// NPU6: Krackan Point (XDNA 2).
    Npu6,
}

impl XdnaNpu {
    /// The NPU behind a PCI device id and revision (the driver's `(device, revision)` key).
    pub fn from_ids(device: u16, revision: Option<u8>) -> Option<Self> {
        match (device, revision) {
            (0x1502, _) => Some(Self::Npu1),
            (0x17f0, Some(0x00)) => Some(Self::Npu2),
            (0x17f0, Some(0x10)) => Some(Self::Npu4),
            (0x17f0, Some(0x11)) => Some(Self::Npu5),
            (0x17f0, Some(0x20)) => Some(Self::Npu6),
            _ => None,
        }
    }

    fn model(self) -> &'static str {
        match self {
            Self::Npu1 => "AMD Ryzen AI NPU (Phoenix/Hawk Point)",
            Self::Npu2 => "AMD Ryzen AI NPU (XDNA 2)",
            Self::Npu4 => "AMD Ryzen AI NPU (Strix Point)",
            Self::Npu5 => "AMD Ryzen AI NPU (Strix Halo)",
            Self::Npu6 => "AMD Ryzen AI NPU (Krackan Point)",
        }
    }

    fn architecture(self) -> &'static str {
        match self {
            Self::Npu1 => "xdna",
            _ => "xdna2",
        }
    }

    /// AIE columns: the XDNA 2 parts have an 8-column array (xrt-smi reports "8 columns").
    fn columns(self) -> Option<u32> {
        match self {
            Self::Npu1 | Self::Npu2 => None,
            _ => Some(8),
        }
    }

    /// AIE-ML (XDNA) and AIE-ML v2 (XDNA 2) vector units take int4, int8, int16 and
    /// bfloat16 (AMD UG1603, "Supported Vector Data Types"); XDNA 2's block FP16 has no
    /// variant here.
    pub fn precisions(self) -> BTreeSet<Precision> {
        [Precision::Bf16, Precision::Int8, Precision::Int4].into()
    }
}

fn xdna_device(
    host: &HostRoot,
    function: &PciFunction,
    npu: Option<XdnaNpu>,
    index: usize,
    node: Option<&str>,
) -> Device {
    let model = npu.map_or("AMD NPU", XdnaNpu::model);
    let mut device = Device::new(
        function.address.clone(),
        Vendor::Amd,
        Family::Npu,
        model,
        "xdna",
    );
    device.index = u32::try_from(index).ok();
    if let Some(npu) = npu {
        device.architecture = Some(npu.architecture().to_string());
        device.compute_units = npu.columns();
        device.precisions = npu.precisions();
    }
    let dir = function.sysfs_dir();
    device.firmware_version = host
        .read_trimmed(format!("{dir}/fw_version"))
        .filter(|v| is_version(v));
    let attributes = &mut device.attributes;
    attributes.insert("memory".into(), "shared-system-memory".into());
    if let Some(vbnv) = host.read_trimmed(format!("{dir}/vbnv")) {
        attributes.insert("vbnv".into(), vbnv);
    }
    if let Some(path) = node.and_then(|n| accel_node::dev_path(host, n)) {
        attributes.insert("device-node".into(), path);
    }
    if let Some(driver) = pci::driver(host, &function.address) {
        attributes.insert("driver".into(), driver);
    }
    device
}

/// A dotted version like the driver's `fw_version` (`1.1.2.65`); the attribute reads
/// `0.0.0.0` before the firmware answered, which says nothing.
pub fn is_version(text: &str) -> bool {
    let parts: Vec<&str> = text.split('.').collect();
    parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        && parts.iter().any(|p| p.chars().any(|c| c != '0'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::testing::detect_on;
    use crate::detect::{CommandRunner, HostRoot};
    use proptest::prelude::*;
    use std::fs;

    #[test]
    fn device_table_follows_the_driver() {
        assert_eq!(XdnaNpu::from_ids(0x1502, Some(0)), Some(XdnaNpu::Npu1));
        assert_eq!(XdnaNpu::from_ids(0x17f0, Some(0x10)), Some(XdnaNpu::Npu4));
        assert_eq!(XdnaNpu::from_ids(0x17f0, Some(0x11)), Some(XdnaNpu::Npu5));
        assert_eq!(XdnaNpu::from_ids(0x17f0, Some(0x20)), Some(XdnaNpu::Npu6));
        assert_eq!(XdnaNpu::from_ids(0x17f0, None), None);
        assert_eq!(XdnaNpu::from_ids(0x1480, Some(0)), None);
        assert!(is_version("1.1.2.65"));
        assert!(!is_version("0.0.0.0"));
        assert!(!is_version("unknown"));
    }

    #[test]
    fn strix_point_laptop_fixture() {
        let findings = detect_on(&Xdna, "ryzen-ai-laptop");
        assert!(findings.warnings.is_empty());
        let [npu] = findings.devices.as_slice() else {
            panic!("one NPU expected: {:?}", findings.devices)
        };
        assert_eq!(npu.id, "0000:c5:00.1");
        assert_eq!(npu.model, "AMD Ryzen AI NPU (Strix Point)");
        assert_eq!(npu.family, Family::Npu);
        assert_eq!(npu.architecture.as_deref(), Some("xdna2"));
        assert_eq!(npu.compute_units, Some(8));
        assert_eq!(npu.firmware_version.as_deref(), Some("1.0.0.166"));
        assert_eq!(
            npu.attributes.get("vbnv").map(String::as_str),
            Some("RyzenAI-npu4")
        );
        assert_eq!(
            npu.attributes.get("device-node").map(String::as_str),
            Some("/dev/accel/accel0")
        );
    }

    #[test]
    fn phoenix_npu_without_firmware_answer() {
        let dir = tempfile::tempdir().unwrap();
        let function = dir.path().join("sys/bus/pci/devices/0000:c4:00.1");
        fs::create_dir_all(&function).unwrap();
        fs::write(function.join("vendor"), "0x1022\n").unwrap();
        fs::write(function.join("class"), "0x118000\n").unwrap();
        fs::write(function.join("device"), "0x1502\n").unwrap();
        fs::write(function.join("revision"), "0x00\n").unwrap();
        fs::write(function.join("fw_version"), "0.0.0.0\n").unwrap();
        let ctx = Context::new(HostRoot::new(dir.path()), CommandRunner::new(Vec::new()));
        let findings = Xdna.detect(&ctx);
        assert_eq!(
            findings.devices[0].model,
            "AMD Ryzen AI NPU (Phoenix/Hawk Point)"
        );
        assert_eq!(findings.devices[0].firmware_version, None);
        assert_eq!(findings.devices[0].compute_units, None);
    }

    #[test]
    fn hosts_without_xdna_find_nothing() {
        assert_eq!(detect_on(&Xdna, "pci-misc"), Findings::default());
        assert_eq!(detect_on(&Xdna, "laptop-npu"), Findings::default());
    }

    proptest! {
        #[test]
        fn version_check_never_panics(s in ".*") {
            let _ = is_version(&s);
        }

        #[test]
        fn ids_never_panic(device in any::<u16>(), revision in any::<Option<u8>>()) {
            let _ = XdnaNpu::from_ids(device, revision);
        }
    }
}
