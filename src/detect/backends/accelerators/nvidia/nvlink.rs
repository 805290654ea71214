//! The NVLink domain: which GPUs are joined by NVLink, and whether through NVSwitch.
//!
//! Both sources reduce to a `LinkGraph`: per GPU, the links it has up, its NVLink peers and
//! the NVSwitches it reaches. NVML says what is at the far end of each link. `nvidia-smi topo
//! -m` only prints `NV<n>` (a bonded set of n links) per GPU pair, so switches are inferred: a
//! GPU whose bonded links to all its peers add up to more links than it has must be reaching
//! them through a switch (an H100 SXM shows NV18 to each of seven peers with 18 links).
//! Connected GPUs form one [`InterconnectGroup`].

use std::collections::{BTreeMap, BTreeSet};

use crate::hardware::{InterconnectGroup, InterconnectKind};

/// The most NVLink links one GPU has (Hopper and Blackwell: 18; A100: 12; V100: 6).
const MAX_LINKS_PER_GPU: u32 = 18;

/// The switch id used when a switch is inferred rather than seen.
const INFERRED_SWITCH: &str = "nvswitch";

/// NVLink facts about one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct GpuLinks {
    /// Links up, when known.
    pub active_links: Option<u32>,
    /// Sum of the link speeds in GB/s (one direction), when known.
    pub bandwidth_gbps: Option<f64>,
    /// Peer GPU bus id to the number of links to it.
    pub peers: BTreeMap<String, u32>,
    /// NVSwitches this GPU has links to (PCI bus ids, or a placeholder when inferred).
    pub switches: BTreeSet<String>,
}

/// NVLink facts by GPU bus id.
pub(super) type LinkGraph = BTreeMap<String, GpuLinks>;

/// The GPUs joined by NVLink, one group per connected set of two or more, sorted by id.
pub(super) fn groups(graph: &LinkGraph) -> Vec<InterconnectGroup> {
    let gpus: Vec<&String> = graph.keys().collect();
    let position: BTreeMap<&str, usize> = gpus
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let mut sets = DisjointSets::new(gpus.len());
    let mut by_switch: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, links) in graph.values().enumerate() {
        for peer in links.peers.keys() {
            if let Some(&j) = position.get(peer.as_str()) {
                sets.join(i, j);
            }
        }
        for switch in &links.switches {
            let first = *by_switch.entry(switch.as_str()).or_insert(i);
            sets.join(first, i);
        }
    }
    let mut members: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..gpus.len() {
        members.entry(sets.root(i)).or_default().push(i);
    }
    let mut groups: Vec<InterconnectGroup> = members
        .into_values()
        .filter(|set| set.len() > 1)
        .map(|set| {
            group_of(
                &set.iter().map(|&i| gpus[i].as_str()).collect::<Vec<_>>(),
                graph,
            )
        })
        .collect();
    groups.sort_by(|a, b| a.id.cmp(&b.id));
    groups
}

fn group_of(ids: &[&str], graph: &LinkGraph) -> InterconnectGroup {
    let links: Vec<&GpuLinks> = ids.iter().filter_map(|id| graph.get(*id)).collect();
    let switched = links.iter().any(|l| !l.switches.is_empty());
    // A figure holds for the group only when every member has it; the smallest one is what
    // every member can count on.
    let links_per_device = links
        .iter()
        .map(|l| l.active_links)
        .collect::<Option<Vec<u32>>>()
        .and_then(|all| all.into_iter().min());
    let bandwidth_gbps = links
        .iter()
        .map(|l| l.bandwidth_gbps)
        .collect::<Option<Vec<f64>>>()
        .and_then(|all| all.into_iter().reduce(f64::min))
        .map(|gbps| (gbps * 1000.0).round() / 1000.0);
    let devices: Vec<String> = ids.iter().map(|id| (*id).to_string()).collect();
    let kind = if switched {
        InterconnectKind::Nvswitch
    } else {
        InterconnectKind::Nvlink
    };
    InterconnectGroup {
        kind,
        id: InterconnectGroup::local_id(kind, &devices),
        devices,
        links_per_device,
        bandwidth_gbps,
        topology: switched.then(|| "all-to-all".to_string()),
    }
}

/// Union-find over GPU positions.
struct DisjointSets(Vec<usize>);

impl DisjointSets {
    fn new(len: usize) -> Self {
        Self((0..len).collect())
    }

    fn root(&mut self, mut i: usize) -> usize {
        while self.0[i] != i {
            self.0[i] = self.0[self.0[i]];
            i = self.0[i];
        }
        i
    }

    fn join(&mut self, a: usize, b: usize) {
        let (a, b) = (self.root(a), self.root(b));
        // The smaller root wins so the result does not depend on the order of joins.
        let (low, high) = (a.min(b), a.max(b));
        self.0[high] = low;
    }
}

/// One GPU row of `nvidia-smi topo -m`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopoRow {
    /// The GPU index.
    pub index: u32,
    /// Peer GPU index to the number of bonded NVLinks (`NV18` → 18).
    pub nvlinks: BTreeMap<u32, u32>,
    /// The `NUMA Affinity` column.
    pub numa: Option<u32>,
}

/// Parses the `nvidia-smi topo -m` matrix. Header cells are underlined with ANSI escapes on
/// many drivers, columns are tab-separated with irregular padding (so neither tabs nor
/// whitespace give cell positions), NIC columns and rows may follow the GPUs, and a legend ends
/// the matrix.
///
/// After the matrix cells come the affinity columns the header names: `CPU Affinity` alone on
/// old drivers, then `NUMA Affinity`, then `GPU NUMA ID` on newer drivers. A cell may be empty
/// (the CPU affinity of a GPU the driver cannot place), which whitespace splitting cannot see,
/// so those cells are matched by their shape, not their position (`affinity_cells`).
pub fn parse_topo_matrix(text: &str) -> Vec<TopoRow> {
    let clean = strip_ansi(text);
    let mut header: Option<Header> = None;
    let mut rows = Vec::new();
    for line in clean.lines() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        let Some(&first) = tokens.first() else {
            continue;
        };
        if first.starts_with("Legend") {
            break;
        }
        match &header {
            None if gpu_index(first).is_some() && !tokens.contains(&"X") => {
                header = Some(Header::parse(&tokens));
            }
            Some(header) => {
                if let Some(row) = parse_topo_row(&tokens, header) {
                    rows.push(row);
                }
            }
            None => {}
        }
    }
    rows.sort_by_key(|row| row.index);
    rows.dedup_by_key(|row| row.index);
    rows
}

/// The matrix header: the device columns, then which affinity columns follow them.
struct Header<'a> {
    columns: Vec<&'a str>,
    has_numa: bool,
    has_gpu_numa_id: bool,
}

impl<'a> Header<'a> {
    fn parse(tokens: &[&'a str]) -> Self {
        let columns: Vec<&str> = tokens.iter().copied().take_while(|t| *t != "CPU").collect();
        let rest = tokens.get(columns.len()..).unwrap_or_default().join(" ");
        Header {
            columns,
            has_numa: rest.contains("NUMA Affinity"),
            has_gpu_numa_id: rest.contains("GPU NUMA ID"),
        }
    }
}

fn parse_topo_row(tokens: &[&str], header: &Header) -> Option<TopoRow> {
    let columns = &header.columns;
    let index = gpu_index(tokens.first()?)?;
    let cells = tokens.get(1..=columns.len())?;
    let nvlinks = columns
        .iter()
        .zip(cells)
        .filter_map(|(column, cell)| {
            let peer = gpu_index(column)?;
            let count = cell.strip_prefix("NV")?.parse().ok()?;
            (peer != index).then_some((peer, count))
        })
        .collect();
    let trailing = tokens.get(columns.len() + 1..).unwrap_or_default();
    let numa = affinity_cells(trailing, header).and_then(|numa| numa.parse().ok());
    Some(TopoRow {
        index,
        nvlinks,
        numa,
    })
}

/// The `NUMA Affinity` cell among the cells after the matrix, or `None` when the header has
/// no such column or the cells cannot be told apart.
///
/// With every cell present they are positional. With one fewer, one is empty. A CPU list
/// (`0-7`, `0-55,112-167`) in first place is the CPU affinity, and the NUMA affinity is the
/// cell after it, if any (nvidia-smi writes `N/A`, not nothing, for an unknown NUMA node or
/// GPU NUMA ID, so an empty cell there is the rarer case). Otherwise the CPU affinity is the
/// empty one (a process whose cpuset shares no CPU with the GPU's node) and the first cell is
/// the NUMA affinity. A bare number is read as a NUMA node there because a GPU's CPU affinity
/// is never a single CPU on the machines `topo -m` describes.
fn affinity_cells<'a>(trailing: &[&'a str], header: &Header) -> Option<&'a str> {
    if !header.has_numa {
        return None;
    }
    let expected = 2 + usize::from(header.has_gpu_numa_id);
    let looks_like_cpu_list = |cell: &str| cell.contains('-') || cell.contains(',');
    match trailing.len() {
        n if n == expected => trailing.get(1).copied(),
        n if n + 1 == expected => {
            let first = trailing.first()?;
            if looks_like_cpu_list(first) {
                trailing.get(1).copied()
            } else {
                Some(*first)
            }
        }
        _ => None,
    }
}

/// `GPU3` → 3.
fn gpu_index(token: &str) -> Option<u32> {
    token.strip_prefix("GPU")?.parse().ok()
}

/// Removes ANSI escape sequences (`ESC [ ... letter`) and stray escape bytes.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            // Parameters and intermediates, then one final byte in '@'..='~'.
            for next in chars.by_ref() {
                if ('@'..='~').contains(&next) {
                    break;
                }
            }
        }
    }
    out
}

/// Link state of one GPU from `nvidia-smi nvlink -s`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LinkStatus {
    /// Links with a speed.
    pub active: u32,
    /// Sum of the link speeds in GB/s.
    pub gbps: f64,
}

/// Parses `nvidia-smi nvlink -s`: a `GPU n:` line, then `Link k: 26.562 GB/s` or
/// `Link k: <inactive>` per link.
pub fn parse_nvlink_status(text: &str) -> BTreeMap<u32, LinkStatus> {
    let mut status = BTreeMap::new();
    let mut current = None;
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("GPU ") {
            current = rest
                .split(':')
                .next()
                .and_then(|index| index.trim().parse::<u32>().ok());
            if let Some(index) = current {
                status.entry(index).or_insert_with(LinkStatus::default);
            }
        } else if let Some(rest) = line.strip_prefix("Link ")
            && let Some(index) = current
            && let Some((_, speed)) = rest.split_once(':')
            && let Some(gbps) = speed
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<f64>().ok())
                .filter(|gbps| gbps.is_finite() && *gbps > 0.0)
        {
            let entry = status.entry(index).or_insert_with(LinkStatus::default);
            entry.active += 1;
            entry.gbps += gbps;
        }
    }
    status.retain(|_, s| s.active > 0);
    status
}

/// Builds the link graph from `topo -m` rows and `nvlink -s` status, keyed by bus id.
pub(super) fn graph_from_matrix(
    rows: &[TopoRow],
    status: &BTreeMap<u32, LinkStatus>,
    bus_of: &BTreeMap<u32, String>,
) -> LinkGraph {
    let mut graph = LinkGraph::new();
    for row in rows {
        let Some(bus) = bus_of.get(&row.index) else {
            continue;
        };
        let mut links = GpuLinks::default();
        if let Some(state) = status.get(&row.index) {
            links.active_links = Some(state.active);
            links.bandwidth_gbps = Some(state.gbps);
        }
        for (peer, count) in &row.nvlinks {
            if let Some(peer_bus) = bus_of.get(peer) {
                links.peers.insert(peer_bus.clone(), *count);
            }
        }
        let bonded: u32 = links
            .peers
            .values()
            .fold(0, |sum, n| sum.saturating_add(*n));
        if bonded > links.active_links.unwrap_or(MAX_LINKS_PER_GPU) {
            links.switches.insert(INFERRED_SWITCH.to_string());
            // Through a switch every link reaches every peer, so NV<n> is the GPU's link count.
            if links.active_links.is_none() {
                links.active_links = links.peers.values().copied().max();
            }
        }
        graph.insert(bus.clone(), links);
    }
    graph
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const H100_TOPO: &str =
        include_str!("../../../../../fixtures/hosts/h100-8x-nvswitch/commands/outputs/topo-m.txt");
    const H100_NVLINK: &str = include_str!(
        "../../../../../fixtures/hosts/h100-8x-nvswitch/commands/outputs/nvlink-status.txt"
    );
    const A100_TOPO: &str =
        include_str!("../../../../../fixtures/hosts/a100-mig/commands/outputs/topo-m.txt");

    fn buses(n: u32) -> BTreeMap<u32, String> {
        (0..n)
            .map(|i| (i, format!("0000:{:02x}:00.0", i + 1)))
            .collect()
    }

    #[test]
    fn parses_the_h100_matrix_through_ansi_escapes() {
        let rows = parse_topo_matrix(H100_TOPO);
        assert_eq!(rows.len(), 8, "NIC rows are not GPUs");
        assert_eq!(rows[0].nvlinks.len(), 7);
        assert!(rows[0].nvlinks.values().all(|&n| n == 18));
        assert!(!rows[3].nvlinks.contains_key(&3));
        assert_eq!(rows[0].numa, Some(0));
        assert_eq!(rows[7].numa, Some(1));
    }

    #[test]
    fn h100_matrix_is_one_nvswitch_domain() {
        let rows = parse_topo_matrix(H100_TOPO);
        let status = parse_nvlink_status(H100_NVLINK);
        assert_eq!(status.len(), 8);
        assert_eq!(status[&0].active, 18);
        let groups = groups(&graph_from_matrix(&rows, &status, &buses(8)));
        assert_eq!(groups.len(), 1);
        let group = &groups[0];
        assert_eq!(group.kind, InterconnectKind::Nvswitch);
        assert_eq!(group.devices.len(), 8);
        assert_eq!(group.links_per_device, Some(18));
        assert_eq!(group.bandwidth_gbps, Some(478.116));
        // Without nvlink -s the NV18 cells still say how many links each GPU has.
        let groups = super::groups(&graph_from_matrix(&rows, &BTreeMap::new(), &buses(8)));
        assert_eq!(groups[0].kind, InterconnectKind::Nvswitch);
        assert_eq!(groups[0].links_per_device, Some(18));
        assert_eq!(groups[0].bandwidth_gbps, None);
    }

    #[test]
    fn a_pair_is_point_to_point_nvlink() {
        let rows = parse_topo_matrix(A100_TOPO);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].numa, None, "N/A on a single-node VM");
        let groups = groups(&graph_from_matrix(&rows, &BTreeMap::new(), &buses(2)));
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].kind, InterconnectKind::Nvlink);
        assert_eq!(groups[0].devices, ["0000:01:00.0", "0000:02:00.0"]);
    }

    #[test]
    fn affinity_cells_are_read_by_header_and_shape() {
        // A pre-R450 header has only `CPU Affinity` (kubernetes/kubernetes#53497, 2017).
        let old = "\tGPU0\tGPU1\tmlx4_0\tCPU Affinity\nGPU0\t X \tPIX\tPHB\t0-9,20-29\n\
GPU1\tPIX\t X \tPHB\t0-9,20-29\n";
        let rows = parse_topo_matrix(old);
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().all(|row| row.numa.is_none()));
        // No `GPU NUMA ID` column, CPU affinity present, NUMA cell empty.
        let empty_numa = "\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-7\t\t\n";
        assert_eq!(parse_topo_matrix(empty_numa)[0].numa, None);
        // `GPU NUMA ID` column, CPU affinity present, one of the two later cells empty.
        let one_empty = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n\
GPU0\t X \t0-7\t\t0\t\t\n";
        assert_eq!(parse_topo_matrix(one_empty)[0].numa, Some(0));
        // No `GPU NUMA ID` column, CPU affinity empty.
        let empty_cpu = "\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t\t\t1\n";
        assert_eq!(parse_topo_matrix(empty_cpu)[0].numa, Some(1));
    }

    #[test]
    fn separate_nvlink_bridges_make_separate_groups() {
        // Four PCIe GPUs bridged in pairs (NV4 each), PCIe between the pairs.
        let text = "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\n\
            GPU0\t X \tNV4\tSYS\tSYS\t0-31\t0\n\
            GPU1\tNV4\t X \tSYS\tSYS\t0-31\t0\n\
            GPU2\tSYS\tSYS\t X \tNV4\t32-63\t1\n\
            GPU3\tSYS\tSYS\tNV4\t X \t32-63\t1\n";
        let groups = groups(&graph_from_matrix(
            &parse_topo_matrix(text),
            &BTreeMap::new(),
            &buses(4),
        ));
        assert_eq!(groups.len(), 2);
        assert!(
            groups
                .iter()
                .all(|g| g.kind == InterconnectKind::Nvlink && g.devices.len() == 2)
        );
        assert_eq!(groups[0].id, "nvlink-0000:01:00.0");
        assert_eq!(groups[1].id, "nvlink-0000:03:00.0");
    }

    #[test]
    fn four_gpus_sharing_their_links_stay_point_to_point() {
        // HGX H100 4-GPU: 18 links split six to each of three peers, no switch.
        let mut text = String::from("\tGPU0\tGPU1\tGPU2\tGPU3\n");
        for i in 0..4 {
            let cells: Vec<&str> = (0..4).map(|j| if i == j { "X" } else { "NV6" }).collect();
            text.push_str(&format!("GPU{i}\t{}\t0-47\t0\n", cells.join("\t")));
        }
        let groups = groups(&graph_from_matrix(
            &parse_topo_matrix(&text),
            &BTreeMap::new(),
            &buses(4),
        ));
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].kind, InterconnectKind::Nvlink);
        assert_eq!(groups[0].devices.len(), 4);
    }

    #[test]
    fn nvml_switch_links_join_gpus_without_peer_links() {
        let mut graph = LinkGraph::new();
        for bus in ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"] {
            let mut links = GpuLinks {
                active_links: Some(12),
                ..GpuLinks::default()
            };
            links.switches.insert("0000:c4:00.0".into());
            graph.insert(bus.into(), links);
        }
        graph.insert("0000:09:00.0".into(), GpuLinks::default());
        let groups = groups(&graph);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].kind, InterconnectKind::Nvswitch);
        assert_eq!(groups[0].devices.len(), 3);
        assert_eq!(groups[0].links_per_device, Some(12));
    }

    #[test]
    fn nvlink_status_skips_inactive_links() {
        let text = "GPU 0: NVIDIA H100 PCIe (UUID: GPU-1)\n\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n\t Link 2: 0 GB/s\nGPU 1: NVIDIA H100 PCIe (UUID: GPU-2)\n\t Link 0: <inactive>\n";
        let status = parse_nvlink_status(text);
        assert_eq!(status.len(), 1);
        assert_eq!(status[&0].active, 1);
    }

    #[test]
    fn strips_escapes() {
        assert_eq!(strip_ansi("\u{1b}[4mGPU0\u{1b}[0m\tX"), "GPU0\tX");
        assert_eq!(strip_ansi("a\u{1b}"), "a");
    }

    proptest! {
        #[test]
        fn topo_parsers_never_panic(s in ".*") {
            let rows = parse_topo_matrix(&s);
            let status = parse_nvlink_status(&s);
            let _ = groups(&graph_from_matrix(&rows, &status, &buses(8)));
        }

        #[test]
        fn topo_parsers_never_panic_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let s = String::from_utf8_lossy(&bytes);
            let rows = parse_topo_matrix(&s);
            let _ = parse_nvlink_status(&s);
            let _ = groups(&graph_from_matrix(&rows, &BTreeMap::new(), &buses(4)));
        }

        #[test]
        fn matrix_like_text_never_panics(cells in proptest::collection::vec(proptest::sample::select(
            vec!["GPU0", "GPU1", "GPU7", "GPU99999999999", "NV4", "NV18", "NV", "X", "SYS", "N/A",
                 "CPU", "Legend:", "\u{1b}[4m", "\t", "\n", " "]), 0..200)) {
            let text = cells.concat();
            let rows = parse_topo_matrix(&text);
            let _ = groups(&graph_from_matrix(&rows, &BTreeMap::new(), &buses(10)));
        }
    }
}
