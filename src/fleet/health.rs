//! The fleet's health roll-up: per node and per product, devices present, healthy, unhealthy
//! (with reasons), missing, reserved and free.
//!
//! The input is the planner's view of each node ([`NodeSpec`], made by the one inventory
//! conversion, `AcceleratorInventory::planner_node`) plus what that view leaves out: the
//! accelerators the planner cannot use, with the reason, and the count the node should have.
//! The command line builds it from inventory objects, the controller from its fleet view
//! (`NodePart` already keeps the unplannable devices), so both count the same way.
//!
//! Counting rules, per node:
//! * `devices`: accelerators present (plannable + unusable);
//! * `healthy`: plannable devices plus unusable ones whose health is still healthy (a GPU split
//!   into MIG instances, a device without a memory size);
//! * `missing`: `expected − devices`, never below zero, when the node states an expectation;
//! * `reserved`: plannable devices a placement holds;
//! * `free`: plannable devices nobody holds, what capacity questions plan on.
//!
//! A node's missing devices count under its product when it has one product, else under
//! `unknown`: a vanished device cannot say what it was.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::hardware::{Family, Vendor};
use crate::plan::units::Bytes;
use crate::plan::{NodeSpec, Reservations};

/// The product name missing devices are counted under when a node mixes products.
pub const UNKNOWN_PRODUCT: &str = "unknown";

/// An accelerator a node has that the planner cannot use now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnusableDevice {
    /// Device id, named as the node's planner devices are.
    pub id: String,
    /// Product name.
    pub product: String,
    /// Maker.
    pub vendor: Vendor,
    /// Whether the device's health is `healthy` (it is unusable for another reason).
    pub healthy: bool,
    /// Why it cannot be planned on (`health unhealthy, 3 uncorrected ECC errors`).
    pub reason: String,
}

/// One node as the roll-up reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInput {
    /// The planner's view: the devices placements can use.
    pub node: NodeSpec,
    /// Accelerators present but not plannable.
    pub unusable: Vec<UnusableDevice>,
    /// Accelerators the node should have (`status.expectedDevices`), when known.
    pub expected: Option<u32>,
}

impl NodeInput {
    /// A node whose every accelerator is plannable and whose expected count is unknown
    /// (node lists and hardware shorthand carry nothing more).
    pub fn plannable(node: NodeSpec) -> Self {
        Self {
            node,
            unusable: Vec::new(),
            expected: None,
        }
    }
}

/// Device counts of a node, a product or the fleet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// Accelerators present.
    pub devices: u32,
    /// Of which healthy.
    pub healthy: u32,
    /// Of which not healthy.
    pub unhealthy: u32,
    /// Expected but not present.
    pub missing: u32,
    /// Plannable and held by a placement.
    pub reserved: u32,
    /// Plannable and held by nobody.
    pub free: u32,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.devices = self.devices.saturating_add(other.devices);
        self.healthy = self.healthy.saturating_add(other.healthy);
        self.unhealthy = self.unhealthy.saturating_add(other.unhealthy);
        self.missing = self.missing.saturating_add(other.missing);
        self.reserved = self.reserved.saturating_add(other.reserved);
        self.free = self.free.saturating_add(other.free);
    }
}

/// One node's roll-up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeHealth {
    /// Node name.
    pub name: String,
    /// Its counts.
    #[serde(flatten)]
    pub counts: Counts,
    /// The expected count the node states, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<u32>,
    /// Products on the node, sorted.
    pub products: Vec<String>,
    /// Devices present but not plannable, with reasons.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unusable: Vec<UnusableDevice>,
}

impl NodeHealth {
    /// True when something on the node needs a person: a device unhealthy or missing.
    pub fn is_sick(&self) -> bool {
        self.counts.unhealthy > 0 || self.counts.missing > 0
    }
}

/// One product's roll-up across the fleet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProductHealth {
    /// Product name as reported (`NVIDIA H100 80GB HBM3`), or [`UNKNOWN_PRODUCT`].
    pub product: String,
    /// Maker, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vendor: Option<Vendor>,
    /// Its counts.
    #[serde(flatten)]
    pub counts: Counts,
    /// Nodes that have it.
    pub nodes: u32,
}

/// The whole roll-up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetHealth {
    /// Fleet totals.
    pub total: Counts,
    /// Per product, by name.
    pub products: Vec<ProductHealth>,
    /// Per node, by name.
    pub nodes: Vec<NodeHealth>,
}

impl FleetHealth {
    /// Nodes with an unhealthy or missing device, by name.
    pub fn sick_nodes(&self) -> impl Iterator<Item = &NodeHealth> {
        self.nodes.iter().filter(|n| n.is_sick())
    }
}

/// Whether the planner counts `device` as an accelerator at all (it skips CPUs and devices
/// without memory when indexing).
fn is_accelerator(family: Family, memory: Bytes) -> bool {
    family != Family::Cpu && memory != Bytes::ZERO
}

/// Rolls up `nodes` with `reserved` devices held. `O(devices + nodes log nodes)`.
pub fn roll_up(nodes: &[NodeInput], reserved: &Reservations) -> FleetHealth {
    let mut per_node = Vec::with_capacity(nodes.len());
    let mut products: BTreeMap<String, (Option<Vendor>, Counts, u32)> = BTreeMap::new();
    for input in nodes {
        let taken = reserved.on_node(&input.node.name);
        // Counts per product on this node, then folded into the fleet's.
        let mut mine: BTreeMap<&str, (Option<Vendor>, Counts)> = BTreeMap::new();
        for device in &input.node.devices {
            if !is_accelerator(device.family, device.memory) {
                continue;
            }
            let entry = mine
                .entry(device.product.as_str())
                .or_insert((Some(device.vendor), Counts::default()));
            entry.1.devices += 1;
            entry.1.healthy += 1;
            if taken.is_some_and(|ids| ids.contains(&device.id)) {
                entry.1.reserved += 1;
            } else {
                entry.1.free += 1;
            }
        }
        for device in &input.unusable {
            let entry = mine
                .entry(device.product.as_str())
                .or_insert((Some(device.vendor), Counts::default()));
            entry.1.devices += 1;
            if device.healthy {
                entry.1.healthy += 1;
            } else {
                entry.1.unhealthy += 1;
            }
        }
        let present: u32 = mine.values().map(|(_, c)| c.devices).sum();
        let missing = input
            .expected
            .map_or(0, |expected| expected.saturating_sub(present));
        let names: Vec<String> = mine.keys().map(|p| (*p).to_string()).collect();
        if missing > 0 {
            let key = if mine.len() == 1 {
                names[0].as_str()
            } else {
                UNKNOWN_PRODUCT
            };
            // A product seen nowhere on the node (all gone) has no vendor to report.
            let entry = mine.entry(key).or_insert((None, Counts::default()));
            entry.1.missing += missing;
        }
        let mut counts = Counts::default();
        for (product, (vendor, c)) in &mine {
            counts.add(c);
            let fleet =
                products
                    .entry((*product).to_string())
                    .or_insert((*vendor, Counts::default(), 0));
            fleet.0 = fleet.0.or(*vendor);
            fleet.1.add(c);
            fleet.2 += 1;
        }
        let mut unusable = input.unusable.clone();
        unusable.sort_by(|a, b| a.id.cmp(&b.id));
        per_node.push(NodeHealth {
            name: input.node.name.clone(),
            counts,
            expected: input.expected,
            products: names,
            unusable,
        });
    }
    per_node.sort_by(|a, b| a.name.cmp(&b.name));
    let mut total = Counts::default();
    let products = products
        .into_iter()
        .map(|(product, (vendor, counts, nodes))| {
            total.add(&counts);
            ProductHealth {
                product,
                vendor,
                counts,
                nodes,
            }
        })
        .collect();
    FleetHealth {
        total,
        products,
        nodes: per_node,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::shorthand::parse_hardware;

    fn sick(id: &str, product: &str) -> UnusableDevice {
        UnusableDevice {
            id: id.into(),
            product: product.into(),
            vendor: Vendor::Nvidia,
            healthy: false,
            reason: "health unhealthy".into(),
        }
    }

    #[test]
    fn counts_present_healthy_missing_reserved_and_free() {
        let mut nodes: Vec<NodeInput> = parse_hardware("2x8xH100,1x4xL4")
            .unwrap()
            .into_iter()
            .map(NodeInput::plannable)
            .collect();
        let h100 = nodes[0].node.devices[0].product.clone();
        // Node 0: one device went unhealthy (gone from the planner's view) and one vanished.
        nodes[0].node.devices.truncate(6);
        nodes[0].unusable.push(sick("gpu7", &h100));
        nodes[0].expected = Some(8);
        let mut reserved = Reservations::none();
        reserved.insert(nodes[1].node.name.clone(), "gpu0");
        reserved.insert(nodes[1].node.name.clone(), "gpu1");
        reserved.insert("elsewhere", "gpu0");
        let health = roll_up(&nodes, &reserved);
        assert_eq!(
            health.total,
            Counts {
                devices: 19,
                healthy: 18,
                unhealthy: 1,
                missing: 1,
                reserved: 2,
                free: 16,
            }
        );
        let h = &health.products.iter().find(|p| p.product == h100).unwrap();
        assert_eq!((h.counts.devices, h.counts.missing, h.nodes), (15, 1, 2));
        assert_eq!(h.vendor, Some(Vendor::Nvidia));
        let sick: Vec<&str> = health.sick_nodes().map(|n| n.name.as_str()).collect();
        assert_eq!(sick, [nodes[0].node.name.as_str()]);
        assert_eq!(health.nodes[0].unusable[0].id, "gpu7");
    }

    #[test]
    fn a_node_with_every_device_gone_counts_them_missing_under_unknown() {
        let mut nodes: Vec<NodeInput> = parse_hardware("1x8xH100")
            .unwrap()
            .into_iter()
            .map(NodeInput::plannable)
            .collect();
        nodes[0].node.devices.clear();
        nodes[0].expected = Some(8);
        let health = roll_up(&nodes, &Reservations::none());
        assert_eq!(health.total.missing, 8);
        assert_eq!(health.total.devices, 0);
        assert_eq!(health.products[0].product, UNKNOWN_PRODUCT);
        assert_eq!(health.products[0].vendor, None);
    }

    #[test]
    fn more_devices_than_expected_is_not_negative_missing() {
        let mut nodes: Vec<NodeInput> = parse_hardware("1x8xH100")
            .unwrap()
            .into_iter()
            .map(NodeInput::plannable)
            .collect();
        nodes[0].expected = Some(4);
        assert_eq!(roll_up(&nodes, &Reservations::none()).total.missing, 0);
    }
}
