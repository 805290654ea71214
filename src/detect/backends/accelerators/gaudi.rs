//! Intel Gaudi AI accelerators (Habana Labs, PCI vendor 0x1da3).
//!
//! The devices are the PCI functions of vendor 0x1da3 bound to `habanalabs`. The driver's sysfs
//! attributes (on `/sys/class/accel/accelN/device` since the driver moved to the accel
//! subsystem, on `/sys/class/habanalabs/hlN` before) give the device type, module id, serial,
//! firmware and status; `hl-smi -Q ... -f csv,noheader` adds the board name, memory, index and
//! UUID ([`hl_smi`]). Without `hl-smi`, memory comes from the generation's fixed HBM size.
//!
//! Gaudi's scale-up network is on the chip: RoCE ports wired all-to-all across the OAM
//! baseboard (Gaudi 2 and 3: 24 ports, 3 to each of the 7 peers, 21 in all), so the OAM devices
//! of one generation form one `gaudilink` group. PCIe cards have no such wiring.

pub mod hl_smi;

use std::collections::BTreeMap;

use crate::detect::backends::shared::tool_output::{Tool, Wording};
use crate::detect::{Backend, Context, Findings, HostRoot, PciFunction, pci};
use crate::hardware::{
    Device, Family, GIB, Health, InterconnectGroup, InterconnectKind, Precision, Vendor,
};

use hl_smi::HlSmiDevice;

/// Habana Labs' PCI vendor id.
const HABANA_VENDOR: u16 = 0x1da3;

/// Where the driver publishes its version.
const MODULE_VERSION: &str = "/sys/module/habanalabs/version";

/// A Gaudi generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation {
    /// Architecture name (`gaudi2`).
    pub name: &'static str,
    /// Model name.
    pub model: &'static str,
    /// HBM per device, the same on every SKU of the generation.
    pub memory_bytes: u64,
    /// Tensor processor cores.
    pub tpcs: u32,
    /// Native precisions.
    pub precisions: &'static [Precision],
    /// Scale-up wiring of the OAM baseboard: ports to each peer, ports in all, Gb/s per port.
    pub scale_up: (u32, u32, u32),
}

use Precision::{Bf16, Fp8, Fp16, Fp32, Int8, Tf32};

// Habana's white papers: Gaudi's MME computes in FP32 and BF16, its TPCs add integer formats;
// Gaudi 2's MME adds TF32, FP16 and FP8 (E4M3/E5M2), and Gaudi 3 keeps that set. HBM: 32 GB
// HBM2 on Gaudi, 96 GB HBM2E on Gaudi 2, 128 GB HBM2E on Gaudi 3. Ports: Gaudi has 10x100GbE
// with 7 used for the baseboard's all-to-all, Gaudi 2 24x100GbE and Gaudi 3 24x200GbE with 21.
const GAUDI: Generation = Generation {
    name: "gaudi",
    model: "Intel Gaudi",
    memory_bytes: 32 * GIB,
    tpcs: 8,
    precisions: &[Fp32, Bf16, Int8],
    scale_up: (1, 7, 100),
};
const GAUDI2: Generation = Generation {
    name: "gaudi2",
    model: "Intel Gaudi 2",
    memory_bytes: 96 * GIB,
    tpcs: 24,
    precisions: &[Fp32, Tf32, Bf16, Fp16, Fp8, Int8],
    scale_up: (3, 21, 100),
};
const GAUDI3: Generation = Generation {
    name: "gaudi3",
    model: "Intel Gaudi 3",
    memory_bytes: 128 * GIB,
    tpcs: 64,
    precisions: &[Fp32, Tf32, Bf16, Fp16, Fp8, Int8],
    scale_up: (3, 21, 200),
};

/// The generation from the PCI device id, else from the driver's `device_type`.
pub fn generation(device_id: Option<u16>, device_type: Option<&str>) -> Option<Generation> {
    let by_id = match device_id {
        Some(0x1000 | 0x1010) => Some(GAUDI),
        Some(0x1020 | 0x1021 | 0x1030) => Some(GAUDI2),
        Some(0x1060..=0x1063) => Some(GAUDI3),
        _ => None,
    };
    by_id.or_else(|| {
        let device_type = device_type?.trim().to_ascii_uppercase();
        if device_type.starts_with("GAUDI3") {
            Some(GAUDI3)
        } else if device_type.starts_with("GAUDI2") {
            Some(GAUDI2)
        } else if device_type.starts_with("GAUDI") {
            Some(GAUDI)
        } else {
            None
        }
    })
}

/// True for the PCIe add-in cards (HL-288 Gaudi 2, HL-338 Gaudi 3), which lack the baseboard's
/// all-to-all wiring.
fn is_pcie_card(device_id: Option<u16>, board: Option<&str>) -> bool {
    matches!(device_id, Some(0x1021 | 0x1063))
        || board.is_some_and(|b| b.starts_with("HL-288") || b.starts_with("HL-338"))
}

/// The `gaudi` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gaudi;

impl Backend for Gaudi {
    fn name(&self) -> &'static str {
        "gaudi"
    }

    fn detect(&self, ctx: &Context) -> Findings {
        let host = ctx.host();
        let functions: Vec<&PciFunction> = ctx
            .pci_by_vendor(HABANA_VENDOR)
            .filter(|f| f.is_accelerator_class())
            .filter(|f| pci::bound_driver(host, &f.address).as_deref() == Some("habanalabs"))
            .collect();
        if functions.is_empty() {
            return Findings::default();
        }
        let mut findings = Findings::default();
        let tool = run_query(ctx, &mut findings.warnings);
        let class_dirs = class_dirs(host);
        let module_version = host.read_trimmed(MODULE_VERSION);
        let mut built: Vec<(Device, Option<Generation>, bool)> = functions
            .iter()
            .map(|function| {
                let row = tool
                    .iter()
                    .find(|d| d.bus_id.as_deref() == Some(&function.address));
                let class = class_dirs.get(&function.address);
                build_device(host, function, class, row, module_version.as_deref())
            })
            .collect();
        built.sort_by(|a, b| a.0.id.cmp(&b.0.id));
        findings.interconnects = scale_up_groups(&built);
        findings.devices = built.into_iter().map(|(device, _, _)| device).collect();
        findings
    }
}

/// Habana's tool.
const HL_SMI: Tool = Tool::new("hl-smi", Wording::UnusableOutput);

/// Runs the `hl-smi` query; empty when hl-smi is missing (silently) or unusable (warned).
fn run_query(ctx: &Context, warnings: &mut Vec<String>) -> Vec<HlSmiDevice> {
    let args = ["-Q", hl_smi::QUERY_FIELDS, "-f", "csv,noheader"];
    let parse = hl_smi::parse_query;
    HL_SMI
        .run_parsed(ctx, &args, parse, warnings)
        .unwrap_or_default()
}

/// The driver's class device of each Gaudi, by bus id: its name (`accel0`, `hl0`) and the
/// directory holding its attributes.
fn class_dirs(host: &HostRoot) -> BTreeMap<String, (String, String)> {
    let mut dirs = BTreeMap::new();
    for name in host.list("/sys/class/habanalabs") {
        let dir = format!("/sys/class/habanalabs/{name}");
        if let Some(bus) =
            pci_addr(host, &dir).or_else(|| pci::bus_id_of(host, &format!("{dir}/device")))
        {
            dirs.insert(bus, (name, dir));
        }
    }
    // The accel layout is the current one; where both exist it wins.
    for name in host.list("/sys/class/accel") {
        let dir = format!("/sys/class/accel/{name}/device");
        if let Some(bus) = pci::bus_id_of(host, &dir).or_else(|| pci_addr(host, &dir)) {
            dirs.insert(bus, (name, dir));
        }
    }
    dirs
}

fn pci_addr(host: &HostRoot, dir: &str) -> Option<String> {
    host.read_trimmed(format!("{dir}/pci_addr"))
        .and_then(|addr| pci::canonical_bus_id(&addr))
}

fn build_device(
    host: &HostRoot,
    function: &PciFunction,
    class: Option<&(String, String)>,
    row: Option<&HlSmiDevice>,
    module_version: Option<&str>,
) -> (Device, Option<Generation>, bool) {
    let address = function.address.as_str();
    let attr_dir = class.map_or_else(|| function.sysfs_dir(), |(_, dir)| dir.clone());
    let attr = |name: &str| host.read_trimmed(format!("{attr_dir}/{name}"));
    let device_id = function.device_id(host);
    let device_type = attr("device_type");
    let generation = generation(device_id, device_type.as_deref());
    let board = row.and_then(|r| r.name.clone());
    let model = generation.map_or_else(
        || match device_id {
            Some(id) => format!("Intel Gaudi [0x{id:04x}]"),
            None => "Intel Gaudi".to_string(),
        },
        |g| g.model.to_string(),
    );

    let mut device = Device::new(address, Vendor::Intel, Family::Asic, model, "gaudi");
    device.index = row.and_then(|r| r.index);
    let memory = row
        .and_then(|r| r.memory_bytes)
        .map(|b| (b, "hl-smi"))
        .or_else(|| generation.map(|g| (g.memory_bytes, "catalog")));
    if let Some((bytes, source)) = memory {
        device.memory_bytes = Some(bytes);
        device
            .attributes
            .insert("memory_source".into(), source.into());
    }
    if let Some(g) = generation {
        device.architecture = Some(g.name.to_string());
        device.precisions = g.precisions.iter().copied().collect();
        device.compute_units = Some(g.tpcs);
    }
    device.driver_version = row
        .and_then(|r| r.driver_version.clone())
        .or_else(|| module_version.map(str::to_string))
        .or_else(|| attr("driver_ver"));
    device.firmware_version = attr("cpucp_ver")
        .or_else(|| attr("armcp_ver"))
        .and_then(|v| hl_smi::parse_firmware_version(&v));
    device.uuid = row.and_then(|r| r.uuid.clone());
    device.numa_node = pci::numa_node(host, address);
    device.pcie = pci::link(host, address);
    device.health = health(attr("status").as_deref());

    let module_id =
        attr("module_id").or_else(|| row.and_then(|r| r.module_id.map(|m| m.to_string())));
    let serial = attr("serial_number").or_else(|| row.and_then(|r| r.serial.clone()));
    let pcie_card = is_pcie_card(device_id, board.as_deref());
    let attributes = &mut device.attributes;
    for (key, value) in [
        ("pci_device_id", device_id.map(|id| format!("0x{id:04x}"))),
        ("device_type", device_type),
        ("board", board),
        ("module_id", module_id),
        ("serial", serial),
        ("class_device", class.map(|(name, _)| name.clone())),
        (
            "form_factor",
            Some(if pcie_card { "pcie" } else { "oam" }.to_string()),
        ),
    ] {
        if let Some(value) = value {
            attributes.insert(key.into(), value);
        }
    }
    (device, generation, pcie_card)
}

fn health(status: Option<&str>) -> Health {
    let Some(status) = status else {
        return Health::default();
    };
    let (verdict, reason) = hl_smi::status_health(status);
    Health {
        status: verdict,
        reasons: reason.into_iter().collect(),
        ..Health::default()
    }
}

/// One all-to-all group per generation over its OAM devices. With fewer than eight devices
/// visible (a VM given part of the baseboard), each still reaches every other over its ports
/// to that peer, so the link count shrinks with the group.
fn scale_up_groups(devices: &[(Device, Option<Generation>, bool)]) -> Vec<InterconnectGroup> {
    let mut by_generation: BTreeMap<&str, (Generation, Vec<String>)> = BTreeMap::new();
    for (device, generation, pcie_card) in devices {
        if let (Some(g), false) = (generation, pcie_card) {
            by_generation
                .entry(g.name)
                .or_insert_with(|| (*g, Vec::new()))
                .1
                .push(device.id.clone());
        }
    }
    by_generation
        .into_values()
        .filter(|(_, members)| members.len() > 1)
        .map(|(g, mut members)| {
            members.sort();
            let (per_peer, most, gbps) = g.scale_up;
            let peers = u32::try_from(members.len() - 1).unwrap_or(u32::MAX);
            let links = per_peer.saturating_mul(peers).min(most);
            InterconnectGroup {
                kind: InterconnectKind::Gaudilink,
                id: InterconnectGroup::local_id(InterconnectKind::Gaudilink, &members),
                devices: members,
                links_per_device: Some(links),
                // Gb/s per port to GB/s per device, one direction.
                bandwidth_gbps: Some(f64::from(links) * f64::from(gbps) / 8.0),
                topology: Some("all-to-all".to_string()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
