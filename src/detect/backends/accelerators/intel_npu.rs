//! Intel NPUs in Core Ultra SoCs (Meteor/Arrow/Lunar/Panther Lake): PCI functions of the
//! `intel_vpu` driver, their `/dev/accel/accelN` node, and the driver's sysfs attributes.
//!
//! Device ids and NPU generations follow the kernel driver (`drivers/accel/ivpu/ivpu_drv.h`):
//! MTL 0x7d1d and ARL 0xad1d are NPU 37xx, LNL 0x643e is 40xx, PTL-P 0xb03e and WCL 0xfd3e
//! are 50xx. The NPU has no memory of its own (it works in system memory) and the driver
//! publishes no firmware version in sysfs, so both stay unknown.

use std::collections::BTreeSet;

use crate::detect::{Backend, Context, Findings, HostRoot, PciFunction, pci};
use crate::hardware::{Device, Family, Precision, Vendor};

use crate::detect::backends::shared::accel_node;

/// Intel's PCI vendor id.
const INTEL_VENDOR_ID: u16 = 0x8086;
/// The kernel driver's name.
const DRIVER: &str = "intel_vpu";

/// The `intel-npu` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct IntelNpu;

impl Backend for IntelNpu {
    fn name(&self) -> &'static str {
        "intel-npu"
    }

    fn detect(&self, ctx: &Context) -> Findings {
        let host = ctx.host();
        let npus: Vec<(&PciFunction, Option<NpuGeneration>)> = ctx
            .pci_by_vendor(INTEL_VENDOR_ID)
            // NPUs are processing accelerators (0x1200); checking the class first keeps the
            // dozens of other Intel functions of a laptop from costing a read each.
            .filter(|f| f.class_code() == 0x1200)
            .filter_map(|f| {
                let generation = f.device_id(host).and_then(NpuGeneration::from_device_id);
                let bound = pci::driver(host, &f.address).as_deref() == Some(DRIVER);
                (generation.is_some() || bound).then_some((f, generation))
            })
            .collect();
        accel_node::devices_with_nodes(host, &npus, |function, extra, index, node| {
            npu_device(host, function, extra, index, node)
        })
    }
}

/// An Intel NPU generation, as the `ivpu` driver groups them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NpuGeneration {
    /// NPU 37xx in Meteor Lake.
    MeteorLake,
    /// NPU 37xx in Arrow Lake.
    ArrowLake,
    /// NPU 40xx (NPU 4) in Lunar Lake.
    LunarLake,
    /// NPU 50xx (NPU 5) in Panther Lake.
    PantherLake,
    /// NPU 50xx in Wildcat Lake.
    WildcatLake,
}

impl NpuGeneration {
    /// The generation behind an Intel PCI device id.
    pub fn from_device_id(device: u16) -> Option<Self> {
        match device {
            0x7d1d => Some(Self::MeteorLake),
            0xad1d => Some(Self::ArrowLake),
            0x643e => Some(Self::LunarLake),
            0xb03e => Some(Self::PantherLake),
            0xfd3e => Some(Self::WildcatLake),
            _ => None,
        }
    }

    fn model(self) -> &'static str {
        match self {
            Self::MeteorLake => "Intel NPU (Meteor Lake)",
            Self::ArrowLake => "Intel NPU (Arrow Lake)",
            Self::LunarLake => "Intel NPU 4 (Lunar Lake)",
            Self::PantherLake => "Intel NPU 5 (Panther Lake)",
            Self::WildcatLake => "Intel NPU 5 (Wildcat Lake)",
        }
    }

    /// The driver's hardware IP generation (`ivpu_hw_ip_gen`).
    fn architecture(self) -> &'static str {
        match self {
            Self::MeteorLake | Self::ArrowLake => "npu37xx",
            Self::LunarLake => "npu40xx",
            Self::PantherLake | Self::WildcatLake => "npu50xx",
        }
    }

    /// Neural Compute Engines: 2 in NPU 37xx, 6 in NPU 4, 3 (with doubled MAC arrays) in NPU 5.
    fn compute_engines(self) -> u32 {
        match self {
            Self::MeteorLake | Self::ArrowLake => 2,
            Self::LunarLake => 6,
            Self::PantherLake | Self::WildcatLake => 3,
        }
    }

    /// INT8 and FP16 MAC arrays through NPU 4; Intel's Panther Lake disclosure adds native
    /// FP8 to NPU 5.
    pub fn precisions(self) -> BTreeSet<Precision> {
        let mut set: BTreeSet<Precision> = [Precision::Fp16, Precision::Int8].into();
        if matches!(self, Self::PantherLake | Self::WildcatLake) {
            set.insert(Precision::Fp8);
        }
        set
    }
}

fn npu_device(
    host: &HostRoot,
    function: &PciFunction,
    generation: Option<NpuGeneration>,
    index: usize,
    node: Option<&str>,
) -> Device {
    let model = generation.map_or("Intel NPU", NpuGeneration::model);
    let mut device = Device::new(
        function.address.clone(),
        Vendor::Intel,
        Family::Npu,
        model,
        "intel-npu",
    );
    device.index = u32::try_from(index).ok();
    if let Some(generation) = generation {
        device.architecture = Some(generation.architecture().to_string());
        device.compute_units = Some(generation.compute_engines());
        device.precisions = generation.precisions();
    }
    // The NPU computes in system memory; say so instead of leaving readers to guess.
    device
        .attributes
        .insert("memory".into(), "shared-system-memory".into());
    if let Some(path) = node.and_then(|n| accel_node::dev_path(host, n)) {
        device.attributes.insert("device-node".into(), path);
    }
    if let Some(driver) = pci::driver(host, &function.address) {
        device.attributes.insert("driver".into(), driver);
    }
    // `npu_busy_time_us` and the runtime-PM state change by the second; a report must not,
    // or every agent pass would write, so they are left out.
    device
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::testing::detect_on;
    use crate::detect::{CommandRunner, HostRoot};
    use std::fs;

    #[test]
    fn device_ids_follow_the_driver() {
        assert_eq!(
            NpuGeneration::from_device_id(0x7d1d),
            Some(NpuGeneration::MeteorLake)
        );
        assert_eq!(
            NpuGeneration::from_device_id(0x643e),
            Some(NpuGeneration::LunarLake)
        );
        assert_eq!(
            NpuGeneration::from_device_id(0xb03e),
            Some(NpuGeneration::PantherLake)
        );
        // The Meteor Lake iGPU is an Intel function too, but not an NPU.
        assert_eq!(NpuGeneration::from_device_id(0x7d55), None);
        assert!(
            NpuGeneration::PantherLake
                .precisions()
                .contains(&Precision::Fp8)
        );
        assert!(
            !NpuGeneration::LunarLake
                .precisions()
                .contains(&Precision::Fp8)
        );
    }

    #[test]
    fn meteor_lake_laptop_fixture() {
        let findings = detect_on(&IntelNpu, "laptop-npu");
        assert!(findings.warnings.is_empty());
        let [npu] = findings.devices.as_slice() else {
            panic!("one NPU expected: {:?}", findings.devices)
        };
        assert_eq!(npu.id, "0000:00:0b.0");
        assert_eq!(npu.model, "Intel NPU (Meteor Lake)");
        assert_eq!(npu.family, Family::Npu);
        assert_eq!(npu.architecture.as_deref(), Some("npu37xx"));
        assert_eq!(npu.memory_bytes, None);
        assert_eq!(
            npu.attributes.get("device-node").map(String::as_str),
            Some("/dev/accel/accel0")
        );
        assert_eq!(
            npu.attributes.get("driver").map(String::as_str),
            Some("intel_vpu")
        );
        assert!(
            !npu.attributes.contains_key("busy-time-us"),
            "usage is not a fact"
        );
        let precisions: Vec<_> = npu.precisions.iter().map(|p| p.as_str()).collect();
        assert_eq!(precisions, ["fp16", "int8"]);
    }

    #[test]
    fn unknown_device_bound_to_the_driver_is_still_an_npu() {
        let dir = tempfile::tempdir().unwrap();
        let function = dir.path().join("sys/bus/pci/devices/0000:00:0b.0");
        fs::create_dir_all(&function).unwrap();
        fs::write(function.join("vendor"), "0x8086\n").unwrap();
        fs::write(function.join("class"), "0x120000\n").unwrap();
        fs::write(function.join("device"), "0xffff\n").unwrap();
        std::os::unix::fs::symlink(
            "../../../../bus/pci/drivers/intel_vpu",
            function.join("driver"),
        )
        .unwrap();
        let ctx = Context::new(HostRoot::new(dir.path()), CommandRunner::new(Vec::new()));
        let findings = IntelNpu.detect(&ctx);
        assert_eq!(findings.devices.len(), 1);
        assert_eq!(findings.devices[0].model, "Intel NPU");
        assert!(findings.devices[0].precisions.is_empty());
    }

    #[test]
    fn hosts_without_an_npu_find_nothing() {
        assert_eq!(detect_on(&IntelNpu, "trn1-32xl"), Findings::default());
    }
}
