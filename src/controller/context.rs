//! What every reconcile shares: the API client, the watch caches, the metrics, and the
//! controller's mutable state behind one async lock.
//!
//! All reconciles run under that lock: planning is milliseconds, and serialising it is what
//! makes "no device is handed out twice" and "older first" simple and certain.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Client;
use kube::api::PartialObjectMeta;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;
use tokio::sync::{Mutex, MutexGuard, Notify, mpsc};

use crate::api::{AcceleratorInventory, Lenient, ModelPlacement};

use super::core::fleet_view::{FleetView, PartCache};
use super::metrics::ControllerMetrics;
use super::placement::core::ledger::{Ledger, PlacementKey};

/// The field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "hwaccel-controller";

/// Mutable controller state, behind one lock.
#[derive(Debug, Default)]
pub struct State {
    /// Who holds which devices.
    pub ledger: Ledger,
    /// Placement labels last applied per Node, and when, to tell the watch cache lagging
    /// behind our own write from someone having changed the labels since.
    pub applied_labels: BTreeMap<String, (BTreeMap<String, String>, Instant)>,
    /// Nodes whose last placement-label write was refused, until a write to them lands.
    pub refused_labels: BTreeSet<String>,
    /// Last state per placement, for the gauges.
    pub states: BTreeMap<PlacementKey, &'static str>,
    /// The planner's view of the fleet and the fleet epoch it was built at.
    pub(crate) fleet_cache: Option<(u64, Arc<FleetView>)>,
    /// Converted inventories, so a rebuild converts only the changed ones.
    pub(crate) parts: PartCache,
    /// Nodes whose inventory disappeared while the Node stayed, and since when.
    pub(crate) missing_inventories: BTreeMap<String, Instant>,
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
    /// Every ResourceClaim, when the cluster serves `resource.k8s.io/v1` (else `None`).
    pub claims: Option<Store<ResourceClaim>>,
    /// Every ResourceSlice, when the cluster serves `resource.k8s.io/v1` (else `None`).
    pub slices: Option<Store<ResourceSlice>>,
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
    /// How often a placement whose claims are reserved for pods is reconciled again to read
    /// their device health (`--device-health-interval`; see [`Config`]).
    ///
    /// [`Config`]: super::Config
    pub device_health_interval: Duration,
    /// Wakes the fleet pass (`fleet/pass.rs`): inventories, holdings or states changed.
    pub fleet_changed: Arc<Notify>,
    /// The one namespace whose placements this controller reconciles (`Config::namespace`);
    /// `None` for all. The claim watch is cluster-wide, so this says which claims it may judge.
    pub scope: Option<String>,
}

/// Takes the reconcile lock, recording how long that took.
pub(crate) async fn lock<'a>(
    ctx: &'a Context,
    waited: &std::sync::Mutex<Duration>,
) -> MutexGuard<'a, State> {
    let started = Instant::now();
    let guard = ctx.state.lock().await;
    if let Ok(mut waited) = waited.lock() {
        *waited = started.elapsed();
    }
    guard
}
