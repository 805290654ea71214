//! Spec → planner request: a ModelPlacement spec becomes the request `hwaccel plan` would
//! build from the same flags, and the devices it may use become a filter over the planner's
//! view of the fleet. Pure; the other half of building a plan is [`outcome`](super::outcome)
//! (plan → status).
//!
//! Device ids: the planner names devices by their detection id (a PCI bus id), users and the
//! status by the inventory's DNS-label device name (`gpu-0000-18-00-0`). The nodes handed to
//! the planner ([`Request::nodes`]) are renamed to inventory names up front, so reservations,
//! assignments and the ledger all speak one language.

use std::borrow::Cow;

use crate::api::placement::{AllocationMode, Constraints, ModelPlacementSpec};
use crate::controller::core::fleet_view::{DeviceFilter, FleetView};
use crate::plan::request::prepare;
use crate::plan::{Model, NodeSpec, PlanRequest};

use super::no_match;

/// A spec the planner can work on.
#[derive(Debug, Clone)]
pub struct Request {
    /// The model.
    pub model: Model,
    /// Goal, precision and limits.
    pub request: PlanRequest,
    /// Which devices may be used.
    pub filter: DeviceFilter,
    /// Notes about parts of the spec that were not applied.
    pub notes: Vec<String>,
}

impl Request {
    /// The planner's nodes this request may use: the fleet through its filter, and for a
    /// claims placement only the devices a DRA driver publishes.
    pub fn nodes<'a>(&self, fleet: &'a FleetView) -> Cow<'a, [NodeSpec]> {
        let nodes = fleet.filtered(&self.filter);
        if self.filter.dra_only {
            Cow::Owned(dra_published(&nodes, fleet))
        } else {
            nodes
        }
    }
}

/// Turns a spec into a planner request, the way `hwaccel plan` turns its flags into one
/// ([`crate::plan::request::prepare`]); the error lists what is wrong with the spec.
pub fn request_from_spec(spec: &ModelPlacementSpec) -> Result<Request, Vec<String>> {
    let constraints = spec.constraints.clone().unwrap_or_default();
    // A selector or product that is not label syntax can never match: Invalid, not Pending.
    let invalid = no_match::invalid_constraints(&constraints.node_selector, &constraints.products);
    if !invalid.is_empty() {
        return Err(invalid);
    }
    let input = super::plan_input::plan_input(spec).map_err(|reason| vec![reason])?;
    let prepared = prepare(input).map_err(|err| vec![err.to_string()])?;
    Ok(Request {
        model: prepared.model,
        request: prepared.request,
        filter: DeviceFilter {
            // Both claim modes hold devices through DRA, so only what a driver publishes counts.
            dra_only: matches!(
                spec.allocation,
                Some(AllocationMode::Claims | AllocationMode::ClaimTemplate)
            ),
            // A partition is held through a claim: the scheduler's for a template, the
            // controller's own allocation of the partition's device for `claims`.
            fractions: matches!(
                spec.allocation,
                Some(AllocationMode::Claims | AllocationMode::ClaimTemplate)
            ),
            ..filter(&constraints)
        },
        notes: prepared.notes,
    })
}

fn filter(constraints: &Constraints) -> DeviceFilter {
    DeviceFilter {
        families: constraints.families.iter().cloned().collect(),
        products: constraints.products.iter().cloned().collect(),
        node_selector: constraints.node_selector.clone(),
        dra_only: false,
        fractions: false,
    }
}

/// `nodes` with only the devices a DRA driver publishes (a device published only in
/// partitions through them), and only nodes left with some.
fn dra_published(nodes: &[NodeSpec], fleet: &FleetView) -> Vec<NodeSpec> {
    nodes
        .iter()
        .filter_map(|node| {
            let mut node = node.clone();
            node.devices.retain(|device| {
                fleet.dra_device(&node.name, &device.id).is_some()
                    || (device.partitions_only && !device.partitions.is_empty())
            });
            (!node.devices.is_empty()).then_some(node)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::api::placement::AllocationMode;
    use crate::testing::PlacementBuilder;
    use crate::testing::inventory::fixture_inventory as inventory;

    #[test]
    fn constraints_become_the_filter_and_claims_only_published_devices() {
        let mut spec = PlacementBuilder::serve("llama-3.1-8b").context(8192).spec();
        let mut constraints = spec.constraints.clone().unwrap_or_default();
        constraints.families = vec!["gpu".to_string()];
        constraints.products = vec!["nvidia-h100-80gb-hbm3".to_string()];
        constraints.node_selector = BTreeMap::from([("pool".to_string(), "a".to_string())]);
        spec.constraints = Some(constraints);
        let request = request_from_spec(&spec).expect("a valid spec");
        assert_eq!(request.model.name, "llama-3.1-8b");
        assert_eq!(request.filter.families.iter().collect::<Vec<_>>(), ["gpu"]);
        assert_eq!(
            request.filter.products.iter().collect::<Vec<_>>(),
            ["nvidia-h100-80gb-hbm3"]
        );
        assert_eq!(
            request.filter.node_selector.get("pool").map(String::as_str),
            Some("a")
        );
        assert!(!request.filter.dra_only, "labels mode uses every device");

        spec.allocation = Some(AllocationMode::Claims);
        assert!(request_from_spec(&spec).unwrap().filter.dra_only);
        spec.allocation = Some(AllocationMode::ClaimTemplate);
        assert!(request_from_spec(&spec).unwrap().filter.dra_only);
    }

    #[test]
    fn a_claims_request_sees_no_device_that_no_driver_publishes() {
        // The fixture inventories come from the agent alone: no ResourceSlice publishes them.
        let inventories = [inventory("h100-8x-nvswitch", "dgx-1")];
        let fleet = FleetView::new(inventories.iter(), &BTreeMap::new());
        let mut spec = PlacementBuilder::serve("llama-3.1-8b").context(8192).spec();
        let request = request_from_spec(&spec).unwrap();
        assert_eq!(request.nodes(&fleet).len(), 1);
        spec.allocation = Some(AllocationMode::Claims);
        let request = request_from_spec(&spec).unwrap();
        assert!(request.nodes(&fleet).is_empty());
    }

    #[test]
    fn a_spec_that_can_never_match_lists_what_is_wrong() {
        let mut spec = PlacementBuilder::serve("llama-3.1-8b").context(8192).spec();
        let mut constraints = spec.constraints.clone().unwrap_or_default();
        constraints.products = vec!["Not A Slug".to_string()];
        spec.constraints = Some(constraints);
        let reasons = request_from_spec(&spec).expect_err("not label syntax");
        assert!(
            reasons.iter().any(|r| r.contains("Not A Slug")),
            "{reasons:?}"
        );
    }
}
