//! AMD Instinct and Radeon GPUs.
//!
//! Sysfs is the primary source and needs no ROCm install: the PCI functions of vendor 0x1002
//! bound to `amdgpu` are the GPUs; amdgpu's attributes on each give VRAM, VBIOS, partition
//! modes and RAS health ([`amdgpu_sysfs`]); the KFD topology gives the gfx target, compute units and
//! the XGMI hive ([`kfd`]). `amd-smi` (or `rocm-smi` on older installs) only adds the marketing
//! name, the tool's GPU index and an in-box driver's version ([`amd_smi`]); without either tool the
//! name comes from a device-id table ([`gfx_catalog`]).

pub mod amd_smi;
pub mod amdgpu_sysfs;
pub mod gfx_catalog;
pub mod kfd;

use std::collections::BTreeMap;

use crate::detect::backends::shared::tool_output::{Tool, Wording};
use crate::detect::{Backend, Context, Findings, HostRoot, PciFunction, pci};
use crate::hardware::{Device, Family, Partition, Vendor};

use amd_smi::SmiGpu;
use amdgpu_sysfs::AmdgpuFacts;
use kfd::Topology;

/// AMD's PCI vendor id for GPUs.
const AMD_GPU_VENDOR: u16 = 0x1002;

/// Where the amdgpu module publishes its version (DKMS builds only; in-box drivers have none).
const MODULE_VERSION: &str = "/sys/module/amdgpu/version";

/// AMD's tool for its GPUs.
const AMD_SMI: Tool = Tool::new("amd-smi", Wording::UnusableOutput);
/// Its predecessor, all that older ROCm installs have.
const ROCM_SMI: Tool = Tool::new("rocm-smi", Wording::UnusableOutput);

/// The `amd` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Amd;

impl Backend for Amd {
    fn name(&self) -> &'static str {
        "amd"
    }

    fn detect(&self, ctx: &Context) -> Findings {
        let host = ctx.host();
        let gpus: Vec<&PciFunction> = ctx
            .pci_by_vendor(AMD_GPU_VENDOR)
            .filter(|f| f.is_accelerator_class())
            .filter(|f| pci::bound_driver(host, &f.address).as_deref() == Some("amdgpu"))
            .collect();
        if gpus.is_empty() {
            return Findings::default();
        }
        let mut findings = Findings::default();
        let tools = tool_facts(ctx, &mut findings.warnings);
        let topology = kfd::read(host);
        let host_facts = HostFacts {
            driver_version: host.read_trimmed(MODULE_VERSION),
            cards: pci::drm_cards(host),
        };
        findings.devices = gpus
            .iter()
            .map(|f| {
                let tool = tools
                    .iter()
                    .find(|g| g.bus_id.as_deref() == Some(&f.address));
                build_device(host, f, &topology, tool, &host_facts)
            })
            .collect();
        findings.devices.sort_by(|a, b| a.id.cmp(&b.id));
        findings.interconnects = kfd::xgmi_groups(&topology)
            .into_iter()
            .filter(|group| {
                group
                    .devices
                    .iter()
                    .all(|id| findings.devices.iter().any(|d| &d.id == id))
            })
            .collect();
        findings
    }
}

/// Facts shared by every GPU of the host.
struct HostFacts {
    driver_version: Option<String>,
    /// PCI bus id to DRM card name (`card0`).
    cards: BTreeMap<String, String>,
}

/// Asks `amd-smi`, or `rocm-smi` when `amd-smi` is missing or unusable. A missing tool is
/// silent; one that fails or prints nothing usable leaves a warning.
fn tool_facts(ctx: &Context, warnings: &mut Vec<String>) -> Vec<SmiGpu> {
    let parse = amd_smi::parse_amd_smi_static;
    let amd_smi = AMD_SMI.run_parsed(ctx, &["static", "--json"], parse, warnings);
    if let Some(gpus) = amd_smi {
        return gpus;
    }
    let args = [
        "--showproductname",
        "--showmeminfo",
        "vram",
        "--showbus",
        "--json",
    ];
    ROCM_SMI
        .run_parsed(ctx, &args, amd_smi::parse_rocm_smi, warnings)
        .unwrap_or_default()
}

fn build_device(
    host: &HostRoot,
    function: &PciFunction,
    topology: &Topology,
    tool: Option<&SmiGpu>,
    host_facts: &HostFacts,
) -> Device {
    let address = function.address.as_str();
    let facts = amdgpu_sysfs::read(host, &function.sysfs_dir());
    let nodes: Vec<&kfd::KfdGpu> = topology.nodes_of(address).collect();
    let device_id = function.device_id(host);
    let part = device_id.and_then(gfx_catalog::known_part);
    let gfx = nodes
        .iter()
        .find_map(|node| gfx_catalog::gfx_name(node.gfx_target_version))
        .or_else(|| tool.and_then(|t| t.gfx.clone()))
        .or_else(|| part.map(|p| p.gfx.to_string()));
    let model = tool
        .and_then(|t| t.market_name.clone())
        .or_else(|| facts.product_name.clone())
        .or_else(|| part.map(|p| p.name.to_string()))
        .unwrap_or_else(|| match device_id {
            Some(id) => format!("AMD GPU [0x{id:04x}]"),
            None => "AMD GPU".to_string(),
        });

    let mut device = Device::new(address, Vendor::Amd, Family::Gpu, model, "amd");
    device.index = tool.and_then(|t| t.index);
    let integrated = gfx.as_deref().is_some_and(gfx_catalog::is_integrated);
    // An APU's VRAM figure is a carve-out of system memory, not memory of its own.
    device.memory_bytes = (!integrated)
        .then(|| {
            facts
                .vram_bytes
                .or_else(|| sum(nodes.iter().map(|n| n.memory_bytes)))
                .or_else(|| tool.and_then(|t| t.vram_bytes))
                .or_else(|| part.and_then(|p| p.memory_bytes))
        })
        .flatten();
    device.compute_units = sum(nodes.iter().map(|n| n.compute_units.map(u64::from)))
        .and_then(|n| u32::try_from(n).ok())
        .or_else(|| tool.and_then(|t| t.compute_units));
    if let Some(generation) = gfx.as_deref().and_then(gfx_catalog::generation) {
        device.precisions = generation.precisions.iter().copied().collect();
        device
            .attributes
            .insert("generation".into(), generation.name.into());
    }
    device.architecture = gfx;
    device.driver_version = host_facts
        .driver_version
        .clone()
        .or_else(|| tool.and_then(|t| t.driver_version.clone()));
    device.firmware_version = facts
        .vbios
        .clone()
        .or_else(|| tool.and_then(|t| t.vbios.clone()));
    device.uuid = facts
        .unique_id
        .clone()
        .or_else(|| tool.and_then(|t| t.serial.clone()));
    device.numa_node = pci::numa_node(host, address);
    device.pcie = pci::link(host, address);
    device.partitions = partitions(&facts, tool);
    device.health = facts.health.clone().unwrap_or_default();
    add_attributes(
        &mut device,
        device_id,
        &facts,
        &nodes,
        host_facts,
        integrated,
    );
    // The board serial, the AMD exporter's join key (`serial_number`): sysfs, else amd-smi.
    if let Some(serial) = facts
        .serial_number
        .clone()
        .or_else(|| tool.and_then(|t| t.board_serial.clone()))
    {
        device.attributes.insert("serial".into(), serial);
    }
    device
}

/// The sum of the known values; `None` when none is known.
fn sum(values: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    values.flatten().reduce(|a, b| a.saturating_add(b))
}

/// The current compute and memory partition modes (from sysfs, else from the tool).
fn partitions(facts: &AmdgpuFacts, tool: Option<&SmiGpu>) -> Vec<Partition> {
    let compute = facts
        .compute_partition
        .clone()
        .or_else(|| tool.and_then(|t| t.compute_partition.clone()));
    let memory = facts
        .memory_partition
        .clone()
        .or_else(|| tool.and_then(|t| t.memory_partition.clone()));
    [("amd-compute", compute), ("amd-memory", memory)]
        .into_iter()
        .filter_map(|(kind, profile)| {
            Some(Partition {
                kind: kind.to_string(),
                profile: profile?,
                id: None,
                memory_bytes: None,
            })
        })
        .collect()
}

fn add_attributes(
    device: &mut Device,
    device_id: Option<u16>,
    facts: &AmdgpuFacts,
    nodes: &[&kfd::KfdGpu],
    host_facts: &HostFacts,
    integrated: bool,
) {
    let attributes = &mut device.attributes;
    if let Some(id) = device_id {
        attributes.insert("pci_device_id".into(), format!("0x{id:04x}"));
    }
    if let Some(card) = host_facts.cards.get(&device.id) {
        attributes.insert("drm_card".into(), card.clone());
    }
    let render_nodes: Vec<String> = nodes
        .iter()
        .filter_map(|n| n.render_minor)
        .map(|minor| format!("renderD{minor}"))
        .collect();
    if !render_nodes.is_empty() {
        attributes.insert("render_nodes".into(), render_nodes.join(","));
    }
    if nodes.len() > 1 {
        // A partitioned GPU shows up as one KFD node (and one ROCm device) per partition.
        attributes.insert("kfd_nodes".into(), nodes.len().to_string());
    }
    if let Some(xcc) = sum(nodes.iter().map(|n| n.xcc_count)) {
        attributes.insert("xcc_count".into(), xcc.to_string());
    }
    for (key, modes) in [
        (
            "compute_partitions_available",
            &facts.compute_partitions_available,
        ),
        (
            "memory_partitions_available",
            &facts.memory_partitions_available,
        ),
    ] {
        if !modes.is_empty() {
            attributes.insert(key.into(), modes.join(","));
        }
    }
    if integrated {
        attributes.insert("integrated".into(), "true".into());
    }
}

#[cfg(test)]
mod tests;
