//! Optimistic commits: plan on a copy of the ledger without the lock, then apply the copy's
//! changes under the lock only if nothing they depend on moved in between.
//!
//! A reconcile takes a [`Ledger::snapshot`] under the lock (cheap: holdings are shared),
//! lets `decide` (`placement::core::decide`) change that copy as it always has, and
//! hands it to [`Ledger::commit`]. The snapshot records, for every placement it changed,
//! what that placement held when the snapshot was taken. The commit is all or nothing and
//! refuses ([`CommitConflict`]) when:
//!
//! - a placement the copy changed holds something else in the ledger now (another reconcile
//!   planned it on its turn, or its own earlier commit landed): the copy's premise is gone;
//! - a device the copy hands out is held now by a placement the copy did not touch, or by a
//!   claim outside the ledger: two plans made against the same free devices collide, and
//!   only the first to commit gets them;
//! - a placement the copy hands devices to was deleted meanwhile (the caller says which are
//!   alive): its cleanup may already have run, and nothing would free them again;
//! - the placement the reconcile is for holds something else in the ledger than in the copy,
//!   even where the copy did not change it (a kept plan whose placement was cleaned up since):
//!   the status the reconcile writes next must say what the ledger holds.
//!
//! An accepted commit frees every holding it replaces before it records any new one: a copy
//! that re-plans a placement (a spec edit, a new uid, its devices gone) frees its devices and
//! gives some of them to older waiting placements first, and those may sort before it.
//! Applied key by key, freeing the re-planned holding after placing the older one would drop
//! the older one's owner entry, and the device would be handed out again (issue 35).
//!
//! On a refusal nothing changed and the caller plans again from a fresh snapshot. Commits
//! of plans on disjoint devices never refuse each other, which is what lets reconciles plan
//! in parallel while "no device is handed out twice" stays a property of the ledger alone.
//!
//! Refusals ("did not fit") are remembered only when no device was released between the
//! snapshot and the commit: a refusal made against a fuller fleet than the ledger's may be
//! stale, so it is dropped and reported in [`Committed::stale_refusals`] for the caller to
//! plan again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::{Conflict, DraftLog, Holding, Ledger, PlacementKey, Take};

/// Why a snapshot's changes were not applied. Nothing was changed; plan again from a fresh
/// snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitConflict {
    /// A placement the snapshot changed holds something else now.
    #[error("{0} changed since the snapshot")]
    Changed(PlacementKey),
    /// A device the snapshot hands out was taken since by another placement.
    #[error("{0}")]
    Taken(Conflict),
    /// A device the snapshot hands out is now held by a claim outside the ledger.
    #[error("{device} on {node} is now held outside the ledger")]
    External {
        /// The node.
        node: String,
        /// The device name.
        device: String,
    },
    /// A placement the snapshot hands devices to was deleted since.
    #[error("{0} was deleted since the snapshot")]
    Gone(PlacementKey),
    /// The ledger handed in was not made by [`Ledger::snapshot`].
    #[error("only a snapshot of the ledger can be committed")]
    NotASnapshot,
}

/// What a commit applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Committed {
    /// Placements whose holding changed.
    pub changed: usize,
    /// Placements refused on the snapshot whose refusal was not remembered, because devices
    /// were released between the snapshot and the commit: they may fit now.
    pub stale_refusals: Vec<PlacementKey>,
}

impl Ledger {
    /// A copy to plan against without the lock; hand it to [`Ledger::commit`] afterwards.
    /// Holdings and refusals are shared with the ledger, so the copy costs one entry per
    /// placement and per held device, not their statuses.
    pub fn snapshot(&self) -> Ledger {
        let mut copy = self.clone();
        copy.draft = Some(DraftLog {
            releases: self.releases,
            before: BTreeMap::new(),
        });
        copy
    }

    /// Applies what `draft` (a [`Ledger::snapshot`] of this ledger) changed, all or nothing,
    /// for the reconcile of `own`. `alive` says whether a placement may still be given devices
    /// (it exists, with that holding's uid, and is not being deleted). See the module
    /// documentation for when it refuses.
    pub fn commit(
        &mut self,
        mut draft: Ledger,
        own: &PlacementKey,
        alive: impl Fn(&PlacementKey, &Holding) -> bool,
    ) -> Result<Committed, CommitConflict> {
        let log = draft.draft.take().ok_or(CommitConflict::NotASnapshot)?;
        // What the reconcile writes next is the copy's holding for its own placement: unless
        // the copy changed it (checked below like every change), it must still be the ledger's.
        if !log.before.contains_key(own) && !same(self.holdings.get(own), draft.holdings.get(own)) {
            return Err(CommitConflict::Changed(own.clone()));
        }
        // No release between snapshot and commit: refusals made on the snapshot hold here.
        let quiet = self.releases == log.releases;
        let mut changes: BTreeMap<&PlacementKey, Option<Arc<Holding>>> = BTreeMap::new();
        for (key, before) in &log.before {
            if !same(self.holdings.get(key), before.as_ref()) {
                return Err(CommitConflict::Changed(key.clone()));
            }
            let after = draft.holdings.get(key);
            if !same(after, before.as_ref()) {
                changes.insert(key, after.cloned());
            }
        }
        let mut handed_out = HandedOut::default();
        for (key, after) in &changes {
            let Some(holding) = after else { continue };
            if !alive(key, holding) {
                return Err(CommitConflict::Gone((*key).clone()));
            }
            let take = holding.take();
            for (node, device) in holding.devices() {
                self.check_free(&changes, key, (node, device), take, &mut handed_out)?;
            }
        }
        let committed = changes.len();
        // Every replaced holding is freed before any new one is recorded: a device may move
        // from one changed placement to another in either key order.
        for key in changes.keys() {
            self.remove_unlogged(key);
        }
        for (key, after) in changes {
            if let Some(holding) = after {
                self.place_unchecked(key.clone(), holding);
            }
        }
        let mut stale_refusals = Vec::new();
        for key in log.before.keys() {
            match draft.unfit.remove(key) {
                // Made after every release the snapshot itself made, and none happened here
                // meanwhile: as true in the ledger as it was in the snapshot.
                Some(unfit) if quiet && unfit.releases == draft.releases => {
                    let mut unfit = Arc::unwrap_or_clone(unfit);
                    unfit.releases = self.releases;
                    self.unfit.insert(key.clone(), Arc::new(unfit));
                }
                Some(_) => {
                    self.unfit.remove(key);
                    stale_refusals.push(key.clone());
                }
                None => {
                    self.unfit.remove(key);
                }
            }
        }
        self.debug_check_index();
        Ok(Committed {
            changed: committed,
            stale_refusals,
        })
    }

    /// Refuses `(node, device)` for `key` unless this ledger can give it as `take` says: a
    /// whole device held by nobody (or by a placement whose holding this commit replaces, and
    /// so gives up: if the replacement names the device again, `handed_out` catches it), not
    /// shared and not handed out twice; a share that, with the shares others keep, the
    /// claims' and this commit's other shares, fits in the device's capacity.
    fn check_free<'a>(
        &self,
        changes: &BTreeMap<&PlacementKey, Option<Arc<Holding>>>,
        key: &PlacementKey,
        (node, device): (&'a str, &'a str),
        take: Take,
        handed_out: &mut HandedOut<'a>,
    ) -> Result<(), CommitConflict> {
        let taken = |holder: PlacementKey| {
            CommitConflict::Taken(Conflict {
                node: node.to_string(),
                device: device.to_string(),
                holder,
            })
        };
        let external = || CommitConflict::External {
            node: node.to_string(),
            device: device.to_string(),
        };
        if let Some(holder) = self.holder_of(node, device)
            && !changes.contains_key(holder)
        {
            return Err(taken(holder.clone()));
        }
        if self.external.devices.contains(node, device) {
            return Err(external());
        }
        let kept = self.shares_of(node, device);
        let kept_by_others = kept.map_or(0, |s| s.used_except(|h| changes.contains_key(h)));
        let outside = self.external.devices.consumed(node, device);
        match take {
            Take::Whole => {
                if let Some(holder) =
                    kept.and_then(|s| s.by.keys().find(|h| !changes.contains_key(h)))
                {
                    return Err(taken(holder.clone()));
                }
                if outside > 0 {
                    return Err(external());
                }
                let pair = (node.to_string(), device.to_string());
                if let Some(holder) =
                    self.counter_conflict(&pair, |h| !changes.contains_key(h), &handed_out.owned)
                {
                    return Err(match holder {
                        Some(holder) => taken(holder.clone()),
                        None => taken(key.clone()),
                    });
                }
                handed_out.owned.insert(pair);
                if handed_out.shares.contains_key(&(node, device))
                    || !handed_out.whole.insert((node, device))
                {
                    return Err(taken(key.clone()));
                }
            }
            Take::Share { bytes, capacity } => {
                if handed_out.whole.contains(&(node, device)) {
                    return Err(taken(key.clone()));
                }
                let capacity = kept.map_or(capacity, |s| s.capacity.min(capacity));
                let mine = handed_out.shares.entry((node, device)).or_default();
                *mine = mine.saturating_add(bytes);
                let total = kept_by_others.saturating_add(outside).saturating_add(*mine);
                if total > capacity {
                    return Err(
                        match kept.and_then(|s| s.by.keys().find(|h| !changes.contains_key(h))) {
                            Some(holder) => taken(holder.clone()),
                            None if outside > 0 => external(),
                            None => taken(key.clone()),
                        },
                    );
                }
            }
        }
        Ok(())
    }

    /// Frees what `key` holds, counting a release, without touching its refusal or the
    /// snapshot's log; returns the holding. An owner entry naming another placement is left
    /// alone: the device is that one's now, whatever `key`'s old holding says.
    pub(super) fn remove_unlogged(&mut self, key: &PlacementKey) -> Option<Arc<Holding>> {
        let holding = self.holdings.remove(key)?;
        let mut freed = false;
        for (node, device) in holding.devices() {
            let pair = (node.to_string(), device.to_string());
            if self.owners.get(&pair) == Some(key) {
                self.owned.remove(&pair.0, &pair.1);
                self.owners.remove(&pair);
            }
            if let Some(shared) = self.shares.get_mut(&pair) {
                shared.by.remove(key);
                if shared.by.is_empty() {
                    self.shares.remove(&pair);
                }
            }
            freed = true;
        }
        // A holding without devices (a claim-template placement) frees nothing, so what did
        // not fit before still does not.
        if freed {
            self.releases += 1;
        }
        Some(holding)
    }

    /// Records a holding whose devices [`Ledger::commit`] has already checked.
    fn place_unchecked(&mut self, key: PlacementKey, holding: Arc<Holding>) {
        let take = holding.take();
        for (node, device) in holding.devices() {
            let pair = (node.to_string(), device.to_string());
            match take {
                Take::Whole => {
                    self.owned.insert(pair.0.clone(), pair.1.clone());
                    self.owners.insert(pair, key.clone());
                }
                Take::Share { bytes, capacity } => self.add_share(pair, &key, bytes, capacity),
            }
        }
        self.holdings.insert(key, holding);
    }
}

/// What one commit hands out so far: whole devices, and the bytes of each shared device.
#[derive(Debug, Default)]
struct HandedOut<'a> {
    whole: BTreeSet<(&'a str, &'a str)>,
    /// `whole` owned, for the DRA counter check.
    owned: BTreeSet<(String, String)>,
    shares: BTreeMap<(&'a str, &'a str), u64>,
}

/// The same holding: the same shared one, or an equal one.
fn same(a: Option<&Arc<Holding>>, b: Option<&Arc<Holding>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
        _ => false,
    }
}
