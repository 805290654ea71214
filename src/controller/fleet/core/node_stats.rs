//! Each inventory's numbers (the one device-state rule, [`NodeStats`]) kept between fleet
//! passes and counted again only for the nodes whose inputs changed: the inventory itself
//! (its uid and resourceVersion), the devices placements and other claims hold on its node,
//! and what DRA publishes of it (the view's verdicts and informational taints).
//!
//! A pass over 10,000 nodes of which a handful changed hashes each node's inputs and counts
//! the handful; counting all of them was 15 % of the controller's CPU in the 10,000-node,
//! 3,000-placement run (docs/benchmarks.md). What the cache answers is always what a count
//! from scratch answers (the tests below hold it to that through random changes).

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::api::AcceleratorInventory;
use crate::controller::core::fleet_figures::NodeStats;
use crate::controller::core::fleet_view::{FleetView, names_its_node};
use crate::fleet::health::Holdings;

/// Per node: the hash of what its numbers were counted from, and the numbers.
#[derive(Debug, Default)]
pub struct NodeStatsCache {
    by_node: HashMap<String, (u64, Arc<NodeStats>)>,
}

impl NodeStatsCache {
    /// The numbers of every inventory that names its own node, in the order given, counted
    /// again where their inputs changed; nodes no longer given are forgotten.
    pub fn count<'a>(
        &mut self,
        inventories: impl IntoIterator<Item = &'a AcceleratorInventory>,
        held: &Holdings<'_>,
        view: Option<&FleetView>,
    ) -> Vec<Arc<NodeStats>> {
        let stats: Vec<Arc<NodeStats>> = inventories
            .into_iter()
            .filter(|inventory| names_its_node(inventory))
            .map(|inventory| {
                let node = inventory.spec.node_name.as_str();
                let published = view.and_then(|view| view.unplannable_on(node));
                let notices = view.and_then(|view| view.notices_on(node));
                let inputs = {
                    let mut hasher = DefaultHasher::new();
                    inventory.metadata.uid.hash(&mut hasher);
                    inventory.metadata.resource_version.hash(&mut hasher);
                    held.placements.on_node(node).hash(&mut hasher);
                    held.placements.consumed_on(node).hash(&mut hasher);
                    held.claims.map(|c| c.on_node(node)).hash(&mut hasher);
                    held.claims.map(|c| c.consumed_on(node)).hash(&mut hasher);
                    published.hash(&mut hasher);
                    notices.hash(&mut hasher);
                    hasher.finish()
                };
                // Kept in place: a node whose inputs did not change costs a hash and a lookup.
                match self.by_node.get_mut(node) {
                    Some((hash, stats)) if *hash == inputs => stats.clone(),
                    kept => {
                        let stats =
                            Arc::new(NodeStats::with_notices(inventory, held, published, notices));
                        match kept {
                            Some(kept) => *kept = (inputs, stats.clone()),
                            None => {
                                self.by_node
                                    .insert(node.to_string(), (inputs, stats.clone()));
                            }
                        }
                        stats
                    }
                }
            })
            .collect();
        // Every node counted has an entry; more entries than that are nodes gone since.
        if self.by_node.len() > stats.len() {
            let present: HashSet<&str> = stats.iter().map(|s| s.node.as_str()).collect();
            self.by_node
                .retain(|node, _| present.contains(node.as_str()));
        }
        stats
    }

    /// Nodes whose numbers are kept.
    pub fn len(&self) -> usize {
        self.by_node.len()
    }

    /// True when none are.
    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::api::DeviceAttribute;
    use crate::api::attribute;
    use crate::plan::Reservations;
    use crate::testing::InventoryBuilder;

    const NODES: usize = 6;

    fn fleet() -> Vec<AcceleratorInventory> {
        (0..NODES)
            .map(|i| {
                let scenario = ["h100-8x-nvswitch", "mi300x-8x", "gaudi2-8x"][i % 3];
                let mut inventory = InventoryBuilder::fixture(scenario)
                    .node(&format!("node-{i}"))
                    .build();
                inventory.metadata.uid = Some(format!("uid-{i}"));
                inventory.metadata.resource_version = Some("1".into());
                inventory
            })
            .collect()
    }

    fn from_scratch(inventories: &[AcceleratorInventory], held: &Holdings<'_>) -> Vec<NodeStats> {
        inventories
            .iter()
            .filter(|inventory| names_its_node(inventory))
            .map(|inventory| NodeStats::of(inventory, held, None))
            .collect()
    }

    /// One change between two passes.
    #[derive(Debug, Clone)]
    enum Change {
        /// A placement takes (or gives back) a device of a node.
        Toggle { node: usize, device: usize },
        /// A claim takes (or gives back) a device of a node.
        Claim { node: usize, device: usize },
        /// A device's health changes: a new resourceVersion.
        Health {
            node: usize,
            device: usize,
            sick: bool,
        },
        /// The inventory is deleted and re-created with the same version (a new uid).
        Recreate { node: usize },
        /// The inventory goes away, or comes back.
        Flip { node: usize },
    }

    fn change() -> impl Strategy<Value = Change> {
        let at = (0..NODES, 0..8usize);
        prop_oneof![
            at.clone()
                .prop_map(|(node, device)| Change::Toggle { node, device }),
            at.clone()
                .prop_map(|(node, device)| Change::Claim { node, device }),
            (at, any::<bool>()).prop_map(|((node, device), sick)| Change::Health {
                node,
                device,
                sick
            }),
            (0..NODES).prop_map(|node| Change::Recreate { node }),
            (0..NODES).prop_map(|node| Change::Flip { node }),
        ]
    }

    fn toggle(set: &mut std::collections::BTreeSet<(String, String)>, pair: (String, String)) {
        if !set.remove(&pair) {
            set.insert(pair);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn the_kept_numbers_always_equal_a_count_from_scratch(
            changes in prop::collection::vec(prop::collection::vec(change(), 0..4), 1..12)
        ) {
            let mut inventories = fleet();
            let mut present = vec![true; NODES];
            let mut ours = std::collections::BTreeSet::new();
            let mut theirs = std::collections::BTreeSet::new();
            let mut version = 1u64;
            let mut cache = NodeStatsCache::default();
            for pass in changes {
                for change in pass {
                    version += 1;
                    match change {
                        Change::Toggle { node, device } => {
                            let name = inventories[node].spec.devices
                                [device % inventories[node].spec.devices.len()].name.clone();
                            toggle(&mut ours, (format!("node-{node}"), name));
                        }
                        Change::Claim { node, device } => {
                            let name = inventories[node].spec.devices
                                [device % inventories[node].spec.devices.len()].name.clone();
                            toggle(&mut theirs, (format!("node-{node}"), name));
                        }
                        Change::Health { node, device, sick } => {
                            let inventory = &mut inventories[node];
                            let count = inventory.spec.devices.len();
                            let entry = &mut inventory.spec.devices[device % count];
                            let health = if sick { "unhealthy" } else { "healthy" };
                            entry
                                .attributes
                                .insert(attribute::HEALTH.to_string(), DeviceAttribute::String(health.into()));
                            inventory.metadata.resource_version = Some(version.to_string());
                        }
                        Change::Recreate { node } => {
                            inventories[node].metadata.uid = Some(format!("uid-{node}-{version}"));
                        }
                        Change::Flip { node } => present[node] = !present[node],
                    }
                }
                let mut placements = Reservations::none();
                for (node, device) in &ours {
                    placements.insert(node.clone(), device.clone());
                }
                let mut claims = Reservations::none();
                for (node, device) in &theirs {
                    claims.insert(node.clone(), device.clone());
                }
                let held = Holdings { placements: &placements, claims: Some(&claims) };
                let given: Vec<AcceleratorInventory> = inventories
                    .iter()
                    .zip(&present)
                    .filter(|(_, present)| **present)
                    .map(|(inventory, _)| inventory.clone())
                    .collect();
                let kept: Vec<NodeStats> = cache
                    .count(&given, &held, None)
                    .into_iter()
                    .map(Arc::unwrap_or_clone)
                    .collect();
                prop_assert_eq!(&kept, &from_scratch(&given, &held));
                prop_assert_eq!(cache.len(), given.len());
            }
        }
    }

    #[test]
    fn an_unchanged_node_is_not_counted_again() {
        let inventories = fleet();
        let placements = Reservations::none();
        let held = Holdings::placements(&placements);
        let mut cache = NodeStatsCache::default();
        let first = cache.count(&inventories, &held, None);
        let second = cache.count(&inventories, &held, None);
        assert!(
            first.iter().zip(&second).all(|(a, b)| Arc::ptr_eq(a, b)),
            "the same numbers, not counted again"
        );
        let mut taken = Reservations::none();
        let device = inventories[0].spec.devices[0].name.clone();
        taken.insert("node-0", device);
        let third = cache.count(&inventories, &Holdings::placements(&taken), None);
        assert!(
            !Arc::ptr_eq(&first[0], &third[0]),
            "node-0's holdings changed"
        );
        assert!(
            third[1..]
                .iter()
                .zip(&first[1..])
                .all(|(a, b)| Arc::ptr_eq(a, b))
        );
        assert_eq!(third[0].counts.free + 1, first[0].counts.free);
    }
}
