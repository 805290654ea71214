//! The KFD topology (`/sys/class/kfd/kfd/topology/nodes/<n>`), the ROCm kernel driver's view of
//! compute agents: one node per CPU socket and per GPU (per partition, when a GPU is split), each
//! with a `properties` file of `name value` lines, memory banks, and IO links to other nodes.
//!
//! From it come what sysfs' PCI view lacks: the gfx target, the compute-unit count, the XGMI
//! hive id and the XGMI links between GPUs, which make the hive's interconnect group.
//! It is also a source of a GPU's memory size when sysfs's `mem_info_vram_total` is missing:
//! the memory banks' `size_in_bytes`, else the node's `local_mem_size`.

use std::collections::{BTreeMap, BTreeSet};

use crate::detect::HostRoot;
use crate::hardware::{InterconnectGroup, InterconnectKind};

/// Where KFD publishes its topology.
pub const TOPOLOGY_NODES: &str = "/sys/class/kfd/kfd/topology/nodes";

/// KFD's IO link type for XGMI (`HSA_IOLINK_TYPE_XGMI`); PCIe is 2.
const IOLINK_TYPE_XGMI: u64 = 11;

/// One GPU node of the topology (a whole GPU, or one partition of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KfdGpu {
    /// The KFD node number.
    pub node: u32,
    /// Canonical PCI bus id, from `domain` and `location_id`.
    pub bus_id: String,
    /// `gfx_target_version` (`90402`).
    pub gfx_target_version: u64,
    /// Compute units of this node.
    pub compute_units: Option<u32>,
    /// XGMI hive id; 0 when the GPU is in no hive.
    pub hive_id: u64,
    /// The DRM render minor (`128` is `/dev/dri/renderD128`).
    pub render_minor: Option<u64>,
    /// Accelerator complex dies (XCCs) in this node.
    pub xcc_count: Option<u64>,
    /// Device-local memory of this node: its memory banks, else its `local_mem_size`.
    pub memory_bytes: Option<u64>,
}

/// One IO link out of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoLink {
    /// Link type (2 PCIe, 11 XGMI).
    pub link_type: u64,
    /// The node at the far end.
    pub node_to: u32,
    /// Peak bandwidth in MB/s, when the driver reports it (0 when it does not).
    pub max_bandwidth_mbps: u64,
}

/// What the topology says about the GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// GPU nodes, by node number.
    pub gpus: Vec<KfdGpu>,
    /// IO links of the GPU nodes, by node number.
    pub links: BTreeMap<u32, Vec<IoLink>>,
}

impl Topology {
    /// The GPU nodes of one PCI device (several when it is partitioned).
    pub fn nodes_of<'a>(&'a self, bus_id: &'a str) -> impl Iterator<Item = &'a KfdGpu> + 'a {
        self.gpus.iter().filter(move |gpu| gpu.bus_id == bus_id)
    }
}

/// Parses a KFD `properties` file: one `name value` pair per line, values unsigned integers.
/// Lines that do not fit are skipped, so a newer kernel's extra fields do no harm.
pub fn parse_properties(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next()?;
            let value = words.next()?.parse::<u64>().ok()?;
            words.next().is_none().then(|| (name.to_string(), value))
        })
        .collect()
}

/// The canonical bus id of KFD's `domain` and `location_id` (bus << 8 | device << 3 | function).
pub fn bus_id(domain: u64, location_id: u64) -> Option<String> {
    if domain > 0xffff || location_id > 0xffff {
        return None;
    }
    let bus = location_id >> 8;
    let device = (location_id >> 3) & 0x1f;
    let function = location_id & 0x7;
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

/// A GPU node from its properties; `None` for CPU nodes (no SIMDs) and nodes without a bus id.
pub fn gpu_from_properties(node: u32, props: &BTreeMap<String, u64>) -> Option<KfdGpu> {
    let get = |name: &str| props.get(name).copied();
    if get("simd_count").unwrap_or(0) == 0 {
        return None;
    }
    let bus_id = bus_id(get("domain").unwrap_or(0), get("location_id")?)?;
    Some(KfdGpu {
        node,
        bus_id,
        gfx_target_version: get("gfx_target_version").unwrap_or(0),
        compute_units: compute_units(props),
        hive_id: get("hive_id").unwrap_or(0),
        render_minor: get("drm_render_minor").filter(|&minor| minor > 0),
        xcc_count: get("num_xcc").filter(|&n| n > 0),
        memory_bytes: None,
    })
}

/// Compute units: SIMDs divided by SIMDs per CU, which is exact; the shader-array product
/// counts CUs the die has rather than those enabled, so it is only the fallback.
fn compute_units(props: &BTreeMap<String, u64>) -> Option<u32> {
    let get = |name: &str| props.get(name).copied().filter(|&v| v > 0);
    let units = match (get("simd_count"), get("simd_per_cu")) {
        (Some(simds), Some(per_cu)) => simds / per_cu,
        _ => get("array_count")? * get("cu_per_simd_array")?,
    };
    u32::try_from(units).ok().filter(|&u| u > 0)
}

/// Parses an IO link's `properties`; `None` without a type or far end.
pub fn parse_io_link(text: &str) -> Option<IoLink> {
    let props = parse_properties(text);
    Some(IoLink {
        link_type: *props.get("type")?,
        node_to: u32::try_from(*props.get("node_to")?).ok()?,
        max_bandwidth_mbps: props.get("max_bandwidth").copied().unwrap_or(0),
    })
}

/// Device-local memory from a memory bank's `properties`: heap types 1 and 2 are the public and
/// private frame buffer; 0 is system memory.
pub fn parse_mem_bank(text: &str) -> Option<u64> {
    let props = parse_properties(text);
    let heap = props.get("heap_type").copied()?;
    matches!(heap, 1 | 2)
        .then(|| props.get("size_in_bytes").copied())
        .flatten()
        .filter(|&size| size > 0)
}

/// Reads the topology under a host root; empty when KFD is not loaded.
pub fn read(host: &HostRoot) -> Topology {
    let mut topology = Topology::default();
    for name in host.list(TOPOLOGY_NODES) {
        let Ok(node) = name.parse::<u32>() else {
            continue;
        };
        let dir = format!("{TOPOLOGY_NODES}/{name}");
        let Some(props) = host.read(format!("{dir}/properties")) else {
            continue;
        };
        let props = parse_properties(&props);
        let Some(mut gpu) = gpu_from_properties(node, &props) else {
            continue;
        };
        // The memory banks, else the node's own `local_mem_size` (issue 35): kernels print it
        // as 0 now, but some publish the VRAM size only there, and without it such a GPU
        // had no memory at all (so nothing was planned on it).
        gpu.memory_bytes = read_memory(host, &dir).or_else(|| {
            props
                .get("local_mem_size")
                .copied()
                .filter(|&size| size > 0)
        });
        let links = host
            .list(format!("{dir}/io_links"))
            .into_iter()
            .filter_map(|link| host.read(format!("{dir}/io_links/{link}/properties")))
            .filter_map(|text| parse_io_link(&text))
            .collect();
        topology.links.insert(node, links);
        topology.gpus.push(gpu);
    }
    topology.gpus.sort_by_key(|gpu| gpu.node);
    topology
}

fn read_memory(host: &HostRoot, node_dir: &str) -> Option<u64> {
    let banks = host.list(format!("{node_dir}/mem_banks"));
    let sizes: Vec<u64> = banks
        .iter()
        .filter_map(|bank| host.read(format!("{node_dir}/mem_banks/{bank}/properties")))
        .filter_map(|text| parse_mem_bank(&text))
        .collect();
    (!sizes.is_empty()).then(|| sizes.iter().sum())
}

/// The XGMI hives among the GPUs, as interconnect groups over PCI bus ids.
///
/// A hive is named by its `hive_id` in hex. Kernels that do not publish `hive_id` still list
/// XGMI links, so GPUs without one are grouped by the links themselves and the group is named
/// by its sorted members. Partitions of one GPU count as that GPU.
pub fn xgmi_groups(topology: &Topology) -> Vec<InterconnectGroup> {
    let bus_of: BTreeMap<u32, &str> = topology
        .gpus
        .iter()
        .map(|gpu| (gpu.node, gpu.bus_id.as_str()))
        .collect();
    let peers = xgmi_peers(topology, &bus_of);
    let mut groups = Vec::new();
    for (hive_id, members) in hives(topology, &peers) {
        if members.len() < 2 {
            continue;
        }
        let id = if hive_id == 0 {
            InterconnectGroup::local_id(
                InterconnectKind::Xgmi,
                &members.iter().cloned().collect::<Vec<_>>(),
            )
        } else {
            format!("0x{hive_id:x}")
        };
        groups.push(group(id, &members, &peers));
    }
    groups.sort_by(|a, b| a.id.cmp(&b.id));
    groups
}

/// Per GPU (bus id): its XGMI peers (bus id to summed link bandwidth in MB/s).
type Peers = BTreeMap<String, BTreeMap<String, u64>>;

fn xgmi_peers(topology: &Topology, bus_of: &BTreeMap<u32, &str>) -> Peers {
    let mut peers = Peers::new();
    for (node, links) in &topology.links {
        let Some(&from) = bus_of.get(node) else {
            continue;
        };
        for link in links.iter().filter(|l| l.link_type == IOLINK_TYPE_XGMI) {
            let Some(&to) = bus_of.get(&link.node_to) else {
                continue;
            };
            if to == from {
                continue;
            }
            // Partitions of one GPU each list the same physical links; keep the widest figure.
            let entry = peers
                .entry(from.to_string())
                .or_default()
                .entry(to.to_string())
                .or_insert(0);
            *entry = (*entry).max(link.max_bandwidth_mbps);
        }
    }
    peers
}

/// Hive ids with their member bus ids. GPUs that publish no hive id but have XGMI links come
/// as hive 0, one entry per set of GPUs the links connect.
fn hives(topology: &Topology, peers: &Peers) -> Vec<(u64, BTreeSet<String>)> {
    let mut by_hive: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    let mut unnamed: BTreeSet<String> = BTreeSet::new();
    for gpu in &topology.gpus {
        if gpu.hive_id != 0 {
            by_hive
                .entry(gpu.hive_id)
                .or_default()
                .insert(gpu.bus_id.clone());
        } else if peers.contains_key(&gpu.bus_id) {
            unnamed.insert(gpu.bus_id.clone());
        }
    }
    let mut hives: Vec<_> = by_hive.into_iter().collect();
    hives.extend(components(&unnamed, peers).into_iter().map(|c| (0, c)));
    hives
}

fn components(nodes: &BTreeSet<String>, peers: &Peers) -> Vec<BTreeSet<String>> {
    let mut seen = BTreeSet::new();
    let mut components = Vec::new();
    for start in nodes {
        if seen.contains(start) {
            continue;
        }
        let mut component = BTreeSet::new();
        let mut stack = vec![start.clone()];
        while let Some(bus) = stack.pop() {
            if !nodes.contains(&bus) || !component.insert(bus.clone()) {
                continue;
            }
            stack.extend(peers.get(&bus).into_iter().flat_map(|p| p.keys().cloned()));
        }
        seen.extend(component.iter().cloned());
        components.push(component);
    }
    components
}

fn group(id: String, members: &BTreeSet<String>, peers: &Peers) -> InterconnectGroup {
    let empty = BTreeMap::new();
    let member_peers = |bus: &String| {
        peers
            .get(bus)
            .unwrap_or(&empty)
            .iter()
            .filter(|(peer, _)| members.contains(*peer))
            .collect::<Vec<_>>()
    };
    let link_counts: Vec<usize> = members.iter().map(|m| member_peers(m).len()).collect();
    let bandwidths: Vec<u64> = members
        .iter()
        .map(|m| member_peers(m).iter().map(|(_, bw)| **bw).sum())
        .collect();
    let fewest_links = link_counts.iter().copied().min().unwrap_or(0);
    let all_to_all = fewest_links + 1 == members.len();
    let least_bandwidth = bandwidths.iter().copied().min().unwrap_or(0);
    InterconnectGroup {
        kind: InterconnectKind::Xgmi,
        id,
        devices: members.iter().cloned().collect(),
        links_per_device: u32::try_from(fewest_links).ok().filter(|&n| n > 0),
        // MB/s to GB/s; 0 means the driver did not say.
        bandwidth_gbps: (least_bandwidth > 0).then(|| least_bandwidth as f64 / 1000.0),
        topology: all_to_all.then(|| "all-to-all".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU_NODE: &str = include_str!(
        "../../../../../fixtures/hosts/mi300x-8x/sys/class/kfd/kfd/topology/nodes/2/properties"
    );
    const CPU_NODE: &str = include_str!(
        "../../../../../fixtures/hosts/mi300x-8x/sys/class/kfd/kfd/topology/nodes/0/properties"
    );
    const XGMI_LINK: &str = include_str!(
        "../../../../../fixtures/hosts/mi300x-8x/sys/class/kfd/kfd/topology/nodes/2/io_links/1/properties"
    );
    const MEM_BANK: &str = include_str!(
        "../../../../../fixtures/hosts/mi300x-8x/sys/class/kfd/kfd/topology/nodes/2/mem_banks/0/properties"
    );

    #[test]
    fn a_gpu_node_gives_its_bus_id_target_and_compute_units() {
        let gpu = gpu_from_properties(2, &parse_properties(GPU_NODE)).unwrap();
        assert_eq!(gpu.bus_id, "0000:05:00.0");
        assert_eq!(gpu.gfx_target_version, 90402);
        assert_eq!(gpu.compute_units, Some(304));
        assert_eq!(gpu.render_minor, Some(128));
        assert_eq!(gpu.xcc_count, Some(8));
        assert_ne!(gpu.hive_id, 0);
    }

    #[test]
    fn cpu_nodes_are_not_gpus() {
        let props = parse_properties(CPU_NODE);
        assert_eq!(props.get("simd_count"), Some(&0));
        assert_eq!(gpu_from_properties(0, &props), None);
    }

    #[test]
    fn links_and_banks_parse() {
        let link = parse_io_link(XGMI_LINK).unwrap();
        assert_eq!(link.link_type, IOLINK_TYPE_XGMI);
        assert_eq!(parse_mem_bank(MEM_BANK), Some(206_141_652_992));
        assert_eq!(parse_io_link("weight 15\n"), None);
        assert_eq!(parse_mem_bank("heap_type 0\nsize_in_bytes 1024\n"), None);
    }

    #[test]
    fn location_ids_decode_to_bus_ids() {
        assert_eq!(bus_id(0, 0x7500).as_deref(), Some("0000:75:00.0"));
        assert_eq!(bus_id(1, 0x050b).as_deref(), Some("0001:05:01.3"));
        assert_eq!(bus_id(0x1_0000, 0), None);
    }

    fn gpu(node: u32, bus: &str, hive_id: u64) -> KfdGpu {
        KfdGpu {
            node,
            bus_id: bus.to_string(),
            gfx_target_version: 90010,
            compute_units: Some(110),
            hive_id,
            render_minor: None,
            xcc_count: None,
            memory_bytes: None,
        }
    }

    fn xgmi(node_to: u32) -> IoLink {
        IoLink {
            link_type: IOLINK_TYPE_XGMI,
            node_to,
            max_bandwidth_mbps: 0,
        }
    }

    #[test]
    fn gpus_without_hive_ids_are_grouped_by_their_links() {
        // Two separate pairs, as on a host with two unconnected dual-GCD boards.
        let topology = Topology {
            gpus: vec![
                gpu(1, "0000:01:00.0", 0),
                gpu(2, "0000:02:00.0", 0),
                gpu(3, "0000:03:00.0", 0),
                gpu(4, "0000:04:00.0", 0),
            ],
            links: BTreeMap::from([
                (1, vec![xgmi(2)]),
                (2, vec![xgmi(1)]),
                (3, vec![xgmi(4)]),
                (4, vec![xgmi(3)]),
            ]),
        };
        let groups = xgmi_groups(&topology);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].id, "xgmi-0000:01:00.0");
        assert_eq!(groups[0].links_per_device, Some(1));
        assert_eq!(groups[0].bandwidth_gbps, None);
        assert_eq!(groups[1].devices, ["0000:03:00.0", "0000:04:00.0"]);
    }

    #[test]
    fn a_partial_mesh_is_not_all_to_all() {
        let topology = Topology {
            gpus: vec![
                gpu(1, "0000:01:00.0", 7),
                gpu(2, "0000:02:00.0", 7),
                gpu(3, "0000:03:00.0", 7),
            ],
            links: BTreeMap::from([
                (1, vec![xgmi(2)]),
                (2, vec![xgmi(1), xgmi(3)]),
                (3, vec![xgmi(2)]),
            ]),
        };
        let groups = xgmi_groups(&topology);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].id, "0x7");
        assert_eq!(groups[0].topology, None);
        assert_eq!(groups[0].links_per_device, Some(1));
    }
}
