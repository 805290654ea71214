//! The reservation ledger: which devices each ModelPlacement holds. Pure and in memory.
//!
//! The ledger is the controller's single source of truth for "is this device taken". It is
//! rebuilt at start-up (and by a new leader) from every placement's `.status.assignments`,
//! and changed only under one short lock, so a device is never handed to two placements:
//! [`Ledger::insert`] refuses a holding that overlaps another one. Reconciles plan in
//! parallel against a [`Ledger::snapshot`] taken under that lock and hand the changed copy to
//! [`Ledger::commit`], which applies it only when none of it collides with what other
//! commits did since (see [`commit`]).
//!
//! It also remembers which waiting placements were tried and did not fit, and against what:
//! a placement that did not fit cannot fit later while no device has been released and the
//! fleet is unchanged (fewer free devices never make a plan fit), so it need not be planned
//! again on every newer placement's turn. [`Ledger::releases`] counts releases for that.
//!
//! Order is deterministic everywhere: placements compare by creation time, then by
//! `namespace/name` ([`PlacementKey`]), so "older first" means the same thing on every replica
//! and after every restart.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use imbl::OrdMap;

use crate::api::placement::{Assignment, ModelPlacementStatus};
use crate::plan::Reservations;
use crate::plan::report::FractionKind;

use super::outcome::Outcome;

pub mod commit;
#[cfg(test)]
mod commit_model_tests;
#[cfg(test)]
mod counter_tests;
pub mod rebuild;
#[cfg(test)]
mod share_tests;

pub use super::placement_key::PlacementKey;

/// Precedence among placements: older first, then by `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Precedence {
    /// `metadata.creationTimestamp`, in seconds since the epoch.
    pub created: i64,
    /// The placement.
    pub key: PlacementKey,
}

/// What one placement holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Holding {
    /// Creation time, seconds since the epoch.
    pub created: i64,
    /// `metadata.uid`: a placement deleted and re-created under the same name is another one.
    pub uid: String,
    /// The `metadata.generation` the plan was made for.
    pub generation: i64,
    /// The status that describes the plan (assignments, plan, nodeSelector...), without
    /// conditions; written to the placement by its reconcile.
    pub status: ModelPlacementStatus,
}

impl Holding {
    /// The assigned devices: for a disaggregated placement, both pools'.
    pub fn assignments(&self) -> Cow<'_, [Assignment]> {
        if self.status.prefill.is_none() {
            Cow::Borrowed(&self.status.assignments)
        } else {
            Cow::Owned(self.status.all_assignments().cloned().collect())
        }
    }

    /// The nodes it holds, and for a disaggregated placement each pool's, for the labels.
    pub fn held_nodes(&self) -> HeldNodes {
        let nodes = |list: &[Assignment]| list.iter().map(|a| a.node.clone()).collect();
        HeldNodes {
            all: self.nodes(),
            roles: self
                .status
                .prefill
                .as_ref()
                .map(|prefill| (nodes(&prefill.assignments), nodes(&self.status.assignments))),
        }
    }

    /// The distinct nodes the placement uses.
    pub fn nodes(&self) -> BTreeSet<String> {
        self.assignments().iter().map(|a| a.node.clone()).collect()
    }

    /// How it takes each device it names: whole, or (a serving plan whose fraction is a
    /// share) that many bytes of each device's memory.
    pub fn take(&self) -> Take {
        match self
            .status
            .plan
            .as_ref()
            .and_then(|plan| plan.fraction.as_ref())
        {
            Some(fraction)
                if fraction.kind == FractionKind::Share.as_str()
                    && fraction.bytes > 0
                    && fraction.bytes < fraction.device_bytes =>
            {
                Take::Share {
                    bytes: fraction.bytes,
                    capacity: fraction.device_bytes,
                }
            }
            _ => Take::Whole,
        }
    }

    /// Every (node, device) pair held.
    pub fn devices(&self) -> impl Iterator<Item = (&str, &str)> {
        self.status
            .all_assignments()
            .flat_map(|a| a.devices.iter().map(move |d| (a.node.as_str(), d.as_str())))
    }
}

/// How a holding takes the devices it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// Each device whole: no other placement or claim may hold any of it.
    Whole,
    /// A share of each device's memory (a device its DRA driver publishes shareable): others
    /// may hold shares beside it while all of them together fit in `capacity`.
    Share {
        /// Bytes of each device taken (per replica: two replicas on one device take twice).
        bytes: u64,
        /// Each device's memory capacity.
        capacity: u64,
    },
}

/// The shares placements hold of one device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedDevice {
    /// The device's memory capacity, as the holdings' plans saw it (the smallest one, should
    /// two plans disagree).
    pub capacity: u64,
    /// Bytes each placement takes.
    pub by: BTreeMap<PlacementKey, u64>,
}

impl SharedDevice {
    /// Bytes taken by the placements `skip` does not pick out.
    pub fn used_except(&self, skip: impl Fn(&PlacementKey) -> bool) -> u64 {
        self.by
            .iter()
            .filter(|(key, _)| !skip(key))
            .fold(0u64, |sum, (_, bytes)| sum.saturating_add(*bytes))
    }
}

/// A holding that would share devices with another placement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{device} on {node} is already held by {holder}")]
pub struct Conflict {
    /// The node.
    pub node: String,
    /// The device name.
    pub device: String,
    /// Who holds it.
    pub holder: PlacementKey,
}

/// A placement version and the fleet view it is planned against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tried {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.generation`.
    pub generation: i64,
    /// The id of the fleet view.
    pub fleet: u64,
}

/// A try that did not fit: with what, at which release count, and the refusal.
#[derive(Debug, Clone, PartialEq)]
struct Unfit {
    tried: Tried,
    releases: u64,
    refusal: Outcome,
}

/// The nodes one placement holds, and for a disaggregated one, each pool's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldNodes {
    /// Every node of the placement.
    pub all: BTreeSet<String>,
    /// Disaggregated: (prefill pool's nodes, decode pool's nodes).
    pub roles: Option<(BTreeSet<String>, BTreeSet<String>)>,
}

impl HeldNodes {
    /// An ordinary placement on `nodes`.
    pub fn plain(nodes: BTreeSet<String>) -> Self {
        Self {
            all: nodes,
            roles: None,
        }
    }
}

/// Devices held outside the ledger, as planner reservations on a fleet view's node and device
/// ids: named by an allocated claim the ledger does not count, or blocked by DRA counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeldOutside {
    /// Every such device, and what such claims consume of devices shared by memory.
    pub devices: Reservations,
    /// Why a device no claim names is held: `(node, device)` → the counter set it cannot get.
    pub blocked: BTreeMap<(String, String), String>,
    /// The DRA counters of the fleet's partitionable devices and what those claims consume
    /// of them: how the ledger keeps its own partitions and whole GPUs apart.
    pub counters: super::counter_book::CounterBook,
}

/// What a snapshot was taken from, and what each placement it changed held then.
#[derive(Debug, Clone, Default, PartialEq)]
struct DraftLog {
    /// The ledger's release count when the snapshot was taken.
    releases: u64,
    /// Every placement the snapshot changed (holding or refusal), with its holding at the
    /// time of the snapshot.
    before: BTreeMap<PlacementKey, Option<Arc<Holding>>>,
}

impl DraftLog {
    /// Records `key`'s holding before its first change; later changes keep the first.
    fn touched(&mut self, key: &PlacementKey, before: Option<Arc<Holding>>) {
        self.before.entry(key.clone()).or_insert(before);
    }
}

/// Every placement's devices.
///
/// Holdings and refusals are shared (`Arc`) so that a [`Ledger::snapshot`] copies pointers,
/// not statuses; the holdings and their device indexes are persistent maps (`imbl::OrdMap`,
/// ADR 0014), so a snapshot shares them whole and a change copies only the path to what it
/// changes: every plan takes one, and copying 3,000 holdings' 20,000 device entries each
/// time was a tenth of the controller's CPU at 10,000 nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    holdings: OrdMap<PlacementKey, Arc<Holding>>,
    /// (node, device) -> holder of the whole device; kept in step with `holdings` for
    /// O(log n) conflict checks.
    owners: OrdMap<(String, String), PlacementKey>,
    /// (node, device) -> the shares placements hold of it; kept in step with `holdings` like
    /// `owners`. A device is in at most one of the two.
    shares: OrdMap<(String, String), SharedDevice>,
    /// The keys of `owners` as reservations, kept in step with it: what every plan starts
    /// from (a copy shares it whole), less its own placement's devices.
    owned: Reservations,
    /// Holdings removed so far.
    releases: u64,
    /// Placements that did not fit, by key.
    unfit: HashMap<PlacementKey, Arc<Unfit>>,
    /// Devices held outside the ledger: allocated by ResourceClaims that are not ours, or
    /// blocked by DRA counters those claims used up (with why).
    external: HeldOutside,
    /// Placements whose holding conflicted with an older one's through DRA counters when the
    /// counters became known ([`Ledger::set_external`]), removed so they are planned again.
    counter_dropped: Vec<PlacementKey>,
    /// On a snapshot only: what it was taken from and what it changed since, for
    /// [`Ledger::commit`].
    draft: Option<DraftLog>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Rebuilds the ledger from the placements' own statuses. When two statuses claim the
    /// same device (a split brain, a hand-edited status), the one with precedence keeps it
    /// and the other is left out, to be planned again; the keys left out are returned.
    pub fn rebuild(
        entries: impl IntoIterator<Item = (PlacementKey, Holding)>,
    ) -> (Self, Vec<PlacementKey>) {
        let mut sorted: Vec<(PlacementKey, Holding)> = entries
            .into_iter()
            .filter(|(_, holding)| !holding.assignments().is_empty())
            .collect();
        sorted.sort_by(|a, b| (a.1.created, &a.0).cmp(&(b.1.created, &b.0)));
        let mut ledger = Self::new();
        let mut dropped = Vec::new();
        for (key, holding) in sorted {
            if ledger.insert(key.clone(), holding).is_err() {
                dropped.push(key);
            }
        }
        (ledger, dropped)
    }

    /// Records `holding` for `key`, replacing what `key` held before. Refuses (and changes
    /// nothing) when any device is held whole by another placement, a whole device is listed
    /// twice or shared by another placement, or the shares of a device would exceed its
    /// capacity.
    pub fn insert(&mut self, key: PlacementKey, holding: Holding) -> Result<(), Conflict> {
        let take = holding.take();
        let mut whole = BTreeSet::new();
        let mut shared: BTreeMap<(String, String), u64> = BTreeMap::new();
        for (node, device) in holding.devices() {
            let pair = (node.to_string(), device.to_string());
            let conflict = |holder: &PlacementKey| Conflict {
                node: pair.0.clone(),
                device: pair.1.clone(),
                holder: holder.clone(),
            };
            if let Some(holder) = self.owners.get(&pair).filter(|holder| **holder != key) {
                return Err(conflict(holder));
            }
            let others = self.shares.get(&pair);
            match take {
                Take::Whole => {
                    if let Some(holder) = others.and_then(|s| s.by.keys().find(|h| **h != key)) {
                        return Err(conflict(holder));
                    }
                    if let Some(holder) = self.counter_conflict(&pair, |h| *h != key, &whole) {
                        return Err(conflict(holder.unwrap_or(&key)));
                    }
                    if !whole.insert(pair.clone()) {
                        return Err(conflict(&key));
                    }
                }
                Take::Share { bytes, capacity } => {
                    let entry = shared.entry(pair.clone()).or_default();
                    *entry = entry.saturating_add(bytes);
                    let capacity = others.map_or(capacity, |s| s.capacity.min(capacity));
                    let used = others.map_or(0, |s| s.used_except(|h| *h == key));
                    if used.saturating_add(*entry) > capacity {
                        let holder = others
                            .and_then(|s| s.by.keys().find(|h| **h != key))
                            .unwrap_or(&key);
                        return Err(conflict(holder));
                    }
                }
            }
        }
        self.touch(&key);
        self.remove(&key);
        for pair in whole {
            self.owned.insert(pair.0.clone(), pair.1.clone());
            self.owners.insert(pair, key.clone());
        }
        if let Take::Share { capacity, .. } = take {
            for (pair, bytes) in shared {
                self.add_share(pair, &key, bytes, capacity);
            }
        }
        self.unfit.remove(&key);
        self.holdings.insert(key, Arc::new(holding));
        self.debug_check_index();
        Ok(())
    }

    /// Records that `key` takes `bytes` of the device `pair` of `capacity`.
    fn add_share(&mut self, pair: (String, String), key: &PlacementKey, bytes: u64, capacity: u64) {
        let device = self.shares.entry(pair).or_insert_with(|| SharedDevice {
            capacity,
            by: BTreeMap::new(),
        });
        device.capacity = device.capacity.min(capacity);
        let taken = device.by.entry(key.clone()).or_default();
        *taken = taken.saturating_add(bytes);
    }

    /// The shares placements hold of `device` on `node`, if any.
    pub fn shares_of(&self, node: &str, device: &str) -> Option<&SharedDevice> {
        self.shares.get(&(node.to_string(), device.to_string()))
    }

    /// When `pair` consumes DRA counters that, beside the devices held by placements `counts`
    /// picks out, those in `also` and what claims outside the ledger consume, are used up:
    /// `Some` of a placement holding a device of the same counter set, if one does.
    fn counter_conflict(
        &self,
        pair: &(String, String),
        counts: impl Fn(&PlacementKey) -> bool,
        also: &BTreeSet<(String, String)>,
    ) -> Option<Option<&PlacementKey>> {
        let book = &self.external.counters;
        if book.is_empty() || !book.counts(pair) {
            return None;
        }
        let held = |device: &(String, String)| {
            also.contains(device) || self.owners.get(device).is_some_and(&counts)
        };
        let (_, members) = book.misfit(pair, held)?;
        Some(
            members
                .into_iter()
                .find_map(|m| self.owners.get(m).filter(|h| counts(h))),
        )
    }

    /// The devices no placement `counts` picks out holds that DRA counters keep from being
    /// held beside what those do hold (a GPU one of whose MIG devices is held, the MIG devices
    /// of a GPU held whole, overlapping MIG devices), with why.
    fn blocked_by_holdings(
        &self,
        counts: impl Fn(&PlacementKey) -> bool,
    ) -> Vec<(&(String, String), String)> {
        let book = &self.external.counters;
        if book.is_empty() {
            return Vec::new();
        }
        book.blocked(|device| self.owners.get(device).is_some_and(&counts))
    }

    /// The devices no placement holds that what placements hold keeps from anyone else through
    /// DRA counters: the GPU of a MIG device a placement holds, the other MIG devices of a GPU
    /// a placement holds whole. Counted as held by placements, as the scheduler will count
    /// them once the claims are allocated.
    pub fn held_through_counters(&self) -> impl Iterator<Item = (&str, &str)> {
        self.blocked_by_holdings(|_| true)
            .into_iter()
            .map(|((node, device), _)| (node.as_str(), device.as_str()))
    }

    /// Forgets what `key` holds; returns it.
    pub fn remove(&mut self, key: &PlacementKey) -> Option<Holding> {
        self.touch(key);
        let removed = self.remove_unlogged(key).map(Arc::unwrap_or_clone);
        self.debug_check_index();
        removed
    }

    /// Where `owners` and `shares` are not exactly what `holdings` say (a device indexed for
    /// a placement whose holding does not name it, a held device not indexed or indexed for
    /// another placement, a share of another size); `None` when the index is exact.
    pub fn index_mismatch(&self) -> Option<String> {
        let mut owners: BTreeMap<(String, String), &PlacementKey> = BTreeMap::new();
        let mut shares: BTreeMap<(String, String), BTreeMap<&PlacementKey, u64>> = BTreeMap::new();
        for (key, holding) in &self.holdings {
            let take = holding.take();
            for (node, device) in holding.devices() {
                let pair = (node.to_string(), device.to_string());
                match take {
                    Take::Whole => {
                        if let Some(other) = owners.insert(pair, key) {
                            return Some(format!(
                                "{node}/{device} is held whole by {key} and {other}"
                            ));
                        }
                    }
                    Take::Share { bytes, .. } => {
                        let taken = shares.entry(pair).or_default().entry(key).or_default();
                        *taken = taken.saturating_add(bytes);
                    }
                }
            }
        }
        for (pair, key) in &owners {
            if self.owners.get(pair) != Some(*key) {
                return Some(format!(
                    "{}/{} is held by {key} but indexed for {:?}",
                    pair.0,
                    pair.1,
                    self.owners.get(pair)
                ));
            }
        }
        if owners.len() != self.owners.len() {
            return Some(format!(
                "{} devices indexed whole, {} held whole",
                self.owners.len(),
                owners.len()
            ));
        }
        if self.owned.len() != owners.len()
            || owners
                .keys()
                .any(|(node, device)| !self.owned.contains(node, device))
        {
            return Some(format!(
                "{} devices reserved whole, {} held whole",
                self.owned.len(),
                owners.len()
            ));
        }
        for (pair, by) in &shares {
            let indexed = self.shares.get(pair).map(|s| {
                s.by.iter()
                    .map(|(key, bytes)| (key, *bytes))
                    .collect::<BTreeMap<&PlacementKey, u64>>()
            });
            if indexed.as_ref() != Some(by) {
                return Some(format!(
                    "{}/{} is shared by {by:?} but indexed as {indexed:?}",
                    pair.0, pair.1
                ));
            }
        }
        (shares.len() != self.shares.len()).then(|| {
            format!(
                "{} devices indexed as shared, {} shared",
                self.shares.len(),
                shares.len()
            )
        })
    }

    /// In debug builds, panics unless `owners` is exactly the inverse of `holdings`: the
    /// ledger's promise that a device is held by one placement rests on that index.
    pub(super) fn debug_check_index(&self) {
        debug_assert_eq!(
            self.index_mismatch(),
            None,
            "the ledger's device index drifted from its holdings"
        );
    }

    /// On a snapshot, remembers what `key` held before its first change.
    fn touch(&mut self, key: &PlacementKey) {
        if let Some(log) = self.draft.as_mut() {
            let before = self.holdings.get(key).cloned();
            log.touched(key, before);
        }
    }

    /// How many holdings have been removed since the ledger was made: while it stays the
    /// same, no device has become free.
    pub fn releases(&self) -> u64 {
        self.releases
    }

    /// Remembers that `key`, tried as `tried` now, got `refusal`.
    pub fn mark_unfit(&mut self, key: PlacementKey, tried: Tried, refusal: Outcome) {
        let releases = self.releases;
        self.touch(&key);
        self.unfit.insert(
            key,
            Arc::new(Unfit {
                tried,
                releases,
                refusal,
            }),
        );
    }

    /// The refusal `key` got when it was last tried exactly as `tried`, if no device has
    /// been released since: planning it again would fail again.
    pub fn known_unfit(&self, key: &PlacementKey, tried: &Tried) -> Option<&Outcome> {
        self.unfit
            .get(key)
            .filter(|unfit| unfit.tried == *tried && unfit.releases == self.releases)
            .map(|unfit| &unfit.refusal)
    }

    /// Forgets everything about a deleted placement.
    pub fn forget(&mut self, key: &PlacementKey) -> Option<Holding> {
        self.touch(key);
        self.unfit.remove(key);
        self.remove(key)
    }

    /// Forgets every placement that holds devices but no longer exists as the object its
    /// holding was planned for: `exists(key, uid)` says whether the placement `key` is still
    /// there with that uid (and may keep devices). Returns what each ghost held. Nothing else
    /// would ever free them: a vanished object gets no reconcile, and so no cleanup.
    pub fn forget_ghosts(
        &mut self,
        exists: impl Fn(&PlacementKey, &str) -> bool,
    ) -> Vec<(PlacementKey, Holding)> {
        let ghosts: Vec<PlacementKey> = self
            .holdings
            .iter()
            .filter(|(key, holding)| !exists(key, &holding.uid))
            .map(|(key, _)| key.clone())
            .collect();
        ghosts
            .into_iter()
            .filter_map(|key| {
                let holding = self.forget(&key)?;
                Some((key, holding))
            })
            .collect()
    }

    /// The devices held by placements that no longer exist (`exists` as for
    /// [`Ledger::forget_ghosts`]), one `node/device held by namespace/name (uid ...)` line
    /// each, at most `limit`, then how many more: for a refusal, so that devices kept by a
    /// holding nothing has freed yet are named rather than silently missing.
    pub fn ghost_devices(
        &self,
        exists: impl Fn(&PlacementKey, &str) -> bool,
        limit: usize,
    ) -> Vec<String> {
        let held: Vec<String> = self
            .holdings
            .iter()
            .filter(|(key, holding)| !exists(key, &holding.uid))
            .flat_map(|(key, holding)| {
                holding.devices().map(move |(node, device)| {
                    format!(
                        "{node}/{device} is held by {key} (uid {}), which no longer exists",
                        holding.uid
                    )
                })
            })
            .collect();
        let mut lines: Vec<String> = held.iter().take(limit).cloned().collect();
        if held.len() > limit {
            lines.push(format!(
                "and {} more device(s) held by placements that no longer exist",
                held.len() - limit
            ));
        }
        lines
    }

    /// What `key` holds.
    pub fn get(&self, key: &PlacementKey) -> Option<&Holding> {
        self.holdings.get(key).map(Arc::as_ref)
    }

    /// The placement holding `device` on `node`, if one does.
    pub fn holder_of(&self, node: &str, device: &str) -> Option<&PlacementKey> {
        self.owners.get(&(node.to_string(), device.to_string()))
    }

    /// Every holding, by key.
    pub fn iter(&self) -> impl Iterator<Item = (&PlacementKey, &Holding)> {
        self.holdings
            .iter()
            .map(|(key, holding)| (key, holding.as_ref()))
    }

    /// Replaces the devices held outside the ledger (allocated by ResourceClaims that are
    /// not ours, or blocked by the DRA counters claims used up). Returns true when they
    /// changed; a release among them counts as a release, so placements that did not fit are
    /// tried again (freeing a MIG slice makes its whole GPU plannable again).
    ///
    /// When the counter sets themselves are new (the first fleet view after a rebuild, a
    /// driver publishing again), the holdings are checked against them, older first: one
    /// whose devices no longer fit beside the older ones' (two statuses naming overlapping MIG
    /// devices, which the rebuild could not see without the slices) is removed, to be planned
    /// again ([`Ledger::take_counter_dropped`]), as the rebuild leaves out a whole device
    /// claimed twice.
    pub fn set_external(&mut self, external: HeldOutside) -> bool {
        if external == self.external {
            return false;
        }
        if !self.external.devices.is_empty() {
            self.releases = self.releases.wrapping_add(1);
        }
        let new_counters = !self.external.counters.same_sets(&external.counters);
        self.external = external;
        if new_counters {
            self.drop_counter_conflicts();
        }
        true
    }

    /// The placements [`Ledger::set_external`] removed because their holding conflicted with
    /// an older one's through DRA counters, since the last call: to log and reconcile again.
    pub fn take_counter_dropped(&mut self) -> Vec<PlacementKey> {
        std::mem::take(&mut self.counter_dropped)
    }

    /// Removes every holding whose counted devices do not fit beside those of older holdings
    /// (claims outside the ledger left out: the allocation step judges those).
    fn drop_counter_conflicts(&mut self) {
        let book = self.external.counters.without_outside();
        if book.is_empty() {
            return;
        }
        let mut order: Vec<(i64, &PlacementKey)> = self
            .holdings
            .iter()
            .map(|(key, holding)| (holding.created, key))
            .collect();
        order.sort();
        let mut accepted: BTreeSet<(String, String)> = BTreeSet::new();
        let mut dropped = Vec::new();
        for (_, key) in order {
            let Some(holding) = self.holdings.get(key) else {
                continue;
            };
            if holding.take() != Take::Whole {
                continue;
            }
            let devices: Vec<(String, String)> = holding
                .devices()
                .map(|(node, device)| (node.to_string(), device.to_string()))
                .collect();
            let conflicts = devices.iter().enumerate().any(|(at, device)| {
                book.counts(device)
                    && book
                        .misfit(device, |other| {
                            accepted.contains(other) || devices[..at].contains(other)
                        })
                        .is_some()
            });
            if conflicts {
                dropped.push(key.clone());
            } else {
                accepted.extend(devices);
            }
        }
        for key in &dropped {
            self.remove_unlogged(key);
            self.unfit.remove(key);
        }
        self.counter_dropped.extend(dropped);
        self.debug_check_index();
    }

    /// Why devices no claim names are held outside the ledger (their DRA counters are used
    /// up), one `node/device: why` each, for a refusal's reasons; at most `limit`, then how
    /// many more.
    pub fn blocked_by_counters(&self, limit: usize) -> Vec<String> {
        // What claims used up, then what placements' holdings use up that no claim says yet.
        let mut blocked: Vec<(&(String, String), &str)> = self
            .external
            .blocked
            .iter()
            .map(|(device, why)| (device, why.as_str()))
            .collect();
        let by_holdings = self.blocked_by_holdings(|_| true);
        blocked.extend(
            by_holdings
                .iter()
                .filter(|(device, _)| !self.external.blocked.contains_key(*device))
                .map(|(device, why)| (*device, why.as_str())),
        );
        let mut lines: Vec<String> = blocked
            .iter()
            .take(limit)
            .map(|((node, device), why)| format!("{node}/{device} cannot be allocated: {why}"))
            .collect();
        if blocked.len() > limit {
            lines.push(format!(
                "and {} more device(s) blocked by DRA counters",
                blocked.len() - limit
            ));
        }
        lines
    }

    /// The devices every placement other than `key` holds whole, plus those held outside the
    /// ledger, and what others consume of shared devices (other placements' shares and other
    /// claims'), for the planner.
    pub fn reserved_by_others(&self, key: &PlacementKey) -> Reservations {
        // Every whole device held (shared with the ledger, not copied), less this
        // placement's own: the cost follows its devices, not the fleet's.
        let mut reserved = self.owned.clone();
        if let Some(own) = self.holdings.get(key) {
            for (node, device) in own.devices() {
                if self.owners.get(&(node.to_string(), device.to_string())) == Some(key) {
                    reserved.remove(node, device);
                }
            }
        }
        reserved.merge(&self.external.devices);
        for ((node, device), shared) in &self.shares {
            reserved.consume(
                node.clone(),
                device.clone(),
                shared.used_except(|h| h == key),
            );
        }
        for ((node, device), _) in self.blocked_by_holdings(|h| h != key) {
            reserved.insert(node.clone(), device.clone());
        }
        reserved
    }

    /// Every device held, whole or in part, by placements and outside the ledger.
    pub fn reserved_all(&self) -> Reservations {
        let mut reserved = self.owned.clone();
        reserved.merge(&self.external.devices);
        for ((node, device), shared) in &self.shares {
            reserved.consume(node.clone(), device.clone(), shared.used_except(|_| false));
        }
        for ((node, device), _) in self.blocked_by_holdings(|_| true) {
            reserved.insert(node.clone(), device.clone());
        }
        reserved
    }

    /// Devices held in total, whole or in shares.
    pub fn devices_reserved(&self) -> usize {
        self.owners.len() + self.shares.len()
    }

    /// Placements holding devices.
    pub fn len(&self) -> usize {
        self.holdings.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.holdings.is_empty()
    }

    /// The placements holding a device on `node`.
    pub fn holders_on(&self, node: &str) -> BTreeSet<PlacementKey> {
        let start = (node.to_string(), String::new());
        let whole = self
            .owners
            .range(start.clone()..)
            .take_while(|((n, _), _)| n == node)
            .map(|(_, holder)| holder.clone());
        let shared = self
            .shares
            .range(start..)
            .take_while(|((n, _), _)| n == node)
            .flat_map(|(_, shared)| shared.by.keys().cloned());
        whole.chain(shared).collect()
    }
}

/// Sorts placements into the order in which they get devices: older first, then by
/// `namespace/name`.
pub fn in_precedence_order(mut placements: Vec<Precedence>) -> Vec<Precedence> {
    placements.sort();
    placements
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(created: i64, devices: &[(&str, &str)]) -> Holding {
        let mut by_node: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (node, device) in devices {
            by_node.entry(node).or_default().push(device.to_string());
        }
        let assignments = by_node
            .into_iter()
            .map(|(node, devices)| Assignment {
                node: node.to_string(),
                devices,
                replica: 0,
                stage: 0,
            })
            .collect();
        Holding {
            created,
            uid: format!("uid-{created}"),
            generation: 1,
            status: ModelPlacementStatus {
                assignments,
                ..ModelPlacementStatus::default()
            },
        }
    }

    fn key(name: &str) -> PlacementKey {
        PlacementKey::new("ml", name)
    }

    #[test]
    fn a_device_is_never_held_twice() {
        let mut ledger = Ledger::new();
        ledger
            .insert(key("a"), holding(1, &[("n1", "gpu-0"), ("n1", "gpu-1")]))
            .unwrap();
        let conflict = ledger
            .insert(key("b"), holding(2, &[("n1", "gpu-1"), ("n1", "gpu-2")]))
            .unwrap_err();
        assert_eq!(conflict.holder, key("a"));
        assert_eq!(conflict.device, "gpu-1");
        assert!(
            ledger.get(&key("b")).is_none(),
            "refused holdings change nothing"
        );
        let twice = ledger.insert(key("c"), holding(3, &[("n2", "gpu-0"), ("n2", "gpu-0")]));
        assert!(twice.is_err(), "one device listed twice");
        assert_eq!(ledger.devices_reserved(), 2);
    }

    #[test]
    fn others_reservations_exclude_your_own_and_follow_removal() {
        let mut ledger = Ledger::new();
        ledger
            .insert(key("a"), holding(1, &[("n1", "gpu-0")]))
            .unwrap();
        ledger
            .insert(key("b"), holding(2, &[("n1", "gpu-1"), ("n2", "gpu-0")]))
            .unwrap();
        let for_a = ledger.reserved_by_others(&key("a"));
        assert!(!for_a.contains("n1", "gpu-0"));
        assert!(for_a.contains("n1", "gpu-1") && for_a.contains("n2", "gpu-0"));
        assert_eq!(
            ledger.holders_on("n1"),
            BTreeSet::from([key("a"), key("b")])
        );
        assert!(ledger.remove(&key("b")).is_some());
        assert!(ledger.reserved_by_others(&key("a")).is_empty());
        assert!(ledger.holders_on("n2").is_empty());
    }

    #[test]
    fn replacing_a_holding_releases_the_old_devices() {
        let mut ledger = Ledger::new();
        ledger
            .insert(key("a"), holding(1, &[("n1", "gpu-0")]))
            .unwrap();
        ledger
            .insert(key("a"), holding(1, &[("n2", "gpu-0")]))
            .unwrap();
        ledger
            .insert(key("b"), holding(2, &[("n1", "gpu-0")]))
            .unwrap();
        assert_eq!(ledger.len(), 2);
        assert_eq!(ledger.devices_reserved(), 2);
    }

    #[test]
    fn rebuild_is_deterministic_and_older_wins() {
        let entries = vec![
            (key("young"), holding(20, &[("n1", "gpu-0")])),
            (key("old"), holding(10, &[("n1", "gpu-0"), ("n1", "gpu-1")])),
            (key("other"), holding(30, &[("n2", "gpu-0")])),
            (key("empty"), holding(5, &[])),
        ];
        let mut reversed = entries.clone();
        reversed.reverse();
        let (first, dropped_first) = Ledger::rebuild(entries);
        let (second, dropped_second) = Ledger::rebuild(reversed);
        assert_eq!(first, second, "input order does not matter");
        assert_eq!(dropped_first, vec![key("young")]);
        assert_eq!(dropped_second, dropped_first);
        assert!(first.get(&key("old")).is_some());
        assert!(
            first.get(&key("empty")).is_none(),
            "nothing held, nothing recorded"
        );
    }

    #[test]
    fn ghosts_are_forgotten_and_named_until_then() {
        let mut ledger = Ledger::new();
        ledger
            .insert(key("gone"), holding(1, &[("n1", "gpu-0"), ("n1", "gpu-1")]))
            .unwrap();
        ledger
            .insert(key("here"), holding(2, &[("n1", "gpu-2")]))
            .unwrap();
        ledger
            .insert(key("renamed"), holding(3, &[("n2", "gpu-0")]))
            .unwrap();
        // `here` exists as planned; `renamed` exists under another uid; `gone` does not.
        let exists = |key: &PlacementKey, uid: &str| match key.name.as_str() {
            "here" => uid == "uid-2",
            "renamed" => uid == "uid-99",
            _ => false,
        };
        let named = ledger.ghost_devices(exists, 2);
        assert_eq!(named.len(), 3, "{named:?}");
        assert!(named[0].contains("n1/gpu-0 is held by ml/gone (uid uid-1)"));
        assert_eq!(
            named[2],
            "and 1 more device(s) held by placements that no longer exist"
        );
        let releases = ledger.releases();
        let forgotten: Vec<PlacementKey> = ledger
            .forget_ghosts(exists)
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        assert_eq!(forgotten, vec![key("gone"), key("renamed")]);
        assert!(ledger.releases() > releases, "a prune is a release");
        assert_eq!(ledger.devices_reserved(), 1);
        assert_eq!(ledger.index_mismatch(), None);
        assert!(ledger.ghost_devices(exists, 2).is_empty());
    }

    #[test]
    fn equal_creation_times_fall_back_to_names() {
        let (ledger, dropped) = Ledger::rebuild(vec![
            (key("b"), holding(10, &[("n1", "gpu-0")])),
            (key("a"), holding(10, &[("n1", "gpu-0")])),
        ]);
        assert!(ledger.get(&key("a")).is_some());
        assert_eq!(dropped, vec![key("b")]);
        let order = in_precedence_order(vec![
            Precedence {
                created: 10,
                key: key("b"),
            },
            Precedence {
                created: 11,
                key: PlacementKey::new("aa", "a"),
            },
            Precedence {
                created: 10,
                key: key("a"),
            },
        ]);
        let names: Vec<String> = order.iter().map(|p| p.key.to_string()).collect();
        assert_eq!(names, ["ml/a", "ml/b", "aa/a"]);
    }
}
