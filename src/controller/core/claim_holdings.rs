//! Which devices ResourceClaims hold, whoever holds the claim, and which of the claims we
//! made have outlived their placement. Pure.
//!
//! A device that an allocated ResourceClaim names is taken until the claim lets go of it: the
//! kubelet's driver refuses to prepare it for anyone else. So every allocated claim counts,
//! in planning and in the fleet's numbers, whoever holds it: the scheduler's claims for pods
//! that never went through a placement, a claim a tenant kept after deleting its placement
//! (a finalizer of its own, or an ownerReference taken off so that neither our finalizer nor
//! the garbage collector deletes it), a stale claim of a live placement that is stuck
//! terminating. The one exception is a device the ledger already counts for the placement
//! that owns the claim (label and ownerReference uid): that is the placement's own holding,
//! and counting it twice would make the placement plan around itself.
//!
//! Before, a claim was skipped whole as soon as it was ours by label and owner, whatever
//! devices it named, and the fleet gauges and `status.freeDevices` counted only the ledger:
//! a claim kept past its placement showed its device free.
//!
//! A device no claim names is taken too when the counters it consumes are used up
//! (partitionable devices, [`crate::dra::counters`]): the whole GPU once the scheduler
//! gave one of its MIG slices to a pod. [`held_outside`] is the one place both are added up,
//! for the controller's planning and fleet pass and for `hwaccel fleet`.

use std::collections::HashMap;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};

use crate::dra::DeviceRef;
use crate::dra::claims::{allocated_devices, consumed_capacity, owning_placement};
use crate::dra::counters::blocked_by_counters;
use crate::plan::Reservations;

use super::counter_book::CounterBook;
use super::ledger::{HeldOutside, Ledger, PlacementKey};
use crate::controller::core::fleet_view::FleetView;

/// A claim labelled for a placement (by us, or made to look so), still allocated, whose
/// placement is gone: no placement of that name exists in its namespace, or the one that
/// does is not the claim's owner (deleted and made again).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct OutlivedClaim {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The claim's uid (empty when the cache has none), to report it once.
    pub uid: String,
    /// The placement its label names.
    pub placement: String,
    /// Devices its allocation names.
    pub devices: usize,
}

/// The devices `claim` is allocated, each with the claim as `namespace/name`: what the
/// counter rule names as the holder of a counter set.
pub fn devices_with_holder(claim: &ResourceClaim) -> impl Iterator<Item = (DeviceRef, String)> {
    let holder = format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    );
    allocated_devices(claim)
        .into_iter()
        .map(move |device| (device, holder.clone()))
}

/// What allocated `claims` hold outside `ledger` ([`claimed_devices`]) plus the devices of
/// `fleet` whose counters the allocated devices of every claim (ours included: a placement's
/// whole GPU blocks its MIG slices for everyone) used up, as `slices` publish them; and the
/// counter book of `fleet` ([`FleetView::with_counters`]) with what allocations the ledger
/// does not count consume, for the ledger's own partitions.
pub fn held_outside(
    claims: &[&ResourceClaim],
    slices: &[&ResourceSlice],
    ledger: &Ledger,
    fleet: &FleetView,
) -> HeldOutside {
    let mut held = HeldOutside {
        devices: claimed_devices(claims.iter().copied(), ledger, fleet),
        ..HeldOutside::default()
    };
    if !fleet.counters().is_empty() {
        // What the ledger's holdings may take is counted against what every other allocation
        // consumes: the claims of other parties, and our own claims the ledger does not count.
        let index = dra_index(fleet);
        let outside: Vec<DeviceRef> = claims
            .iter()
            .flat_map(|claim| {
                let owner = own_placement(claim, ledger);
                allocated_devices(claim)
                    .into_iter()
                    .filter(|device| {
                        !index.get(device).is_some_and(|(node, id)| {
                            counted_by_ledger(owner.as_ref(), ledger, node, id)
                        })
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        held.counters = CounterBook::new(fleet.counters().clone(), &outside);
        // What those allocations alone keep from anyone, where the slices publish no counters
        // to say so (a GPU one of whose AMD partitions, or MIG devices on an apiserver
        // without partitionable devices, a pod holds): taken by a claim, as the counts and
        // every plan see it. Devices a placement holds stay its own.
        for ((node, id), why) in held.counters.blocked(|_| false) {
            if ledger.holder_of(node, id).is_none() {
                held.devices.insert(node.clone(), id.clone());
                held.blocked
                    .entry((node.clone(), id.clone()))
                    .or_insert(why);
            }
        }
    }
    let allocated = claims.iter().copied().flat_map(devices_with_holder);
    let blocked = blocked_by_counters(slices.iter().copied(), allocated);
    if blocked.is_empty() {
        return held;
    }
    let index = dra_index(fleet);
    for (device, why) in blocked {
        // Devices the fleet does not plan on (partitions, shared devices) need no reservation.
        let Some((node, id)) = index.get(&device) else {
            continue;
        };
        held.devices.insert(node.clone(), id.clone());
        held.blocked.insert((node.clone(), id.clone()), why);
    }
    held
}

/// The devices allocated claims hold that the ledger does not already count for the claim's
/// own placement, as planner reservations on `fleet`'s node and device ids: a device whole,
/// or, where the allocation records what it consumed of a shared device (`consumedCapacity`,
/// a share), those bytes. Devices the fleet does not know are left out: nothing could plan on
/// them, and no gauge counts them.
pub fn claimed_devices<'a>(
    claims: impl IntoIterator<Item = &'a ResourceClaim>,
    ledger: &Ledger,
    fleet: &FleetView,
) -> Reservations {
    let mut taken = Reservations::none();
    let mut index: Option<HashMap<DeviceRef, (String, String)>> = None;
    for claim in claims {
        let devices = consumed_capacity(claim);
        if devices.is_empty() {
            continue;
        }
        let owner = own_placement(claim, ledger);
        // Built on the first allocated claim only: a fleet without DRA claims pays nothing.
        let index = index.get_or_insert_with(|| dra_index(fleet));
        for (device, consumed) in devices {
            let Some((node, id)) = index.get(&device) else {
                continue;
            };
            if counted_by_ledger(owner.as_ref(), ledger, node, id) {
                continue;
            }
            match consumed {
                Some(bytes) => taken.consume(node.clone(), id.clone(), bytes),
                None => taken.insert(node.clone(), id.clone()),
            }
        }
    }
    taken
}

/// True when the ledger already counts device `id` of `node` for `owner`, the placement
/// that holds the claim naming it: whole, or as a share.
fn counted_by_ledger(owner: Option<&PlacementKey>, ledger: &Ledger, node: &str, id: &str) -> bool {
    owner.is_some_and(|key| {
        ledger.holder_of(node, id) == Some(key)
            || ledger
                .shares_of(node, id)
                .is_some_and(|shared| shared.by.contains_key(key))
    })
}

/// The allocated claims labelled for a placement that is gone. `placement_uid` gives the uid
/// of the placement `(namespace, name)` when it exists; `in_scope` says whether this
/// controller reconciles placements of a namespace (a controller scoped to one namespace
/// cannot tell about the others).
pub fn outlived_claims<'a, 'p>(
    claims: impl IntoIterator<Item = &'a ResourceClaim>,
    placement_uid: impl Fn(&str, &str) -> Option<&'p str>,
    in_scope: impl Fn(&str) -> bool,
) -> Vec<OutlivedClaim> {
    let mut outlived: Vec<OutlivedClaim> = claims
        .into_iter()
        .filter_map(|claim| {
            let (namespace, placement) = owning_placement(claim)?;
            if !in_scope(namespace) {
                return None;
            }
            let devices = allocated_devices(claim).len();
            if devices == 0 {
                return None;
            }
            let alive = placement_uid(namespace, placement).is_some_and(|uid| {
                claim
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == uid)
            });
            (!alive).then(|| OutlivedClaim {
                namespace: namespace.to_string(),
                name: claim.metadata.name.clone().unwrap_or_default(),
                uid: claim.metadata.uid.clone().unwrap_or_default(),
                placement: placement.to_string(),
                devices,
            })
        })
        .collect();
    outlived.sort();
    outlived
}

/// The placement that holds `claim` in the ledger: the one its label names, in its
/// namespace, when the claim's ownerReferences carry that holding's uid (a placement deleted
/// and made again under the same name is another placement).
fn own_placement(claim: &ResourceClaim, ledger: &Ledger) -> Option<PlacementKey> {
    let (namespace, placement) = owning_placement(claim)?;
    let key = PlacementKey::new(namespace, placement);
    let uid = &ledger.get(&key)?.uid;
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| &o.uid == uid)
        .then_some(key)
}

/// Every DRA-published device in the fleet, by its DRA name (shared ones and partitions
/// included).
fn dra_index(fleet: &FleetView) -> HashMap<DeviceRef, (String, String)> {
    fleet
        .dra_devices()
        .map(|(node, id, reference)| (reference.clone(), (node.to_string(), id.to_string())))
        .collect()
}

#[cfg(test)]
#[path = "claim_holdings_tests.rs"]
mod tests;
