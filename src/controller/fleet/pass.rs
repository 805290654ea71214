//! The fleet pass: after inventories or placements changed (gathered for a second), the
//! controller asks `src/fleet` for the fleet's numbers once ([`fleet_figures`]: the one
//! device-state rule, never re-counted here) and from them publishes the
//! fleet gauges, writes each inventory's `status.freeDevices` where it changed, records Node
//! Events on `DevicesMissing` transitions, and returns what it counted ([`Figures`]) for the
//! health taints, which `controller::fleet_loop` runs after it (this loop never names the
//! taint loop; it still reads the placement loop's cache readers and ledger, issue 37).
//! At most once per capacity interval it also counts the replicas of each `--capacity-model` the free devices hold
//! ([`model_capacity`]): dozens of plans per model, so on a blocking thread and never in a
//! reconcile's way.
//!
//! One pass per burst of changes rather than one per reconcile: at 10,000 nodes a pass walks
//! every inventory (milliseconds), which a reconcile must not pay. A slow resync catches what
//! a missed trigger would leave behind.
//!
//! [`fleet_figures`]: crate::controller::core::fleet_figures
//! [`model_capacity`]: super::core::model_capacity

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use tracing::Instrument;

use crate::api::AcceleratorInventory;
use crate::fleet::health::Holdings;
use crate::plan::Reservations;

use super::core::model_capacity::{self, CountedModel};
use super::core::node_stats::NodeStatsCache;
use super::publication::{self, Audits, audit_nodes};
use crate::controller::cache::{
    any_allocated, any_published, claimed_in_cache, fleet_view, outlived_in_cache, set_external,
};
use crate::controller::context::{Context, FIELD_MANAGER};
use crate::controller::core::claim_holdings::OutlivedClaim;
use crate::controller::core::fleet_figures::{FleetTotals, NodeStats, share_headroom};
use crate::controller::core::fleet_view::{DeviceFilter, FleetView};
use crate::controller::core::placement_key::PlacementKey;
use crate::controller::metrics::fleet::PlacementFigures;
use crate::controller::node_events::{cut, node_span, publish_node_event};

/// How long changes are gathered before a pass.
const GATHER: Duration = Duration::from_secs(1);
/// A pass without any trigger, at least this often.
const RESYNC: Duration = Duration::from_secs(60);
/// How long a freeDevices value we wrote is trusted over an older one in the watch cache.
const CACHE_LAG: Duration = Duration::from_secs(10);
/// freeDevices writes in flight at once (a first pass over a large fleet writes them all).
const WRITE_CONCURRENCY: usize = 8;

/// What the passes remember between them.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// freeDevices and the `DRAPublished` condition (status, reason, message) last written
    /// per node, and when.
    status_written: HashMap<String, (Written, Instant)>,
    /// The publication audits, kept while their inputs stay.
    audits: Audits,
    /// `DevicesMissing` as last seen per node, for the Events on its transitions.
    missing_seen: HashMap<String, bool>,
    /// When the models were last counted.
    counted_at: Option<Instant>,
    /// Claims already reported as outliving their placement, by uid (or namespace/name).
    outlived_reported: BTreeSet<String>,
    /// Each node's numbers and what they were counted from.
    node_stats: NodeStatsCache,
}

/// Which models to count in units of replicas, and how often at most.
#[derive(Debug, Clone, Default)]
pub struct CapacityCounting {
    /// The models (`--capacity-model`); none turns counting off.
    pub models: Arc<Vec<CountedModel>>,
    /// Least time between two counts.
    pub interval: Duration,
}

/// Waits for the next pass: a change in the fleet (gathered for [`GATHER`]) or the resync.
pub(crate) async fn next_pass(ctx: &Context) {
    tokio::select! {
        () = ctx.fleet_changed.notified() => {}
        () = tokio::time::sleep(RESYNC) => {}
    }
    tokio::time::sleep(GATHER).await;
}

/// What one pass counted, for the passes that follow it (the health taints).
pub(crate) struct Figures {
    /// Per node, from the one device-state rule.
    pub stats: Vec<Arc<NodeStats>>,
    /// The planner's view of the fleet, when the pass needed it or was asked for it.
    pub view: Option<Arc<FleetView>>,
}

/// One pass: numbers, gauges, freeDevices, Events. In a `fleet_pass` span; the work on one
/// node runs in a `node` span inside it. `needs_view`: a later pass reads the planner's view
/// (which devices DRA publishes), so build it even when nothing here needs it.
#[tracing::instrument(name = "fleet_pass", skip_all)]
pub(crate) async fn pass(ctx: &Context, memory: &mut Memory, needs_view: bool) -> Figures {
    let (ours, claimed, placements, view, share_held) = {
        let mut state = ctx.state.lock().await;
        // Health taints need the planner's view (which devices DRA publishes), and so do
        // allocated claims (which of our devices they name); without either the pass never
        // makes a reconcile pay for rebuilding it.
        // So do published devices: the counts leave out what the planner's merged node
        // leaves out (a shared device, one published only in parts), and only the view knows.
        let view: Option<Arc<FleetView>> = (needs_view || any_allocated(ctx) || any_published(ctx))
            .then(|| fleet_view(ctx, &mut state));
        // A device an allocated claim names is taken whoever holds the claim (a tenant may
        // keep one after its placement is gone). Refreshed here as well as in a reconcile:
        // with no placement left, nothing reconciles, and model counting reads the ledger.
        // A device whose DRA counters claims used up (the whole GPU of an allocated MIG
        // slice) counts as held by a claim as well.
        let claimed = view
            .as_ref()
            .map(|view| claimed_in_cache(ctx, &state.ledger, || view.clone()))
            .unwrap_or_default();
        set_external(ctx, &mut state.ledger, claimed.clone());
        // A device other claims take shares of is no free whole device.
        let claimed = claimed.devices.with_consumed_taken();
        // Who holds what, for the one device-state rule: our placements, then any other
        // allocated claim (a device both name counts once, as the placement's).
        let mut ours = Reservations::none();
        for (_, holding) in state.ledger.iter() {
            for (node, device) in holding.devices() {
                ours.insert(node, device);
            }
        }
        // A GPU one of whose MIG devices a placement holds is the placement's too.
        for (node, device) in state.ledger.held_through_counters() {
            ours.insert(node, device);
        }
        let mut placements: BTreeMap<PlacementKey, PlacementFigures> = state
            .states
            .iter()
            .map(|(key, state)| {
                (
                    key.clone(),
                    PlacementFigures {
                        devices: 0,
                        state: Some(*state),
                        idle_devices: 0,
                    },
                )
            })
            .collect();
        for (key, holding) in state.ledger.iter() {
            placements
                .entry(key.clone())
                .or_insert(PlacementFigures {
                    devices: 0,
                    state: None,
                    idle_devices: 0,
                })
                .devices = holding.devices().count() as u64;
        }
        if let Ok(mut checked) = ctx.conformance_checked.lock() {
            checked.retain(|key, _| placements.contains_key(key));
        }
        if let Ok(mut idle) = ctx.idle_devices.lock() {
            idle.retain(|key, _| placements.contains_key(key));
            for (key, devices) in idle.iter() {
                if let Some(figures) = placements.get_mut(key) {
                    figures.idle_devices = u64::from(*devices);
                }
            }
        }
        // What placements and claims take of shared devices, whole or in shares.
        // Only where a driver publishes shareable devices: it copies every holding.
        let share_held = view
            .as_ref()
            .filter(|view| view.any_shareable())
            .map(|_| state.ledger.reserved_all());
        (ours, claimed, placements, view, share_held)
    };
    let held = Holdings {
        placements: &ours,
        claims: Some(&claimed),
    };
    let inventories = ctx.inventories.state();
    let stats = memory.node_stats.count(
        inventories.iter().filter_map(|object| object.decoded()),
        &held,
        view.as_deref(),
    );
    let totals = FleetTotals::of(stats.iter().map(|s| &**s));
    ctx.metrics.fleet.publish(&totals, &placements);
    let headroom = match (&view, &share_held) {
        (Some(view), Some(held)) => share_headroom(view, held),
        _ => BTreeMap::new(),
    };
    ctx.metrics.fleet.publish_share_headroom(&headroom);
    audit_nodes(ctx, &mut memory.audits);
    write_status(ctx, memory, &stats).await;
    publication::publish(ctx, &mut memory.audits);
    node_events(ctx, memory, &stats);
    report_outlived(ctx, memory, &outlived_in_cache(ctx));
    Figures { stats, view }
}

/// Counts the replicas of each model the free devices hold and publishes them, unless the
/// last count is more recent than the interval.
#[tracing::instrument(name = "model_capacity", skip_all)]
pub(crate) async fn count_models(ctx: &Context, memory: &mut Memory, counting: &CapacityCounting) {
    if counting.models.is_empty()
        || memory
            .counted_at
            .is_some_and(|at| at.elapsed() < counting.interval)
    {
        return;
    }
    let (view, reserved) = {
        let mut state = ctx.state.lock().await;
        (fleet_view(ctx, &mut state), state.ledger.reserved_all())
    };
    let models = counting.models.clone();
    let started = Instant::now();
    let counted = tokio::task::spawn_blocking(move || {
        // With the fractions a placement held by claims may take (published partitions,
        // devices shareable by memory), as `hwaccel fleet` counts them.
        let nodes = view.filtered(&DeviceFilter {
            fractions: true,
            ..DeviceFilter::default()
        });
        model_capacity::count(&models, &nodes, &reserved)
    })
    .await;
    memory.counted_at = Some(Instant::now());
    let Ok((counts, errors)) = counted else {
        tracing::warn!("counting model capacity panicked; the next interval tries again");
        return;
    };
    for error in &errors {
        tracing::warn!(%error, "counting a model's capacity failed");
    }
    tracing::debug!(
        models = counts.len(),
        seconds = started.elapsed().as_secs_f64(),
        "counted model capacity"
    );
    ctx.metrics.fleet.publish_models(&counts);
}

/// What the controller writes into an inventory's status: `freeDevices` and the
/// `DRAPublished` condition's status, reason and message.
type Written = (u32, (String, String, String));

/// Writes the controller's status fields on every inventory where one changed, by server-side
/// apply on the status subresource: `status.freeDevices` and the `DRAPublished` condition,
/// always together (an apply that left one out would remove it), in one request; the agent's
/// fields stay its own.
async fn write_status(ctx: &Context, memory: &mut Memory, stats: &[Arc<NodeStats>]) {
    let now = Instant::now();
    memory
        .status_written
        .retain(|_, (_, when)| now.duration_since(*when) < CACHE_LAG);
    let stamp = Time(k8s_openapi::jiff::Timestamp::now());
    let due: Vec<(String, u32, Condition)> = stats
        .iter()
        .filter_map(|node| {
            let free = node.free_devices();
            let audit = memory.audits.get(&node.node)?;
            if node.written_free == Some(free) && audit.is_written() {
                return None;
            }
            let condition = audit.condition(&stamp);
            let key = (
                free,
                (
                    condition.status.clone(),
                    condition.reason.clone(),
                    condition.message.clone(),
                ),
            );
            // The cache may still show the status before our own write: trust that write
            // for a while rather than writing it again.
            let fresh = memory
                .status_written
                .get(&node.node)
                .map(|(written, _)| written);
            (fresh != Some(&key)).then(|| (node.node.clone(), free, condition))
        })
        .collect();
    let api: Api<AcceleratorInventory> = Api::all(ctx.client.clone());
    let written: Vec<(String, Written, bool)> = futures::stream::iter(due)
        .map(|(node, free, condition)| {
            let api = api.clone();
            let span = node_span(&node);
            async move {
                let started = Instant::now();
                let result = apply_status(&api, &ctx.client, &node, free, &condition).await;
                match &result {
                    Ok(()) => ctx.metrics.wrote("inventory_status", started.elapsed()),
                    // Gone since the cache saw it: nothing to write.
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(err) => {
                        ctx.metrics.failed("inventory_status");
                        tracing::warn!(error = %err, "writing the inventory's status failed; the next pass retries");
                    }
                }
                let key = (free, (condition.status, condition.reason, condition.message));
                (node, key, result.is_ok())
            }
            .instrument(span)
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    for (node, key, ok) in written {
        if ok {
            memory.status_written.insert(node, (key, Instant::now()));
        }
    }
}

/// The apply of one inventory's controller status fields. The apiserver answers with the
/// whole inventory (about 12 KiB for an 8-GPU node), which the inventory watch delivers again
/// a moment later: the answer is read as text and dropped, not decoded (a first pass over
/// 10,000 new inventories decoded 120 MiB of JSON it never used).
async fn apply_status(
    api: &Api<AcceleratorInventory>,
    client: &kube::Client,
    node: &str,
    free: u32,
    condition: &Condition,
) -> Result<(), kube::Error> {
    let patch = serde_json::json!({
        "apiVersion": crate::api::API_VERSION,
        "kind": "AcceleratorInventory",
        "status": {"freeDevices": free, "conditions": [condition]},
    });
    let mut request = kube::core::Request::new(api.resource_url())
        .patch_subresource(
            "status",
            node,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .map_err(kube::Error::BuildRequest)?;
    request.extensions_mut().insert("patch_status");
    client.request_text(request).await.map(drop)
}

/// A Warning `DevicesMissing` Event on a Node when its inventory's condition turns True, a
/// Normal `DevicesRestored` when it turns back; nothing while it stays. After a restart a
/// node already missing devices gets one Warning, a healthy one nothing.
fn node_events(ctx: &Context, memory: &mut Memory, stats: &[Arc<NodeStats>]) {
    // Updated in place: a pass where nothing changed allocates nothing here.
    for node in stats {
        let missing = node.missing.is_some();
        let before = match memory.missing_seen.get_mut(&node.node) {
            Some(seen) => Some(std::mem::replace(seen, missing)),
            None => memory.missing_seen.insert(node.node.clone(), missing),
        };
        let event = match (before, &node.missing) {
            (None | Some(false), Some(message)) => Event {
                type_: EventType::Warning,
                reason: "DevicesMissing".to_string(),
                note: Some(cut(&format!(
                    "{message}; see kubectl describe acceleratorinventory {}",
                    node.node
                ))),
                action: "Detect".to_string(),
                secondary: None,
            },
            (Some(true), None) => Event {
                type_: EventType::Normal,
                reason: "DevicesRestored".to_string(),
                note: Some("every expected accelerator is present again".to_string()),
                action: "Detect".to_string(),
                secondary: None,
            },
            _ => continue,
        };
        publish_node_event(ctx, &node.node, event);
    }
    // Every node counted now has an entry; more entries than nodes are nodes gone since.
    if memory.missing_seen.len() > stats.len() {
        let present: HashSet<&str> = stats.iter().map(|s| s.node.as_str()).collect();
        memory
            .missing_seen
            .retain(|node, _| present.contains(node.as_str()));
    }
}

/// Publishes how many allocated claims outlived their placement, and reports each one once:
/// a warning log line and a Warning Event on the claim (`kubectl describe resourceclaim`).
/// The controller does not delete them: it deletes only claims its placement owns, and a
/// claim a tenant kept (its own finalizer, or the ownerReference taken off) is the tenant's
/// to let go; until then its devices count as reserved.
fn report_outlived(ctx: &Context, memory: &mut Memory, outlived: &[OutlivedClaim]) {
    ctx.metrics.fleet.publish_outlived(outlived.len());
    let key = |claim: &OutlivedClaim| {
        if claim.uid.is_empty() {
            format!("{}/{}", claim.namespace, claim.name)
        } else {
            claim.uid.clone()
        }
    };
    let current: BTreeSet<String> = outlived.iter().map(key).collect();
    memory.outlived_reported.retain(|k| current.contains(k));
    for claim in outlived {
        if !memory.outlived_reported.insert(key(claim)) {
            continue;
        }
        tracing::warn!(
            claim = %format!("{}/{}", claim.namespace, claim.name),
            placement = %claim.placement,
            devices = claim.devices,
            "an allocated ResourceClaim outlived its ModelPlacement; its devices count as reserved until it is deleted"
        );
        let reference = ObjectReference {
            api_version: Some("resource.k8s.io/v1".to_string()),
            kind: Some("ResourceClaim".to_string()),
            name: Some(claim.name.clone()),
            namespace: Some(claim.namespace.clone()),
            uid: (!claim.uid.is_empty()).then(|| claim.uid.clone()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "PlacementGone".to_string(),
            note: Some(cut(&format!(
                "still allocated to {} device(s) for ModelPlacement {}, which no longer exists; \
                 they count as reserved until this claim is deleted",
                claim.devices, claim.placement
            ))),
            action: "Account".to_string(),
            secondary: None,
        };
        let recorder = ctx.recorder.clone();
        let metrics = ctx.metrics.clone();
        tokio::spawn(async move {
            if let Err(err) = recorder.publish(&event, &reference).await {
                metrics.failed("event");
                tracing::warn!(error = %err, "publishing a ResourceClaim event failed");
            }
        });
    }
}
