//! A placement's spec on the fleet → its [`Outcome`]: the one entry to the placement loop's
//! planning. Invalid specs are refused here; a ResourceClaimTemplate placement is planned as
//! alternatives ([`super::template`]), any other as one plan ([`super::outcome`]).

use std::borrow::Cow;

use crate::api::placement::{AllocationMode, ModelPlacementSpec};
use crate::controller::core::fleet_view::FleetView;
use crate::controller::core::outcome::Outcome;
use crate::plan::Reservations;

use super::outcome::{no_devices, outcome_of, refusal};
use super::request::request_from_spec;
use super::{no_match, template};

/// Why a disaggregated placement with DRA allocation is refused.
pub const DISAGGREGATED_NEEDS_LABELS: &str = "disaggregated serving supports allocation: labels for now (spec.allocation is claims or claimTemplate)";

/// Plans `spec` for `namespace/name` on `fleet` minus `reserved`.
pub fn evaluate(
    spec: &ModelPlacementSpec,
    namespace: &str,
    name: &str,
    fleet: &FleetView,
    reserved: &Reservations,
) -> Outcome {
    let request = match request_from_spec(spec) {
        Ok(request) => request,
        Err(reasons) => return Outcome::Invalid(refusal(None, reasons, Vec::new())),
    };
    if request.request.disaggregation.is_some()
        && matches!(
            spec.allocation,
            Some(AllocationMode::Claims | AllocationMode::ClaimTemplate)
        )
    {
        return Outcome::Invalid(refusal(
            Some(request.model.name.clone()),
            vec![DISAGGREGATED_NEEDS_LABELS.to_string()],
            vec!["set spec.allocation: labels, or drop spec.goal.serve.disaggregated".to_string()],
        ));
    }
    let nodes = request.nodes(fleet);
    // The planner sees only what is left; the whole fleet says why nothing is.
    if let Some(why) = no_match::why_nothing_left(fleet, &request.filter, &nodes) {
        return Outcome::Unschedulable(no_devices(&request, &why));
    }
    if spec.allocation == Some(AllocationMode::ClaimTemplate) {
        return template::evaluate_template(&request, &nodes, fleet, namespace, name);
    }
    // The whole fleet, unfiltered, is planned through the view's index of it.
    let index = matches!(nodes, Cow::Borrowed(_)).then(|| fleet.indexed_nodes().1);
    outcome_of(&request, (&nodes, index), reserved, namespace, name)
}

#[cfg(test)]
#[path = "evaluate_tests.rs"]
mod tests;
