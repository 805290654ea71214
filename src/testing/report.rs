//! Detection reports for tests: hand-built nodes for the cases the label scheme and the CRD
//! conversion are about (8 x H100 NVSwitch, mixed L4 + A100, an overlong product name,
//! CPU-only, every node-wide fact filled in), and [`ReportBuilder`] for synthetic nodes of
//! any size (n identical accelerators at consecutive PCI addresses, one fabric over them).
//!
//! Reports detected from the fixture hosts are in [`super::fixture`].

use std::collections::BTreeSet;

use crate::hardware::{
    CpuInfo, Device, Family, GIB, HealthStatus, InterconnectGroup, InterconnectKind, MIB,
    NetworkAdapter, NicKind, NumaNode, PcieLink, Precision, RuntimeEnv, Vendor,
};
use crate::hardware::{Report, Warning};

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
    let cpu = host_cpu(Vendor::Amd, "AMD EPYC 9654 96-Core Processor");
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

/// The CPU backend's device for the host's processors (`cpu:0`).
pub fn host_cpu(vendor: Vendor, model: &str) -> Device {
    Device::new("cpu:0", vendor, Family::Cpu, model, "cpu")
}

/// An accelerator as its vendor's backend reports it, with only a model and a memory size;
/// [`ReportBuilder::accelerators`] gives it its PCI address.
pub fn accelerator(vendor: Vendor, family: Family, model: &str, memory_bytes: u64) -> Device {
    let backend = match vendor {
        Vendor::Nvidia => "nvidia",
        Vendor::Amd => "amd",
        Vendor::Intel if family == Family::Npu => "intel-npu",
        Vendor::Intel => "intel-gpu",
        Vendor::Google => "tpu",
        Vendor::Aws => "neuron",
        _ => "pci",
    };
    let mut device = Device::new("0000:00:00.0", vendor, family, model, backend);
    device.memory_bytes = Some(memory_bytes);
    device
}

/// A synthetic node's report: identical accelerators at consecutive PCI addresses
/// (`0000:10:00.0`, `0000:11:00.0`... unless [`first_bus`](Self::first_bus) says otherwise),
/// any other devices as given, and at most one interconnect group over the accelerators.
///
/// ```ignore
/// let node = ReportBuilder::new()
///     .accelerators(8, &accelerator(Vendor::Nvidia, Family::Gpu, "NVIDIA H100 80GB HBM3", 80 * GIB))
///     .fabric(InterconnectKind::Nvswitch, Some(18))
///     .build();
/// ```
#[derive(Debug, Clone)]
pub struct ReportBuilder {
    devices: Vec<Device>,
    accelerator_ids: Vec<String>,
    /// A `u16` so that filling bus `ff` does not overflow; past `ff` is refused.
    next_bus: u16,
    fabric: Option<(InterconnectKind, Option<u32>)>,
}

impl Default for ReportBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ReportBuilder {
    /// An empty report whose first accelerator goes to bus `0x10`.
    pub fn new() -> Self {
        Self {
            devices: Vec::new(),
            accelerator_ids: Vec::new(),
            next_bus: 0x10,
            fabric: None,
        }
    }

    /// The PCI bus of the next accelerator.
    #[must_use]
    pub fn first_bus(mut self, bus: u8) -> Self {
        self.next_bus = u16::from(bus);
        self
    }

    /// `count` copies of `device`, each at the next PCI address (`0000:<bus>:00.0`).
    ///
    /// # Panics
    /// When the addresses run past bus `ff`.
    #[must_use]
    pub fn accelerators(mut self, count: usize, device: &Device) -> Self {
        for _ in 0..count {
            assert!(
                self.next_bus <= 0xff,
                "a synthetic report has at most 256 accelerator buses"
            );
            let mut copy = device.clone();
            copy.id = format!("0000:{:02x}:00.0", self.next_bus);
            self.next_bus += 1;
            self.accelerator_ids.push(copy.id.clone());
            self.devices.push(copy);
        }
        self
    }

    /// One more device, kept as it is (the host CPU, a device at a chosen address).
    #[must_use]
    pub fn device(mut self, device: Device) -> Self {
        self.devices.push(device);
        self
    }

    /// One interconnect group (`id` `0`) of `kind` over every accelerator.
    #[must_use]
    pub fn fabric(mut self, kind: InterconnectKind, links_per_device: Option<u32>) -> Self {
        self.fabric = Some((kind, links_per_device));
        self
    }

    /// The report, devices sorted by id as `merge` sorts them.
    pub fn build(self) -> Report {
        let mut report = report_with(self.devices);
        if let Some((kind, links_per_device)) = self.fabric {
            report.interconnects.push(InterconnectGroup {
                kind,
                id: "0".into(),
                devices: self.accelerator_ids,
                links_per_device,
                bandwidth_gbps: None,
                topology: None,
            });
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_node_has_consecutive_addresses_and_one_fabric_over_its_accelerators() {
        let l4 = accelerator(Vendor::Nvidia, Family::Gpu, "NVIDIA L4", 24 * GIB);
        let report = ReportBuilder::new()
            .first_bus(0xfe)
            .accelerators(2, &l4)
            .device(host_cpu(Vendor::Intel, "Intel Xeon"))
            .fabric(InterconnectKind::Nvlink, Some(4))
            .build();
        let ids: Vec<&str> = report.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["0000:fe:00.0", "0000:ff:00.0", "cpu:0"]);
        assert_eq!(report.devices[0].backend, "nvidia");
        assert_eq!(report.interconnects.len(), 1);
        assert_eq!(
            report.interconnects[0].devices,
            ["0000:fe:00.0", "0000:ff:00.0"]
        );
        assert_eq!(report.interconnects[0].links_per_device, Some(4));
    }

    #[test]
    #[should_panic(expected = "at most 256")]
    fn addresses_never_wrap_around() {
        let l4 = accelerator(Vendor::Nvidia, Family::Gpu, "NVIDIA L4", 24 * GIB);
        let _ = ReportBuilder::new().first_bus(0xff).accelerators(2, &l4);
    }
}
