//! The planner's view of hardware: nodes, their accelerators, which accelerators share a
//! scale-up domain (NVLink/NVSwitch, XGMI, ICI...), and which nodes share an InfiniBand
//! fabric. Deliberately smaller than a detection report, so the planner can take hardware from
//! a report ([`NodeSpec::from_report`]), from an `AcceleratorInventory` later (the same few
//! lines over its status), or from the `--hardware` shorthand.

use std::collections::{BTreeMap, BTreeSet};

use imbl::{OrdMap, OrdSet};
use serde::{Deserialize, Serialize};

use crate::hardware::Report;
use crate::hardware::{Device, Family, InterconnectKind, NicKind, Precision, Vendor};

use super::products::{self, CONSERVATIVE_PRECISIONS, Product};
use super::share::{Partition, Shareable};
use super::units::Bytes;

/// One accelerator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSpec {
    /// Identifier, unique within the node (a PCI bus id, or `gpu0` for shorthand hardware).
    pub id: String,
    /// Product name as reported (`NVIDIA H100 80GB HBM3`).
    pub product: String,
    /// Maker.
    pub vendor: Vendor,
    /// Kind.
    pub family: Family,
    /// Device memory.
    #[serde(rename = "memoryBytes")]
    pub memory: Bytes,
    /// Native precisions.
    #[serde(default)]
    pub precisions: BTreeSet<Precision>,
    /// The scale-up domain within the node (`nvswitch:0`); `None` when only PCIe links it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Peak memory bandwidth, TB/s, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_tbps: Option<f64>,
    /// Other names a user may give the device by (its inventory name, PCI address, UUID),
    /// besides `id`; what `--reserved NODE/DEVICE` and placement files are matched against.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// The kernel driver's version as detection read it (`580.159.04`), when known: the
    /// engine images' minimum driver is checked against it (`engine::images`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// For a device a DRA driver publishes as shareable (`allowMultipleAllocations` with a
    /// `memory` capacity): its policy and what is consumed of it. A plan may then take a
    /// share of it instead of all of it (docs/decisions/0011); `None` for every other device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<Shareable>,
    /// The partitions a driver publishes of this device (MIG devices), smallest first where
    /// the merge found them; a replica may take one instead of the whole device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<Partition>,
    /// The device is published only as its [`partitions`](Self::partitions) (an AMD GPU
    /// partitioned on the node): a replica may take one of them, never the device whole.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partitions_only: bool,
}

impl DeviceSpec {
    /// A device of `product` (the table's name, maker, kind, precisions and bandwidth);
    /// `memory` overrides the table's size.
    pub fn of_product(product: &Product, id: String, memory: Option<Bytes>) -> Self {
        Self {
            id,
            product: product.name.to_string(),
            vendor: product.vendor,
            family: product.family,
            memory: memory.unwrap_or_else(|| product.memory()),
            precisions: product.precisions.iter().copied().collect(),
            domain: None,
            bandwidth_tbps: Some(product.bandwidth_tbps),
            aliases: Vec::new(),
            driver_version: None,
            share: None,
            partitions: Vec::new(),
            partitions_only: false,
        }
    }

    /// A device of a product the table does not know, named `product`: only what the
    /// conservative precisions run on ([`CONSERVATIVE_PRECISIONS`]), no bandwidth.
    pub fn of_unknown_product(
        id: String,
        product: &str,
        vendor: Vendor,
        family: Family,
        memory: Bytes,
    ) -> Self {
        Self {
            id,
            product: product.to_string(),
            vendor,
            family,
            memory,
            precisions: CONSERVATIVE_PRECISIONS.iter().copied().collect(),
            domain: None,
            bandwidth_tbps: None,
            aliases: Vec::new(),
            driver_version: None,
            share: None,
            partitions: Vec::new(),
            partitions_only: false,
        }
    }

    /// The memory an engine can allocate on this device: the reported total less what the
    /// driver keeps ([`super::runtime_memory`]). Every serving and training budget starts
    /// from this; `memory` stays what the inventory and the vendor tool say.
    pub fn runtime_memory(&self) -> Bytes {
        super::runtime_memory::runtime_memory(self.vendor, &self.product, self.memory)
    }
}

/// One node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    /// Node name (unique in the fleet).
    pub name: String,
    /// Accelerators.
    #[serde(default)]
    pub devices: Vec<DeviceSpec>,
    /// InfiniBand fabric (subnet prefix) shared with other nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<String>,
    /// Node labels (free-form; reported, not interpreted).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// The node label that names a node's multi-node NVLink domain (a GB200 NVL72 rack's NVLink
/// partition): `<cluster UUID>.<clique id>`, set by NVIDIA's GPU operator / DRA driver from
/// NVML's fabric info, and read by NVIDIA's topograph (`docs.nvidia.com/topograph`, DRA
/// provider: "discovers NVLink domain membership by reading nvidia.com/gpu.clique node
/// labels"). Nodes with the same value reach each other's GPUs over NVLink.
pub const NVLINK_CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";

impl NodeSpec {
    /// The multi-node NVLink domain the node's accelerators belong to, if any.
    pub fn nvlink_clique(&self) -> Option<&str> {
        self.labels
            .get(NVLINK_CLIQUE_LABEL)
            .map(String::as_str)
            .filter(|clique| !clique.is_empty())
    }
}

impl DeviceSpec {
    /// True when `name` names this device: its id or an alias, exactly, or as the same PCI
    /// address written another way (`18:00.0`, `0000:18:00.0`), or the same UUID in another
    /// case.
    pub fn is_named(&self, name: &str) -> bool {
        let name = name.trim();
        let canonical = crate::detect::pci::canonical_bus_id(name);
        std::iter::once(&self.id).chain(&self.aliases).any(|known| {
            known == name
                || known.eq_ignore_ascii_case(name)
                || canonical.is_some() && crate::detect::pci::canonical_bus_id(known) == canonical
        })
    }

    /// `id (alias, alias)`, for listings in errors.
    pub fn names(&self) -> String {
        if self.aliases.is_empty() {
            self.id.clone()
        } else {
            format!("{} ({})", self.id, self.aliases.join(", "))
        }
    }
}

/// True when some device of `nodes` is published shareable.
pub fn any_shareable(nodes: &[NodeSpec]) -> bool {
    nodes
        .iter()
        .any(|node| node.devices.iter().any(|device| device.share.is_some()))
}

/// True when some device of `nodes` is published only in partitions.
pub fn any_partitions_only(nodes: &[NodeSpec]) -> bool {
    nodes
        .iter()
        .any(|node| node.devices.iter().any(|device| device.partitions_only))
}

/// The node of `nodes` named `name`: found by binary search when `nodes` are in name order, as
/// a fleet view's and a loaded inventory's are (a plan looks its nodes up by name, and a linear
/// scan per device was a visible share of a plan at 10,000 nodes), else by a scan. Node names
/// are unique in a fleet (`load` refuses duplicates, a view is keyed by name).
pub fn find_node<'a>(nodes: &'a [NodeSpec], name: &str) -> Option<&'a NodeSpec> {
    match nodes.binary_search_by(|node| node.name.as_str().cmp(name)) {
        Ok(index) => Some(&nodes[index]),
        // Not found by bisection: absent, or the nodes are not in name order.
        Err(_) => nodes.iter().find(|node| node.name == name),
    }
}

/// The device of `nodes` that `node`/`device` names, by any of its names
/// ([`DeviceSpec::is_named`]); an error that lists the node's devices (or the nodes) when
/// nothing matches, so a name that matches nothing is never quietly ignored.
pub fn resolve_device<'a>(
    nodes: &'a [NodeSpec],
    node: &str,
    device: &str,
) -> Result<&'a DeviceSpec, String> {
    let Some(found) = find_node(nodes, node) else {
        let mut known: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        known.sort_unstable();
        return Err(format!(
            "no node {node:?} in the fleet; its nodes: {}",
            list(&known)
        ));
    };
    found
        .devices
        .iter()
        .find(|d| d.is_named(device))
        .ok_or_else(|| {
            let names: Vec<String> = found.devices.iter().map(DeviceSpec::names).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            format!(
                "node {node} has no plannable device named {device:?} (a device name, PCI \
                 address or UUID); its devices: {}",
                list(&names)
            )
        })
}

/// Up to 32 names, comma-separated, with a count of the rest.
fn list(names: &[&str]) -> String {
    const SHOWN: usize = 32;
    if names.is_empty() {
        return "none".to_string();
    }
    let mut text = names
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

/// Devices already taken, by node name and device id, and what is consumed of devices shared
/// by memory (`allowMultipleAllocations`): such a device others hold shares of is no whole
/// device to plan on, and a share of it may take only what is left.
///
/// Persistent maps (`imbl`, ADR 0014): a copy shares everything with its original and a
/// change copies only the path to what it changes, so the controller keeps every
/// placement's reservations in its ledger and hands each plan a copy less its own for the
/// price of that placement's devices, not the fleet's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reservations {
    taken: OrdMap<String, OrdSet<String>>,
    consumed: OrdMap<String, OrdMap<String, u64>>,
}

impl Reservations {
    /// No reservations.
    pub fn none() -> Self {
        Self::default()
    }

    /// Marks a device as taken.
    pub fn insert(&mut self, node: impl Into<String>, device: impl Into<String>) {
        self.taken
            .entry(node.into())
            .or_default()
            .insert(device.into());
    }

    /// Marks a device as no longer taken (a node left with none is dropped).
    pub fn remove(&mut self, node: &str, device: &str) {
        if let Some(ids) = self.taken.get_mut(node) {
            ids.remove(device);
            if ids.is_empty() {
                self.taken.remove(node);
            }
        }
    }

    /// Marks `devices` of `node` as taken (one lookup of the node for all of them).
    pub fn insert_all(&mut self, node: &str, devices: impl IntoIterator<Item = String>) {
        match self.taken.get_mut(node) {
            Some(taken) => taken.extend(devices),
            None => {
                let devices: OrdSet<String> = devices.into_iter().collect();
                if !devices.is_empty() {
                    self.taken.insert(node.to_string(), devices);
                }
            }
        }
    }

    /// Adds `bytes` to what is consumed of a shared device (saturating: a sum past the
    /// device's capacity means it is full, never that it wraps to empty).
    pub fn consume(&mut self, node: impl Into<String>, device: impl Into<String>, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let used = self
            .consumed
            .entry(node.into())
            .or_default()
            .entry(device.into())
            .or_default();
        *used = used.saturating_add(bytes);
    }

    /// True when the device is taken (no allocation: called once per device in the fleet).
    pub fn contains(&self, node: &str, device: &str) -> bool {
        self.taken.get(node).is_some_and(|ids| ids.contains(device))
    }

    /// The reserved device ids on `node`, if any (one lookup per node instead of one per
    /// device).
    pub fn on_node(&self, node: &str) -> Option<&OrdSet<String>> {
        self.taken.get(node)
    }

    /// Bytes consumed of each shared device on `node` that anything consumes, if any.
    pub fn consumed_on(&self, node: &str) -> Option<&OrdMap<String, u64>> {
        self.consumed.get(node)
    }

    /// Bytes consumed of a shared device (0 when nothing is).
    pub fn consumed(&self, node: &str, device: &str) -> u64 {
        self.consumed
            .get(node)
            .and_then(|devices| devices.get(device))
            .copied()
            .unwrap_or(0)
    }

    /// The nodes something is reserved or consumed on, in name order, each once.
    pub fn nodes(&self) -> Vec<&str> {
        let mut taken = self.taken.keys().map(String::as_str).peekable();
        let mut consumed = self.consumed.keys().map(String::as_str).peekable();
        let mut names = Vec::with_capacity(self.taken.len().max(self.consumed.len()));
        loop {
            let next = match (taken.peek(), consumed.peek()) {
                (Some(a), Some(b)) if a < b => taken.next(),
                (Some(a), Some(b)) if a > b => consumed.next(),
                (Some(_), Some(_)) => {
                    consumed.next();
                    taken.next()
                }
                (Some(_), None) => taken.next(),
                (None, Some(_)) => consumed.next(),
                (None, None) => break,
            };
            names.extend(next);
        }
        names
    }

    /// Every shared device something consumes, as `(node, device id, bytes)`, in order.
    pub fn iter_consumed(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.consumed.iter().flat_map(|(node, devices)| {
            devices
                .iter()
                .map(move |(id, bytes)| (node.as_str(), id.as_str(), *bytes))
        })
    }

    /// Adds every device `other` reserves, and what it consumes.
    pub fn merge(&mut self, other: &Reservations) {
        for (node, ids) in &other.taken {
            self.taken
                .entry(node.clone())
                .or_default()
                .extend(ids.iter().cloned());
        }
        for (node, id, bytes) in other.iter_consumed() {
            self.consume(node, id, bytes);
        }
    }

    /// Every reserved device as `(node, device id)`, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.taken
            .iter()
            .flat_map(|(node, ids)| ids.iter().map(move |id| (node.as_str(), id.as_str())))
    }

    /// The same, with every device anything consumes a share of counted as taken: the
    /// devices no whole-device plan may have, for counts of free devices.
    #[must_use]
    pub fn with_consumed_taken(mut self) -> Self {
        let consumed: Vec<(String, String)> = self
            .iter_consumed()
            .map(|(node, id, _)| (node.to_string(), id.to_string()))
            .collect();
        for (node, id) in consumed {
            self.insert(node, id);
        }
        self
    }

    /// Number of reserved devices.
    pub fn len(&self) -> usize {
        self.taken.values().map(OrdSet::len).sum()
    }

    /// True when nothing is reserved and nothing consumed.
    pub fn is_empty(&self) -> bool {
        self.taken.is_empty() && self.consumed.is_empty()
    }
}

/// Interconnect kinds that form a scale-up domain for tensor parallelism.
fn is_scale_up(kind: InterconnectKind) -> bool {
    !matches!(kind, InterconnectKind::Other)
}

impl NodeSpec {
    /// The planner's view of a detection report for the node `name`. Devices without a known
    /// memory size, unhealthy devices and devices split into MIG instances cannot be planned
    /// on; each one skipped is explained in the returned notes.
    pub fn from_report(report: &Report, name: &str) -> (Self, Vec<String>) {
        let mut notes = Vec::new();
        let domains: BTreeMap<&str, String> = report
            .interconnects
            .iter()
            .filter(|group| is_scale_up(group.kind))
            .flat_map(|group| {
                let domain = format!("{}:{}", group.kind.as_str(), group.id);
                group
                    .devices
                    .iter()
                    .map(move |id| (id.as_str(), domain.clone()))
            })
            .collect();
        let devices = report
            .accelerators()
            .filter_map(|device| match usable(device) {
                Ok(memory) => Some(device_spec(
                    device,
                    memory,
                    domains.get(device.id.as_str()).cloned(),
                )),
                Err(why) => {
                    notes.push(format!(
                        "{name}: skipped {} ({}): {why}",
                        device.id, device.model
                    ));
                    None
                }
            })
            .collect();
        let node = Self {
            name: name.to_string(),
            devices,
            fabric: fabric_of(report),
            labels: BTreeMap::new(),
        };
        (node, notes)
    }
}

/// The device's memory, or why it cannot be planned on: the one rule of
/// `hardware::device_state`, so the planner's free set is what every view counts free.
fn usable(device: &Device) -> Result<Bytes, &'static str> {
    match crate::hardware::device_state::unplannable(device) {
        Some(why) => Err(why),
        None => Ok(Bytes(device.memory_bytes.unwrap_or(0))),
    }
}

fn device_spec(device: &Device, memory: Bytes, domain: Option<String>) -> DeviceSpec {
    let product = products::lookup_sized(&device.model, Some(memory));
    let precisions = if device.precisions.is_empty() {
        product.map_or_else(
            || CONSERVATIVE_PRECISIONS.iter().copied().collect(),
            |p| p.precisions.iter().copied().collect(),
        )
    } else {
        device.precisions.clone()
    };
    DeviceSpec {
        id: device.id.clone(),
        product: device.model.clone(),
        vendor: device.vendor,
        family: device.family,
        memory,
        precisions,
        domain,
        bandwidth_tbps: product.map(|p| p.bandwidth_tbps),
        aliases: device.uuid.iter().cloned().collect(),
        driver_version: device.driver_version.clone(),
        share: None,
        partitions: Vec::new(),
        partitions_only: false,
    }
}

/// The InfiniBand fabric: the subnet of the first active InfiniBand port that reports one,
/// else of any port that does.
fn fabric_of(report: &Report) -> Option<String> {
    let with_fabric = || report.nics.iter().filter(|nic| nic.fabric.is_some());
    with_fabric()
        .find(|nic| nic.kind == NicKind::Infiniband && nic.state.as_deref() == Some("ACTIVE"))
        .or_else(|| with_fabric().next())
        .and_then(|nic| nic.fabric.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{Health, HealthStatus, InterconnectGroup, NetworkAdapter, Partition};

    fn gpu(id: &str, memory: Option<u64>) -> Device {
        let mut device = Device::new(
            id,
            Vendor::Nvidia,
            Family::Gpu,
            "NVIDIA H100 80GB HBM3",
            "nvidia",
        );
        device.memory_bytes = memory;
        device
    }

    #[test]
    fn taking_a_node_s_devices_at_once_is_taking_them_one_by_one() {
        let mut one_by_one = Reservations::none();
        let mut at_once = Reservations::none();
        for device in ["gpu1", "gpu0"] {
            one_by_one.insert("a", device);
        }
        one_by_one.insert("b", "gpu2");
        at_once.insert_all("a", ["gpu1".to_string()]);
        at_once.insert_all("a", ["gpu0".to_string()]);
        at_once.insert_all("b", ["gpu2".to_string()]);
        at_once.insert_all("c", []);
        assert_eq!(at_once, one_by_one);
        assert_eq!(at_once.nodes(), ["a", "b"]);
    }

    #[test]
    fn reserved_nodes_are_listed_once_in_name_order() {
        let mut reserved = Reservations::none();
        reserved.insert("b", "gpu0");
        reserved.insert("d", "gpu0");
        reserved.consume("a", "gpu0", 1);
        reserved.consume("b", "gpu1", 1);
        reserved.consume("e", "gpu0", 1);
        reserved.consume("f", "gpu0", 0);
        assert_eq!(reserved.nodes(), ["a", "b", "d", "e"]);
        assert!(Reservations::none().nodes().is_empty());
    }

    #[test]
    fn report_devices_domains_and_fabric() {
        let mut report = Report::empty();
        let mut cpu = Device::new("cpu0", Vendor::Intel, Family::Cpu, "Xeon", "cpu");
        cpu.memory_bytes = Some(1 << 40);
        let mut sick = gpu("0000:03:00.0", Some(85_520_809_984));
        sick.health = Health {
            status: HealthStatus::Unhealthy,
            ..Health::default()
        };
        let mut mig = gpu("0000:04:00.0", Some(85_520_809_984));
        mig.partitions.push(Partition {
            kind: "mig".into(),
            profile: "1g.10gb".into(),
            id: Some("1".into()),
            memory_bytes: None,
        });
        report.devices = vec![
            gpu("0000:01:00.0", Some(85_520_809_984)),
            gpu("0000:02:00.0", None),
            sick,
            mig,
            cpu,
        ];
        report.interconnects.push(InterconnectGroup {
            kind: InterconnectKind::Nvswitch,
            id: "0".into(),
            devices: vec!["0000:01:00.0".into()],
            links_per_device: None,
            bandwidth_gbps: None,
            topology: None,
        });
        report.nics.push(NetworkAdapter {
            name: "mlx5_0/1".into(),
            kind: NicKind::Infiniband,
            rate_gbps: Some(400),
            state: Some("ACTIVE".into()),
            pci_id: None,
            numa_node: None,
            fabric: Some("fe80:0000:0000:0000".into()),
        });
        let (node, notes) = NodeSpec::from_report(&report, "n1");
        assert_eq!(node.devices.len(), 1);
        let device = &node.devices[0];
        assert_eq!(device.domain.as_deref(), Some("nvswitch:0"));
        assert!(
            device.precisions.contains(&Precision::Fp8),
            "filled from the product table"
        );
        assert_eq!(device.bandwidth_tbps, Some(3.35));
        assert_eq!(node.fabric.as_deref(), Some("fe80:0000:0000:0000"));
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes.iter().any(|n| n.contains("memory size unknown")));
    }

    #[test]
    fn node_specs_round_trip_through_json() {
        let node = NodeSpec {
            name: "a".into(),
            devices: vec![DeviceSpec::of_product(
                products::lookup("L4", None).unwrap(),
                "gpu0".into(),
                None,
            )],
            fabric: None,
            labels: BTreeMap::new(),
        };
        let json = serde_json::to_string(&node).unwrap();
        assert!(json.contains("memoryBytes"));
        assert_eq!(serde_json::from_str::<NodeSpec>(&json).unwrap(), node);
    }

    #[test]
    fn a_device_is_found_by_any_of_its_names_and_a_miss_lists_them() {
        let mut device = gpu("0000:18:00.0", Some(85_520_809_984));
        device.uuid = Some("GPU-5c2a1e0f".into());
        let mut report = Report::empty();
        report.devices = vec![device];
        let (mut node, _) = NodeSpec::from_report(&report, "n1");
        node.devices[0].aliases.insert(0, "gpu-0000-18-00-0".into());
        let nodes = [node];
        for name in [
            "0000:18:00.0",
            "18:00.0",
            "gpu-0000-18-00-0",
            "GPU-5c2a1e0f",
            "gpu-5c2a1e0f",
        ] {
            let found = resolve_device(&nodes, "n1", name).unwrap();
            assert_eq!(found.id, "0000:18:00.0", "{name}");
        }
        let miss = resolve_device(&nodes, "n1", "gpu-0000-19-00-0").unwrap_err();
        assert!(
            miss.contains("its devices: 0000:18:00.0 (gpu-0000-18-00-0, GPU-5c2a1e0f)"),
            "{miss}"
        );
        let no_node = resolve_device(&nodes, "n2", "0000:18:00.0").unwrap_err();
        assert!(no_node.contains("its nodes: n1"), "{no_node}");
    }
}
