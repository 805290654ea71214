//! One ModelPlacement reconcile: dereference → validate → build → apply → status.
//!
//! * dereference: the placement, the inventories and Node labels come from watch caches;
//! * validate and build: [`decide`] (pure) keeps a placement's plan while it is still valid,
//!   otherwise plans it against the inventories minus what the ledger says others hold —
//!   giving older waiting placements their turn first — and records the result in the ledger;
//! * apply: every Node whose set of placements changed gets its complete set of
//!   `placement.hwaccel.io/*` labels by server-side apply (labels of placements that are gone
//!   disappear by omission);
//! * status: written by server-side apply on the status subresource, only when it changed,
//!   with an Event when the state or the reason changes.
//!
//! All reconciles run under one async lock: planning is milliseconds, and serialising it is
//! what makes "no device is handed out twice" and "older first" simple and certain.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::finalizer::{self, Event as FinalizerEvent};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{Mutex, mpsc};

use crate::api::conditions;
use crate::api::placement::{ModelPlacementSpec, ModelPlacementStatus};
use crate::api::{AcceleratorInventory, Lenient, ModelPlacement};

use super::build::{Outcome, evaluate};
use super::fleet_view::{FleetView, PartCache};
use super::labels::{is_placement_label, labels_by_node};
use super::ledger::{Holding, Ledger, PlacementKey, Precedence, Tried};
use super::metrics::ControllerMetrics;

/// The field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "hwaccel-controller";
/// The finalizer that lets the controller remove a placement's Node labels.
pub const FINALIZER: &str = "hwaccel.io/placement-cleanup";
/// The condition saying whether the placement has a plan.
pub const PLANNED: &str = "Planned";
/// The condition saying an assigned device went bad while the plan is kept.
pub const DEGRADED: &str = conditions::DEGRADED;
/// The condition saying workloads can use the placement now: it is planned, every planned
/// Node carries its placement label (so `status.nodeSelector` selects exactly them), and no
/// assigned device is degraded. The controller runs no workloads, so this is as far as it
/// can vouch.
pub const READY: &str = conditions::READY;

/// How often a plan that holds is re-checked without any trigger.
const PLANNED_RESYNC: Duration = Duration::from_secs(600);
/// How often a placement that does not fit tries again without any trigger.
const PENDING_RETRY: Duration = Duration::from_secs(300);
/// How long the Node watch cache may lag behind a label write of ours before a difference
/// means someone else changed the labels.
pub const CACHE_LAG: Duration = Duration::from_secs(10);
/// Node label writes one reconcile has in flight at once.
const PARALLEL_NODE_WRITES: usize = 16;
/// Longest wait after repeated failures.
const MAX_ERROR_BACKOFF: Duration = Duration::from_secs(300);

/// What can make a reconcile fail (and be retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Adding or removing the finalizer, or the work inside it, failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
    /// The object lacks a namespace or creation time (never for objects from the apiserver).
    #[error("placement {0} lacks metadata the controller needs")]
    Metadata(String),
}

/// Mutable controller state, behind one lock.
#[derive(Debug, Default)]
pub struct State {
    /// Who holds which devices.
    pub ledger: Ledger,
    /// Placement labels last applied per Node, and when, to tell the watch cache lagging
    /// behind our own write from someone having changed the labels since.
    pub applied_labels: BTreeMap<String, (BTreeMap<String, String>, Instant)>,
    /// Last state per placement, for the gauges.
    pub states: BTreeMap<PlacementKey, &'static str>,
    /// The planner's view of the fleet and the fleet epoch it was built at.
    fleet_cache: Option<(u64, Arc<FleetView>)>,
    /// Converted inventories, so a rebuild converts only the changed ones.
    parts: PartCache,
    /// Nodes whose inventory disappeared while the Node stayed, and since when.
    missing_inventories: BTreeMap<String, Instant>,
}

/// Everything a reconcile needs.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Placements, as the controller's own watch sees them.
    pub placements: Store<Lenient<ModelPlacement>>,
    /// Inventories in scope.
    pub inventories: Store<Lenient<AcceleratorInventory>>,
    /// Node metadata in scope.
    pub nodes: Store<PartialObjectMeta<Node>>,
    /// The lock every reconcile holds.
    pub state: Mutex<State>,
    /// Metrics.
    pub metrics: ControllerMetrics,
    /// Event recorder.
    pub recorder: Recorder,
    /// Placements to reconcile again (older ones planned on another's turn, waiting ones
    /// when devices are freed).
    pub requeue: mpsc::UnboundedSender<()>,
    /// Consecutive failures per placement, for the backoff.
    pub failures: std::sync::Mutex<HashMap<PlacementKey, u32>>,
    /// Bumped by the watches after the caches took in a change of inventories or of Nodes'
    /// non-placement labels.
    pub fleet_epoch: Arc<AtomicU64>,
    /// How long plans on a Node whose inventory disappeared are kept (see [`Config`]).
    ///
    /// [`Config`]: super::Config
    pub inventory_grace: Duration,
}

/// A placement as [`decide`] sees it.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    /// Order among placements.
    pub precedence: Precedence,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.generation`.
    pub generation: i64,
    /// The spec.
    pub spec: &'a ModelPlacementSpec,
}

/// What [`decide`] concluded for one placement.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The outcome for the placement reconciled.
    pub outcome: Outcome,
    /// True when an existing plan was kept as it was.
    pub kept: bool,
    /// Why an earlier plan was dropped, when its devices are gone.
    pub replanned: Option<String>,
    /// Nodes whose placement labels change.
    pub changed_nodes: BTreeSet<String>,
    /// Older placements that got devices on this turn.
    pub planned_others: Vec<PlacementKey>,
    /// True when devices were released (waiting placements may fit now).
    pub freed: bool,
    /// Assigned devices still present but no longer usable (`node/device (why)`): the plan
    /// is kept — moving a running workload is worse — and marked Degraded.
    pub degraded: Vec<String>,
    /// Planned Nodes that could not be labelled because the Node object is gone (filled in
    /// after the labels are written).
    pub unlabeled: Vec<String>,
    /// Why writing the placement labels failed, if it did.
    pub label_error: Option<String>,
    /// True when older placements still wait to be tried, so `me` was not decided on this
    /// turn (the outcome means nothing) and must be reconciled again.
    pub deferred: bool,
}

/// Older placements one decision tries before its own: bounds the time one reconcile plans
/// (a few milliseconds each on a 1,000-node fleet) when many placements arrive at once.
pub const OLDER_PER_TURN: usize = 8;

/// Decides for `me`, updating the ledger. `older_pending` are placements that hold nothing,
/// in any order; those older than `me` are tried first, in precedence order, skipping those
/// known not to fit. When more than [`OLDER_PER_TURN`] need trying, the decision tries that
/// many and is deferred: `me` comes only after every older placement had its try.
pub fn decide(
    ledger: &mut Ledger,
    me: &Candidate<'_>,
    older_pending: &[Candidate<'_>],
    fleet: &FleetView,
) -> Decision {
    let key = &me.precedence.key;
    let mut decision = Decision {
        outcome: Outcome::Invalid(ModelPlacementStatus::default()),
        kept: false,
        replanned: None,
        changed_nodes: BTreeSet::new(),
        planned_others: Vec::new(),
        freed: false,
        degraded: Vec::new(),
        unlabeled: Vec::new(),
        label_error: None,
        deferred: false,
    };
    if let Some(holding) = ledger.get(key) {
        let same_object = holding.uid == me.uid && holding.generation == me.generation;
        match fleet.holds(holding.assignments()) {
            Ok(()) if same_object => {
                decision.degraded = fleet.degraded(holding.assignments());
                decision.outcome = Outcome::Planned(holding.status.clone());
                decision.kept = true;
                return decision;
            }
            Ok(()) => {}
            Err(why) => decision.replanned = Some(why),
        }
        if let Some(old) = ledger.remove(key) {
            decision.changed_nodes.extend(old.nodes());
            decision.freed = true;
        }
    }
    let mut older: Vec<&Candidate<'_>> = older_pending
        .iter()
        .filter(|c| c.precedence < me.precedence && ledger.get(&c.precedence.key).is_none())
        .filter(|c| {
            ledger
                .known_unfit(&c.precedence.key, &tried(c, fleet))
                .is_none()
        })
        .collect();
    older.sort_by(|a, b| a.precedence.cmp(&b.precedence));
    decision.deferred = older.len() > OLDER_PER_TURN;
    for other in older.into_iter().take(OLDER_PER_TURN) {
        if let Some(nodes) = try_to_plan(ledger, other, fleet).1 {
            decision.changed_nodes.extend(nodes);
            decision.planned_others.push(other.precedence.key.clone());
        }
    }
    if decision.deferred {
        return decision;
    }
    if let Some(refusal) = ledger.known_unfit(key, &tried(me, fleet)) {
        decision.outcome = refusal.clone();
        return decision;
    }
    let (outcome, nodes) = try_to_plan(ledger, me, fleet);
    decision.changed_nodes.extend(nodes.into_iter().flatten());
    decision.outcome = outcome;
    decision
}

/// Plans `candidate` against the fleet minus what others hold. A plan is entered in the
/// ledger (its Nodes are returned); a refusal is remembered as unfit for this fleet and the
/// ledger's current releases.
fn try_to_plan(
    ledger: &mut Ledger,
    candidate: &Candidate<'_>,
    fleet: &FleetView,
) -> (Outcome, Option<BTreeSet<String>>) {
    let key = &candidate.precedence.key;
    let reserved = ledger.reserved_by_others(key);
    let outcome = evaluate(candidate.spec, &key.namespace, &key.name, fleet, &reserved);
    match &outcome {
        Outcome::Planned(status) => {
            let holding = holding_for(candidate, status.clone());
            let nodes = holding.nodes();
            match ledger.insert(key.clone(), holding) {
                Ok(()) => (outcome, Some(nodes)),
                // The planner was told which devices were taken, so the ledger refusing the
                // plan is a bug; refusing the placement is the safe answer.
                Err(conflict) => {
                    tracing::error!(placement = %key, %conflict, "a plan overlaps the ledger");
                    let refusal = Outcome::Unschedulable(ModelPlacementStatus {
                        reasons: vec![format!("internal: {conflict}")],
                        ..ModelPlacementStatus::default()
                    });
                    (refusal, None)
                }
            }
        }
        Outcome::Unschedulable(_) | Outcome::Invalid(_) => {
            ledger.mark_unfit(key.clone(), tried(candidate, fleet), outcome.clone());
            (outcome, None)
        }
    }
}

/// The placement version and fleet a try is made with.
fn tried(candidate: &Candidate<'_>, fleet: &FleetView) -> Tried {
    Tried {
        uid: candidate.uid.clone(),
        generation: candidate.generation,
        fleet: fleet.id(),
    }
}

fn holding_for(candidate: &Candidate<'_>, status: ModelPlacementStatus) -> Holding {
    Holding {
        created: candidate.precedence.created,
        uid: candidate.uid.clone(),
        generation: candidate.generation,
        status,
    }
}

/// The key and precedence of a placement.
pub fn precedence_of(placement: &ModelPlacement) -> Result<Precedence, Error> {
    let namespace = placement
        .namespace()
        .ok_or_else(|| Error::Metadata(placement.name_any()))?;
    let created = placement
        .meta()
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second());
    Ok(Precedence {
        created,
        key: PlacementKey::new(namespace, placement.name_any()),
    })
}

fn candidate(placement: &ModelPlacement) -> Result<Candidate<'_>, Error> {
    Ok(Candidate {
        precedence: precedence_of(placement)?,
        uid: placement.uid().unwrap_or_default(),
        generation: placement.meta().generation.unwrap_or(0),
        spec: &placement.spec,
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
        uid: placement.uid().unwrap_or_default(),
        generation: status
            .observed_generation
            .or(placement.meta().generation)
            .unwrap_or(0),
        status: kept,
    };
    Some((precedence.key, holding))
}

/// The controller's entry point for one placement.
pub async fn reconcile(
    object: Arc<Lenient<ModelPlacement>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let placement = match &*object {
        Lenient::Decoded(placement) => Arc::new(placement.clone()),
        Lenient::Undecodable { error, .. } => return Ok(skip_undecodable(&object, error, &ctx)),
    };
    let started = Instant::now();
    let namespace = placement
        .namespace()
        .ok_or_else(|| Error::Metadata(placement.name_any()))?;
    let api: Api<ModelPlacement> = Api::namespaced(ctx.client.clone(), &namespace);
    let key = PlacementKey::new(namespace, placement.name_any());
    let waited = std::sync::Mutex::new(Duration::ZERO);
    // kube-runtime's finalizer helper spends a first reconcile on adding the finalizer alone.
    let adding_finalizer = placement.meta().deletion_timestamp.is_none()
        && !placement.finalizers().iter().any(|f| f == FINALIZER);
    let result = finalizer::finalizer(&api, FINALIZER, placement, |event| async {
        match event {
            FinalizerEvent::Apply(placement) => apply(&placement, &api, &ctx, &waited).await,
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
    Action::await_change()
}

/// Retries a failed reconcile with exponential backoff per placement.
pub fn error_policy(
    placement: Arc<Lenient<ModelPlacement>>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    let reason = match error {
        Error::Kube(_) => "api",
        Error::Finalizer(_) => "finalizer",
        Error::Metadata(_) => "metadata",
    };
    ctx.metrics.failed(reason);
    let key = PlacementKey::new(
        placement.namespace().unwrap_or_default(),
        placement.name_any(),
    );
    let attempts = ctx.failures.lock().map_or(1, |mut failures| {
        let count = failures.entry(key.clone()).or_insert(0);
        *count = count.saturating_add(1);
        *count
    });
    let wait = Duration::from_millis(500)
        .saturating_mul(2u32.saturating_pow(attempts.min(12)))
        .min(MAX_ERROR_BACKOFF);
    tracing::warn!(placement = %key, %error, retry_in = ?wait, "reconcile failed");
    Action::requeue(wait)
}

async fn apply(
    placement: &ModelPlacement,
    api: &Api<ModelPlacement>,
    ctx: &Context,
    waited: &std::sync::Mutex<Duration>,
) -> Result<Action, Error> {
    let me = candidate(placement)?;
    let mut state = lock(ctx, waited).await;
    let deciding = Instant::now();
    let fleet = fleet_view(ctx, &mut state);
    let waiting: Vec<Arc<Lenient<ModelPlacement>>> = ctx
        .placements
        .state()
        .into_iter()
        .filter(|p| p.meta().deletion_timestamp.is_none())
        .filter(|p| {
            p.decoded().is_some_and(|p| {
                p.status.as_ref().and_then(|s| s.state.as_deref()) != Some("Invalid")
            })
        })
        .collect();
    let older: Vec<Candidate<'_>> = waiting
        .iter()
        .filter_map(|p| candidate(p.decoded()?).ok())
        .filter(|c| c.precedence.key != me.precedence.key)
        .collect();
    let decision = decide(&mut state.ledger, &me, &older, &fleet);
    ctx.metrics
        .decide_seconds
        .observe(deciding.elapsed().as_secs_f64());
    if decision.deferred {
        // Older placements go first; those planned on this turn get their labels now and
        // their statuses on their own reconciles, and this one comes back after them.
        sync_node_labels(ctx, &mut state, &decision.changed_nodes).await?;
        drop(state);
        let _ = ctx.requeue.send(());
        return Ok(Action::requeue(Duration::ZERO));
    }
    // A kept plan re-checks its Nodes too (no write unless a label went missing).
    let mut check_nodes = decision.changed_nodes.clone();
    if decision.kept {
        check_nodes.extend(
            decision
                .outcome
                .status()
                .assignments
                .iter()
                .map(|a| a.node.clone()),
        );
    }
    let mut decision = decision;
    decision.unlabeled = decision
        .outcome
        .status()
        .assignments
        .iter()
        .map(|a| a.node.clone())
        .filter(|node| ctx.nodes.get(&ObjectRef::new(node)).is_none())
        .collect::<BTreeSet<String>>()
        .into_iter()
        .collect();
    let state_name = state_name(&decision.outcome);
    state.states.insert(me.precedence.key.clone(), state_name);
    publish_gauges(ctx, &state);
    if decision.freed {
        requeue_waiting(ctx, &state, &me.precedence.key);
    }
    // The Node labels and the status go out together, so a reconcile costs one apiserver
    // round trip rather than two. The status says Ready on the assumption that the labels
    // land; when a label write fails, a second status write takes that back before the
    // reconcile is retried.
    let current = placement.status.as_ref();
    let (labels, written) = tokio::join!(
        sync_node_labels(ctx, &mut state, &check_nodes),
        write_status(placement, current, api, ctx, &decision),
    );
    drop(state);
    if !decision.planned_others.is_empty() {
        let _ = ctx.requeue.send(());
    }
    if let Err(err) = labels {
        decision.label_error = Some(err.to_string());
        let written = written.ok().flatten();
        if let Err(status_err) =
            write_status(placement, written.as_ref().or(current), api, ctx, &decision).await
        {
            tracing::warn!(error = %status_err, "could not mark the placement not Ready");
        }
        return Err(err);
    }
    written?;
    Ok(match decision.outcome {
        Outcome::Planned(_) => Action::requeue(PLANNED_RESYNC),
        Outcome::Unschedulable(_) => Action::requeue(PENDING_RETRY),
        Outcome::Invalid(_) => Action::await_change(),
    })
}

async fn cleanup(
    placement: &ModelPlacement,
    ctx: &Context,
    waited: &std::sync::Mutex<Duration>,
) -> Result<Action, Error> {
    let key = precedence_of(placement)?.key;
    let mut state = lock(ctx, waited).await;
    let nodes = state
        .ledger
        .get(&key)
        .map(Holding::nodes)
        .unwrap_or_default();
    let removed = state.ledger.forget(&key);
    if let Err(err) = sync_node_labels(ctx, &mut state, &nodes).await {
        // Keep the holding until the labels are gone, so a retry removes them.
        if let Some(holding) = removed {
            let _ = state.ledger.insert(key, holding);
        }
        return Err(err);
    }
    state.states.remove(&key);
    publish_gauges(ctx, &state);
    if removed.is_some() {
        tracing::info!(placement = %key, "placement deleted; its devices are free");
        requeue_waiting(ctx, &state, &key);
    }
    Ok(Action::await_change())
}

/// Takes the reconcile lock, recording how long that took.
async fn lock<'a>(
    ctx: &'a Context,
    waited: &std::sync::Mutex<Duration>,
) -> tokio::sync::MutexGuard<'a, State> {
    let started = Instant::now();
    let guard = ctx.state.lock().await;
    if let Ok(mut waited) = waited.lock() {
        *waited = started.elapsed();
    }
    guard
}

/// Reconciles again when some placement other than `except` holds nothing, so freed
/// devices go to the oldest waiter.
fn requeue_waiting(ctx: &Context, state: &State, except: &PlacementKey) {
    let someone_waits = ctx.placements.state().iter().any(|placement| {
        placement.decoded().is_some_and(|placement| {
            precedence_of(placement)
                .is_ok_and(|p| &p.key != except && state.ledger.get(&p.key).is_none())
        })
    });
    if someone_waits {
        let _ = ctx.requeue.send(());
    }
}

fn state_name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Planned(_) => "Planned",
        Outcome::Unschedulable(_) => "Pending",
        Outcome::Invalid(_) => "Invalid",
    }
}

fn publish_gauges(ctx: &Context, state: &State) {
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for name in state.states.values() {
        *counts.entry(name).or_default() += 1;
    }
    ctx.metrics.set_states(counts);
    ctx.metrics
        .devices_reserved
        .set(i64::try_from(state.ledger.devices_reserved()).unwrap_or(i64::MAX));
}

/// Builds the planner's view of the fleet before the first reconcile needs it (converting
/// every inventory is the one slow step, and it belongs to start-up, not to a reconcile).
pub async fn warm_up(ctx: &Context) {
    let mut state = ctx.state.lock().await;
    fleet_view(ctx, &mut state);
}

/// The inventories (and Node labels) as the planner sees them, rebuilt only when the watches
/// saw a change since the last build.
fn fleet_view(ctx: &Context, state: &mut State) -> Arc<FleetView> {
    // Read before the caches: a change landing in between makes the view newer than its
    // epoch, never older, and the next bump rebuilds it.
    let epoch = ctx.fleet_epoch.load(Ordering::Acquire);
    if let Some((built_at, view)) = &state.fleet_cache
        && *built_at == epoch
    {
        return view.clone();
    }
    let building = Instant::now();
    let node_labels: BTreeMap<String, BTreeMap<String, String>> = ctx
        .nodes
        .state()
        .iter()
        .map(|node| {
            let labels = node
                .labels()
                .iter()
                .filter(|(k, _)| !is_placement_label(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            (node.name_any(), labels)
        })
        .collect();
    let inventories = ctx.inventories.state();
    let had_inventory = state.parts.names();
    // Only inventories that describe the Node they are named after: the agent's admission
    // policy ties an agent to the inventory named after its Node, so an inventory naming
    // another node in spec.nodeName would let one node's agent attract models to another.
    let parts = state.parts.refresh(
        inventories
            .iter()
            .filter_map(|i| i.decoded())
            .filter(|i| super::fleet_view::names_its_node(i)),
    );
    let awaiting = awaited_inventories(ctx, state, &had_inventory);
    let view = Arc::new(FleetView::from_parts(parts, &node_labels).with_awaiting(awaiting));
    ctx.metrics
        .fleet_view_seconds
        .observe(building.elapsed().as_secs_f64());
    state.fleet_cache = Some((epoch, view.clone()));
    view
}

/// Nodes whose inventory disappeared while their Node stayed, still within the grace period,
/// as node → why their plans are kept. A node that newly lost its inventory gets a wake-up at
/// the end of its grace, when its plans are checked again without it.
fn awaited_inventories(
    ctx: &Context,
    state: &mut State,
    had_inventory: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    let has_inventory = state.parts.names();
    let node_exists = |name: &str| ctx.nodes.get(&ObjectRef::new(name)).is_some();
    for gone in had_inventory.difference(&has_inventory) {
        if node_exists(gone) && !state.missing_inventories.contains_key(gone) {
            state
                .missing_inventories
                .insert(gone.clone(), Instant::now());
            let (epoch, requeue) = (ctx.fleet_epoch.clone(), ctx.requeue.clone());
            let grace = ctx.inventory_grace;
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                epoch.fetch_add(1, Ordering::Release);
                let _ = requeue.send(());
            });
        }
    }
    state.missing_inventories.retain(|node, since| {
        !has_inventory.contains(node) && node_exists(node) && since.elapsed() < ctx.inventory_grace
    });
    let why = format!(
        "inventory missing; plans on the node are kept for up to {}s while its agent writes it again",
        ctx.inventory_grace.as_secs()
    );
    state
        .missing_inventories
        .keys()
        .map(|node| (node.clone(), why.clone()))
        .collect()
}

/// Applies, to each of `nodes`, the complete set of placement labels it should carry.
/// Returns the Nodes whose cached labels still differ from a write made within
/// [`CACHE_LAG`], which were trusted to be in flight rather than written again.
pub async fn sync_node_labels(
    ctx: &Context,
    state: &mut State,
    nodes: &BTreeSet<String>,
) -> Result<Vec<String>, Error> {
    let mut unconfirmed = Vec::new();
    if nodes.is_empty() {
        return Ok(unconfirmed);
    }
    let holdings: Vec<(PlacementKey, BTreeSet<String>)> = state
        .ledger
        .iter()
        .map(|(key, holding)| (key.clone(), holding.nodes()))
        .filter(|(_, held)| held.iter().any(|n| nodes.contains(n)))
        .collect();
    let desired = labels_by_node(
        holdings
            .iter()
            .map(|(key, held)| (key.namespace.as_str(), key.name.as_str(), held)),
    );
    let mut writes: Vec<(String, BTreeMap<String, String>)> = Vec::new();
    for node in nodes {
        let labels = desired.get(node).cloned().unwrap_or_default();
        // Server-side apply creates missing objects: never apply to a Node that is gone.
        let Some(cached) = ctx.nodes.get(&ObjectRef::new(node)) else {
            state.applied_labels.remove(node);
            continue;
        };
        let on_node: BTreeMap<String, String> = cached
            .labels()
            .iter()
            .filter(|(k, _)| is_placement_label(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let just_written = state
            .applied_labels
            .get(node)
            .is_some_and(|(sent, at)| *sent == labels && at.elapsed() < CACHE_LAG);
        if on_node == labels {
            continue;
        }
        if just_written {
            unconfirmed.push(node.clone());
        } else {
            writes.push((node.clone(), labels));
        }
    }
    // One placement can span many Nodes (and planning older placements on this turn adds
    // more): the writes go out together, so a reconcile costs one apiserver round trip rather
    // than one per Node. Each Node gets at most one write, so their order does not matter.
    let api: Api<Node> = Api::all(ctx.client.clone());
    let results: Vec<LabelWrite> = futures::stream::iter(writes)
        .map(|(node, labels)| {
            let api = api.clone();
            async move {
                let result = apply_node_labels(&api, ctx, &node, &labels).await;
                (node, labels, result)
            }
        })
        .buffer_unordered(PARALLEL_NODE_WRITES)
        .collect()
        .await;
    let mut first_error = None;
    for (node, labels, result) in results {
        match result {
            Ok(()) => {
                state.applied_labels.insert(node, (labels, Instant::now()));
            }
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    first_error.map_or(Ok(unconfirmed), |err| Err(Error::Kube(err)))
}

/// A Node, the placement labels sent to it, and how the write went.
type LabelWrite = (String, BTreeMap<String, String>, Result<(), kube::Error>);

/// Sets the complete set of placement labels on one Node.
async fn apply_node_labels(
    api: &Api<Node>,
    ctx: &Context,
    node: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    let writing = Instant::now();
    let patch = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": node, "labels": labels },
    });
    // Forced: every key under `placement.hwaccel.io/` is the controller's by design. Without
    // force, a label someone edited by hand (kubectl label --overwrite) becomes theirs, and
    // every later apply of ours to that Node fails with a 409 conflict: new placements there
    // never get labelled and deleted ones hang on their finalizer.
    api.patch(
        node,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .inspect_err(|_| ctx.metrics.failed("node_labels"))?;
    ctx.metrics.wrote("node_labels", writing.elapsed());
    Ok(())
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
    } else if decision.degraded.is_empty() {
        Some(conditions::condition(
            DEGRADED,
            Some(false),
            "DevicesUsable",
            "",
            generation,
            now,
        ))
    } else {
        let message = format!(
            "assigned devices no longer usable: {}",
            decision.degraded.join(", ")
        );
        Some(conditions::condition(
            DEGRADED,
            Some(true),
            "DeviceUnusable",
            &message,
            generation,
            now,
        ))
    };
    if let Some(degraded) = degraded {
        conditions::set(&mut conds, degraded);
    }
    let (ready, reason, message) = readiness(decision);
    conditions::set(
        &mut conds,
        conditions::condition(READY, Some(ready), reason, &message, generation, now),
    );
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
    if !decision.degraded.is_empty() {
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
    (
        true,
        "NodesLabelled",
        format!("status.nodeSelector selects the {nodes} planned node(s)"),
    )
}

/// Writes the status `decision` leads to over `current`, unless they are the same; returns
/// what it wrote.
async fn write_status(
    placement: &ModelPlacement,
    current: Option<&ModelPlacementStatus>,
    api: &Api<ModelPlacement>,
    ctx: &Context,
    decision: &Decision,
) -> Result<Option<ModelPlacementStatus>, Error> {
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
    Ok(Some(desired))
}

/// An Event when the state or the Planned reason changed.
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

/// Events are informational: published in the background so the reconcile (and the
/// placements queued behind it) do not wait for them.
fn publish_in_background(
    ctx: &Context,
    event: Event,
    reference: k8s_openapi::api::core::v1::ObjectReference,
) {
    let recorder = ctx.recorder.clone();
    let metrics = ctx.metrics.clone();
    tokio::spawn(async move {
        if let Err(err) = recorder.publish(&event, &reference).await {
            metrics.failed("event");
            tracing::warn!(error = %err, "publishing an event failed");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::placement::{
        Constraints, Goal, ModelSource, PrecisionChoice as ApiPrecision, ServeGoal,
    };
    use crate::controller::fleet_view::fixture_inventory;

    fn inventories(nodes: &[&str]) -> Vec<AcceleratorInventory> {
        nodes
            .iter()
            .map(|n| fixture_inventory("h100-8x-nvswitch", n))
            .collect()
    }

    fn fleet(nodes: &[&str]) -> FleetView {
        FleetView::new(inventories(nodes).iter(), &BTreeMap::new())
    }

    /// 70B at bf16 for 40 requests: half of an 8 x H100 node.
    fn half_node() -> ModelPlacementSpec {
        ModelPlacementSpec {
            model: ModelSource {
                preset: Some("llama-3.1-70b".into()),
                ..ModelSource::default()
            },
            goal: Goal {
                serve: Some(ServeGoal {
                    context: 8192,
                    concurrency: 40,
                }),
                train: None,
            },
            constraints: Some(Constraints {
                precision: Some(ApiPrecision::Bf16),
                ..Constraints::default()
            }),
            replicas: None,
        }
    }

    fn candidate<'a>(name: &str, created: i64, spec: &'a ModelPlacementSpec) -> Candidate<'a> {
        Candidate {
            precedence: Precedence {
                created,
                key: PlacementKey::new("ml", name),
            },
            uid: format!("uid-{name}"),
            generation: 1,
            spec,
        }
    }

    fn devices(ledger: &Ledger, name: &str) -> BTreeSet<(String, String)> {
        ledger
            .get(&PlacementKey::new("ml", name))
            .map(|h| {
                h.devices()
                    .map(|(n, d)| (n.to_string(), d.to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn older_waiting_placements_go_first() {
        let spec = half_node();
        let fleet = fleet(&["n1"]);
        let mut ledger = Ledger::new();
        let holder = candidate("holder", 1, &spec);
        decide(&mut ledger, &holder, &[], &fleet);
        // `old` and `young` both wait; `young` is reconciled first, but `old` gets the room.
        let old = candidate("old", 2, &spec);
        let young = candidate("young", 3, &spec);
        let decision = decide(&mut ledger, &young, std::slice::from_ref(&old), &fleet);
        assert_eq!(
            decision.planned_others,
            vec![PlacementKey::new("ml", "old")]
        );
        assert!(
            matches!(decision.outcome, Outcome::Unschedulable(_)),
            "{decision:?}"
        );
        assert_eq!(devices(&ledger, "old").len(), 4);
        assert!(devices(&ledger, "old").is_disjoint(&devices(&ledger, "holder")));
        assert!(devices(&ledger, "young").is_empty());
    }

    #[test]
    fn a_burst_of_older_placements_is_tried_a_few_per_turn_in_order() {
        let spec = half_node();
        let names: Vec<String> = (0..6).map(|i| format!("n{i}")).collect();
        let fleet = fleet(&names.iter().map(String::as_str).collect::<Vec<_>>());
        let mut ledger = Ledger::new();
        let older_names: Vec<String> = (0..OLDER_PER_TURN + 3)
            .map(|i| format!("old{i:02}"))
            .collect();
        let older: Vec<Candidate<'_>> = older_names
            .iter()
            .enumerate()
            .map(|(i, name)| candidate(name, i64::try_from(i).unwrap(), &spec))
            .collect();
        let me = candidate("me", 100, &spec);
        let first = decide(&mut ledger, &me, &older, &fleet);
        assert!(first.deferred, "{first:?}");
        let oldest: Vec<PlacementKey> = older_names[..OLDER_PER_TURN]
            .iter()
            .map(|n| PlacementKey::new("ml", n.as_str()))
            .collect();
        assert_eq!(first.planned_others, oldest);
        assert!(
            devices(&ledger, "me").is_empty(),
            "not decided on this turn"
        );
        let second = decide(&mut ledger, &me, &older, &fleet);
        assert!(!second.deferred);
        assert_eq!(second.planned_others.len(), 3);
        assert!(matches!(second.outcome, Outcome::Planned(_)), "{second:?}");
    }

    #[test]
    fn a_placement_that_did_not_fit_is_tried_again_only_after_a_release() {
        let spec = half_node();
        let fleet = fleet(&["n1"]);
        let mut ledger = Ledger::new();
        for (name, created) in [("a", 1), ("b", 2)] {
            decide(&mut ledger, &candidate(name, created, &spec), &[], &fleet);
        }
        // More waiting placements than one turn tries: they do not fit, and once tried they
        // no longer count against a newer placement's turn.
        let waiting_names: Vec<String> = (0..=OLDER_PER_TURN).map(|i| format!("w{i}")).collect();
        let waiting: Vec<Candidate<'_>> = waiting_names
            .iter()
            .enumerate()
            .map(|(i, name)| candidate(name, 10 + i64::try_from(i).unwrap(), &spec))
            .collect();
        let late = candidate("late", 99, &spec);
        assert!(decide(&mut ledger, &late, &waiting, &fleet).deferred);
        let tried = decide(&mut ledger, &late, &waiting, &fleet);
        assert!(!tried.deferred && tried.planned_others.is_empty());
        let again = decide(&mut ledger, &late, &waiting, &fleet);
        assert!(
            !again.deferred,
            "nothing was released: nobody is tried again"
        );
        assert!(matches!(again.outcome, Outcome::Unschedulable(_)));
        // A release makes everyone worth trying again, oldest first.
        ledger.forget(&PlacementKey::new("ml", "a"));
        let after = decide(&mut ledger, &late, &waiting, &fleet);
        assert!(after.deferred);
        assert_eq!(after.planned_others, vec![PlacementKey::new("ml", "w0")]);
    }

    #[test]
    fn a_valid_plan_is_kept_and_a_lost_device_replans() {
        let spec = half_node();
        let mut ledger = Ledger::new();
        let me = candidate("me", 1, &spec);
        let both = fleet(&["n1", "n2"]);
        let first = decide(&mut ledger, &me, &[], &both);
        assert!(matches!(first.outcome, Outcome::Planned(_)));
        assert!(!first.kept);
        let held = devices(&ledger, "me");
        let again = decide(&mut ledger, &me, &[], &both);
        assert!(again.kept && again.changed_nodes.is_empty());
        assert_eq!(devices(&ledger, "me"), held, "stable: no re-plan");
        let old_node = held.iter().next().map(|(n, _)| n.clone()).unwrap();
        let remaining = if old_node == "n1" { "n2" } else { "n1" };
        let shrunk = fleet(&[remaining]);
        let moved = decide(&mut ledger, &me, &[], &shrunk);
        assert!(moved.replanned.as_deref().unwrap().contains(&old_node));
        assert!(moved.freed && moved.changed_nodes.contains(&old_node));
        assert!(devices(&ledger, "me").iter().all(|(n, _)| n == remaining));
    }

    #[test]
    fn an_unhealthy_assigned_device_keeps_the_plan_and_degrades() {
        let spec = half_node();
        let mut ledger = Ledger::new();
        let me = candidate("me", 1, &spec);
        let first = decide(&mut ledger, &me, &[], &fleet(&["n1"]));
        let at = Time(k8s_openapi::jiff::Timestamp::from_second(1).unwrap());
        let status = desired_status(None, &first, Some(1), &at);
        assert!(!conditions::is_true(&status.conditions, DEGRADED));
        let sick = status.assignments[0].devices[0].clone();
        let mut changed = inventories(&["n1"]);
        let entry = changed[0]
            .spec
            .devices
            .iter_mut()
            .find(|d| d.name == sick)
            .unwrap();
        entry.attributes.insert(
            crate::api::attribute::HEALTH.to_string(),
            crate::api::DeviceAttribute::String("unhealthy".into()),
        );
        let fleet = FleetView::new(changed.iter(), &BTreeMap::new());
        let kept = decide(&mut ledger, &me, &[], &fleet);
        assert!(
            kept.kept,
            "a running workload is not moved for one bad device"
        );
        assert_eq!(kept.degraded.len(), 1, "{:?}", kept.degraded);
        assert!(kept.degraded[0].contains(&sick));
        let degraded = desired_status(Some(&status), &kept, Some(1), &at);
        assert!(conditions::is_true(&degraded.conditions, DEGRADED));
        assert!(conditions::is_true(&degraded.conditions, PLANNED));
        let ready = conditions::find(&degraded.conditions, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "DevicesDegraded")
        );
    }

    #[test]
    fn a_new_generation_is_planned_again() {
        let spec = half_node();
        let mut ledger = Ledger::new();
        let fleet = fleet(&["n1"]);
        decide(&mut ledger, &candidate("me", 1, &spec), &[], &fleet);
        let mut changed = candidate("me", 1, &spec);
        changed.generation = 2;
        let decision = decide(&mut ledger, &changed, &[], &fleet);
        assert!(!decision.kept && decision.replanned.is_none());
        assert_eq!(ledger.get(&changed.precedence.key).unwrap().generation, 2);
    }

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
