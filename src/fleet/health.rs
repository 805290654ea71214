//! The fleet's health roll-up: per node and per product, devices present, healthy, degraded,
//! unhealthy, of unknown health, missing, reserved and free, and the devices that need a
//! person, with their reasons.
//!
//! Every figure is a count of [`DeviceState`]s, the one definition of device state
//! (`device_state`): the command line builds each node from inventory objects and the
//! controller from the inventories it watches, both through the one conversion
//! (`dra::inventory_node::fleet_node`), so both count the same way, and the free count is
//! the planner's free set (plannable devices nobody holds).
//!
//! A node's missing devices (`expected − present`, never below zero, when the node states an
//! expectation) count under its product when it has one product, else under `unknown`: a
//! vanished device cannot say what it was.

use std::collections::BTreeMap;

use serde::Serialize;

pub use crate::hardware::device_state::Counts;
use crate::hardware::device_state::{DeviceFacts, DeviceState, Holder};
use crate::hardware::{Family, HealthStatus, Vendor};
use crate::plan::units::Bytes;
use crate::plan::{NodeSpec, Reservations};

/// The product name missing devices are counted under when a node mixes products.
pub const UNKNOWN_PRODUCT: &str = "unknown";

/// One node as the roll-up reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInput {
    /// The planner's view: the devices placements can use.
    pub node: NodeSpec,
    /// Every accelerator present, plannable or not, named as the planner's devices are.
    pub devices: Vec<DeviceFacts>,
    /// Accelerators the node should have (`status.expectedDevices`), when known.
    pub expected: Option<u32>,
}

impl NodeInput {
    /// A node known only by its planner view (node lists, hardware shorthand): every
    /// accelerator is plannable and, with no health reading, of `unknown` health.
    pub fn plannable(node: NodeSpec) -> Self {
        let devices = node
            .devices
            .iter()
            .filter(|d| d.family != Family::Cpu && d.memory != Bytes::ZERO)
            .map(|d| DeviceFacts {
                name: d.id.clone(),
                product: d.product.clone(),
                vendor: d.vendor,
                health: HealthStatus::Unknown,
                health_reasons: Vec::new(),
                unplannable: None,
            })
            .collect();
        Self {
            node,
            devices,
            expected: None,
        }
    }

    /// This node with the verdicts of its DRA drivers (device name → why the planner's merged
    /// node leaves it out: shared, published only in parts...), so it counts as the planner
    /// plans.
    pub fn with_published_verdicts(mut self, verdicts: &BTreeMap<String, String>) -> Self {
        self.devices = self
            .devices
            .into_iter()
            .map(|facts| {
                let verdict = verdicts.get(&facts.name).map(String::as_str);
                facts.with_published_verdict(verdict)
            })
            .collect();
        self
    }

    /// This node with the informational taints its DRA drivers put on devices (device name
    /// → the taint): such a device counts degraded, still plannable.
    pub fn with_published_notices(mut self, notices: &BTreeMap<String, String>) -> Self {
        self.devices = self
            .devices
            .into_iter()
            .map(|facts| {
                let notice = notices.get(&facts.name).map(String::as_str);
                facts.with_published_notice(notice)
            })
            .collect();
        self
    }

    /// The state of each device present, with `held` saying who holds what.
    pub fn states(&self, held: &Holdings<'_>) -> Vec<DeviceState> {
        states_of(&self.node.name, &self.devices, held)
    }

    /// The node's counts with `held`, missing devices included.
    pub fn counts(&self, held: &Holdings<'_>) -> Counts {
        let mut counts = Counts::of(&self.states(held));
        counts.missing = self.missing(counts.devices);
        counts
    }

    /// Devices expected but not present.
    pub fn missing(&self, present: u32) -> u32 {
        self.expected
            .map_or(0, |expected| expected.saturating_sub(present))
    }
}

/// Who holds which devices: our placements, and everything else that allocated one (another
/// ResourceClaim, a consumed DRA counter).
#[derive(Debug, Clone, Copy)]
pub struct Holdings<'a> {
    /// Devices our placements hold.
    pub placements: &'a Reservations,
    /// Devices held otherwise, when known: allocated ResourceClaims and devices whose DRA
    /// counters they used up (the command line reads them from a cluster, not from files).
    pub claims: Option<&'a Reservations>,
}

impl<'a> Holdings<'a> {
    /// Only placements hold devices.
    pub fn placements(placements: &'a Reservations) -> Self {
        Self {
            placements,
            claims: None,
        }
    }
}

/// The state of each of `devices` on `node`, with `held` saying who holds what.
pub fn states_of(node: &str, devices: &[DeviceFacts], held: &Holdings<'_>) -> Vec<DeviceState> {
    let placements = held.placements.on_node(node);
    let claims = held.claims.and_then(|c| c.on_node(node));
    devices
        .iter()
        .map(|facts| {
            let holder = if placements.is_some_and(|ids| ids.contains(&facts.name)) {
                Some(Holder::Placement)
            } else if claims.is_some_and(|ids| ids.contains(&facts.name)) {
                Some(Holder::Claim)
            } else {
                None
            };
            DeviceState::of(facts, holder)
        })
        .collect()
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
    /// Devices that need a person (degraded, unhealthy) or that nobody can plan on, by name,
    /// with their state and reasons.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attention: Vec<DeviceState>,
}

impl NodeHealth {
    /// True when something on the node needs a person: a device degraded, unhealthy or
    /// missing.
    pub fn is_sick(&self) -> bool {
        self.counts.degraded > 0 || self.counts.unhealthy > 0 || self.counts.missing > 0
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
    /// Nodes with a degraded, unhealthy or missing device, by name.
    pub fn sick_nodes(&self) -> impl Iterator<Item = &NodeHealth> {
        self.nodes.iter().filter(|n| n.is_sick())
    }
}

/// Rolls up `nodes` with `held` devices. `O(devices + nodes log nodes)`.
pub fn roll_up(nodes: &[NodeInput], held: &Holdings<'_>) -> FleetHealth {
    let mut per_node = Vec::with_capacity(nodes.len());
    let mut products: BTreeMap<String, (Option<Vendor>, Counts, u32)> = BTreeMap::new();
    for input in nodes {
        let states = input.states(held);
        // Counts per product on this node, then folded into the fleet's.
        let mut mine: BTreeMap<&str, (Option<Vendor>, Counts)> = BTreeMap::new();
        for (facts, state) in input.devices.iter().zip(&states) {
            mine.entry(facts.product.as_str())
                .or_insert((Some(facts.vendor), Counts::default()))
                .1
                .count(state);
        }
        let present: u32 = mine.values().map(|(_, c)| c.devices).sum();
        let missing = input.missing(present);
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
        let mut attention: Vec<DeviceState> = states
            .into_iter()
            .filter(DeviceState::needs_attention)
            .collect();
        attention.sort_by(|a, b| a.name.cmp(&b.name));
        per_node.push(NodeHealth {
            name: input.node.name.clone(),
            counts,
            expected: input.expected,
            products: names,
            attention,
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
    use crate::hardware::device_state::Use;
    use crate::plan::shorthand::parse_hardware;

    fn nodes(hardware: &str) -> Vec<NodeInput> {
        parse_hardware(hardware)
            .unwrap()
            .into_iter()
            .map(NodeInput::plannable)
            .collect()
    }

    fn set(input: &mut NodeInput, index: usize, health: HealthStatus) {
        let facts = &mut input.devices[index];
        facts.health = health;
        if health == HealthStatus::Unhealthy {
            facts.unplannable = Some("unhealthy".into());
            let id = facts.name.clone();
            input.node.devices.retain(|d| d.id != id);
        }
    }

    #[test]
    fn counts_every_health_missing_reserved_and_free() {
        let mut nodes = nodes("2x8xH100,1x4xL4");
        let h100 = nodes[0].node.devices[0].product.clone();
        for node in &mut nodes {
            for i in 0..node.devices.len() {
                set(node, i, HealthStatus::Healthy);
            }
        }
        // Node 0: one device went unhealthy, one is degraded, one vanished.
        nodes[0].node.devices.truncate(7);
        nodes[0].devices.truncate(7);
        set(&mut nodes[0], 6, HealthStatus::Unhealthy);
        set(&mut nodes[0], 5, HealthStatus::Degraded);
        nodes[0].devices[5].health_reasons = vec!["1 retired page(s)".into()];
        nodes[0].expected = Some(8);
        // The L4 node has no health reading.
        set(&mut nodes[2], 0, HealthStatus::Unknown);
        let mut placements = Reservations::none();
        placements.insert(nodes[1].node.name.clone(), "gpu0");
        placements.insert(nodes[1].node.name.clone(), "gpu1");
        placements.insert("elsewhere", "gpu0");
        let mut claims = Reservations::none();
        claims.insert(nodes[1].node.name.clone(), "gpu2");
        let held = Holdings {
            placements: &placements,
            claims: Some(&claims),
        };
        let health = roll_up(&nodes, &held);
        assert_eq!(
            health.total,
            Counts {
                devices: 19,
                healthy: 16,
                degraded: 1,
                unhealthy: 1,
                unknown: 1,
                missing: 1,
                reserved: 3,
                free: 15,
                unusable: 1,
            }
        );
        let h = &health.products.iter().find(|p| p.product == h100).unwrap();
        assert_eq!((h.counts.devices, h.counts.missing, h.nodes), (15, 1, 2));
        assert_eq!(h.vendor, Some(Vendor::Nvidia));
        let sick: Vec<&str> = health.sick_nodes().map(|n| n.name.as_str()).collect();
        assert_eq!(sick, [nodes[0].node.name.as_str()]);
        let attention: Vec<(&str, HealthStatus)> = health.nodes[0]
            .attention
            .iter()
            .map(|d| (d.name.as_str(), d.health))
            .collect();
        assert_eq!(
            attention,
            [
                ("gpu5", HealthStatus::Degraded),
                ("gpu6", HealthStatus::Unhealthy)
            ]
        );
        assert_eq!(health.nodes[0].attention[0].usage, Use::Free);
        // The free count is the planner's free set: its devices nobody holds.
        let planner_free: usize = nodes
            .iter()
            .flat_map(|n| n.node.devices.iter().map(move |d| (n, d)))
            .filter(|(n, d)| {
                !placements.contains(&n.node.name, &d.id) && !claims.contains(&n.node.name, &d.id)
            })
            .count();
        assert_eq!(health.total.free as usize, planner_free);
    }

    #[test]
    fn a_node_with_every_device_gone_counts_them_missing_under_unknown() {
        let mut nodes = nodes("1x8xH100");
        nodes[0].node.devices.clear();
        nodes[0].devices.clear();
        nodes[0].expected = Some(8);
        let health = roll_up(&nodes, &Holdings::placements(&Reservations::none()));
        assert_eq!(health.total.missing, 8);
        assert_eq!(health.total.devices, 0);
        assert_eq!(health.products[0].product, UNKNOWN_PRODUCT);
        assert_eq!(health.products[0].vendor, None);
    }

    #[test]
    fn more_devices_than_expected_is_not_negative_missing() {
        let mut nodes = nodes("1x8xH100");
        nodes[0].expected = Some(4);
        let none = Reservations::none();
        let held = Holdings::placements(&none);
        assert_eq!(roll_up(&nodes, &held).total.missing, 0);
        assert_eq!(nodes[0].counts(&held).missing, 0);
    }
}
