//! NUMA nodes and RDMA adapters (InfiniBand, RoCE, EFA), from sysfs.
//!
//! - NUMA: `/sys/devices/system/node/node<N>/cpulist` and the `MemTotal` line of its
//!   `meminfo` (`Node 0 MemTotal:  1056375520 kB`).
//! - RDMA: every port of every device under `/sys/class/infiniband/<dev>/ports/<port>/`:
//!   `rate` (`400 Gb/sec (4X NDR)`), `state` (`4: ACTIVE`), `link_layer` (`InfiniBand`,
//!   `Ethernet`), and `gids/0`, whose first 64 bits are the subnet prefix that names an
//!   InfiniBand fabric. The adapter's PCI address comes from the `device` link (or
//!   `device/uevent` `PCI_SLOT_NAME` where the tree has plain directories) and its NUMA node
//!   from `device/numa_node`.
//!
//! AWS EFA devices (`efa_0`, or `rdmap*` bound to the `efa` driver) are their own kind; an
//! Ethernet link layer is RoCE. Software RDMA (`rxe*`, `siw*`) rides on any NIC and says
//! nothing about the fabric, so it is skipped.

use crate::detect::pci::canonical_bus_id;
use crate::detect::{Backend, Context, Findings, HostRoot};
use crate::hardware::{NetworkAdapter, NicKind, NumaNode};

use super::cpu::parse_kib_value;

/// Where sysfs lists NUMA nodes.
const NODES: &str = "/sys/devices/system/node";
/// Where sysfs lists RDMA devices.
const INFINIBAND: &str = "/sys/class/infiniband";

/// The `topology` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Topology;

impl Backend for Topology {
    fn name(&self) -> &'static str {
        "topology"
    }

    fn detect(&self, ctx: &Context) -> Findings {
        let host = ctx.host();
        Findings {
            numa: numa_nodes(host),
            nics: rdma_ports(host),
            ..Findings::default()
        }
    }
}

/// The NUMA nodes, by id.
fn numa_nodes(host: &HostRoot) -> Vec<NumaNode> {
    let mut nodes: Vec<NumaNode> = host
        .list(NODES)
        .iter()
        .filter_map(|name| node_id(name))
        .map(|id| {
            let dir = format!("{NODES}/node{id}");
            NumaNode {
                id,
                cpus: host.read_trimmed(format!("{dir}/cpulist")),
                memory_bytes: host
                    .read(format!("{dir}/meminfo"))
                    .and_then(|text| parse_node_meminfo_total(&text)),
            }
        })
        .collect();
    nodes.sort_by_key(|node| node.id);
    nodes
}

/// `node12` is node 12; the directory's other entries (`online`, `possible`, `power`) are not.
pub fn node_id(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("node")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The `Node <n> MemTotal:` line of a node's `meminfo`, in bytes.
pub fn parse_node_meminfo_total(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (_, rest) = line.split_once("MemTotal:")?;
        parse_kib_value(rest)
    })
}

/// Every port of every hardware RDMA device, sorted by `device/port`.
fn rdma_ports(host: &HostRoot) -> Vec<NetworkAdapter> {
    let mut adapters = Vec::new();
    for device in host.list(INFINIBAND) {
        if is_software_rdma(&device) {
            continue;
        }
        let dir = format!("{INFINIBAND}/{device}");
        // Links where the tree has them, the uevent file where it holds plain directories.
        let uevent = host
            .read(format!("{dir}/device/uevent"))
            .unwrap_or_default();
        let pci_id = host
            .link_name(format!("{dir}/device"))
            .and_then(|name| canonical_bus_id(&name))
            .or_else(|| uevent_value(&uevent, "PCI_SLOT_NAME").and_then(canonical_bus_id));
        let driver = host
            .link_name(format!("{dir}/device/driver"))
            .or_else(|| uevent_value(&uevent, "DRIVER").map(str::to_string));
        let numa_node = host
            .read_trimmed(format!("{dir}/device/numa_node"))
            .and_then(|n| n.parse::<i64>().ok())
            .and_then(|n| u32::try_from(n).ok());
        for port in host.list(format!("{dir}/ports")) {
            let port_dir = format!("{dir}/ports/{port}");
            let read = |name: &str| host.read_trimmed(format!("{port_dir}/{name}"));
            let link_layer = read("link_layer");
            let kind = nic_kind(&device, driver.as_deref(), link_layer.as_deref());
            let fabric = match kind {
                NicKind::Infiniband => read("gids/0").and_then(|gid| subnet_prefix(&gid)),
                NicKind::Roce | NicKind::Efa => None,
            };
            adapters.push(NetworkAdapter {
                name: format!("{device}/{port}"),
                kind,
                rate_gbps: read("rate").and_then(|rate| parse_rate(&rate)),
                state: read("state").and_then(|state| parse_port_state(&state)),
                pci_id: pci_id.clone(),
                numa_node,
                fabric,
            });
        }
    }
    adapters.sort_by(|a, b| a.name.cmp(&b.name));
    adapters
}

/// Soft-RoCE and soft-iWARP devices are created on top of any Ethernet NIC.
fn is_software_rdma(device: &str) -> bool {
    device.starts_with("rxe") || device.starts_with("siw")
}

/// The value of `KEY=value` in a uevent file.
pub fn uevent_value<'a>(uevent: &'a str, key: &str) -> Option<&'a str> {
    uevent.lines().find_map(|line| {
        let (name, value) = line.trim().split_once('=')?;
        (name == key).then_some(value)
    })
}

/// EFA by name or driver, otherwise the link layer: `Ethernet` is RoCE, anything else
/// (`InfiniBand`, or a missing file) is InfiniBand.
pub fn nic_kind(device: &str, driver: Option<&str>, link_layer: Option<&str>) -> NicKind {
    if device.starts_with("efa") || driver == Some("efa") {
        return NicKind::Efa;
    }
    match link_layer {
        Some(layer) if layer.eq_ignore_ascii_case("ethernet") => NicKind::Roce,
        _ => NicKind::Infiniband,
    }
}

/// `400 Gb/sec (4X NDR)` is 400; fractional legacy rates (`2.5 Gb/sec (1X SDR)`) round to the
/// nearest whole Gb/s.
pub fn parse_rate(text: &str) -> Option<u32> {
    let number = text.split_ascii_whitespace().next()?;
    let rate: f64 = number.parse().ok()?;
    if !rate.is_finite() || rate < 0.0 || rate > f64::from(u32::MAX) {
        return None;
    }
    // Bounds checked above, so the cast neither wraps nor saturates.
    Some(rate.round() as u32)
}

/// `4: ACTIVE` is `ACTIVE`; a bare word is kept as it is.
pub fn parse_port_state(text: &str) -> Option<String> {
    let state = text.split_once(':').map_or(text, |(_, name)| name).trim();
    (!state.is_empty()).then(|| state.to_string())
}

/// The subnet prefix of a GID (`fe80:0000:0000:0000:0c42:a103:00fb:2d54` gives
/// `fe80:0000:0000:0000`): the first four groups. `None` when it is not a full GID or is all
/// zeros (an unconfigured port).
pub fn subnet_prefix(gid: &str) -> Option<String> {
    let groups: Vec<&str> = gid.trim().split(':').collect();
    let well_formed = groups.len() == 8
        && groups
            .iter()
            .all(|g| g.len() == 4 && g.bytes().all(|b| b.is_ascii_hexdigit()));
    if !well_formed || groups.iter().all(|g| *g == "0000") {
        return None;
    }
    Some(groups[..4].join(":").to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::testing::detect_on;
    use crate::detect::testing::write_host_file as write;
    use crate::detect::{CommandRunner, Context};
    use proptest::prelude::*;
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    fn link(root: &Path, path: &str, target: &str) {
        let path = root.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        symlink(target, path).unwrap();
    }

    fn port(root: &Path, device: &str, rate: &str, state: &str, layer: &str, gid: &str) {
        let dir = format!("sys/class/infiniband/{device}/ports/1");
        write(root, &format!("{dir}/rate"), rate);
        write(root, &format!("{dir}/state"), state);
        write(root, &format!("{dir}/link_layer"), layer);
        write(root, &format!("{dir}/gids/0"), gid);
    }

    fn detect_in(root: &Path) -> Findings {
        Topology.detect(&Context::new(
            HostRoot::new(root),
            CommandRunner::new(Vec::new()),
        ))
    }

    #[test]
    fn parses_node_meminfo() {
        let text = include_str!(
            "../../../../fixtures/hosts/cpu-only-vm/sys/devices/system/node/node0/meminfo"
        );
        assert_eq!(parse_node_meminfo_total(text), Some(32_386_544 * 1024));
        assert_eq!(
            parse_node_meminfo_total("Node 1 MemTotal:       1056375520 kB\n"),
            Some(1_056_375_520 * 1024)
        );
        assert_eq!(parse_node_meminfo_total("Node 0 MemFree: 1 kB"), None);
    }

    #[test]
    fn recognises_node_directories() {
        assert_eq!(node_id("node0"), Some(0));
        assert_eq!(node_id("node12"), Some(12));
        assert_eq!(node_id("node"), None);
        assert_eq!(node_id("online"), None);
        assert_eq!(node_id("node-1"), None);
    }

    #[test]
    fn parses_port_attributes() {
        assert_eq!(parse_rate("400 Gb/sec (4X NDR)\n"), Some(400));
        assert_eq!(parse_rate("2.5 Gb/sec (1X SDR)"), Some(3));
        assert_eq!(parse_rate("Gb/sec"), None);
        assert_eq!(parse_rate("NaN Gb/sec"), None);
        assert_eq!(parse_port_state("4: ACTIVE\n").as_deref(), Some("ACTIVE"));
        assert_eq!(parse_port_state("1: DOWN").as_deref(), Some("DOWN"));
        assert_eq!(parse_port_state(" : "), None);
        assert_eq!(
            subnet_prefix("fe80:0000:0000:0000:a088:c203:00b7:3c2e\n").as_deref(),
            Some("fe80:0000:0000:0000")
        );
        assert_eq!(
            subnet_prefix("0000:0000:0000:0000:0000:0000:0000:0000"),
            None
        );
        assert_eq!(subnet_prefix("fe80::1"), None);
        let uevent = "DRIVER=mlx5_core\nPCI_SLOT_NAME=0000:1A:00.0\n";
        assert_eq!(uevent_value(uevent, "PCI_SLOT_NAME"), Some("0000:1A:00.0"));
        assert_eq!(uevent_value(uevent, "DRIVER"), Some("mlx5_core"));
        assert_eq!(uevent_value(uevent, "PCI_ID"), None);
    }

    #[test]
    fn classifies_adapters() {
        assert_eq!(
            nic_kind("mlx5_0", Some("mlx5_core"), Some("InfiniBand")),
            NicKind::Infiniband
        );
        assert_eq!(
            nic_kind("mlx5_4", Some("mlx5_core"), Some("Ethernet")),
            NicKind::Roce
        );
        assert_eq!(nic_kind("efa_0", None, Some("Unknown")), NicKind::Efa);
        assert_eq!(
            nic_kind("rdmap79s0", Some("efa"), Some("Unknown")),
            NicKind::Efa
        );
        assert_eq!(
            nic_kind("bnxt_re0", Some("bnxt_en"), Some("Ethernet")),
            NicKind::Roce
        );
    }

    #[test]
    fn the_fixture_vm_has_one_node_and_no_rdma() {
        let findings = detect_on(&Topology, "cpu-only-vm");
        assert_eq!(
            findings.numa,
            [NumaNode {
                id: 0,
                cpus: Some("0-7".into()),
                memory_bytes: Some(32_386_544 * 1024),
            }]
        );
        assert!(findings.nics.is_empty());
        assert!(findings.warnings.is_empty());
    }

    #[test]
    fn reads_numa_nodes_and_every_kind_of_rdma_port() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for (id, cpus) in [(1, "48-95,144-191"), (0, "0-47,96-143")] {
            write(
                root,
                &format!("sys/devices/system/node/node{id}/cpulist"),
                &format!("{cpus}\n"),
            );
            write(
                root,
                &format!("sys/devices/system/node/node{id}/meminfo"),
                &format!("Node {id} MemTotal:       1056375520 kB\nNode {id} MemFree: 1 kB\n"),
            );
        }
        write(root, "sys/devices/system/node/online", "0-1\n");

        // An NDR HCA with a real device link and driver link.
        let pci = "sys/devices/pci0000:15/0000:15:01.0/0000:18:00.0";
        write(root, &format!("{pci}/numa_node"), "0\n");
        link(
            root,
            &format!("{pci}/driver"),
            "../../../../bus/pci/drivers/mlx5_core",
        );
        link(
            root,
            "sys/class/infiniband/mlx5_0/device",
            "../../../devices/pci0000:15/0000:15:01.0/0000:18:00.0",
        );
        port(
            root,
            "mlx5_0",
            "400 Gb/sec (4X NDR)\n",
            "4: ACTIVE\n",
            "InfiniBand\n",
            "fe80:0000:0000:0000:a088:c203:00b7:3c2e\n",
        );
        // A RoCE port where `device` is a plain directory (fixture style).
        write(
            root,
            "sys/class/infiniband/mlx5_1/device/uevent",
            "DRIVER=mlx5_core\nPCI_SLOT_NAME=0000:9a:00.1\n",
        );
        write(root, "sys/class/infiniband/mlx5_1/device/numa_node", "-1\n");
        port(
            root,
            "mlx5_1",
            "200 Gb/sec (2X HDR)\n",
            "1: DOWN\n",
            "Ethernet\n",
            "fe80:0000:0000:0000:0e42:a1ff:fe5e:7a01\n",
        );
        // An EFA device named by rdma-core's udev rule, and soft-RoCE that must be skipped.
        // Its driver is known only from the uevent file.
        write(
            root,
            "sys/class/infiniband/rdmap79s0/device/uevent",
            "DRIVER=efa\nPCI_SLOT_NAME=0000:4f:00.0\n",
        );
        port(
            root,
            "rdmap79s0",
            "100 Gb/sec (4X EDR)\n",
            "4: ACTIVE\n",
            "Unknown\n",
            "fe80:0000:0000:0000:04e2:f1ff:fe3d:9b21\n",
        );
        port(
            root,
            "rxe0",
            "100 Gb/sec (4X EDR)\n",
            "4: ACTIVE\n",
            "Ethernet\n",
            "",
        );

        let findings = detect_in(root);
        let ids: Vec<_> = findings
            .numa
            .iter()
            .map(|n| (n.id, n.cpus.clone().unwrap()))
            .collect();
        assert_eq!(
            ids,
            [(0, "0-47,96-143".into()), (1, "48-95,144-191".into())]
        );
        assert_eq!(findings.numa[1].memory_bytes, Some(1_056_375_520 * 1024));

        let names: Vec<_> = findings.nics.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["mlx5_0/1", "mlx5_1/1", "rdmap79s0/1"]);
        let ib = &findings.nics[0];
        assert_eq!(ib.kind, NicKind::Infiniband);
        assert_eq!(ib.rate_gbps, Some(400));
        assert_eq!(ib.state.as_deref(), Some("ACTIVE"));
        assert_eq!(ib.pci_id.as_deref(), Some("0000:18:00.0"));
        assert_eq!(ib.numa_node, Some(0));
        assert_eq!(ib.fabric.as_deref(), Some("fe80:0000:0000:0000"));
        let roce = &findings.nics[1];
        assert_eq!(roce.kind, NicKind::Roce);
        assert_eq!(roce.pci_id.as_deref(), Some("0000:9a:00.1"));
        assert_eq!((roce.numa_node, roce.fabric.as_deref()), (None, None));
        assert_eq!(roce.state.as_deref(), Some("DOWN"));
        let efa = &findings.nics[2];
        assert_eq!(efa.kind, NicKind::Efa);
        assert_eq!(efa.rate_gbps, Some(100));
        assert_eq!(efa.pci_id.as_deref(), Some("0000:4f:00.0"));
    }

    #[test]
    fn a_missing_host_has_no_topology() {
        assert_eq!(
            detect_in(Path::new("/nonexistent/host")),
            Findings::default()
        );
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in ".*") {
            let _ = parse_node_meminfo_total(&s);
            let _ = node_id(&s);
            let _ = parse_rate(&s);
            let _ = parse_port_state(&s);
            let _ = subnet_prefix(&s);
            let _ = uevent_value(&s, "DRIVER");
        }

        #[test]
        fn parsers_never_panic_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let s = String::from_utf8_lossy(&bytes);
            let _ = parse_node_meminfo_total(&s);
            let _ = parse_rate(&s);
            let _ = subnet_prefix(&s);
            let _ = uevent_value(&s, "DRIVER");
        }

        #[test]
        fn rates_round_trip(rate in 0u32..100_000) {
            prop_assert_eq!(parse_rate(&format!("{rate} Gb/sec (4X NDR)")), Some(rate));
        }
    }
}
