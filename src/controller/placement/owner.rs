//! What ties a placement's DRA objects (its ResourceClaims and its ResourceClaimTemplate) to
//! it, for both writers: an owner reference that never blocks the placement's deletion (the
//! finalizer deletes the objects itself, and a blocking reference would hold the placement up
//! behind them), and the test that an object is one we made for it: our placement label names
//! it and an owner reference carries its uid. A tenant can copy the label onto an object of
//! its own, but not the uid of a placement it did not create in that namespace, so the
//! controller never deletes a tenant's object for a label alone.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};

use crate::api::ModelPlacement;
use crate::dra::claims::PLACEMENT_LABEL;

/// The placement as the controlling owner of an object we write for it, not blocking the
/// placement's deletion; `None` before the placement has a uid (never for a stored object).
pub fn non_blocking_owner(placement: &ModelPlacement) -> Option<OwnerReference> {
    let mut owner = placement.controller_owner_ref(&())?;
    owner.block_owner_deletion = None;
    Some(owner)
}

/// True when `object` is labelled for the placement `name` and owned by the placement
/// object `uid`.
pub fn made_for(object: &impl Resource, name: &str, uid: &str) -> bool {
    object.labels().get(PLACEMENT_LABEL).map(String::as_str) == Some(name)
        && object
            .owner_references()
            .iter()
            .any(|owner| owner.uid == uid)
}
