//! A model test of concurrent reconciles on the ledger: several simulated workers take
//! snapshots, plan on them (older waiting placements first, as `decide` does), and commit in
//! any interleaving with status writes that fail, deletions, cleanups, re-creations,
//! foreign claims and controller restarts that rebuild the ledger from the statuses written.
//!
//! A property test rather than loom: what can go wrong is the order of whole ledger
//! operations (snapshot, commit, forget, rebuild) across workers, each of which runs under
//! the one lock; loom explores thread interleavings inside one lock-free structure, which
//! the ledger is not. Proptest drives thousands of such orders and shrinks a failure to the
//! shortest one.
//!
//! After every step: no device is held by two placements (recomputed from the holdings, not
//! trusted from the ledger's own index), none is held by a placement that was cleaned up or
//! by a claim outside the ledger, and a status written after a commit says what the ledger
//! holds. At the end, with every placement reconciled one at a time until nothing changes,
//! no device is lost: no waiting placement fits in the devices nobody holds, which also shows
//! that no stale "did not fit" memo survived a race.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::{Holding, Ledger, PlacementKey, Tried};
use crate::api::placement::{Assignment, ModelPlacementStatus};
use crate::controller::placement::core::claim_holdings::HeldOutside;
use crate::controller::placement::core::outcome::Outcome;
use crate::plan::Reservations;

const NODES: usize = 2;
const DEVICES_PER_NODE: usize = 4;
const PLACEMENTS: usize = 5;
const WORKERS: usize = 3;

/// One step of the simulated controller.
#[derive(Debug, Clone)]
enum Step {
    /// A worker takes a snapshot and plans placement `placement` on it (its reconcile).
    Plan { worker: usize, placement: usize },
    /// A worker commits its plan, then writes the status (or the write fails).
    Commit { worker: usize, write_ok: bool },
    /// The watch sees the placement's deletion timestamp.
    Delete { placement: usize },
    /// The placement's cleanup reconcile frees its devices; it is then created again (a
    /// new uid, the youngest of all).
    Cleanup { placement: usize },
    /// The controller restarts: the ledger is rebuilt from the statuses written.
    Restart,
    /// A foreign claim is allocated on a free device, or released.
    Foreign { node: usize, device: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..WORKERS, 0..PLACEMENTS).prop_map(|(worker, placement)| Step::Plan { worker, placement }),
        4 => (0..WORKERS, prop::bool::weighted(0.75)).prop_map(|(worker, write_ok)| Step::Commit { worker, write_ok }),
        1 => (0..PLACEMENTS).prop_map(|placement| Step::Delete { placement }),
        1 => (0..PLACEMENTS).prop_map(|placement| Step::Cleanup { placement }),
        1 => Just(Step::Restart),
        1 => (0..NODES, 0..DEVICES_PER_NODE).prop_map(|(node, device)| Step::Foreign { node, device }),
    ]
}

/// A placement as the apiserver has it.
#[derive(Debug, Clone)]
struct Placement {
    /// Devices it asks for.
    wants: usize,
    created: i64,
    incarnation: u32,
    deleting: bool,
}

impl Placement {
    fn uid(&self, index: usize) -> String {
        format!("uid-{index}-{}", self.incarnation)
    }
}

/// A worker's reconcile in flight: its placement, and the snapshot it planned on.
#[derive(Debug)]
struct InFlight {
    placement: usize,
    draft: Ledger,
}

/// The simulated controller and apiserver.
struct Sim {
    placements: Vec<Placement>,
    ledger: Ledger,
    /// `.status` of each placement as last written: what a restart rebuilds from.
    statuses: BTreeMap<usize, Holding>,
    workers: Vec<Option<InFlight>>,
    foreign: Reservations,
    clock: i64,
}

fn key(index: usize) -> PlacementKey {
    PlacementKey::new("ml", format!("p{index}"))
}

fn index_of(key: &PlacementKey) -> usize {
    key.name
        .trim_start_matches('p')
        .parse()
        .unwrap_or(usize::MAX)
}

/// The placement exists as `holding` was planned for, and is not being deleted.
fn alive(placements: &[Placement], key: &PlacementKey, holding: &Holding) -> bool {
    let index = index_of(key);
    placements
        .get(index)
        .is_some_and(|p| !p.deleting && p.uid(index) == holding.uid)
}

fn all_devices() -> Vec<(String, String)> {
    (0..NODES)
        .flat_map(|n| (0..DEVICES_PER_NODE).map(move |d| (format!("n{n}"), format!("gpu-{d}"))))
        .collect()
}

impl Sim {
    fn new(wants: &[usize]) -> Self {
        let placements = wants
            .iter()
            .enumerate()
            .map(|(i, wants)| Placement {
                wants: *wants,
                created: i64::try_from(i).unwrap_or(0),
                incarnation: 0,
                deleting: false,
            })
            .collect();
        Self {
            placements,
            ledger: Ledger::new(),
            statuses: BTreeMap::new(),
            workers: (0..WORKERS).map(|_| None).collect(),
            foreign: Reservations::none(),
            clock: i64::try_from(wants.len()).unwrap_or(0),
        }
    }

    fn alive(&self, key: &PlacementKey, holding: &Holding) -> bool {
        alive(&self.placements, key, holding)
    }

    fn tried(&self, index: usize) -> Tried {
        Tried {
            uid: self.placements[index].uid(index),
            generation: 1,
            fleet: 0,
        }
    }

    /// Plans `index` on `ledger` against what others hold, taking free devices from an
    /// offset (different workers prefer different devices, so plans both collide and not).
    fn try_to_plan(&self, ledger: &mut Ledger, index: usize, offset: usize) {
        let key = key(index);
        let reserved = ledger.reserved_by_others(&key);
        let devices = all_devices();
        let free: Vec<&(String, String)> = (0..devices.len())
            .map(|i| &devices[(i + offset) % devices.len()])
            .filter(|(n, d)| !reserved.contains(n, d))
            .collect();
        let placement = &self.placements[index];
        if free.len() < placement.wants {
            let refusal = Outcome::Unschedulable(ModelPlacementStatus::default());
            ledger.mark_unfit(key, self.tried(index), refusal);
            return;
        }
        let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (node, device) in free.into_iter().take(placement.wants) {
            by_node
                .entry(node.clone())
                .or_default()
                .push(device.clone());
        }
        let assignments = by_node
            .into_iter()
            .map(|(node, devices)| Assignment {
                node,
                devices,
                replica: 0,
                stage: 0,
            })
            .collect();
        let holding = Holding {
            created: placement.created,
            uid: placement.uid(index),
            generation: 1,
            status: ModelPlacementStatus {
                assignments,
                ..ModelPlacementStatus::default()
            },
        };
        let planned = ledger.insert(key, holding);
        assert!(planned.is_ok(), "planned on reserved devices: {planned:?}");
    }

    /// `decide` in miniature: keep a held plan; else older waiting placements first, then
    /// `index`, each skipped while known not to fit.
    fn decide(&self, ledger: &mut Ledger, index: usize, offset: usize) {
        let me = &self.placements[index];
        if ledger
            .get(&key(index))
            .is_some_and(|h| h.uid == me.uid(index))
        {
            return;
        }
        let mut order: Vec<usize> = (0..self.placements.len())
            .filter(|i| !self.placements[*i].deleting)
            .filter(|i| (self.placements[*i].created, key(*i)) < (me.created, key(index)))
            .collect();
        order.sort_by_key(|i| (self.placements[*i].created, key(*i)));
        order.push(index);
        for other in order {
            let waiting = ledger.get(&key(other)).is_none();
            let known = ledger
                .known_unfit(&key(other), &self.tried(other))
                .is_some();
            if waiting && !known {
                self.try_to_plan(ledger, other, offset);
            }
        }
    }

    fn apply(&mut self, step: &Step) {
        match *step {
            Step::Plan { worker, placement } => {
                if self.workers[worker].is_some() || self.placements[placement].deleting {
                    return;
                }
                let mut draft = self.ledger.snapshot();
                self.decide(&mut draft, placement, worker * 3);
                self.workers[worker] = Some(InFlight { placement, draft });
            }
            Step::Commit { worker, write_ok } => {
                let Some(InFlight { placement, draft }) = self.workers[worker].take() else {
                    return;
                };
                let planned = draft.get(&key(placement)).cloned();
                let placements = &self.placements;
                let alive = |key: &PlacementKey, holding: &Holding| alive(placements, key, holding);
                let Ok(committed) = self.ledger.commit(draft, &key(placement), alive) else {
                    return;
                };
                if committed.stale_refusals.contains(&key(placement)) || !write_ok {
                    return;
                }
                // The reconcile writes the outcome it committed for its own placement.
                match planned {
                    Some(holding) => self.statuses.insert(placement, holding),
                    None => self.statuses.remove(&placement),
                };
                assert_eq!(
                    self.ledger.get(&key(placement)),
                    self.statuses.get(&placement),
                    "the status written says what the ledger holds"
                );
            }
            Step::Delete { placement } => self.placements[placement].deleting = true,
            Step::Cleanup { placement } => {
                if !self.placements[placement].deleting {
                    return;
                }
                self.ledger.forget(&key(placement));
                self.statuses.remove(&placement);
                self.clock += 1;
                let recreated = &mut self.placements[placement];
                recreated.deleting = false;
                recreated.incarnation += 1;
                recreated.created = self.clock;
            }
            Step::Restart => {
                self.workers.iter_mut().for_each(|w| *w = None);
                let entries = self.statuses.iter().map(|(i, h)| (key(*i), h.clone()));
                self.ledger = Ledger::rebuild(entries).0;
                self.ledger.set_external(HeldOutside {
                    devices: self.foreign.clone(),
                    blocked: Default::default(),
                });
            }
            Step::Foreign { node, device } => {
                let (node, device) = (format!("n{node}"), format!("gpu-{device}"));
                let mut foreign = Reservations::none();
                let was_foreign = self.foreign.contains(&node, &device);
                for (n, d) in all_devices() {
                    let toggled = n == node && d == device;
                    if self.foreign.contains(&n, &d) != toggled {
                        foreign.insert(n, d);
                    }
                }
                // A claim is allocated only on a device nobody holds.
                if was_foreign || self.ledger.holder_of(&node, &device).is_none() {
                    self.foreign = foreign;
                    self.ledger.set_external(HeldOutside {
                        devices: self.foreign.clone(),
                        blocked: Default::default(),
                    });
                }
            }
        }
    }

    /// Every invariant that holds between steps.
    fn check(&self) -> Result<(), TestCaseError> {
        let mut owners: BTreeMap<(String, String), PlacementKey> = BTreeMap::new();
        for (key, holding) in self.ledger.iter() {
            prop_assert!(
                self.alive(key, holding) || self.placements[index_of(key)].deleting,
                "{key} holds devices after its cleanup"
            );
            for (node, device) in holding.devices() {
                let pair = (node.to_string(), device.to_string());
                prop_assert!(
                    !self.foreign.contains(node, device),
                    "{node}/{device} is held by {key} and by a foreign claim"
                );
                let other = owners.insert(pair, key.clone());
                prop_assert!(
                    other.is_none(),
                    "{node}/{device} is held by {key} and {other:?}"
                );
            }
        }
        prop_assert_eq!(&owners, &self.ledger.owners, "the ledger's index drifted");
        Ok(())
    }

    /// Reconciles every placement one at a time, writes succeeding, until nothing changes.
    fn settle(&mut self) {
        for _ in 0..=PLACEMENTS {
            let mut order: Vec<usize> = (0..self.placements.len()).collect();
            order.sort_by_key(|i| (self.placements[*i].created, key(*i)));
            for placement in order {
                self.apply(&Step::Plan {
                    worker: 0,
                    placement,
                });
                self.apply(&Step::Commit {
                    worker: 0,
                    write_ok: true,
                });
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_device_is_committed_twice_or_lost(
        wants in prop::collection::vec(1..=5usize, PLACEMENTS),
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let mut sim = Sim::new(&wants);
        for step in &steps {
            sim.apply(step);
            sim.check()?;
        }
        sim.workers.iter_mut().for_each(|w| *w = None);
        sim.settle();
        sim.check()?;
        let held: BTreeSet<(String, String)> = sim.ledger.owners.keys().cloned().collect();
        let free = all_devices()
            .into_iter()
            .filter(|(n, d)| !held.contains(&(n.clone(), d.clone())) && !sim.foreign.contains(n, d))
            .count();
        for (index, placement) in sim.placements.iter().enumerate() {
            let holds = sim.ledger.get(&key(index)).is_some();
            prop_assert!(
                holds || placement.deleting || placement.wants > free,
                "p{index} wants {} of {free} free devices and waits", placement.wants
            );
            if !placement.deleting {
                prop_assert_eq!(sim.ledger.get(&key(index)), sim.statuses.get(&index));
            }
        }
    }
}
