//! Tells, from the AcceleratorInventory watch, which events change what the planner sees.
//!
//! The planner's view of the fleet reads an inventory's spec (its devices) and nothing of its
//! status; the controller itself writes `status.freeDevices` whenever placements come and go,
//! and each such write is a watch event. Counting every event as a fleet change made every
//! placement's next reconcile rebuild the whole fleet view (250 ms at 10,000 nodes), hundreds
//! of times in a burst of new placements. The spec's changes are what `metadata.generation`
//! counts (the inventory's status is a subresource, so status writes leave it alone), so a
//! change matters when an inventory comes, goes, is re-created (a new uid) or gets a new
//! generation. A relist counts as a change: what it dropped is not seen one by one.
//!
//! Pure and without a clock, fed the same events as the watch cache.

use std::collections::HashMap;

use kube::Resource;
use kube::runtime::watcher::Event;

/// What identifies an inventory's spec: its uid and generation.
type SpecVersion = (Option<String>, Option<i64>);

/// The spec version last seen per inventory.
#[derive(Debug, Default)]
pub struct InventoryChanges {
    seen: HashMap<String, SpecVersion>,
    /// Inventories listed since the last `Init`.
    relisted: Option<HashMap<String, SpecVersion>>,
}

impl InventoryChanges {
    /// A tracker that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// True when `event` changes what the planner sees; call it for every event, in order.
    pub fn observe<K: Resource>(&mut self, event: &Event<K>) -> bool {
        match event {
            Event::Apply(object) => {
                let (name, version) = spec_version(object);
                self.seen.insert(name, version.clone()) != Some(version)
            }
            Event::Delete(object) => {
                let (name, _) = spec_version(object);
                self.seen.remove(&name);
                true
            }
            Event::Init => {
                self.relisted = Some(HashMap::new());
                false
            }
            Event::InitApply(object) => {
                let (name, version) = spec_version(object);
                self.relisted
                    .get_or_insert_with(HashMap::new)
                    .insert(name, version);
                false
            }
            Event::InitDone => {
                self.seen = self.relisted.take().unwrap_or_default();
                true
            }
        }
    }
}

fn spec_version<K: Resource>(object: &K) -> (String, SpecVersion) {
    let meta = object.meta();
    (
        meta.name.clone().unwrap_or_default(),
        (meta.uid.clone(), meta.generation),
    )
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;

    use super::*;
    use crate::api::AcceleratorInventory;
    use crate::testing::inventory::fixture_inventory;

    fn inventory(
        name: &str,
        uid: &str,
        generation: i64,
        resource_version: &str,
    ) -> AcceleratorInventory {
        let mut inventory = fixture_inventory("h100-8x-nvswitch", name);
        inventory.metadata = ObjectMeta {
            name: Some(name.into()),
            uid: Some(uid.into()),
            generation: Some(generation),
            resource_version: Some(resource_version.into()),
            ..ObjectMeta::default()
        };
        inventory
    }

    #[test]
    fn a_status_write_is_no_fleet_change_but_a_spec_change_a_new_uid_or_a_deletion_is() {
        let mut changes = InventoryChanges::new();
        assert!(
            changes.observe(&Event::Apply(inventory("n1", "u1", 1, "10"))),
            "new"
        );
        // The controller's own freeDevices write: a new resourceVersion, the same generation.
        assert!(!changes.observe(&Event::Apply(inventory("n1", "u1", 1, "11"))));
        assert!(
            changes.observe(&Event::Apply(inventory("n1", "u1", 2, "12"))),
            "spec"
        );
        assert!(
            changes.observe(&Event::Apply(inventory("n1", "u2", 2, "13"))),
            "re-created"
        );
        assert!(
            changes.observe(&Event::Delete(inventory("n1", "u2", 2, "14"))),
            "gone"
        );
        assert!(
            changes.observe(&Event::Apply(inventory("n1", "u2", 2, "15"))),
            "back"
        );
    }

    #[test]
    fn a_relist_is_one_change_at_its_end_and_replaces_what_was_seen() {
        let mut changes = InventoryChanges::new();
        assert!(changes.observe(&Event::Apply(inventory("n1", "u1", 1, "10"))));
        assert!(!changes.observe(&Event::<AcceleratorInventory>::Init));
        assert!(!changes.observe(&Event::InitApply(inventory("n2", "u2", 1, "20"))));
        assert!(changes.observe(&Event::<AcceleratorInventory>::InitDone));
        // n1 was not relisted: seen again, it is new.
        assert!(changes.observe(&Event::Apply(inventory("n1", "u1", 1, "21"))));
        assert!(!changes.observe(&Event::Apply(inventory("n2", "u2", 1, "22"))));
    }
}
