//! The status a decision leads to, without any I/O: the plan or refusal from the planner plus
//! the `Planned`, `Degraded` (a device no longer usable, or reported unhealthy by its driver or
//! kubelet) and `Ready` conditions, merged into the current status so a
//! condition that did not change keeps its transition time (and an unchanged status is not
//! written again).

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::conditions;
use crate::api::placement::{AllocationMode, ModelPlacementStatus};

use super::claims::ClaimsReport;
use super::decide::Decision;
use super::outcome::Outcome;

/// The condition saying whether the placement has a plan.
pub const PLANNED: &str = "Planned";
/// The condition saying an assigned device went bad while the plan is kept.
pub const DEGRADED: &str = conditions::DEGRADED;
/// Whether the pods that run the plan run it (`core::conformance`).
pub const CONFORMANT: &str = "Conformant";
/// The condition saying workloads can use the placement now: it is planned, every planned
/// Node carries its placement label (so `status.nodeSelector` selects exactly them), and no
/// assigned device is degraded. The controller runs no workloads, so this is as far as it
/// can vouch.
pub const READY: &str = conditions::READY;

/// The `status.state` an outcome is reported as (also the gauge label).
pub fn state_name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Planned(_) => "Planned",
        Outcome::Unschedulable(_) => "Pending",
        Outcome::Invalid(_) => "Invalid",
    }
}

/// The status a decision leads to, merged into the current one so unchanged conditions keep
/// their transition time.
pub fn desired_status(
    current: Option<&ModelPlacementStatus>,
    decision: &Decision,
    generation: Option<i64>,
    now: &Time,
) -> ModelPlacementStatus {
    let mut status = decision.outcome.status().clone();
    let mut conds = current.map(|s| s.conditions.clone()).unwrap_or_default();
    let current_planned = conditions::find(&conds, PLANNED).cloned();
    let (reason, message, ok) = match &decision.outcome {
        Outcome::Planned(s) => {
            let where_ = s.node_names.clone().unwrap_or_default();
            let devices: usize = s.assignments.iter().map(|a| a.devices.len()).sum();
            match (&decision.replanned, &current_planned) {
                (_, _) if s.claim_template.is_some() => (
                    "Planned".to_string(),
                    format!("alternatives in order: {}", s.alternatives.join("; ")),
                    true,
                ),
                (Some(why), _) => (
                    "Replanned".to_string(),
                    format!("re-planned because {why}; now {devices} device(s) on {where_}"),
                    true,
                ),
                // A kept plan keeps its condition as written (a Replanned stays Replanned).
                (None, Some(c)) if decision.kept && c.status == "True" => {
                    (c.reason.clone(), c.message.clone(), true)
                }
                _ => (
                    "Planned".to_string(),
                    format!("{devices} device(s) on {where_}"),
                    true,
                ),
            }
        }
        Outcome::Unschedulable(s) => {
            let first = s
                .reasons
                .first()
                .cloned()
                .unwrap_or_else(|| "does not fit".to_string());
            let message = match &decision.replanned {
                Some(why) => format!("re-planned because {why}; {first}"),
                None => first,
            };
            ("Unschedulable".to_string(), message, false)
        }
        Outcome::Invalid(s) => (
            "Invalid".to_string(),
            s.reasons
                .first()
                .cloned()
                .unwrap_or_else(|| "invalid spec".to_string()),
            false,
        ),
    };
    conditions::set(
        &mut conds,
        conditions::condition(PLANNED, Some(ok), &reason, &message, generation, now),
    );
    let degraded = if !matches!(decision.outcome, Outcome::Planned(_)) {
        conditions::remove(&mut conds, DEGRADED);
        None
    } else if decision.degraded.is_empty() && decision.device_health.is_empty() {
        Some(conditions::condition(
            DEGRADED,
            Some(false),
            "DevicesUsable",
            "",
            generation,
            now,
        ))
    } else {
        let unhealthy = (!decision.device_health.is_empty()).then(|| {
            format!(
                "allocated devices reported unhealthy: {}",
                decision.device_health.join("; ")
            )
        });
        let (reason, message) = if decision.degraded.is_empty() {
            ("DeviceUnhealthy", unhealthy.unwrap_or_default())
        } else {
            let unusable = format!(
                "assigned devices no longer usable: {}",
                decision.degraded.join(", ")
            );
            let message = match unhealthy {
                Some(unhealthy) => format!("{unusable}; {unhealthy}"),
                None => unusable,
            };
            ("DeviceUnusable", message)
        };
        Some(conditions::condition(
            DEGRADED,
            Some(true),
            reason,
            &message,
            generation,
            now,
        ))
    };
    if let Some(degraded) = degraded {
        conditions::set(&mut conds, degraded);
    }
    match (&decision.outcome, &decision.conformance) {
        (Outcome::Planned(_), Some(verdict)) => {
            conditions::set(
                &mut conds,
                conditions::condition(
                    CONFORMANT,
                    verdict.status(),
                    verdict.reason(),
                    &verdict.message(),
                    generation,
                    now,
                ),
            );
        }
        (Outcome::Planned(_), None) => {}
        _ => {
            conditions::remove(&mut conds, CONFORMANT);
        }
    }
    let (ready, reason, message) = readiness(decision);
    conditions::set(
        &mut conds,
        conditions::condition(READY, Some(ready), reason, &message, generation, now),
    );
    if let Outcome::Planned(_) = &decision.outcome {
        match &decision.claims {
            Some(report) => report.fill(&mut status),
            // A template placement's evaluation already says `claimTemplate`.
            None if status.allocation.is_some() => {}
            None => status.allocation = Some(AllocationMode::Labels.as_str().to_string()),
        }
    }
    status.conditions = conds;
    status.observed_generation = generation;
    status.state = Some(state_name(&decision.outcome).to_string());
    status
}

/// The Ready condition's status, reason and message.
fn readiness(decision: &Decision) -> (bool, &'static str, String) {
    let Outcome::Planned(status) = &decision.outcome else {
        return (
            false,
            "NotPlanned",
            "no plan; see the Planned condition".to_string(),
        );
    };
    if let Some(template) = &status.claim_template {
        return match &decision.template_error {
            Some(error) => (
                false,
                "ClaimTemplateWriteFailed",
                format!("writing ResourceClaimTemplate {template} failed: {error}"),
            ),
            None => (
                true,
                "ClaimTemplateWritten",
                format!(
                    "ResourceClaimTemplate {template} lists {} alternative(s); use status.podTemplate",
                    status.alternatives.len()
                ),
            ),
        };
    }
    if let Some(error) = &decision.label_error {
        let message = format!("writing the placement labels failed: {error}");
        return (false, "LabelWriteFailed", message);
    }
    if !decision.unlabeled.is_empty() {
        let message = format!(
            "planned Node(s) not found, so their placement label is missing: {}",
            decision.unlabeled.join(", ")
        );
        return (false, "NodeNotFound", message);
    }
    if let Some(report) = decision.claims.as_ref().filter(|r| !r.complete()) {
        return claims_not_ready(report);
    }
    if !decision.degraded.is_empty() || !decision.device_health.is_empty() {
        return (
            false,
            "DevicesDegraded",
            "an assigned device is no longer usable; see the Degraded condition".to_string(),
        );
    }
    let nodes = status
        .assignments
        .iter()
        .map(|a| a.node.as_str())
        .collect::<BTreeSet<_>>()
        .len();
    if let Some(report) = &decision.claims {
        return (
            true,
            "ClaimsAllocated",
            format!(
                "{} ResourceClaim(s) hold the planned devices on {nodes} node(s); use status.claims[].podTemplate",
                report.claims.len()
            ),
        );
    }
    (
        true,
        "NodesLabelled",
        format!("status.nodeSelector selects the {nodes} planned node(s)"),
    )
}

/// The Ready condition while the claims are not all allocated.
fn claims_not_ready(report: &ClaimsReport) -> (bool, &'static str, String) {
    if let Some(error) = &report.error {
        return (
            false,
            "ClaimWriteFailed",
            format!("writing the ResourceClaims failed: {error}"),
        );
    }
    if !report.blocked.is_empty() {
        return (
            false,
            "DevicesHeldByOtherClaims",
            format!(
                "waiting for other ResourceClaims to release planned devices: {}",
                report.blocked.join(", ")
            ),
        );
    }
    let pending: Vec<&str> = report
        .claims
        .iter()
        .filter(|c| !c.allocated)
        .map(|c| c.name.as_str())
        .collect();
    (
        false,
        "ClaimsPending",
        format!("ResourceClaims not allocated yet: {}", pending.join(", ")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::core::ledger::Ledger;
    use crate::controller::placement::core::decide::decide;
    use crate::controller::placement::core::decide::tests::{candidate, fleet, half_node};

    #[test]
    fn status_conditions_follow_the_decision() {
        let spec = half_node();
        let mut ledger = Ledger::new();
        let fleet = fleet(&["n1"]);
        let decision = decide(&mut ledger, &candidate("me", 1, &spec), &[], &fleet);
        let at = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
        let status = desired_status(None, &decision, Some(1), &at(10));
        assert_eq!(status.state.as_deref(), Some("Planned"));
        let planned = conditions::find(&status.conditions, PLANNED).unwrap();
        assert_eq!(
            (planned.status.as_str(), planned.reason.as_str()),
            ("True", "Planned")
        );
        let ready = conditions::find(&status.conditions, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.message.as_str()),
            ("True", "status.nodeSelector selects the 1 planned node(s)")
        );
        // A planned Node that is gone cannot carry the label: planned, but not ready.
        let orphaned = Decision {
            unlabeled: vec!["n1".into()],
            ..decision.clone()
        };
        let not_ready = desired_status(None, &orphaned, Some(1), &at(10));
        assert!(conditions::is_true(&not_ready.conditions, PLANNED));
        let ready = conditions::find(&not_ready.conditions, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "NodeNotFound")
        );
        // A failed label write takes Ready back until a retry lands the labels.
        let failed = Decision {
            label_error: Some("connection refused".into()),
            ..decision.clone()
        };
        let taken_back = desired_status(Some(&status), &failed, Some(1), &at(11));
        let ready = conditions::find(&taken_back.conditions, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "LabelWriteFailed")
        );
        assert!(ready.message.contains("connection refused"));
        // A driver reports a held device unhealthy: Degraded names it, Ready is taken back;
        // once the report clears, both come back.
        let sick = Decision {
            device_health: vec![
                "gpu.nvidia.com/n1/gpu-0 (ResourceClaim ml/me-r0): Ready=False XidError: Xid 79"
                    .into(),
            ],
            ..decision.clone()
        };
        let degraded = desired_status(Some(&status), &sick, Some(1), &at(12));
        let condition = conditions::find(&degraded.conditions, DEGRADED).unwrap();
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("True", "DeviceUnhealthy")
        );
        assert!(
            condition.message.contains("gpu.nvidia.com/n1/gpu-0"),
            "{}",
            condition.message
        );
        assert!(
            condition.message.contains("Xid 79"),
            "{}",
            condition.message
        );
        let ready = conditions::find(&degraded.conditions, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "DevicesDegraded")
        );
        let both = Decision {
            degraded: vec!["n1/gpu-1 (gone)".into()],
            ..sick.clone()
        };
        let condition = desired_status(Some(&status), &both, Some(1), &at(12));
        let condition = conditions::find(&condition.conditions, DEGRADED).unwrap();
        assert_eq!(condition.reason, "DeviceUnusable");
        assert!(condition.message.contains("n1/gpu-1") && condition.message.contains("Xid 79"));
        let healed = desired_status(Some(&degraded), &decision, Some(1), &at(13));
        assert!(!conditions::is_true(&healed.conditions, DEGRADED));
        assert!(conditions::is_true(&healed.conditions, READY));
        // Re-asserting the same decision later changes nothing, so nothing is written.
        let kept = decide(&mut ledger, &candidate("me", 1, &spec), &[], &fleet);
        assert_eq!(
            desired_status(Some(&status), &kept, Some(1), &at(99)),
            status
        );
        let invalid = Decision {
            outcome: Outcome::Invalid(ModelPlacementStatus {
                reasons: vec!["unknown model preset".into()],
                ..ModelPlacementStatus::default()
            }),
            ..kept
        };
        let refused = desired_status(Some(&status), &invalid, Some(2), &at(100));
        let planned = conditions::find(&refused.conditions, PLANNED).unwrap();
        assert_eq!(
            (planned.status.as_str(), planned.reason.as_str()),
            ("False", "Invalid")
        );
        assert_eq!(planned.last_transition_time, at(100));
        assert!(refused.assignments.is_empty() && refused.node_selector.is_empty());
        assert!(
            conditions::find(&refused.conditions, DEGRADED).is_none(),
            "no plan, nothing to be degraded"
        );
        assert!(!conditions::is_true(&refused.conditions, READY));
    }
}
