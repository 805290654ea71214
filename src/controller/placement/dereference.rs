//! Dereference, the first step of a reconcile: everything a decision reads comes from the
//! watch caches — the placement's key and precedence, the other placements still waiting,
//! the fleet view (rebuilt only when the watches saw a change), Nodes that are gone, and the
//! ledger rebuilt from statuses at start-up. Nothing here writes to the apiserver.

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use crate::api::placement::ModelPlacementStatus;
use crate::api::{Lenient, ModelPlacement};

use super::core::decide::Candidate;
use crate::controller::core::ledger::rebuild::precedence_of;
use crate::controller::core::ledger::{Holding, PlacementKey};

use crate::controller::context::{Context, State};
pub use crate::controller::core::ledger::rebuild::DereferenceError;
use crate::names::keys::PLACEMENT_FINALIZER as FINALIZER;

/// A placement as [`decide`](super::core::decide::decide) sees it.
pub fn candidate(placement: &ModelPlacement) -> Result<Candidate<'_>, DereferenceError> {
    Ok(Candidate {
        precedence: precedence_of(placement)?,
        uid: placement.uid().unwrap_or_default(),
        generation: placement.meta().generation.unwrap_or(0),
        spec: &placement.spec,
    })
}

/// True when the placement carries the cleanup finalizer: its deletion is then seen by a
/// cleanup reconcile, which frees its devices and removes its Node labels.
pub fn has_cleanup_finalizer(placement: &impl Resource) -> bool {
    placement
        .meta()
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}

/// The placements other than `me` that may wait for devices: not being deleted, decodable,
/// not known to be invalid, and carrying the cleanup finalizer. [`decide`] picks those older
/// than `me` that hold nothing. One without the finalizer has not had its own first reconcile
/// (which adds it), or a tenant removed it: given devices on another's turn and then deleted,
/// it would never get the cleanup that frees them, so it is planned on its own turn only.
///
/// [`decide`]: super::core::decide::decide
pub fn waiting_placements(ctx: &Context) -> Vec<Arc<Lenient<ModelPlacement>>> {
    ctx.placements
        .state()
        .into_iter()
        .filter(|p| p.meta().deletion_timestamp.is_none() && has_cleanup_finalizer(&**p))
        .filter(|p| {
            p.decoded().is_some_and(|p| {
                p.status.as_ref().and_then(|s| s.state.as_deref()) != Some("Invalid")
            })
        })
        .collect()
}

/// True when the placement `key` is in the watch cache as the object `holding` was planned
/// for (same uid), is not being deleted and carries the cleanup finalizer: it may still be
/// given devices. A placement whose deletion the cache shows may have had its cleanup
/// already, which nothing would repeat; one without the finalizer would get no cleanup.
pub fn still_placeable(ctx: &Context, key: &PlacementKey, holding: &Holding) -> bool {
    let reference = ObjectRef::new(&key.name).within(&key.namespace);
    ctx.placements.get(&reference).is_some_and(|placement| {
        placement.meta().deletion_timestamp.is_none()
            && has_cleanup_finalizer(&*placement)
            && placement.meta().uid.as_deref().unwrap_or_default() == holding.uid
    })
}

/// True when a holding of the placement `key` planned for `uid` may stand: the watch cache
/// has that object, and if it is being deleted, its cleanup finalizer is still there (the
/// cleanup reconcile frees it). False for a placement deleted from the cache, replaced by a
/// namesake (another uid), or being deleted without the finalizer: no reconcile would ever
/// free what it holds.
pub fn holding_may_stand(ctx: &Context, key: &PlacementKey, uid: &str) -> bool {
    let reference = ObjectRef::new(&key.name).within(&key.namespace);
    ctx.placements.get(&reference).is_some_and(|placement| {
        placement.meta().uid.as_deref() == Some(uid)
            && (placement.meta().deletion_timestamp.is_none() || has_cleanup_finalizer(&*placement))
    })
}

/// The placements other than `except` that hold nothing, so freed devices may fit them.
pub fn waiting_keys(ctx: &Context, state: &State, except: &PlacementKey) -> Vec<PlacementKey> {
    ctx.placements
        .state()
        .iter()
        .filter_map(|placement| precedence_of(placement.decoded()?).ok())
        .map(|precedence| precedence.key)
        .filter(|key| key != except && state.ledger.get(key).is_none())
        .collect()
}

/// The planned Nodes the Node cache does not know: they cannot carry a placement label.
pub fn missing_nodes(ctx: &Context, status: &ModelPlacementStatus) -> Vec<String> {
    status
        .all_assignments()
        .map(|a| a.node.clone())
        .filter(|node| ctx.nodes.get(&ObjectRef::new(node)).is_none())
        .collect::<BTreeSet<String>>()
        .into_iter()
        .collect()
}
