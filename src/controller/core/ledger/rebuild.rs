//! A placement's own status as a ledger holding: how the ledger is rebuilt when a controller
//! starts or a new leader takes over, and how `hwaccel fleet` rebuilds it from files. A
//! placement's precedence (creation time, then `namespace/name`) orders the rebuild.

use crate::api::ModelPlacement;

use super::{Holding, PlacementKey, Precedence};

/// A placement the controller cannot order among the others.
#[derive(Debug, thiserror::Error)]
#[error("placement {0} lacks metadata the controller needs")]
pub struct DereferenceError(String);

/// The key and precedence of a placement.
pub fn precedence_of(placement: &ModelPlacement) -> Result<Precedence, DereferenceError> {
    let name = placement.metadata.name.clone().unwrap_or_default();
    let namespace = placement
        .metadata
        .namespace
        .clone()
        .ok_or_else(|| DereferenceError(name.clone()))?;
    let created = placement
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second());
    Ok(Precedence {
        created,
        key: PlacementKey::new(namespace, name),
    })
}

/// The holding a placement's own status describes, for rebuilding the ledger.
pub fn holding_from_status(placement: &ModelPlacement) -> Option<(PlacementKey, Holding)> {
    let status = placement.status.as_ref()?;
    if status.state.as_deref() != Some("Planned") || status.assignments.is_empty() {
        return None;
    }
    let precedence = precedence_of(placement).ok()?;
    let mut kept = status.clone();
    kept.conditions.clear();
    kept.observed_generation = None;
    kept.state = None;
    let holding = Holding {
        created: precedence.created,
        uid: placement.metadata.uid.clone().unwrap_or_default(),
        generation: status
            .observed_generation
            .or(placement.metadata.generation)
            .unwrap_or(0),
        status: kept,
    };
    Some((precedence.key, holding))
}
