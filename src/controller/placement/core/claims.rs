//! Which ResourceClaims a placement should hold, and what its status says about them. Pure.
//!
//! A planned placement is held by claims when its spec asks for them (`allocation: claims`)
//! or, with `auto`, when a DRA driver publishes every chosen device; otherwise by Node labels
//! alone. Devices that other ResourceClaims hold are taken:
//! [`claim_holdings`](crate::controller::core::claim_holdings) turns them into reservations so the planner
//! plans around them.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::placement::{
    AllocationMode, Assignment, ModelPlacementStatus, PlacementClaim, PodClaimFragment,
    PodResourceClaimRef,
};
use crate::dra::claims::{CLAIM_REQUEST, ClaimPlan, ClaimPlanError, ClaimShare};
use crate::plan::report::FractionKind;

use crate::controller::core::fleet_view::FleetView;

/// The name containers use for the claim in `resources.claims[].name`.
pub const POD_CLAIM_NAME: &str = CLAIM_REQUEST;
/// The well-known label pinning a pod to one node.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// How a planned placement holds its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holding {
    /// By Node labels and the ledger only.
    Labels,
    /// By these claims.
    Claims(Vec<ClaimPlan>),
    /// It must be held by claims but cannot be (a chosen device is not published by a DRA
    /// driver any more): why.
    Unclaimable(String),
}

/// How `status` (a planned placement's) should be held under `mode`.
pub fn holding(
    namespace: &str,
    name: &str,
    mode: AllocationMode,
    status: &ModelPlacementStatus,
    fleet: &FleetView,
) -> Holding {
    if mode == AllocationMode::Labels || status.assignments.is_empty() {
        return Holding::Labels;
    }
    let fraction = status.plan.as_ref().and_then(|plan| plan.fraction.as_ref());
    let share = fraction
        .filter(|fraction| fraction.kind == FractionKind::Share.as_str())
        .map(|fraction| fraction.bytes);
    let partition = fraction.is_some_and(|f| f.kind == FractionKind::Partition.as_str());
    let plans: Result<Vec<ClaimPlan>, ClaimPlanError> = status
        .assignments
        .iter()
        .map(|a| {
            let plan = ClaimPlan::new(
                namespace,
                name,
                (a.replica, a.stage, &a.node),
                &a.devices,
                |node, device| fleet.dra_device(node, device).cloned(),
            )?;
            let plan = plan.with_share(claim_share(a, share, fleet));
            Ok(if partition {
                plan.on_partitions()
            } else {
                plan
            })
        })
        .collect();
    match (plans, mode) {
        (Ok(plans), _) => Holding::Claims(plans),
        (Err(_), AllocationMode::Auto) => Holding::Labels,
        (Err(err), _) => Holding::Unclaimable(err.to_string()),
    }
}

/// What the claim of assignment `a` takes of its devices when their driver publishes them
/// shareable by memory: the plan's share (`share`, bytes), or all of each device's memory for
/// a replica that holds it whole, so no other claim's share lands beside it. `None` for
/// devices not shared.
fn claim_share(a: &Assignment, share: Option<u64>, fleet: &FleetView) -> Option<ClaimShare> {
    let capacity = a
        .devices
        .iter()
        .map(|device| fleet.shared_capacity(&a.node, device))
        .collect::<Option<Vec<u64>>>()?
        .into_iter()
        .min()?;
    Some(ClaimShare {
        bytes: share.filter(|bytes| *bytes < capacity).unwrap_or(capacity),
        capacity,
    })
}

/// What the claim step did for one placement.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimsReport {
    /// The claims, in assignment order, with whether each is allocated.
    pub claims: Vec<PlacementClaim>,
    /// Devices not yet allocated because another ResourceClaim holds them
    /// (`pool/device held by namespace/claim`).
    pub blocked: Vec<String>,
    /// Why the claims could not be made or written, when that failed.
    pub error: Option<String>,
}

impl ClaimsReport {
    /// The report for `plans`, given the names of the claims that are allocated.
    pub fn new(plans: &[ClaimPlan], allocated: &BTreeSet<String>) -> Self {
        let claims = plans
            .iter()
            .map(|plan| PlacementClaim {
                name: plan.name.clone(),
                replica: plan.replica,
                stage: plan.stage,
                node: plan.node.clone(),
                devices: plan.devices.clone(),
                allocated: allocated.contains(&plan.name),
                pod_template: PodClaimFragment {
                    resource_claims: vec![PodResourceClaimRef {
                        name: POD_CLAIM_NAME.to_string(),
                        resource_claim_name: plan.name.clone(),
                    }],
                    node_selector: BTreeMap::from([(
                        HOSTNAME_LABEL.to_string(),
                        plan.node.clone(),
                    )]),
                },
            })
            .collect();
        Self {
            claims,
            ..Self::default()
        }
    }

    /// True when every claim is allocated and nothing failed.
    pub fn complete(&self) -> bool {
        self.error.is_none() && self.claims.iter().all(|c| c.allocated)
    }

    /// Writes the claims into a status: the list, and the names and devices as the
    /// comma-separated strings `kubectl get mp -o wide` prints.
    pub fn fill(&self, status: &mut ModelPlacementStatus) {
        status.allocation = Some(AllocationMode::Claims.as_str().to_string());
        status.claims = self.claims.clone();
        let names: Vec<&str> = self.claims.iter().map(|c| c.name.as_str()).collect();
        let devices: Vec<String> = self
            .claims
            .iter()
            .flat_map(|c| c.devices.iter().map(|d| format!("{}/{}", d.pool, d.device)))
            .collect();
        status.claim_names = (!names.is_empty()).then(|| names.join(","));
        status.device_names = (!devices.is_empty()).then(|| devices.join(","));
    }
}

#[cfg(test)]
#[path = "share_tests.rs"]
mod share_tests;

#[cfg(test)]
#[path = "partition_tests.rs"]
mod partition_tests;
