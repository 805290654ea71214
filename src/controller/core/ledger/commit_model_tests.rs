//! A model test of concurrent reconciles on the ledger: several simulated workers take
//! snapshots, plan on them (re-planning a holding whose spec or uid changed, older waiting
//! placements first, as `decide` does), and commit in any interleaving with status writes
//! that fail, spec edits, deletions with and without the cleanup finalizer (a tenant may
//! remove it), cleanups, re-creations under a new uid, prune passes, foreign claims and
//! controller restarts that rebuild the ledger from the statuses stored.
//!
//! A property test rather than loom: what can go wrong is the order of whole ledger
//! operations (snapshot, commit, forget, prune, rebuild) across workers, each of which runs
//! under the one lock; loom explores thread interleavings inside one lock-free structure,
//! which the ledger is not. Proptest drives thousands of such orders and shrinks a failure
//! to the shortest one. Cases follow `PROPTEST_CASES` (256 unless set);
//! `PROPTEST_CASES=20000 cargo test --lib commit_model` is the long run.
//!
//! After every step: the ledger's device index is exactly the inverse of its holdings (issue
//! 35: a commit that re-planned a holding placement and gave one of its devices to an older
//! placement sorting before it dropped that device's owner entry), no device is held by two
//! placements (recomputed from the holdings, not trusted from the index), none by a
//! placement and a claim outside the ledger, and a status written after a commit says what
//! the ledger holds. After a prune pass, nothing is held for a placement that no longer
//! exists. At the end, with every placement reconciled one at a time until nothing changes,
//! no device is lost: no waiting placement fits in the devices nobody holds, which also
//! shows that no stale "did not fit" memo survived a race and no ghost kept a device.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::{Holding, Ledger, PlacementKey, Tried};
use crate::api::placement::{Assignment, ModelPlacementStatus};
use crate::controller::core::ledger::HeldOutside;
use crate::controller::core::outcome::Outcome;
use crate::plan::Reservations;

const NODES: usize = 2;
const DEVICES_PER_NODE: usize = 4;
const PLACEMENTS: usize = 5;
const WORKERS: usize = 3;
const MAX_WANTS: usize = 5;

/// One step of the simulated controller, apiserver and tenants.
#[derive(Debug, Clone)]
enum Step {
    /// A worker reconciles placement `placement`: the first reconcile only adds the cleanup
    /// finalizer; later ones take a snapshot and plan on it.
    Plan { worker: usize, placement: usize },
    /// A worker commits its plan, then writes the status (or the write fails).
    Commit { worker: usize, write_ok: bool },
    /// A tenant edits the spec: a new generation asking for `wants` devices.
    Edit { placement: usize, wants: usize },
    /// A tenant deletes the placement: with the finalizer it waits for its cleanup, without
    /// it it is gone at once.
    Delete { placement: usize },
    /// A tenant removes the cleanup finalizer (a placement being deleted is then gone).
    DropFinalizer { placement: usize },
    /// The placement's cleanup reconcile frees its devices and removes the finalizer.
    Cleanup { placement: usize },
    /// A placement that is gone is created again under its name (a new uid, the youngest).
    Create { placement: usize },
    /// The prune pass: holdings of placements that no longer exist are forgotten.
    Prune,
    /// The controller restarts: the ledger is rebuilt from the statuses stored.
    Restart,
    /// A foreign claim is allocated on a free device, or released.
    Foreign { node: usize, device: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0..WORKERS, 0..PLACEMENTS).prop_map(|(worker, placement)| Step::Plan { worker, placement }),
        5 => (0..WORKERS, prop::bool::weighted(0.75)).prop_map(|(worker, write_ok)| Step::Commit { worker, write_ok }),
        2 => (0..PLACEMENTS, 1..=MAX_WANTS).prop_map(|(placement, wants)| Step::Edit { placement, wants }),
        1 => (0..PLACEMENTS).prop_map(|placement| Step::Delete { placement }),
        1 => (0..PLACEMENTS).prop_map(|placement| Step::DropFinalizer { placement }),
        1 => (0..PLACEMENTS).prop_map(|placement| Step::Cleanup { placement }),
        1 => (0..PLACEMENTS).prop_map(|placement| Step::Create { placement }),
        1 => Just(Step::Prune),
        1 => Just(Step::Restart),
        1 => (0..NODES, 0..DEVICES_PER_NODE).prop_map(|(node, device)| Step::Foreign { node, device }),
    ]
}

/// A placement as the apiserver has it.
#[derive(Debug, Clone)]
struct Placement {
    /// Devices its current generation asks for.
    wants: usize,
    generation: i64,
    created: i64,
    incarnation: u32,
    /// In the apiserver (and the watch cache) at all.
    exists: bool,
    /// Deletion requested; it stays until its cleanup removes the finalizer.
    deleting: bool,
    /// Carries the cleanup finalizer.
    finalizer: bool,
}

impl Placement {
    fn uid(&self, index: usize) -> String {
        format!("uid-{index}-{}", self.incarnation)
    }

    /// May be given devices (the commit's `alive`, `still_placeable` in the driver).
    fn placeable(&self) -> bool {
        self.exists && !self.deleting && self.finalizer
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
    /// `.status` of each existing placement as last written: what a restart rebuilds from.
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

/// The placement exists as `holding` was planned for and may be given devices.
fn alive(placements: &[Placement], key: &PlacementKey, holding: &Holding) -> bool {
    let index = index_of(key);
    placements
        .get(index)
        .is_some_and(|p| p.placeable() && p.uid(index) == holding.uid)
}

/// A holding of `key` planned for `uid` may stand: its object is there, and if it is being
/// deleted, its cleanup is still to come (`holding_may_stand` in the driver).
fn may_stand(placements: &[Placement], key: &PlacementKey, uid: &str) -> bool {
    let index = index_of(key);
    placements
        .get(index)
        .is_some_and(|p| p.exists && p.uid(index) == uid && (!p.deleting || p.finalizer))
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
                generation: 1,
                created: i64::try_from(i).unwrap_or(0),
                incarnation: 0,
                exists: true,
                deleting: false,
                finalizer: false,
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

    fn tried(&self, index: usize) -> Tried {
        let placement = &self.placements[index];
        Tried {
            uid: placement.uid(index),
            generation: placement.generation,
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
            generation: placement.generation,
            status: ModelPlacementStatus {
                assignments,
                ..ModelPlacementStatus::default()
            },
        };
        let planned = ledger.insert(key, holding);
        assert!(planned.is_ok(), "planned on reserved devices: {planned:?}");
    }

    /// `decide` in miniature: keep a plan held for this uid and generation; otherwise free
    /// what the placement held (a spec edit, a namesake's holding), then plan the older
    /// waiting placements (only those with the finalizer, as the driver's
    /// `waiting_placements` hands them over), then `index`, each skipped while known not to
    /// fit.
    fn decide(&self, ledger: &mut Ledger, index: usize, offset: usize) {
        let me = &self.placements[index];
        if let Some(held) = ledger.get(&key(index)) {
            if held.uid == me.uid(index) && held.generation == me.generation {
                return;
            }
            ledger.remove(&key(index));
        }
        let mut order: Vec<usize> = (0..self.placements.len())
            .filter(|i| self.placements[*i].placeable())
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

    /// The placement leaves the apiserver: its status goes with it.
    fn vanish(&mut self, placement: usize) {
        let gone = &mut self.placements[placement];
        gone.exists = false;
        gone.deleting = false;
        gone.finalizer = false;
        self.statuses.remove(&placement);
    }

    fn apply(&mut self, step: &Step) -> Result<(), TestCaseError> {
        match *step {
            Step::Plan { worker, placement } => {
                let p = &self.placements[placement];
                if self.workers[worker].is_some() || !p.exists || p.deleting {
                    return Ok(());
                }
                if !p.finalizer {
                    // kube-runtime's finalizer helper spends the first reconcile on it.
                    self.placements[placement].finalizer = true;
                    return Ok(());
                }
                let mut draft = self.ledger.snapshot();
                self.decide(&mut draft, placement, worker * 3);
                self.workers[worker] = Some(InFlight { placement, draft });
            }
            Step::Commit { worker, write_ok } => {
                let Some(InFlight { placement, draft }) = self.workers[worker].take() else {
                    return Ok(());
                };
                let planned = draft.get(&key(placement)).cloned();
                let placements = &self.placements;
                let alive = |key: &PlacementKey, holding: &Holding| alive(placements, key, holding);
                let Ok(committed) = self.ledger.commit(draft, &key(placement), alive) else {
                    return Ok(());
                };
                let p = &self.placements[placement];
                // A status write needs the object; one deleted meanwhile takes none.
                let writable = p.exists && !p.deleting;
                if committed.stale_refusals.contains(&key(placement)) || !write_ok || !writable {
                    return Ok(());
                }
                // The reconcile writes the outcome it committed for its own placement.
                match planned {
                    Some(holding) => self.statuses.insert(placement, holding),
                    None => self.statuses.remove(&placement),
                };
                prop_assert_eq!(
                    self.ledger.get(&key(placement)),
                    self.statuses.get(&placement),
                    "the status written says what the ledger holds"
                );
            }
            Step::Edit { placement, wants } => {
                let p = &mut self.placements[placement];
                if p.exists && !p.deleting {
                    p.generation += 1;
                    p.wants = wants;
                }
            }
            Step::Delete { placement } => {
                let p = &mut self.placements[placement];
                if p.exists && p.finalizer {
                    p.deleting = true;
                } else if p.exists {
                    self.vanish(placement);
                }
            }
            Step::DropFinalizer { placement } => {
                let p = &mut self.placements[placement];
                p.finalizer = false;
                if p.exists && p.deleting {
                    self.vanish(placement);
                }
            }
            Step::Cleanup { placement } => {
                let p = &self.placements[placement];
                if !(p.exists && p.deleting && p.finalizer) {
                    return Ok(());
                }
                // The driver forgets only the holding of the object being cleaned up; a
                // namesake's is not there while this one exists.
                self.ledger.forget(&key(placement));
                self.vanish(placement);
            }
            Step::Create { placement } => {
                if self.placements[placement].exists {
                    return Ok(());
                }
                self.clock += 1;
                let p = &mut self.placements[placement];
                p.exists = true;
                p.incarnation += 1;
                p.generation = 1;
                p.created = self.clock;
            }
            Step::Prune => {
                let placements = &self.placements;
                self.ledger
                    .forget_ghosts(|key, uid| may_stand(placements, key, uid));
                for (key, holding) in self.ledger.iter() {
                    prop_assert!(
                        may_stand(&self.placements, key, &holding.uid),
                        "{key} holds devices for a placement that no longer exists after a prune"
                    );
                }
            }
            Step::Restart => {
                self.workers.iter_mut().for_each(|w| *w = None);
                let entries = self.statuses.iter().map(|(i, h)| (key(*i), h.clone()));
                self.ledger = Ledger::rebuild(entries).0;
                self.ledger.set_external(HeldOutside {
                    devices: self.foreign.clone(),
                    ..HeldOutside::default()
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
                        ..HeldOutside::default()
                    });
                }
            }
        }
        Ok(())
    }

    /// Every invariant that holds between steps.
    fn check(&self) -> Result<(), TestCaseError> {
        prop_assert_eq!(
            self.ledger.index_mismatch(),
            None,
            "the ledger's device index is not the inverse of its holdings"
        );
        let mut owners: BTreeMap<(String, String), PlacementKey> = BTreeMap::new();
        for (key, holding) in self.ledger.iter() {
            // A restart rebuilds holdings from statuses, and a status whose re-plan was not
            // written (the write failed) still names the devices of the plan before, which
            // may have gone to a foreign claim since. Such a holding was made for an older
            // generation (or another uid), so it is not kept: the placement's next reconcile
            // plans it again, around the claim.
            let index = index_of(key);
            let current = self.placements.get(index).is_some_and(|p| {
                p.exists && p.uid(index) == holding.uid && p.generation == holding.generation
            });
            for (node, device) in holding.devices() {
                let pair = (node.to_string(), device.to_string());
                prop_assert!(
                    !current || !self.foreign.contains(node, device),
                    "{node}/{device} is held by {key} and by a foreign claim"
                );
                let other = owners.insert(pair, key.clone());
                prop_assert!(
                    other.is_none(),
                    "{node}/{device} is held by {key} and {other:?}"
                );
            }
        }
        let indexed: BTreeMap<_, _> = self
            .ledger
            .owners
            .iter()
            .map(|(pair, key)| (pair.clone(), key.clone()))
            .collect();
        prop_assert_eq!(&owners, &indexed, "the ledger's index drifted");
        Ok(())
    }

    /// Reconciles every placement one at a time, writes succeeding, with a prune pass
    /// before each round, until nothing changes.
    fn settle(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..=2 * PLACEMENTS {
            self.apply(&Step::Prune)?;
            let mut order: Vec<usize> = (0..self.placements.len()).collect();
            order.sort_by_key(|i| (self.placements[*i].created, key(*i)));
            for placement in order {
                // Twice: a first reconcile may only add the finalizer.
                for _ in 0..2 {
                    self.apply(&Step::Plan {
                        worker: 0,
                        placement,
                    })?;
                    self.apply(&Step::Commit {
                        worker: 0,
                        write_ok: true,
                    })?;
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn no_device_is_committed_twice_or_lost(
        wants in prop::collection::vec(1..=MAX_WANTS, PLACEMENTS),
        steps in prop::collection::vec(step(), 1..80),
    ) {
        let mut sim = Sim::new(&wants);
        for step in &steps {
            sim.apply(step)?;
            sim.check()?;
        }
        sim.workers.iter_mut().for_each(|w| *w = None);
        sim.settle()?;
        sim.check()?;
        let held: BTreeSet<(String, String)> = sim.ledger.owners.keys().cloned().collect();
        let free = all_devices()
            .into_iter()
            .filter(|(n, d)| !held.contains(&(n.clone(), d.clone())) && !sim.foreign.contains(n, d))
            .count();
        for (index, placement) in sim.placements.iter().enumerate() {
            let holds = sim.ledger.get(&key(index));
            if !placement.exists {
                prop_assert!(holds.is_none(), "p{index} is gone but holds {holds:?}");
                continue;
            }
            prop_assert!(
                holds.is_some() || placement.deleting || placement.wants > free,
                "p{index} wants {} of {free} free devices and waits", placement.wants
            );
            if !placement.deleting {
                prop_assert_eq!(holds, sim.statuses.get(&index));
            }
        }
    }
}
