//! `allocation: claimTemplate`: the planner's alternatives, in its order, for one
//! ResourceClaimTemplate whose prioritized list lets kube-scheduler pick the devices. Pure.
//!
//! Alternative 1 is what the planner chooses on the DRA-published devices of the filtered
//! fleet. Its device kind (driver and product) is then taken out of the candidates and the
//! planner asked again for alternative 2, and so on up to [`MAX_ALTERNATIVES`]. Reservations
//! are ignored on purpose: the scheduler decides what is free when a pod asks, and a
//! template holds nothing in the ledger.
//!
//! Each alternative is one replica-stage group (one pod's claim): its driver, the group's
//! device count, and the plan's per-device memory need as a floor on the driver's memory
//! capacity. On devices a driver publishes shareable by memory it also requests memory: the
//! share the planner sized to the replica, or all of the device for a replica that holds it
//! whole, so the scheduler places shares of several placements on one GPU and never one
//! beside a whole-device replica. No same-domain constraint is written: no driver in the table publishes an
//! attribute that marks an NVLink/XGMI domain for whole GPUs, and a PCIe root is not one.

use std::collections::BTreeSet;

use crate::api::placement::{
    AllocationMode, ModelPlacementSpec, ModelPlacementStatus, PodResourceClaimTemplateRef,
    PodTemplateClaimFragment,
};
use crate::dra::claim_template::{Alternative, MAX_ALTERNATIVES, REQUEST_NAME};
use crate::dra::drivers::known;
use crate::plan::{NodeSpec, Reservations};

use super::outcome::{Outcome, outcome_of};
use super::request::{Request, request_from_spec};
use crate::controller::core::fleet_view::FleetView;

/// Longest DNS label, the limit on a subrequest name.
const MAX_LABEL: usize = 63;
const GIB: u64 = 1 << 30;

/// One alternative of the template and how the status shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The subrequest it becomes.
    pub alternative: Alternative,
    /// `2x gpu.nvidia.com >=75Gi`, for `status.alternatives`.
    pub summary: String,
}

/// A device kind: its driver and its product slug (when the fleet knows one).
type Kind = (String, Option<String>);

/// The template's alternatives for `spec` on `fleet`, in the planner's order (empty when
/// the first plan does not fit or the spec is not a template placement).
pub fn alternatives(
    spec: &ModelPlacementSpec,
    namespace: &str,
    name: &str,
    fleet: &FleetView,
) -> Vec<Choice> {
    if spec.allocation != Some(AllocationMode::ClaimTemplate) {
        return Vec::new();
    }
    let Ok(request) = request_from_spec(spec) else {
        return Vec::new();
    };
    // A template placement's request is dra_only: only what a driver publishes.
    let nodes = request.nodes(fleet);
    plan_choices(&request, &nodes, fleet, namespace, name).1
}

/// The outcome of a template placement: the first alternative's plan, without assignments
/// (nothing is held), with the template's name, the alternatives and the pod fragment.
pub fn evaluate_template(
    request: &Request,
    nodes: &[NodeSpec],
    fleet: &FleetView,
    namespace: &str,
    name: &str,
) -> Outcome {
    let (first, choices) = plan_choices(request, nodes, fleet, namespace, name);
    let Outcome::Planned(mut status) = first else {
        return first;
    };
    if choices.is_empty() {
        return Outcome::Unschedulable(ModelPlacementStatus {
            model: status.model,
            reasons: vec![
                "the plan's devices are not all of one DRA driver, so no claim template can ask for them"
                    .to_string(),
            ],
            ..ModelPlacementStatus::default()
        });
    }
    status.assignments.clear();
    status.node_names = None;
    status.node_selector.clear();
    status.allocation = Some(AllocationMode::ClaimTemplate.as_str().to_string());
    status.claim_template = Some(name.to_string());
    status.alternatives = choices.into_iter().map(|c| c.summary).collect();
    status.pod_template = Some(PodTemplateClaimFragment {
        resource_claims: vec![PodResourceClaimTemplateRef {
            name: REQUEST_NAME.to_string(),
            resource_claim_template_name: name.to_string(),
        }],
    });
    Outcome::Planned(status)
}

/// Plans again and again, each time without the device kinds already chosen. Returns the
/// first outcome (the status's plan) and the alternatives.
fn plan_choices(
    request: &Request,
    nodes: &[NodeSpec],
    fleet: &FleetView,
    namespace: &str,
    name: &str,
) -> (Outcome, Vec<Choice>) {
    let none = Reservations::none();
    let first = outcome_of(request, (nodes, None), &none, namespace, name);
    let mut choices: Vec<Choice> = Vec::new();
    let mut candidates = nodes.to_vec();
    let mut outcome = first.clone();
    // Each round takes at least one kind (or the partitions) out, so this ends; the bound
    // keeps it short.
    for _ in 0..MAX_ALTERNATIVES * 2 {
        let Outcome::Planned(status) = &outcome else {
            break;
        };
        let Some((alternative, kinds)) = alternative_of(status, fleet, choices.len() + 1) else {
            break;
        };
        let partition = alternative.partition_profile.is_some();
        // A selector identical to an earlier one adds nothing: that one already takes it.
        if !choices
            .iter()
            .any(|c| same_selector(&c.alternative, &alternative))
        {
            choices.push(Choice {
                summary: summary(&alternative),
                alternative,
            });
        }
        if choices.len() == MAX_ALTERNATIVES {
            break;
        }
        if partition {
            // After a partition, the next choice is the same devices whole (or shared);
            // each round still takes something out (the partitions), so this ends.
            for node in &mut candidates {
                for device in &mut node.devices {
                    device.partitions.clear();
                }
            }
        } else {
            without_kinds(&mut candidates, fleet, &kinds);
        }
        if candidates.is_empty() {
            break;
        }
        outcome = outcome_of(request, (&candidates, None), &none, namespace, name);
    }
    (first, choices)
}

/// The alternative a planned status stands for (its first group), and the device kinds
/// the plan used; none when the devices are not all of one known DRA driver.
fn alternative_of(
    status: &ModelPlacementStatus,
    fleet: &FleetView,
    index: usize,
) -> Option<(Alternative, BTreeSet<Kind>)> {
    let group = status.assignments.first()?;
    let mut kinds = BTreeSet::new();
    for assignment in &status.assignments {
        for device in &assignment.devices {
            kinds.insert(kind(fleet, &assignment.node, device)?);
        }
    }
    let drivers: BTreeSet<&str> = kinds.iter().map(|(d, _)| d.as_str()).collect();
    let [driver] = drivers.into_iter().collect::<Vec<_>>()[..] else {
        return None;
    };
    let entry = known(driver)?;
    let count = u32::try_from(group.devices.len()).ok()?;
    let memory = status.plan.as_ref().map(|p| p.memory_per_device.total);
    // On a device published shareable: a share sized to the replica, or all of the device so
    // no share lands beside it; on a partitioned one, the partition's profile
    // (`plan::search::fraction`).
    let fraction = status.plan.as_ref().and_then(|p| p.fraction.as_ref());
    let memory_request = fraction.and_then(|f| match f.kind.as_str() {
        "share" => Some(f.bytes),
        "device" => Some(f.device_bytes),
        _ => None,
    });
    let partition_profile = fraction
        .filter(|f| f.kind == "partition")
        .and_then(|f| f.profile.clone());
    let product = kinds.iter().find_map(|(_, p)| p.clone());
    let alternative = Alternative {
        name: subrequest_name(index, product.as_deref()),
        driver: driver.to_string(),
        // The fleet knows the product as our slug, not as the driver's attribute string,
        // so an exact product selector cannot be written reliably: memory stands in.
        product: None,
        min_memory_bytes: memory.filter(|m| *m > 0 && entry.memory.is_some()),
        count,
        same_domain_attribute: None,
        memory_request,
        partition_profile,
    };
    Some((alternative, kinds))
}

fn kind(fleet: &FleetView, node: &str, device: &str) -> Option<Kind> {
    let driver = fleet.dra_device(node, device)?.driver.clone();
    Some((driver, fleet.product(node, device).map(str::to_string)))
}

/// Drops every device of `kinds` from `nodes`, and nodes left empty.
fn without_kinds(nodes: &mut Vec<NodeSpec>, fleet: &FleetView, kinds: &BTreeSet<Kind>) {
    for node in nodes.iter_mut() {
        let name = node.name.clone();
        node.devices
            .retain(|d| kind(fleet, &name, &d.id).is_none_or(|k| !kinds.contains(&k)));
    }
    nodes.retain(|n| !n.devices.is_empty());
}

fn same_selector(a: &Alternative, b: &Alternative) -> bool {
    (
        &a.driver,
        &a.product,
        a.min_memory_bytes,
        a.count,
        a.memory_request,
        &a.partition_profile,
    ) == (
        &b.driver,
        &b.product,
        b.min_memory_bytes,
        b.count,
        b.memory_request,
        &b.partition_profile,
    )
}

/// `a<index>-<product slug>`, cut to a DNS label.
fn subrequest_name(index: usize, product: Option<&str>) -> String {
    let mut name = format!("a{index}");
    if let Some(product) = product {
        let slug: String = product
            .chars()
            .map(|c| c.to_ascii_lowercase())
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        name.push('-');
        name.push_str(&slug);
    }
    name.truncate(MAX_LABEL);
    name.trim_end_matches('-').to_string()
}

/// `2x gpu.nvidia.com >=75Gi` (memory rounded up to whole GiB), with the memory each claim
/// requests of a shareable device (`1x gpu.nvidia.com >=22Gi memory=24Gi`).
fn summary(alternative: &Alternative) -> String {
    let mut text = format!("{}x {}", alternative.count, alternative.driver);
    if let Some(bytes) = alternative.min_memory_bytes {
        text.push_str(&format!(" >={}Gi", bytes.div_ceil(GIB)));
    }
    if let Some(bytes) = alternative.memory_request {
        text.push_str(&format!(" memory={}", crate::api::quantity::bytes(bytes).0));
    }
    if let Some(profile) = &alternative.partition_profile {
        text.push_str(&format!(" profile={profile}"));
    }
    text
}

#[cfg(test)]
#[path = "template_tests.rs"]
mod tests;
