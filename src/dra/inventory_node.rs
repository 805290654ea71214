//! An `AcceleratorInventory` as the planner's node and as the fleet roll-up's node: the one
//! conversion the controller's fleet view, `hwaccel plan --inventory`, `hwaccel fleet` and the
//! DRA merge ([`super::merge`], which adds what the drivers publish) all start from. It sits
//! above the API, which names nothing of the planner.

use std::collections::BTreeMap;

use crate::api::{AcceleratorInventory, attribute};
use crate::fleet::health::NodeInput;
use crate::plan::NodeSpec;

/// `inventory` as a planner node named after `spec.nodeName`, with notes about the
/// devices the planner cannot use.
pub fn planner_node(
    inventory: &AcceleratorInventory,
    ids: PlannerDeviceIds,
) -> (NodeSpec, Vec<String>) {
    let (mut node, notes) =
        NodeSpec::from_report(&inventory.to_report(), &inventory.spec.node_name);
    let names: BTreeMap<String, &str> = inventory
        .spec
        .devices
        .iter()
        .map(|entry| {
            let id = entry
                .text(attribute::ID)
                .unwrap_or_else(|| entry.name.clone());
            (id, entry.name.as_str())
        })
        .collect();
    for device in &mut node.devices {
        let Some(name) = names.get(&device.id) else {
            continue;
        };
        // Whichever names the planner uses, the other one (and the UUID, set by the
        // conversion) is an alias: a user may type any name an inventory prints.
        let other = if ids == PlannerDeviceIds::InventoryNames {
            std::mem::replace(&mut device.id, (*name).to_string())
        } else {
            (*name).to_string()
        };
        if other != device.id {
            device.aliases.insert(0, other);
        }
    }
    (node, notes)
}

/// `inventory` as the fleet roll-up reads it: the planner's node (devices named as in
/// the inventory), every accelerator's facts for the one device-state rule
/// (`hardware::device_state`), and the count the node should have. The command line and the
/// controller both count through this, so they count the same.
pub fn fleet_node(inventory: &AcceleratorInventory) -> (NodeInput, Vec<String>) {
    let (node, notes) = planner_node(inventory, PlannerDeviceIds::InventoryNames);
    let devices = inventory.device_facts();
    let expected = inventory.status.as_ref().and_then(|s| s.expected_devices);
    (
        NodeInput {
            node,
            devices,
            expected,
        },
        notes,
    )
}

/// How a planner node made from an inventory names its devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlannerDeviceIds {
    /// By detection id (a PCI bus id), as `hwaccel plan --inventory` prints them.
    Detection,
    /// By the inventory's DNS-label device name (`gpu-0000-18-00-0`), the names statuses,
    /// reservations and the controller's ledger use.
    InventoryNames,
}

/// Reads an `AcceleratorInventory` object (as `kubectl get accinv -o yaml` or `hwaccel detect
/// --as-inventory NODE` print it) for the planner's inventory files: `None` for any other
/// `kind`, an error saying what is wrong with a malformed one. The planner's file loader
/// takes it as its reader of Kubernetes objects, which keeps `plan` free of the CRD types.
pub fn planner_node_from_object(
    kind: &str,
    object: &serde_json::Value,
) -> Option<Result<(NodeSpec, Vec<String>), String>> {
    (kind == "AcceleratorInventory").then(|| {
        let inventory: AcceleratorInventory = serde_json::from_value(object.clone())
            .map_err(|err| format!("AcceleratorInventory: {err}"))?;
        Ok(planner_node(&inventory, PlannerDeviceIds::Detection))
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The one inventory → planner node conversion, as `hwaccel plan --inventory` reads an object
    /// (detection ids) and as the controller's fleet view does (inventory device names).
    #[test]
    fn inventories_become_planner_nodes_by_either_device_naming() {
        let ctx = crate::detect::testing::fixture_context("h100-8x-nvswitch");
        let detector = crate::detect::Detector::with_backends(
            ctx.host().clone(),
            ctx.runner().clone(),
            crate::detect::backends::all(),
        );
        let report = detector.run(false).0;
        let inventory = AcceleratorInventory::from_report("dgx-01", &report);
        let object = serde_json::to_value(&inventory).unwrap();
        let (node, _) = planner_node_from_object("AcceleratorInventory", &object)
            .expect("the kind is read")
            .unwrap();
        assert_eq!(node.name, "dgx-01");
        assert_eq!(node.devices.len(), 8);
        assert!(
            node.devices.iter().all(|d| d.domain.is_some()),
            "NVSwitch domain kept"
        );
        assert!(
            node.devices.iter().all(|d| d.id.contains(':')),
            "PCI bus ids"
        );
        let (named, _) = planner_node(&inventory, PlannerDeviceIds::InventoryNames);
        let names: BTreeSet<&str> = inventory
            .spec
            .devices
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        assert!(named.devices.iter().all(|d| names.contains(d.id.as_str())));
        assert!(planner_node_from_object("Node", &object).is_none());
        let err = planner_node_from_object(
            "AcceleratorInventory",
            &serde_json::json!({"kind": "AcceleratorInventory"}),
        )
        .expect("the kind is read")
        .unwrap_err();
        assert!(
            err.starts_with("AcceleratorInventory: missing field"),
            "{err}"
        );
    }
}
