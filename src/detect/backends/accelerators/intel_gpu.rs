//! Intel GPUs: Data Center GPU Max ("Ponte Vecchio") and Flex, Arc, and integrated graphics.
//!
//! The GPUs are the display-class PCI functions of vendor 0x8086 bound to `i915` or `xe`.
//! Sysfs names the device id, DRM card and tile count; memory comes from `xpu-smi` when it is
//! installed, else from the driver's sysfs (`lmem_total_bytes` of Intel's out-of-tree i915,
//! per-tile `physical_vram_size_bytes` of xe), else from the device-id table for parts sold in
//! one memory size. Integrated GPUs (by convention the function at bus 0, device 2) are
//! reported too, with no memory of their own. `xpu-smi topology -m` adds Xe Link groups.

pub mod part_catalog;
pub mod xpu_smi;

use std::collections::{BTreeMap, BTreeSet};

use crate::detect::backends::shared::tool_output::{Tool, Wording};
use crate::detect::{Backend, Context, Findings, HostRoot, PciFunction, pci};
use crate::hardware::{Device, Family, InterconnectGroup, InterconnectKind, Vendor};

use xpu_smi::XpuDevice;

/// Intel's PCI vendor id.
const INTEL_VENDOR: u16 = 0x8086;

/// The kernel drivers of Intel GPUs.
const DRIVERS: [&str; 2] = ["i915", "xe"];

/// Where integrated graphics sit on every Intel platform.
const INTEGRATED_SLOT: &str = "0000:00:02.0";

/// The `intel-gpu` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct IntelGpu;

impl Backend for IntelGpu {
    fn name(&self) -> &'static str {
        "intel-gpu"
    }

    fn detect(&self, ctx: &Context) -> Findings {
        let host = ctx.host();
        let gpus: Vec<(&PciFunction, String)> = ctx
            .pci_by_vendor(INTEL_VENDOR)
            .filter(|f| f.class_code() >> 8 == 0x03)
            .filter_map(|f| {
                let driver = pci::bound_driver(host, &f.address)?;
                DRIVERS.contains(&driver.as_str()).then_some((f, driver))
            })
            .collect();
        if gpus.is_empty() {
            return Findings::default();
        }
        let mut findings = Findings::default();
        let tool = run_dump(ctx, &mut findings.warnings);
        let cards = pci::drm_cards(host);
        findings.devices = gpus
            .iter()
            .map(|(function, driver)| {
                let facts = tool
                    .iter()
                    .find(|d| d.bus_id.as_deref() == Some(&function.address));
                build_device(host, function, driver, facts, &cards)
            })
            .collect();
        findings.devices.sort_by(|a, b| a.id.cmp(&b.id));
        if tool.len() > 1 {
            findings.interconnects = xe_link_groups(ctx, &tool, &mut findings.warnings);
        }
        findings
    }
}

/// Intel's GPU tool.
const XPU_SMI: Tool = Tool::new("xpu-smi", Wording::UnusableOutput);

/// Runs the `xpu-smi` dump; empty when the tool is missing (silently) or unusable (warned).
fn run_dump(ctx: &Context, warnings: &mut Vec<String>) -> Vec<XpuDevice> {
    let args = ["discovery", "--dump", xpu_smi::DUMP_FIELDS];
    let parse = xpu_smi::parse_discovery_dump;
    XPU_SMI
        .run_parsed(ctx, &args, parse, warnings)
        .unwrap_or_default()
}

/// Xe Link groups: cards joined by direct links, from `xpu-smi topology -m`.
fn xe_link_groups(
    ctx: &Context,
    tool: &[XpuDevice],
    warnings: &mut Vec<String>,
) -> Vec<InterconnectGroup> {
    let parse = xpu_smi::parse_topology_matrix;
    let Some(pairs) = XPU_SMI.run_parsed(ctx, &["topology", "-m"], parse, warnings) else {
        return Vec::new();
    };
    let bus_of: BTreeMap<u32, String> = tool
        .iter()
        .filter_map(|d| Some((d.index?, d.bus_id.clone()?)))
        .collect();
    let links: BTreeSet<(String, String)> = pairs
        .iter()
        .filter_map(|(a, b)| {
            let (a, b) = (bus_of.get(a)?, bus_of.get(b)?);
            Some((a.min(b).clone(), a.max(b).clone()))
        })
        .collect();
    components(&links)
        .into_iter()
        .map(|members| {
            let all_to_all = members.iter().all(|a| {
                members
                    .iter()
                    .filter(|b| a < *b)
                    .all(|b| links.contains(&(a.clone(), b.clone())))
            });
            InterconnectGroup {
                kind: InterconnectKind::Xelink,
                id: InterconnectGroup::local_id(
                    InterconnectKind::Xelink,
                    &members.iter().cloned().collect::<Vec<_>>(),
                ),
                devices: members.into_iter().collect(),
                links_per_device: None,
                bandwidth_gbps: None,
                topology: all_to_all.then(|| "all-to-all".to_string()),
            }
        })
        .collect()
}

/// Connected sets of bus ids under the given links (each pair smaller-first).
fn components(links: &BTreeSet<(String, String)>) -> Vec<BTreeSet<String>> {
    let mut groups: Vec<BTreeSet<String>> = Vec::new();
    for (a, b) in links {
        let touching: Vec<usize> = groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.contains(a) || g.contains(b))
            .map(|(i, _)| i)
            .collect();
        let mut merged: BTreeSet<String> = [a.clone(), b.clone()].into();
        for i in touching.into_iter().rev() {
            merged.extend(groups.remove(i));
        }
        groups.push(merged);
    }
    groups.sort();
    groups
}

fn build_device(
    host: &HostRoot,
    function: &PciFunction,
    driver: &str,
    tool: Option<&XpuDevice>,
    cards: &BTreeMap<String, String>,
) -> Device {
    let address = function.address.as_str();
    let device_id = function.device_id(host);
    let architecture = device_id.and_then(part_catalog::architecture);
    let part = device_id.and_then(part_catalog::part_for);
    let card = cards.get(address);
    let integrated = address == INTEGRATED_SLOT;
    let model = tool
        .and_then(|t| t.name.clone())
        .or_else(|| part.map(|p| p.name.to_string()))
        .unwrap_or_else(|| part_catalog::fallback_name(device_id));

    let mut device = Device::new(address, Vendor::Intel, Family::Gpu, model, "intel-gpu");
    device.index = tool.and_then(|t| t.index);
    let memory = if integrated {
        // Integrated graphics share system memory; there is no device memory to report.
        None
    } else {
        memory(host, address, card, tool, part)
    };
    if let Some((bytes, source)) = memory {
        device.memory_bytes = Some(bytes);
        device
            .attributes
            .insert("memory_source".into(), source.into());
    }
    device.precisions = architecture
        .map_or(part_catalog::BASELINE_PRECISIONS, |a| a.precisions)
        .iter()
        .copied()
        .collect();
    device.architecture = architecture.map(|a| a.name.to_string());
    let eu_count = tool.and_then(|t| t.eu_count);
    device.compute_units = eu_count
        .zip(architecture)
        .map(|(eus, architecture)| eus / architecture.eus_per_xe_core)
        .filter(|&cores| cores > 0);
    device.driver_version = tool
        .and_then(|t| t.driver_version.clone())
        .or_else(|| host.read_trimmed(format!("/sys/module/{driver}/version")));
    device.firmware_version = tool.and_then(|t| t.firmware_version.clone());
    device.uuid = tool.and_then(|t| t.uuid.clone());
    device.numa_node = pci::numa_node(host, address);
    device.pcie = pci::link(host, address);

    let attributes = &mut device.attributes;
    attributes.insert("driver".into(), driver.to_string());
    if let Some(id) = device_id {
        attributes.insert("pci_device_id".into(), format!("0x{id:04x}"));
    }
    if let Some(card) = card {
        attributes.insert("drm_card".into(), card.clone());
    }
    if let Some(tiles) = tile_count(host, address, card) {
        attributes.insert("tiles".into(), tiles.to_string());
    }
    if let Some(eus) = eu_count {
        attributes.insert("eu_count".into(), eus.to_string());
    }
    if integrated {
        attributes.insert("integrated".into(), "true".into());
    }
    device
}

/// Device memory and where it came from: `xpu-smi`, the driver's sysfs, or the part table.
fn memory(
    host: &HostRoot,
    address: &str,
    card: Option<&String>,
    tool: Option<&XpuDevice>,
    part: Option<part_catalog::Part>,
) -> Option<(u64, &'static str)> {
    if let Some(bytes) = tool.and_then(|t| t.memory_bytes) {
        return Some((bytes, "xpu-smi"));
    }
    let device_dir = format!("{}/{address}", pci::PCI_DEVICES);
    let lmem = card
        .map(|card| format!("/sys/class/drm/{card}/lmem_total_bytes"))
        .into_iter()
        .chain([format!("{device_dir}/lmem_total_bytes")])
        .find_map(|path| host.read_u64(path).filter(|&b| b > 0));
    let xe_vram = || {
        tiles(host, &device_dir)
            .into_iter()
            .filter_map(|tile| {
                let dir = format!("{device_dir}/{tile}");
                host.read_u64(format!("{dir}/physical_vram_size_bytes"))
                    .or_else(|| host.read_u64(format!("{dir}/memory/physical_vram_size_bytes")))
            })
            .reduce(u64::saturating_add)
            .filter(|&b| b > 0)
    };
    if let Some(bytes) = lmem.or_else(xe_vram) {
        return Some((bytes, "sysfs"));
    }
    part.and_then(|p| p.memory_bytes).map(|b| (b, "catalog"))
}

/// `tileN` directories of an xe device.
fn tiles(host: &HostRoot, device_dir: &str) -> Vec<String> {
    host.list(device_dir)
        .into_iter()
        .filter(|name| {
            name.strip_prefix("tile")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect()
}

/// Tiles of a GPU: xe's `tileN` directories, or i915's `gt/gtN` directories on the card.
fn tile_count(host: &HostRoot, address: &str, card: Option<&String>) -> Option<usize> {
    let xe = tiles(host, &format!("{}/{address}", pci::PCI_DEVICES)).len();
    if xe > 0 {
        return Some(xe);
    }
    let card = card?;
    let gts = host
        .list(format!("/sys/class/drm/{card}/gt"))
        .into_iter()
        .filter(|name| name.starts_with("gt"))
        .count();
    (gts > 0).then_some(gts)
}

#[cfg(test)]
mod tests;
