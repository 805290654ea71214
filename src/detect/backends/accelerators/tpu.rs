//! Google Cloud TPUs: chips found on the PCI bus (vendor 0x1ae0) and named by device id,
//! their device nodes (`/dev/vfio/N` for v5e and later, `/dev/accelN` before), and the ICI
//! topology the host's chips form.
//!
//! The PCI ids and the per-chip HBM sizes follow Google's own `tpu-info` tool
//! (cloud-accelerator-diagnostics, `tpu_info/device.py`): v2 and v3 share device 0x0027 and
//! differ in the subsystem id (0x004e, 0x004f); v4 is 0x005e, v5e 0x0063, v5p 0x0062,
//! v6e 0x006f and TPU7x 0x0076.
//!
//! The slice topology lives in the GCE metadata attribute `tpu-env` (`TOPOLOGY: '2x2'`), which
//! detection cannot reach: it never talks to the network. When a node startup script saves
//! that attribute to [`TPU_ENV_PATH`], its topology and accelerator type are used; otherwise
//! the topology of the host's own chips is derived from their count and generation and marked
//! `derived` in the chips' `ici-topology-source` attribute.

use std::collections::{BTreeMap, BTreeSet};

use crate::detect::{Backend, Context, Findings, HostRoot, PciFunction, pci};
use crate::hardware::{
    Device, Family, GIB, InterconnectGroup, InterconnectKind, Precision, Vendor,
};

use crate::detect::backends::shared::accel_node;

/// Google's PCI vendor id.
pub const GOOGLE_VENDOR_ID: u16 = 0x1ae0;

/// Where a saved copy of the GCE `tpu-env` metadata attribute is looked for.
pub const TPU_ENV_PATH: &str = "/etc/hwaccel/tpu-env";

/// The `tpu` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tpu;

impl Backend for Tpu {
    fn name(&self) -> &'static str {
        "tpu"
    }

    fn detect(&self, ctx: &Context) -> Findings {
        let host = ctx.host();
        let chips: Vec<(&PciFunction, TpuGeneration)> = ctx
            .pci_by_vendor(GOOGLE_VENDOR_ID)
            // gVNIC and NVMe functions need no device-id read.
            .filter(|f| !pci::is_plumbing(f.class_code()))
            .filter_map(|function| Some((function, generation_of(host, function)?)))
            .collect();
        if chips.is_empty() {
            return Findings::default();
        }
        let env = host
            .read(TPU_ENV_PATH)
            .map(|text| parse_tpu_env(&text))
            .unwrap_or_default();
        let accel_nodes = accel_node::nodes_by_bus_id(host);
        let mut devices: Vec<Device> = chips
            .iter()
            .enumerate()
            .map(|(index, (function, generation))| {
                let node = device_node(host, function, *generation, index, &accel_nodes);
                chip_device(host, function, *generation, index, node)
            })
            .collect();
        let interconnects = ici_groups(&chips, &env, &mut devices);
        Findings {
            devices,
            interconnects,
            ..Findings::default()
        }
    }
}

/// A TPU chip generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TpuGeneration {
    /// TPU v2.
    V2,
    /// TPU v3.
    V3,
    /// TPU v4.
    V4,
    /// TPU v5e ("v5litepod").
    V5e,
    /// TPU v5p.
    V5p,
    /// TPU v6e (Trillium).
    V6e,
    /// TPU7x (Ironwood).
    V7x,
}

impl TpuGeneration {
    /// The generation behind a Google PCI device id (and, for v2/v3, the subsystem id).
    pub fn from_pci_ids(device: u16, subsystem_device: Option<u16>) -> Option<Self> {
        match device {
            // v2 and v3 share the device id; the subsystem id tells them apart.
            0x0027 => match subsystem_device? {
                0x004e => Some(Self::V2),
                0x004f => Some(Self::V3),
                _ => None,
            },
            0x005e => Some(Self::V4),
            0x0063 => Some(Self::V5e),
            0x0062 => Some(Self::V5p),
            0x006f => Some(Self::V6e),
            0x0076 => Some(Self::V7x),
            _ => None,
        }
    }

    /// Short architecture name (`v5e`), as Google's APIs and logs spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::V2 => "v2",
            Self::V3 => "v3",
            Self::V4 => "v4",
            Self::V5e => "v5e",
            Self::V5p => "v5p",
            Self::V6e => "v6e",
            Self::V7x => "7x",
        }
    }

    fn model(self) -> &'static str {
        match self {
            Self::V2 => "TPU v2",
            Self::V3 => "TPU v3",
            Self::V4 => "TPU v4",
            Self::V5e => "TPU v5e",
            Self::V5p => "TPU v5p",
            Self::V6e => "TPU v6e (Trillium)",
            Self::V7x => "TPU7x (Ironwood)",
        }
    }

    /// HBM per chip. tpu-info lists v2/v3 per TensorCore (8 and 16 GiB, two per chip);
    /// the rest are per chip as in Google's system-architecture pages.
    pub fn hbm_bytes(self) -> u64 {
        let gib = match self {
            Self::V2 | Self::V5e => 16,
            Self::V3 | Self::V4 | Self::V6e => 32,
            Self::V5p => 95,
            Self::V7x => 192,
        };
        gib * GIB
    }

    /// TensorCores per chip (v4, v5p and 7x have two; v5e and v6e one).
    fn tensor_cores(self) -> u32 {
        match self {
            Self::V5e | Self::V6e => 1,
            _ => 2,
        }
    }

    /// Precisions the MXUs compute natively. Google's spec tables: v4/v5e/v5p/v6e list bf16
    /// and int8 peaks; the TPU7x table gives v5p and v6e the same FP8 as BF16 peak (accepted,
    /// not accelerated), and only TPU7x a doubled FP8 rate, so fp8 is listed for 7x alone.
    /// v2/v3 have bf16 MXUs only. fp32 runs everywhere as multi-pass bf16 on the MXU.
    pub fn precisions(self) -> BTreeSet<Precision> {
        use Precision::{Bf16, Fp8, Fp32, Int8};
        let list: &[Precision] = match self {
            Self::V2 | Self::V3 => &[Fp32, Bf16],
            Self::V4 | Self::V5e | Self::V5p | Self::V6e => &[Fp32, Bf16, Int8],
            Self::V7x => &[Fp32, Bf16, Fp8],
        };
        list.iter().copied().collect()
    }

    /// Whether the ICI forms a 3D torus (v4, v5p, 7x) or a 2D one (v2, v3, v5e, v6e).
    fn is_3d(self) -> bool {
        matches!(self, Self::V4 | Self::V5p | Self::V7x)
    }

    /// Chips from v5e on are driven through VFIO (`/dev/vfio/N`); earlier ones by the
    /// `/dev/accelN` driver (tpu-info's `chip_path`).
    fn uses_vfio(self) -> bool {
        matches!(self, Self::V5e | Self::V5p | Self::V6e | Self::V7x)
    }

    /// ICI ports per chip and unidirectional bandwidth per chip in GB/s, where Google's
    /// tables give them (v5e: 4 ports, 400 GB/s bidirectional; v6e: 4 ports, 800 GB/s).
    fn ici_links(self) -> (Option<u32>, Option<f64>) {
        match self {
            Self::V5e => (Some(4), Some(200.0)),
            Self::V6e => (Some(4), Some(400.0)),
            _ => (None, None),
        }
    }
}

/// The generation of a Google PCI function, `None` for Google's other functions (gVNIC, NVMe).
fn generation_of(host: &HostRoot, function: &PciFunction) -> Option<TpuGeneration> {
    let device = function.device_id(host)?;
    let subsystem = host
        .read_u64(format!("{}/subsystem_device", function.sysfs_dir()))
        .and_then(|id| u16::try_from(id).ok());
    TpuGeneration::from_pci_ids(device, subsystem)
}

/// The device node a chip is opened through, when it exists on the host.
fn device_node(
    host: &HostRoot,
    function: &PciFunction,
    generation: TpuGeneration,
    index: usize,
    accel_nodes: &BTreeMap<String, String>,
) -> Option<String> {
    let candidate = if generation.uses_vfio() {
        // A VFIO group node is named after the function's IOMMU group; tpu-info assumes the
        // chip's index, which holds on TPU VMs, so that is the fallback.
        let group = host
            .link_name(format!("{}/iommu_group", function.sysfs_dir()))
            .unwrap_or_else(|| index.to_string());
        format!("/dev/vfio/{group}")
    } else {
        match accel_nodes.get(&function.address) {
            Some(node) => return accel_node::dev_path(host, node),
            None => format!("/dev/accel{index}"),
        }
    };
    host.exists(&candidate).then_some(candidate)
}

fn chip_device(
    host: &HostRoot,
    function: &PciFunction,
    generation: TpuGeneration,
    index: usize,
    node: Option<String>,
) -> Device {
    let mut device = Device::new(
        function.address.clone(),
        Vendor::Google,
        Family::Tpu,
        generation.model(),
        "tpu",
    );
    device.index = u32::try_from(index).ok();
    device.architecture = Some(generation.name().to_string());
    device.memory_bytes = Some(generation.hbm_bytes());
    device.compute_units = Some(generation.tensor_cores());
    device.precisions = generation.precisions();
    if let Some(node) = node {
        device.attributes.insert("device-node".into(), node);
    }
    if let Some(driver) = pci::driver(host, &function.address) {
        device.attributes.insert("driver".into(), driver);
    }
    device
}

/// One ICI group per generation with at least two chips on this host, and the topology
/// attributes on every chip.
fn ici_groups(
    chips: &[(&PciFunction, TpuGeneration)],
    env: &BTreeMap<String, String>,
    devices: &mut [Device],
) -> Vec<InterconnectGroup> {
    let mut by_generation: BTreeMap<TpuGeneration, Vec<usize>> = BTreeMap::new();
    for (position, (_, generation)) in chips.iter().enumerate() {
        by_generation.entry(*generation).or_default().push(position);
    }
    let env_topology = env.get("TOPOLOGY").filter(|t| !t.is_empty());
    let mut groups = Vec::new();
    for (generation, positions) in by_generation {
        let (topology, source) = match env_topology {
            Some(topology) => (topology.clone(), "tpu-env"),
            None => (derive_topology(generation, positions.len()), "derived"),
        };
        for &position in &positions {
            let attributes = &mut devices[position].attributes;
            attributes.insert("ici-topology".into(), topology.clone());
            attributes.insert("ici-topology-source".into(), source.into());
            if let Some(kind) = env.get("ACCELERATOR_TYPE") {
                attributes.insert("accelerator-type".into(), kind.clone());
            }
            if let Some(worker) = env.get("WORKER_ID") {
                attributes.insert("tpu-worker-id".into(), worker.clone());
            }
        }
        if positions.len() < 2 {
            continue;
        }
        let mut members: Vec<String> = positions.iter().map(|&p| devices[p].id.clone()).collect();
        members.sort();
        let id = match env.get("NODE_ID") {
            Some(node) => format!("ici:{node}"),
            None => InterconnectGroup::local_id(InterconnectKind::Ici, &members),
        };
        let (links_per_device, bandwidth_gbps) = generation.ici_links();
        groups.push(InterconnectGroup {
            kind: InterconnectKind::Ici,
            id,
            devices: members,
            links_per_device,
            bandwidth_gbps,
            topology: Some(topology),
        });
    }
    groups
}

/// Parses the GCE `tpu-env` metadata attribute: one `KEY: 'value'` per line (quotes
/// optional). Lines without a key are skipped.
pub fn parse_tpu_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(':')?;
            let key = key.trim();
            let valid_key = !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if !valid_key {
                return None;
            }
            let value = value.trim();
            let value = value
                .strip_prefix('\'')
                .and_then(|v| v.strip_suffix('\''))
                .unwrap_or(value);
            Some((key.to_string(), value.to_string()))
        })
        .collect()
}

/// The topology the host's chips form, from their count: v5e/v6e hosts hold 1, 4 or 8 chips
/// as `1x1`, `2x2`, `2x4`; v4/v5p/7x hosts 4 chips as `2x2x1`. Other counts use the most
/// nearly square factorisation.
pub fn derive_topology(generation: TpuGeneration, chips: usize) -> String {
    let chips = chips.max(1);
    // The largest divisor not above the square root gives the most nearly square grid.
    let mut short = 1;
    let mut candidate = 1;
    while candidate * candidate <= chips {
        if chips.is_multiple_of(candidate) {
            short = candidate;
        }
        candidate += 1;
    }
    let long = chips / short;
    if generation.is_3d() {
        format!("{short}x{long}x1")
    } else {
        format!("{short}x{long}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::testing::detect_on;
    use crate::detect::{CommandRunner, HostRoot};
    use proptest::prelude::*;
    use std::fs;

    #[test]
    fn pci_ids_match_tpu_info() {
        use TpuGeneration::*;
        assert_eq!(TpuGeneration::from_pci_ids(0x0027, Some(0x004e)), Some(V2));
        assert_eq!(TpuGeneration::from_pci_ids(0x0027, Some(0x004f)), Some(V3));
        assert_eq!(TpuGeneration::from_pci_ids(0x0027, None), None);
        assert_eq!(TpuGeneration::from_pci_ids(0x005e, None), Some(V4));
        assert_eq!(TpuGeneration::from_pci_ids(0x0063, Some(0)), Some(V5e));
        assert_eq!(TpuGeneration::from_pci_ids(0x0062, None), Some(V5p));
        assert_eq!(TpuGeneration::from_pci_ids(0x006f, None), Some(V6e));
        assert_eq!(TpuGeneration::from_pci_ids(0x0076, None), Some(V7x));
        // gVNIC is a Google function but not a TPU.
        assert_eq!(TpuGeneration::from_pci_ids(0x0042, None), None);
        assert_eq!(V5p.hbm_bytes(), 95 * GIB);
        assert!(V7x.precisions().contains(&Precision::Fp8));
        assert!(!V6e.precisions().contains(&Precision::Fp8));
    }

    #[test]
    fn derives_host_topologies() {
        assert_eq!(derive_topology(TpuGeneration::V5e, 1), "1x1");
        assert_eq!(derive_topology(TpuGeneration::V5e, 4), "2x2");
        assert_eq!(derive_topology(TpuGeneration::V6e, 8), "2x4");
        assert_eq!(derive_topology(TpuGeneration::V4, 4), "2x2x1");
        assert_eq!(derive_topology(TpuGeneration::V5e, 0), "1x1");
        assert_eq!(derive_topology(TpuGeneration::V5e, 7), "1x7");
    }

    #[test]
    fn parses_tpu_env_metadata() {
        let env = parse_tpu_env(
            "ACCELERATOR_TYPE: 'v5litepod-16'\nCHIPS_PER_HOST_BOUNDS: '2,2,1'\n\
             TOPOLOGY: '4x4'\nWORKER_ID: '2'\nINJECT_SLICE_BUILDER_FAULT: ''\nnot a line\n",
        );
        assert_eq!(env.get("TOPOLOGY").map(String::as_str), Some("4x4"));
        assert_eq!(
            env.get("ACCELERATOR_TYPE").map(String::as_str),
            Some("v5litepod-16")
        );
        assert_eq!(
            env.get("INJECT_SLICE_BUILDER_FAULT").map(String::as_str),
            Some("")
        );
        assert_eq!(env.len(), 5);
    }

    #[test]
    fn v5e_host_fixture() {
        let findings = detect_on(&Tpu, "tpu-v5e-4");
        assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
        let ids: Vec<&str> = findings.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "0000:00:04.0",
                "0000:00:05.0",
                "0000:00:06.0",
                "0000:00:07.0"
            ]
        );
        let chip = &findings.devices[2];
        assert_eq!(chip.model, "TPU v5e");
        assert_eq!(chip.family, Family::Tpu);
        assert_eq!(chip.index, Some(2));
        assert_eq!(chip.memory_bytes, Some(16 * GIB));
        assert_eq!(chip.compute_units, Some(1));
        assert_eq!(
            chip.attributes.get("device-node").map(String::as_str),
            Some("/dev/vfio/2")
        );
        assert_eq!(
            chip.attributes.get("driver").map(String::as_str),
            Some("vfio-pci")
        );
        assert_eq!(
            chip.attributes
                .get("ici-topology-source")
                .map(String::as_str),
            Some("derived")
        );
        let [group] = findings.interconnects.as_slice() else {
            panic!("one ICI group expected: {:?}", findings.interconnects)
        };
        assert_eq!(group.kind, InterconnectKind::Ici);
        assert_eq!(group.topology.as_deref(), Some("2x2"));
        assert_eq!(group.devices.len(), 4);
        assert_eq!(group.links_per_device, Some(4));
    }

    #[test]
    fn hosts_without_tpus_find_nothing() {
        let findings = detect_on(&Tpu, "trn1-32xl");
        assert_eq!(findings, Findings::default());
    }

    #[test]
    fn saved_tpu_env_supplies_the_slice_topology() {
        let dir = tempfile::tempdir().unwrap();
        for (slot, bus) in [("0000:00:04.0", 0), ("0000:00:05.0", 1)] {
            let sys = dir.path().join("sys/bus/pci/devices").join(slot);
            fs::create_dir_all(&sys).unwrap();
            fs::write(sys.join("vendor"), "0x1ae0\n").unwrap();
            fs::write(sys.join("class"), "0x120000\n").unwrap();
            fs::write(sys.join("device"), "0x006f\n").unwrap();
            fs::create_dir_all(dir.path().join("dev/vfio")).unwrap();
            fs::write(dir.path().join(format!("dev/vfio/{bus}")), "").unwrap();
        }
        fs::create_dir_all(dir.path().join("etc/hwaccel")).unwrap();
        fs::write(
            dir.path().join("etc/hwaccel/tpu-env"),
            "ACCELERATOR_TYPE: 'v6e-16'\nNODE_ID: 'train-a'\nTOPOLOGY: '4x4'\n",
        )
        .unwrap();
        let ctx = Context::new(HostRoot::new(dir.path()), CommandRunner::new(Vec::new()));
        let findings = Tpu.detect(&ctx);
        assert_eq!(findings.devices.len(), 2);
        assert_eq!(findings.devices[0].model, "TPU v6e (Trillium)");
        assert_eq!(
            findings.devices[1]
                .attributes
                .get("accelerator-type")
                .map(String::as_str),
            Some("v6e-16")
        );
        assert_eq!(findings.interconnects[0].id, "ici:train-a");
        assert_eq!(findings.interconnects[0].topology.as_deref(), Some("4x4"));
        assert_eq!(
            findings.devices[0]
                .attributes
                .get("device-node")
                .map(String::as_str),
            Some("/dev/vfio/0")
        );
    }

    proptest! {
        #[test]
        fn tpu_env_parser_never_panics(s in ".*") {
            let _ = parse_tpu_env(&s);
        }

        #[test]
        fn tpu_env_parser_survives_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let _ = parse_tpu_env(&String::from_utf8_lossy(&bytes));
        }

        #[test]
        fn derived_topologies_cover_every_chip(chips in 1usize..512) {
            let topology = derive_topology(TpuGeneration::V5e, chips);
            let product: usize = topology.split('x').map(|d| d.parse::<usize>().unwrap()).product();
            prop_assert_eq!(product, chips);
        }
    }
}
