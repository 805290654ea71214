//! One ModelPlacement reconcile, as a thin driver over the pure placement core:
//!
//! 1. dereference ([`dereference`](super::dereference)): the placement, the other waiting
//!    placements, the fleet view and the Nodes, all from watch caches;
//! 2. validate and build ([`decide`]): keep a plan while it is still valid, otherwise plan
//!    against the fleet minus what others hold, older waiting placements first (pure), on a
//!    snapshot of the ledger, then commit it ([`Ledger::commit`]);
//! 3. apply ([`apply`](super::apply)): the Node labels of every Node whose placements changed;
//! 4. status ([`status`](super::status)): the status subresource and Events, only on change.
//!
//! Each step has its own error type; [`Error::step`] says which step failed, and that one
//! [`Step`] names the failure in the metric, the Warning Event and the log.
//!
//! Reconciles run in parallel (`--placement-workers`; kube-runtime runs at most one per
//! placement at a time). Each holds the state lock ([`Context`]) twice, for moments: to take
//! a snapshot of the ledger and the fleet view, and to commit the plan made on the snapshot
//! without the lock. The commit is where "no device is handed out twice" is decided: it is
//! refused when another reconcile's commit took any of the plan's devices, planned a
//! placement this plan also planned, or the placement was deleted meanwhile; the reconcile
//! then plans again on a fresh snapshot, up to [`COMMIT_TRIES`] times, and otherwise comes
//! back shortly. Claims, templates, Node labels and the status are written after the commit,
//! outside the lock, so a slow write holds up no other placement. If such a write fails, the
//! ledger keeps the commitment and the retried reconcile keeps the same plan and writes it
//! again; a restart before then rebuilds the ledger from the statuses, which never named
//! that plan, so the devices are planned afresh (nothing is held twice or lost either way).
//!
//! "Older first" holds as before: every plan tries the older waiting placements before its
//! own, on its snapshot, and a new plan starts only once the placements older than it that
//! other workers are planning at that moment have committed ([`InFlightPlans`], waiting at
//! most [`OLDER_WAIT`]). So among new plans, planning and commits go in precedence order,
//! one at a time, without the duplicated work of several workers planning the same older
//! placements (which a burst of new placements would otherwise cause); their writes, and
//! every kept plan, run in parallel. Only an older plan that takes longer than `OLDER_WAIT`
//! lets a younger one plan beside it, and then the commit sorts out any collision.
//!
//! [`InFlightPlans`]: crate::controller::context::InFlightPlans
//!
//! [`Ledger::commit`]: crate::controller::core::ledger::Ledger::commit

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, Event as FinalizerEvent};
use kube::{Resource, ResourceExt};
use tracing::Instrument;

use crate::api::placement::AllocationMode;
use crate::api::{Lenient, ModelPlacement};
use crate::backoff::Backoff;

use super::apply::{ApplyError, nodes_labelled_for, nodes_to_check, sync_node_labels};
use super::claim_template::{TemplateWriteError, release_template, sync_template};
use super::claims::{ClaimError, device_health_in_cache, release_claims, sync_claims};
use super::conformance::{labelled_pods, verdict as conformance_verdict};
use super::core::claims::{self, ClaimsReport};
use super::core::decide::{Candidate, Decision, decide, keeps};
use super::core::desired::state_name;
use super::core::no_match::MAX_NAMED;
use super::core::outcome::Outcome;
use super::core::template;
use super::dereference::{
    DereferenceError, candidate, holding_may_stand, missing_nodes, still_placeable, waiting_keys,
    waiting_placements,
};
use super::pod_health::consumer_pods;
use super::status::{StatusError, report_failure, report_undecodable, write_status};
use crate::controller::cache::{claimed_in_cache, fleet_view, own_claims_in_cache, set_external};
use crate::controller::context::{Context, State, lock};
use crate::controller::core::fleet_view::FleetView;
use crate::controller::core::ledger::rebuild::{precedence_of, precedes};
use crate::controller::core::ledger::{Holding, PlacementKey};
use crate::controller::core::step::Step;

/// The finalizer that lets the controller remove a placement's Node labels.
pub use crate::names::keys::PLACEMENT_FINALIZER as FINALIZER;
/// How often a plan that holds is re-checked without any trigger.
const PLANNED_RESYNC: Duration = Duration::from_secs(600);
/// How often a placement that does not fit tries again without any trigger.
const PENDING_RETRY: Duration = Duration::from_secs(300);
/// Plans one reconcile makes (on fresh snapshots) before it gives way to the reconciles whose
/// commits kept colliding with its plans.
pub const COMMIT_TRIES: u32 = 4;
/// When a reconcile that gave way comes back.
const COMMIT_RETRY: Duration = Duration::from_millis(200);
/// How long a new plan waits for older placements being planned at the same moment to
/// commit first; past it, it plans anyway and the commit sorts out any collision.
pub const OLDER_WAIT: Duration = Duration::from_secs(2);
/// Waits after a placement's failed reconciles: 1 s, doubling up to 5 minutes, jittered into
/// the upper half of each step (a failure that hits every placement at once, such as an
/// apiserver restart, is not retried in one burst).
pub const ERROR_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));

/// What can make a reconcile fail (and be retried with backoff), by step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Dereference: the placement cannot be ordered among the others.
    #[error(transparent)]
    Dereference(#[from] DereferenceError),
    /// Apply: a Node label write failed.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// Status: the status write failed.
    #[error(transparent)]
    Status(#[from] StatusError),
    /// Claims: a ResourceClaim write failed.
    #[error(transparent)]
    Claims(#[from] ClaimError),
    /// Template: a ResourceClaimTemplate write failed.
    #[error(transparent)]
    Template(#[from] TemplateWriteError),
    /// Adding or removing the finalizer, or the work inside it, failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
}

impl Error {
    /// The step that failed. The work of a reconcile runs inside kube-runtime's finalizer
    /// helper, so most errors arrive wrapped in it: the step is the one inside, and only a
    /// failed finalizer write is the finalizer's own.
    pub fn step(&self) -> Step {
        match self {
            Self::Dereference(_) => Step::Dereference,
            Self::Apply(_) => Step::Apply,
            Self::Status(_) => Step::Status,
            Self::Claims(_) => Step::Claims,
            Self::Template(_) => Step::Template,
            Self::Finalizer(err) => match &**err {
                finalizer::Error::ApplyFailed(inner) | finalizer::Error::CleanupFailed(inner) => {
                    inner.step()
                }
                finalizer::Error::AddFinalizer(_)
                | finalizer::Error::RemoveFinalizer(_)
                | finalizer::Error::UnnamedObject
                | finalizer::Error::InvalidFinalizer => Step::Finalizer,
            },
        }
    }
}

/// The controller's entry point for one placement. It runs in a `reconcile` span carrying
/// the placement (`placement="ml/llama"`), so every line logged on its behalf (and by the
/// client under it) says which placement it is about.
pub async fn reconcile(
    object: Arc<Lenient<ModelPlacement>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let key = PlacementKey::new(object.namespace().unwrap_or_default(), object.name_any());
    let span = tracing::info_span!("reconcile", placement = %key);
    reconcile_placement(object, ctx).instrument(span).await
}

async fn reconcile_placement(
    object: Arc<Lenient<ModelPlacement>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let placement = match &*object {
        Lenient::Decoded(placement) => Arc::new(placement.clone()),
        Lenient::Undecodable { error, .. } => return Ok(skip_undecodable(&object, error, &ctx)),
    };
    let started = Instant::now();
    let key = precedence_of(&placement)?.key;
    let api: Api<ModelPlacement> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let waited = std::sync::Mutex::new(Duration::ZERO);
    // kube-runtime's finalizer helper spends a first reconcile on adding the finalizer alone.
    let adding_finalizer = placement.meta().deletion_timestamp.is_none()
        && !placement.finalizers().iter().any(|f| f == FINALIZER);
    let result = finalizer::finalizer(&api, FINALIZER, placement, |event| async {
        match event {
            FinalizerEvent::Apply(placement) => place(&placement, &api, &ctx, &waited).await,
            FinalizerEvent::Cleanup(placement) => cleanup(&placement, &ctx, &waited).await,
        }
    })
    .await
    .map_err(|err| Error::Finalizer(Box::new(err)));
    let waited = waited.into_inner().unwrap_or_default();
    if adding_finalizer && result.is_ok() {
        ctx.metrics.wrote("finalizer", started.elapsed());
    }
    ctx.metrics.reconciles.inc();
    ctx.metrics.lock_wait_seconds.observe(waited.as_secs_f64());
    ctx.metrics
        .reconcile_seconds
        .observe(started.elapsed().saturating_sub(waited).as_secs_f64());
    if result.is_ok()
        && let Ok(mut failures) = ctx.failures.lock()
    {
        failures.remove(&key);
    }
    result
}

/// A placement whose stored object does not decode: counted, reported in a Warning Event, and
/// left alone until it changes. It holds nothing (the ledger is built from decodable
/// statuses), so skipping it costs no other placement anything.
fn skip_undecodable(object: &Lenient<ModelPlacement>, error: &str, ctx: &Context) -> Action {
    ctx.metrics.observe_decoding("ModelPlacement", object);
    report_undecodable(ctx, object, error);
    Action::await_change()
}

/// Retries a failed reconcile with jittered exponential backoff per placement ([`ERROR_BACKOFF`]).
pub fn error_policy(
    placement: Arc<Lenient<ModelPlacement>>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    let step = error.step();
    ctx.metrics.reconcile_failed(step);
    let key = PlacementKey::new(
        placement.namespace().unwrap_or_default(),
        placement.name_any(),
    );
    let attempts = ctx.failures.lock().map_or(1, |mut failures| {
        let count = failures.entry(key.clone()).or_insert(0);
        *count = count.saturating_add(1);
        *count
    });
    let wait = ERROR_BACKOFF.wait(attempts);
    tracing::warn!(placement = %key, %step, %error, retry_in = ?wait, "reconcile failed");
    report_failure(&ctx, &placement, step, error, wait);
    Action::requeue(wait)
}

/// Decides for a live placement, then writes its Node labels and its status.
async fn place(
    placement: &ModelPlacement,
    api: &Api<ModelPlacement>,
    ctx: &Context,
    waited: &std::sync::Mutex<Duration>,
) -> Result<Action, Error> {
    let me = candidate(placement)?;
    // Read before the ledger lock: these are apiserver round trips, and every reconcile
    // waits on that lock.
    let own_claims = own_claims_in_cache(ctx, placement);
    let own_claims: Vec<&ResourceClaim> = own_claims.iter().map(|claim| &**claim).collect();
    let pods = consumer_pods(ctx, &own_claims).await;
    let Some(Decided {
        mut decision,
        fleet,
        refused_before,
    }) = decide_and_commit(ctx, &me, waited).await
    else {
        return Ok(Action::requeue(COMMIT_RETRY));
    };
    if decision.deferred {
        // Older placements go first; those planned on this turn get their labels now and
        // their statuses on their own reconciles, and this one comes back after them.
        sync_node_labels(ctx, &decision.changed_nodes).await?;
        requeue_each(ctx, &decision.planned_others);
        return Ok(Action::requeue(Duration::ZERO));
    }
    let claim_error = hold_by_claims(ctx, placement, &fleet, &mut decision).await;
    // Pods found when it was last judged keep it on the device-health cadence even on a
    // reconcile that does not judge them.
    let mut running_pods = pods.any
        || placement.status.as_ref().is_some_and(|status| {
            crate::api::conditions::find(&status.conditions, super::core::desired::CONFORMANT)
                .is_some_and(|c| c.status != "Unknown")
        });
    if let Outcome::Planned(planned) = &decision.outcome {
        decision.device_health = device_health_in_cache(ctx, placement, &pods.pods);
        // The claims' pods were read above; the labelled ones are listed here, when due.
        let judging = planned
            .engine
            .clone()
            .map(|engine| (engine, conformance_due(ctx, placement, &me.precedence.key)));
        if let Some((engine, Judging::FirstPlan)) = &judging {
            // Pods of a plan made just now are its claims' at most: judged on those, with
            // no list, so the first status already carries the condition and a later check
            // that still finds no pod writes nothing.
            decision.conformance = Some(conformance_verdict(
                ctx,
                placement,
                engine,
                pods.pods.iter().cloned(),
            ));
        }
        if let Some((engine, Judging::Now)) = judging {
            let labelled = labelled_pods(ctx, placement).await;
            let verdict = conformance_verdict(
                ctx,
                placement,
                &engine,
                pods.pods.iter().cloned().chain(labelled),
            );
            running_pods |= verdict.pods > 0;
            if let Ok(mut idle) = ctx.idle_devices.lock() {
                idle.insert(me.precedence.key.clone(), verdict.idle_devices());
            }
            decision.conformance = Some(verdict);
        }
    }
    let template_error = write_template(ctx, placement, &fleet, &mut decision).await;
    let check_nodes = nodes_to_check(&decision);
    decision.unlabeled = missing_nodes(ctx, decision.outcome.status());
    // The Node labels and the status go out together, so a reconcile costs one apiserver
    // round trip rather than two. The status says Ready on the assumption that the labels
    // land; when a label write fails, a second status write takes that back before the
    // reconcile is retried. Once a Node has refused a write, that assumption is no longer
    // fair: the labels go first and the status says what happened, so Ready does not flap
    // on every retry while the refusal lasts.
    let current = placement.status.as_ref();
    let (labels, written) = if refused_before {
        let labels = sync_node_labels(ctx, &check_nodes).await;
        if let Err(err) = &labels {
            decision.label_error = Some(err.to_string());
        }
        let written = write_status(placement, current, api, ctx, &decision).await;
        (labels, written)
    } else {
        tokio::join!(
            sync_node_labels(ctx, &check_nodes),
            write_status(placement, current, api, ctx, &decision),
        )
    };
    requeue_each(ctx, &decision.planned_others);
    if let Err(err) = labels {
        // After a refusal the status already says so; else Ready is taken back now.
        let taken_back = if refused_before {
            written.map(drop)
        } else {
            decision.label_error = Some(err.to_string());
            let written = written.ok().flatten();
            write_status(placement, written.as_ref().or(current), api, ctx, &decision)
                .await
                .map(drop)
        };
        if let Err(status_err) = taken_back {
            tracing::warn!(error = %status_err, "could not mark the placement not Ready");
        }
        return Err(err.into());
    }
    written?;
    if let Some(err) = claim_error {
        return Err(err.into());
    }
    if let Some(err) = template_error {
        return Err(err.into());
    }
    Ok(match decision.outcome {
        // A pod's status change is no event here: its device health and its conformance
        // are polled.
        Outcome::Planned(_) if running_pods => {
            Action::requeue(ctx.device_health_interval.min(PLANNED_RESYNC))
        }
        Outcome::Planned(_) => Action::requeue(PLANNED_RESYNC),
        Outcome::Unschedulable(_) => Action::requeue(PENDING_RETRY),
        Outcome::Invalid(_) => Action::await_change(),
    })
}

/// When a Planned placement's pods are judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Judging {
    /// The reconcile that first plans it: on its claims' pods only, without a list.
    FirstPlan,
    /// Now, its labelled pods listed too.
    Now,
    /// Not on this reconcile: the `Conformant` condition stays as last written.
    Later,
}

/// How a Planned placement's pods are judged on this reconcile: on the one that first plans
/// it, on its claims' pods alone (labelled pods cannot run a plan not yet written, and a burst
/// of new placements lists nothing), then with a list at most once per
/// `--device-health-interval`.
fn conformance_due(ctx: &Context, placement: &ModelPlacement, key: &PlacementKey) -> Judging {
    let planned_before = placement
        .status
        .as_ref()
        .and_then(|status| status.state.as_deref())
        == Some("Planned");
    let Ok(mut checked) = ctx.conformance_checked.lock() else {
        return Judging::Later;
    };
    let now = Instant::now();
    if !planned_before {
        checked.insert(key.clone(), now);
        return Judging::FirstPlan;
    }
    match checked.get(key) {
        Some(at) if now.duration_since(*at) < ctx.device_health_interval => Judging::Later,
        _ => {
            checked.insert(key.clone(), now);
            Judging::Now
        }
    }
}

/// Frees a deleted placement's devices and removes its Node labels; the finalizer goes only
/// once the labels are gone. The devices are free from the moment the ledger forgets them,
/// which may be moments before the label write lands; a failed label write is retried on
/// the Nodes that still carry the placement's label.
async fn cleanup(
    placement: &ModelPlacement,
    ctx: &Context,
    waited: &std::sync::Mutex<Duration>,
) -> Result<Action, Error> {
    let key = precedence_of(placement)?.key;
    release_claims(ctx, placement).await?;
    if had_template(placement) {
        release_template(ctx, placement).await?;
    }
    let (removed, nodes) = {
        let mut state = lock(ctx, waited).await;
        let mut nodes = nodes_labelled_for(ctx, &state, &key);
        let removed = state.ledger.forget(&key);
        nodes.extend(removed.iter().flat_map(Holding::nodes));
        state.states.remove(&key);
        publish_gauges(ctx, &state);
        if removed.is_some() {
            requeue_waiting(ctx, &state, &key);
        }
        (removed, nodes)
    };
    if removed.is_some() {
        tracing::info!(placement = %key, "placement deleted; its devices are free");
    }
    sync_node_labels(ctx, &nodes).await?;
    Ok(Action::await_change())
}

/// A decision committed to the ledger, the fleet view it was made on, and whether a Node it
/// must label refused a label write before.
struct Decided {
    decision: Decision,
    fleet: Arc<FleetView>,
    refused_before: bool,
}

/// Decides for `me` and commits the decision to the ledger; `None` when every try collided
/// with other reconciles' commits (the caller comes back shortly). A kept plan is decided
/// under the lock at once (it changes nothing); anything else is planned on a snapshot
/// without the lock and committed.
async fn decide_and_commit(
    ctx: &Context,
    me: &Candidate<'_>,
    waited: &std::sync::Mutex<Duration>,
) -> Option<Decided> {
    let key = &me.precedence.key;
    let mut in_flight = None;
    let mut attempt = 0;
    while attempt < COMMIT_TRIES {
        let (fleet, snapshot) = {
            let mut state = lock(ctx, waited).await;
            let fleet = fleet_view(ctx, &mut state);
            // Every device an allocated claim holds is taken, whoever holds the claim,
            // unless the ledger already counts it for the claim's own placement.
            let external = claimed_in_cache(ctx, &state.ledger, || fleet.clone());
            set_external(ctx, &mut state.ledger, external);
            if keeps(&state.ledger, me, &fleet) {
                let deciding = Instant::now();
                let decision = decide(&mut state.ledger, me, &[], &fleet);
                ctx.metrics
                    .decide_seconds
                    .observe(deciding.elapsed().as_secs_f64());
                return Some(committed(ctx, &mut state, me, decision, fleet));
            }
            if in_flight.is_none() {
                // Older first: placements older than this one that are being planned right
                // now commit first, then this one plans on what they left.
                drop(state);
                let started = Instant::now();
                in_flight = Some(ctx.in_flight.enter(&me.precedence, OLDER_WAIT).await);
                if let Ok(mut waited) = waited.lock() {
                    *waited += started.elapsed();
                }
                continue;
            }
            let snapshot = state.ledger.snapshot();
            (fleet, snapshot)
        };
        attempt += 1;
        let deciding = Instant::now();
        let waiting = waiting_placements(ctx);
        // `decide` tries only placements older than this one: the others are left out here,
        // before a candidate copies their names.
        let older: Vec<Candidate<'_>> = waiting
            .iter()
            .filter_map(|p| p.decoded())
            .filter(|p| precedes(p, &me.precedence))
            .filter_map(|p| candidate(p).ok())
            .filter(|c| c.precedence.key != *key)
            .collect();
        let mut draft = snapshot;
        let decision = decide(&mut draft, me, &older, &fleet);
        ctx.metrics
            .decide_seconds
            .observe(deciding.elapsed().as_secs_f64());
        let mut state = lock(ctx, waited).await;
        let alive = |key: &PlacementKey, holding: &Holding| still_placeable(ctx, key, holding);
        match state.ledger.commit(draft, key, alive) {
            Ok(done) if done.stale_refusals.contains(key) && attempt < COMMIT_TRIES => {
                // Devices were freed while this refusal was made: it may fit now.
                ctx.metrics.commit_conflicts.inc();
            }
            Ok(_) => return Some(committed(ctx, &mut state, me, decision, fleet)),
            Err(conflict) => {
                ctx.metrics.commit_conflicts.inc();
                tracing::debug!(%conflict, attempt, "plan collided with another commit; planning again");
            }
        }
    }
    tracing::debug!(
        tries = COMMIT_TRIES,
        "every plan collided with other commits; coming back shortly"
    );
    None
}

/// Bookkeeping for a committed decision, under the lock: the placement's state for the
/// gauges, a wake-up for waiting placements when devices were freed, and whether a Node it
/// must label refused a write before.
fn committed(
    ctx: &Context,
    state: &mut State,
    me: &Candidate<'_>,
    mut decision: Decision,
    fleet: Arc<FleetView>,
) -> Decided {
    // A refusal made just now names devices still held for placements that no longer exist
    // (the prune pass frees them within a second; until then they are missing from the plan
    // for no visible reason). A remembered refusal skips the look: it costs a cache lookup
    // per holding, and the release that pruning counts makes the refusal stale anyway.
    if !decision.remembered
        && !decision.deferred
        && let Outcome::Unschedulable(status) = &mut decision.outcome
    {
        status.reasons.extend(
            state
                .ledger
                .ghost_devices(|key, uid| holding_may_stand(ctx, key, uid), MAX_NAMED),
        );
    }
    let state_changed = !decision.deferred
        && state
            .states
            .insert(me.precedence.key.clone(), state_name(&decision.outcome))
            != Some(state_name(&decision.outcome));
    // A kept plan changes neither holdings nor states: the gauges and the fleet pass (which
    // `publish_gauges` wakes) have nothing new to count. At 3,000 placements every kept
    // reconcile woke a pass over every inventory.
    let holdings_changed = !decision.kept
        || decision.freed
        || !decision.planned_others.is_empty()
        || !decision.changed_nodes.is_empty();
    if state_changed || holdings_changed {
        publish_gauges(ctx, state);
    }
    if decision.freed {
        requeue_waiting(ctx, state, &me.precedence.key);
    }
    let refused_before = nodes_to_check(&decision)
        .iter()
        .any(|n| state.refused_labels.contains(n));
    Decided {
        decision,
        fleet,
        refused_before,
    }
}

/// Makes the placement's ResourceClaims match its decision (none unless it is planned and
/// held by claims) and records what they are in the decision. A failed write is recorded
/// too, so the status says so, and returned, so the reconcile is retried.
async fn hold_by_claims(
    ctx: &Context,
    placement: &ModelPlacement,
    fleet: &FleetView,
    decision: &mut Decision,
) -> Option<ClaimError> {
    ctx.claims.as_ref()?;
    let namespace = placement.namespace().unwrap_or_default();
    let mode = placement.spec.allocation.unwrap_or_default();
    let wanted = match &decision.outcome {
        Outcome::Planned(status) => {
            claims::holding(&namespace, &placement.name_any(), mode, status, fleet)
        }
        _ => claims::Holding::Labels,
    };
    let plans = match &wanted {
        claims::Holding::Claims(plans) => plans.as_slice(),
        claims::Holding::Labels => &[],
        claims::Holding::Unclaimable(why) => {
            // Keep whatever claims exist: the devices may come back, and a running
            // workload holds them anyway.
            decision.claims = Some(ClaimsReport {
                error: Some(why.clone()),
                ..ClaimsReport::default()
            });
            return None;
        }
    };
    let result = sync_claims(ctx, placement, plans).await;
    let held_by_claims = matches!(wanted, claims::Holding::Claims(_));
    match result {
        Ok(report) => {
            if held_by_claims {
                decision.claims = Some(report);
            }
            None
        }
        Err(err) => {
            if held_by_claims {
                let mut report = ClaimsReport::new(plans, &Default::default());
                report.error = Some(err.to_string());
                decision.claims = Some(report);
            }
            Some(err)
        }
    }
}

/// Writes the placement's ResourceClaimTemplate when it is planned in `claimTemplate` mode,
/// and deletes one it had when it is not (another mode, or no plan: a template that lists
/// alternatives nothing can satisfy would leave pods Pending with no reason of ours). A
/// failed write is recorded, so Ready says so, and returned, so the reconcile is retried.
async fn write_template(
    ctx: &Context,
    placement: &ModelPlacement,
    fleet: &FleetView,
    decision: &mut Decision,
) -> Option<TemplateWriteError> {
    // Without DRA there is no template API, and the plan (on DRA devices only) is empty.
    ctx.claims.as_ref()?;
    let planned = matches!(&decision.outcome, Outcome::Planned(s) if s.claim_template.is_some());
    let result = if planned {
        let namespace = placement.namespace().unwrap_or_default();
        let choices =
            template::alternatives(&placement.spec, &namespace, &placement.name_any(), fleet);
        let alternatives: Vec<_> = choices.into_iter().map(|c| c.alternative).collect();
        sync_template(ctx, placement, &alternatives).await
    } else if had_template(placement) {
        release_template(ctx, placement).await
    } else {
        return None;
    };
    let err = result.err()?;
    decision.template_error = Some(err.to_string());
    Some(err)
}

/// True when the placement may have a template of ours: its spec asks for one or its
/// status names one (it was in that mode before).
fn had_template(placement: &ModelPlacement) -> bool {
    placement.spec.allocation == Some(AllocationMode::ClaimTemplate)
        || placement
            .status
            .as_ref()
            .is_some_and(|s| s.claim_template.is_some())
}

/// Reconciles again every placement other than `except` that holds nothing, so freed
/// devices go to the oldest waiter (each plans the older ones first).
pub(super) fn requeue_waiting(ctx: &Context, state: &State, except: &PlacementKey) {
    requeue_each(ctx, &waiting_keys(ctx, state, except));
}

/// Reconciles each of `keys` again: older placements planned on another's turn write their
/// statuses on their own reconciles.
fn requeue_each(ctx: &Context, keys: &[PlacementKey]) {
    for key in keys {
        let _ = ctx.requeue_one.send(key.clone());
    }
}

/// Placements per state and devices reserved, as gauges.
pub(super) fn publish_gauges(ctx: &Context, state: &State) {
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for name in state.states.values() {
        *counts.entry(name).or_default() += 1;
    }
    ctx.metrics.set_states(counts);
    ctx.metrics
        .devices_reserved
        .set(i64::try_from(state.ledger.devices_reserved()).unwrap_or(i64::MAX));
    // Holdings or states may have changed: the fleet gauges and freeDevices follow.
    ctx.fleet_changed.notify_one();
}
