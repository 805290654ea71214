//! AcceleratorInventories for tests, as a node's agent would publish them: detected from a
//! fixture host or converted from any [`Report`] (hand-built or from [`ReportBuilder`]),
//! then named, labelled and versioned, one node or a whole fleet at a time.
//!
//! [`ReportBuilder`]: super::report::ReportBuilder

use std::collections::BTreeMap;

use super::fixture::fixture_report;
use crate::api::AcceleratorInventory;
use crate::hardware::Report;

/// The inventory of `node`, detected from fixture host `scenario`.
pub fn fixture_inventory(scenario: &str, node: &str) -> AcceleratorInventory {
    InventoryBuilder::fixture(scenario).node(node).build()
}

/// `nodes` inventories named `n00000`, `n00001`... taking `reports` in turn, each at
/// resourceVersion `1` (as read back from an apiserver): a fleet for the controller's
/// benches and scale tests.
pub fn fleet(reports: &[Report], nodes: usize) -> Vec<AcceleratorInventory> {
    (0..nodes)
        .map(|i| {
            InventoryBuilder::from_report(reports[i % reports.len()].clone())
                .node(&format!("n{i:05}"))
                .resource_version("1")
                .build()
        })
        .collect()
}

/// Builds one AcceleratorInventory: the report it is converted from, the node it is named
/// after, its labels and resourceVersion.
#[derive(Debug, Clone)]
pub struct InventoryBuilder {
    report: Report,
    node: String,
    labels: BTreeMap<String, String>,
    resource_version: Option<String>,
}

impl InventoryBuilder {
    /// The inventory of fixture host `scenario` (see [`super::fixture`]), for a node named
    /// like the scenario until [`node`](Self::node) says otherwise.
    pub fn fixture(scenario: &str) -> Self {
        Self::from_report(fixture_report(scenario)).node(scenario)
    }

    /// The inventory of `report`, for a node named `node` until [`node`](Self::node) says
    /// otherwise.
    pub fn from_report(report: Report) -> Self {
        Self {
            report,
            node: "node".to_string(),
            labels: BTreeMap::new(),
            resource_version: None,
        }
    }

    /// The node (and so the object) name.
    #[must_use]
    pub fn node(mut self, name: &str) -> Self {
        self.node = name.to_string();
        self
    }

    /// One more label on the object.
    #[must_use]
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }

    /// The object's resourceVersion, as if read back from an apiserver (the controller's
    /// caches key on it).
    #[must_use]
    pub fn resource_version(mut self, version: &str) -> Self {
        self.resource_version = Some(version.to_string());
        self
    }

    /// The inventory. Borrows, so one builder can stamp out many nodes.
    pub fn build(&self) -> AcceleratorInventory {
        let mut inventory = AcceleratorInventory::from_report(&self.node, &self.report);
        if !self.labels.is_empty() {
            inventory.metadata.labels = Some(self.labels.clone());
        }
        inventory
            .metadata
            .resource_version
            .clone_from(&self.resource_version);
        inventory
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::report::{cpu_only, h100_x8};

    #[test]
    fn a_fixture_inventory_is_named_after_its_node_and_lists_the_fixture_devices() {
        let inventory = fixture_inventory("mi300x-8x", "mi-1");
        assert_eq!(inventory.metadata.name.as_deref(), Some("mi-1"));
        let mi300x = inventory
            .to_devices()
            .iter()
            .filter(|d| d.model.contains("MI300X"))
            .count();
        assert_eq!(mi300x, 8, "{:?}", inventory.spec.devices);
        assert_eq!(inventory.metadata.labels, None);
        assert_eq!(inventory.metadata.resource_version, None);
    }

    #[test]
    fn labels_and_version_land_on_the_object() {
        let inventory = InventoryBuilder::from_report(cpu_only())
            .node("cpu-1")
            .label("pool", "a")
            .label("hwaccel.io/test", "t1")
            .resource_version("7")
            .build();
        assert_eq!(inventory.metadata.name.as_deref(), Some("cpu-1"));
        assert_eq!(
            inventory.metadata.labels,
            Some(BTreeMap::from([
                ("hwaccel.io/test".to_string(), "t1".to_string()),
                ("pool".to_string(), "a".to_string()),
            ]))
        );
        assert_eq!(inventory.metadata.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn a_fleet_takes_the_reports_in_turn() {
        let fleet = fleet(&[h100_x8(), cpu_only()], 3);
        let names: Vec<_> = fleet
            .iter()
            .map(|i| i.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["n00000", "n00001", "n00002"]);
        assert_eq!(fleet[0].to_devices(), fleet[2].to_devices());
        assert_ne!(fleet[0].to_devices(), fleet[1].to_devices());
        assert!(
            fleet
                .iter()
                .all(|i| i.metadata.resource_version.as_deref() == Some("1"))
        );
    }
}
