//! Status, the last step of a reconcile: the status a decision leads to ([`desired_status`])
//! is written by server-side apply on the status subresource, only when it changed, with an
//! Event when the state or the `Planned` reason changes. Events go out in the background:
//! they are informational, and the placements queued behind this reconcile do not wait.
//!
//! [`desired_status`]: super::core::desired::desired_status

use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tracing::Instrument;

use crate::api::conditions;
use crate::api::placement::ModelPlacementStatus;
use crate::api::{Lenient, ModelPlacement};

use super::core::decide::Decision;
use super::core::desired::{CONFORMANT, PLANNED, desired_status};
use crate::controller::context::{Context, FIELD_MANAGER};
use crate::controller::core::step::Step;

/// A status write the apiserver refused or never answered.
#[derive(Debug, thiserror::Error)]
#[error("kubernetes API: {0}")]
pub struct StatusError(#[from] kube::Error);

/// Writes the status `decision` leads to over `current`, unless they are the same; returns
/// what it wrote.
pub async fn write_status(
    placement: &ModelPlacement,
    current: Option<&ModelPlacementStatus>,
    api: &Api<ModelPlacement>,
    ctx: &Context,
    decision: &Decision,
) -> Result<Option<ModelPlacementStatus>, StatusError> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let desired = desired_status(current, decision, placement.meta().generation, &now).fitted();
    if current == Some(&desired) {
        return Ok(None);
    }
    let writing = Instant::now();
    let patch = serde_json::json!({
        "apiVersion": crate::api::API_VERSION,
        "kind": "ModelPlacement",
        "status": desired,
    });
    api.patch_status(
        &placement.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .inspect_err(|_| ctx.metrics.failed("status"))?;
    ctx.metrics.wrote("status", writing.elapsed());
    emit_event(placement, ctx, current, &desired);
    emit_conformance_event(placement, ctx, current, &desired);
    Ok(Some(desired))
}

/// An Event when the state or the Planned reason changed, except a placement's first plan:
/// that transition is routine and its `Planned` condition already says it, and at 3,000
/// placements its Events were a third of the controller's writes. A plan after a refusal, a
/// refusal, and a re-plan still get one.
fn emit_event(
    placement: &ModelPlacement,
    ctx: &Context,
    before: Option<&ModelPlacementStatus>,
    after: &ModelPlacementStatus,
) {
    let reason_of = |s: Option<&ModelPlacementStatus>| {
        s.and_then(|s| conditions::find(&s.conditions, PLANNED))
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let (Some((reason, message)), previous) = (reason_of(Some(after)), reason_of(before)) else {
        return;
    };
    if previous.as_ref().map(|(r, _)| r) == Some(&reason)
        && before.and_then(|s| s.state.as_ref()) == after.state.as_ref()
    {
        return;
    }
    if previous.is_none() && reason == "Planned" {
        return;
    }
    let type_ = if reason == "Planned" {
        EventType::Normal
    } else {
        EventType::Warning
    };
    let event = Event {
        type_,
        reason,
        note: Some(message.chars().take(1000).collect()),
        action: "Plan".to_string(),
        secondary: None,
    };
    publish_in_background(ctx, event, placement.object_ref(&()));
}

/// A Warning `NotConformant` Event when the pods stop running the plan or the leading
/// reason changes, a Normal `Conformant` when they run it again; none while it stays.
fn emit_conformance_event(
    placement: &ModelPlacement,
    ctx: &Context,
    before: Option<&ModelPlacementStatus>,
    after: &ModelPlacementStatus,
) {
    let of = |s: Option<&ModelPlacementStatus>| {
        s.and_then(|s| conditions::find(&s.conditions, CONFORMANT))
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let (Some((status, reason, message)), previous) = (of(Some(after)), of(before)) else {
        return;
    };
    let was = previous.as_ref().map(|(s, r, _)| (s.as_str(), r.as_str()));
    let event = match (was, status.as_str()) {
        (Some((_, r)), "False") if r == reason => return,
        (_, "False") => Event {
            type_: EventType::Warning,
            reason: "NotConformant".to_string(),
            note: Some(format!("{reason}: {message}").chars().take(1000).collect()),
            action: "Audit".to_string(),
            secondary: None,
        },
        (Some(("False", _)), "True") => Event {
            type_: EventType::Normal,
            reason: CONFORMANT.to_string(),
            note: Some(message.chars().take(1000).collect()),
            action: "Audit".to_string(),
            secondary: None,
        },
        _ => return,
    };
    publish_in_background(ctx, event, placement.object_ref(&()));
}

/// Events are informational: published in the background so the reconcile (and the
/// placements queued behind it) do not wait for them.
fn publish_in_background(
    ctx: &Context,
    event: Event,
    reference: k8s_openapi::api::core::v1::ObjectReference,
) {
    let recorder = ctx.recorder.clone();
    let metrics = ctx.metrics.clone();
    // In the reconcile's span, so a failure still names the placement.
    let publish = async move {
        if let Err(err) = recorder.publish(&event, &reference).await {
            metrics.failed("event");
            tracing::warn!(error = %err, "publishing an event failed");
        }
    };
    tokio::spawn(publish.in_current_span());
}

/// Reports a failed reconcile in a Warning Event named after the step that failed
/// (`ApplyFailed`, `StatusFailed`...), so `kubectl describe` says what went wrong and when it
/// is tried again.
pub fn report_failure(
    ctx: &Context,
    object: &Lenient<ModelPlacement>,
    step: Step,
    error: &dyn std::fmt::Display,
    retry_in: std::time::Duration,
) {
    let event = Event {
        type_: EventType::Warning,
        reason: step.event_reason(),
        note: Some(
            format!(
                "the {step} step failed: {error}; retrying in {}s",
                retry_in.as_secs().max(1)
            )
            .chars()
            .take(1000)
            .collect(),
        ),
        action: "Reconcile".to_string(),
        secondary: None,
    };
    publish_in_background(ctx, event, object.object_ref(&()));
}

/// Reports a placement whose stored object does not decode in a Warning Event.
pub fn report_undecodable(ctx: &Context, object: &Lenient<ModelPlacement>, error: &str) {
    let event = Event {
        type_: EventType::Warning,
        reason: "Undecodable".to_string(),
        note: Some(
            format!("the controller cannot read this object and skips it: {error}")
                .chars()
                .take(1000)
                .collect(),
        ),
        action: "Plan".to_string(),
        secondary: None,
    };
    publish_in_background(ctx, event, object.object_ref(&()));
}
