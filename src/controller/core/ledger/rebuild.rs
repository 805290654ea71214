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

/// True when `placement` comes before `than` in precedence (older, then by
/// `namespace/name`), compared without copying its names: every plan asks this of every
/// waiting placement. False for one that has no precedence ([`precedence_of`] refuses it).
pub fn precedes(placement: &ModelPlacement, than: &Precedence) -> bool {
    let Some(namespace) = placement.metadata.namespace.as_deref() else {
        return false;
    };
    let name = placement.metadata.name.as_deref().unwrap_or_default();
    let created = placement
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second());
    (created, namespace, name)
        < (
            than.created,
            than.key.namespace.as_str(),
            than.key.name.as_str(),
        )
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

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use proptest::prelude::*;

    use super::*;
    use crate::testing::PlacementBuilder;

    fn placement(namespace: Option<&str>, name: &str, created: i64) -> ModelPlacement {
        let mut placement = PlacementBuilder::serve("llama-3.1-8b").name(name).build();
        placement.metadata.namespace = namespace.map(str::to_string);
        placement.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created).expect("in range"),
        ));
        placement
    }

    proptest! {
        /// `precedes` answers what comparing the copied precedences answers.
        #[test]
        fn precedes_agrees_with_the_precedence_order(
            a in (proptest::option::of("[ab]{0,2}"), "[ab]{0,2}", 0i64..3),
            b in ("[ab]{0,2}", "[ab]{0,2}", 0i64..3),
        ) {
            let first = placement(a.0.as_deref(), &a.1, a.2);
            let second = precedence_of(&placement(Some(&b.0), &b.1, b.2)).expect("namespaced");
            let expected = precedence_of(&first).is_ok_and(|p| p < second);
            prop_assert_eq!(precedes(&first, &second), expected);
        }
    }
}
