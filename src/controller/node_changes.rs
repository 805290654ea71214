//! Tells, from the Node watch, which changes matter to the controller.
//!
//! Nodes change all the time for reasons the controller does not care about (kubelet and kwok
//! heartbeats touch `status`, and so the resourceVersion). Two kinds of change do matter:
//!
//! * a change of a Node's *other* labels, which placements select nodes by: the planner's
//!   view of the fleet is stale, and waiting placements may fit now;
//! * a change of its `placement.hwaccel.io/*` labels, which only the controller should
//!   write: if someone removed or edited one, the Node must be brought back to the ledger's
//!   set at once rather than on the next periodic reconcile.
//!
//! [`NodeChanges`] keeps the last labels seen per Node (it is fed the same events as the
//! watch cache) and sorts each event into these two kinds. It is pure and has no clock.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Node;
use kube::api::PartialObjectMeta;
use kube::runtime::watcher::Event;

use crate::names::keys::is_placement_label;

type Labels = BTreeMap<String, String>;

/// What one watch event changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Change {
    /// Non-placement labels changed, or Nodes came or went: the fleet view is stale.
    pub fleet: bool,
    /// Nodes whose placement labels differ from what was seen before.
    pub placement_labels: Vec<String>,
}

/// The last labels seen per Node, split into the two kinds.
#[derive(Debug, Default)]
pub struct NodeChanges {
    seen: HashMap<String, (Labels, Labels)>,
    /// Nodes listed since the last `Init`, to drop those the relist no longer has.
    relisted: Option<HashMap<String, (Labels, Labels)>>,
}

impl NodeChanges {
    /// A tracker that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sorts one watch event; call it for every event, in order.
    pub fn observe(&mut self, event: &Event<PartialObjectMeta<Node>>) -> Change {
        let mut change = Change::default();
        match event {
            Event::Apply(node) => self.apply(node, &mut change),
            Event::Delete(node) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                // A deleted Node's labels need no repair; its inventory goes with it.
                change.fleet = self.seen.remove(&name).is_some();
            }
            Event::Init => self.relisted = Some(HashMap::new()),
            Event::InitApply(node) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                self.relisted
                    .get_or_insert_with(HashMap::new)
                    .insert(name, split(node));
            }
            Event::InitDone => {
                let relisted = self.relisted.take().unwrap_or_default();
                for (name, labels) in &relisted {
                    match self.seen.get(name) {
                        Some((other, placement)) => {
                            change.fleet |= *other != labels.0;
                            if *placement != labels.1 {
                                change.placement_labels.push(name.clone());
                            }
                        }
                        None => {
                            change.fleet = true;
                            if !labels.1.is_empty() {
                                change.placement_labels.push(name.clone());
                            }
                        }
                    }
                }
                change.fleet |= self.seen.keys().any(|name| !relisted.contains_key(name));
                self.seen = relisted;
                change.placement_labels.sort();
            }
        }
        change
    }

    fn apply(&mut self, node: &PartialObjectMeta<Node>, change: &mut Change) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let (other, placement) = split(node);
        match self.seen.get(&name) {
            Some((seen_other, seen_placement)) => {
                change.fleet = *seen_other != other;
                if *seen_placement != placement {
                    change.placement_labels.push(name.clone());
                }
            }
            None => {
                change.fleet = true;
                if !placement.is_empty() {
                    change.placement_labels.push(name.clone());
                }
            }
        }
        self.seen.insert(name, (other, placement));
    }
}

/// A Node's labels: the others, and the placement labels.
fn split(node: &PartialObjectMeta<Node>) -> (Labels, Labels) {
    node.metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .partition(|(k, _)| !is_placement_label(k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn node(name: &str, labels: &[(&str, &str)]) -> PartialObjectMeta<Node> {
        PartialObjectMeta {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            ..PartialObjectMeta::default()
        }
    }

    const ZONE: (&str, &str) = ("topology.kubernetes.io/zone", "a");
    const MINE: (&str, &str) = ("placement.hwaccel.io/ml.llama", "true");

    fn listed(tracker: &mut NodeChanges, nodes: &[PartialObjectMeta<Node>]) -> Change {
        tracker.observe(&Event::Init);
        for n in nodes {
            assert_eq!(
                tracker.observe(&Event::InitApply(n.clone())),
                Change::default()
            );
        }
        tracker.observe(&Event::InitDone)
    }

    #[test]
    fn heartbeats_change_nothing() {
        let mut tracker = NodeChanges::new();
        listed(&mut tracker, &[node("a", &[ZONE, MINE])]);
        // A status heartbeat arrives as an Apply of the same metadata.
        let change = tracker.observe(&Event::Apply(node("a", &[ZONE, MINE])));
        assert_eq!(change, Change::default());
    }

    #[test]
    fn other_labels_make_the_fleet_stale() {
        let mut tracker = NodeChanges::new();
        listed(&mut tracker, &[node("a", &[ZONE])]);
        let change = tracker.observe(&Event::Apply(node(
            "a",
            &[("topology.kubernetes.io/zone", "b")],
        )));
        assert!(change.fleet);
        assert!(change.placement_labels.is_empty());
    }

    #[test]
    fn a_removed_placement_label_is_reported_without_a_fleet_change() {
        let mut tracker = NodeChanges::new();
        listed(&mut tracker, &[node("a", &[ZONE, MINE])]);
        let change = tracker.observe(&Event::Apply(node("a", &[ZONE])));
        assert_eq!(
            change,
            Change {
                fleet: false,
                placement_labels: vec!["a".to_string()],
            }
        );
    }

    #[test]
    fn new_and_deleted_nodes_make_the_fleet_stale() {
        let mut tracker = NodeChanges::new();
        listed(&mut tracker, &[node("a", &[ZONE])]);
        assert!(tracker.observe(&Event::Apply(node("b", &[ZONE]))).fleet);
        let deleted = tracker.observe(&Event::Delete(node("a", &[ZONE])));
        assert!(deleted.fleet);
        // A Delete for a Node never seen changes nothing.
        assert_eq!(
            tracker.observe(&Event::Delete(node("zz", &[]))),
            Change::default()
        );
    }

    #[test]
    fn a_relist_reports_what_changed_while_the_watch_was_down() {
        let mut tracker = NodeChanges::new();
        let first = listed(
            &mut tracker,
            &[node("a", &[ZONE, MINE]), node("b", &[ZONE])],
        );
        assert!(first.fleet, "the first list is a change");
        assert_eq!(first.placement_labels, vec!["a".to_string()]);
        // Same Nodes, same labels: nothing to do.
        let same = listed(
            &mut tracker,
            &[node("a", &[ZONE, MINE]), node("b", &[ZONE])],
        );
        assert_eq!(same, Change::default());
        // "a" lost its placement label and "b" is gone.
        let later = listed(&mut tracker, &[node("a", &[ZONE])]);
        assert!(later.fleet);
        assert_eq!(later.placement_labels, vec!["a".to_string()]);
    }
}
