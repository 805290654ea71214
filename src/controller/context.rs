//! What every reconcile shares: the API client, the watch caches, the metrics, and the
//! controller's mutable state behind one async lock.
//!
//! Reconciles run in parallel (`--placement-workers`) and hold that lock only for moments:
//! to take a snapshot of the ledger and the fleet view, and to commit what they planned on
//! it ([`Ledger::commit`](super::core::ledger::Ledger::commit) decides, atomically,
//! whether the plan still stands). Planning and every apiserver write happen outside it. Node
//! label writes are serialised per Node instead ([`NodeWriteLocks`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use super::events::Recorder;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Client;
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::Store;
use tokio::sync::{Mutex, MutexGuard, Notify, mpsc};

use crate::api::{AcceleratorInventory, Lenient, ModelPlacement};

use super::core::fleet_view::{FleetView, PartCache};
use super::core::ledger::{Ledger, PlacementKey, Precedence};
use super::metrics::ControllerMetrics;

/// The field manager of every write the controller makes.
pub use crate::names::keys::CONTROLLER_FIELD_MANAGER as FIELD_MANAGER;

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
    /// The state lock, held briefly: snapshot, commit, label bookkeeping.
    pub state: Mutex<State>,
    /// One placement-label writer per Node at a time.
    pub node_writes: NodeWriteLocks,
    /// Placements being planned on a snapshot right now.
    pub in_flight: InFlightPlans,
    /// Metrics.
    pub metrics: ControllerMetrics,
    /// Event recorder.
    pub recorder: Recorder,
    /// Placements to reconcile again (older ones planned on another's turn, waiting ones
    /// when devices are freed).
    pub requeue: mpsc::UnboundedSender<()>,
    /// One placement to reconcile again (an older one planned on another's turn, a waiting
    /// one when devices are freed): at 3,000 placements, reconciling all of them for each
    /// such request was 160,000 reconciles in one burst.
    pub requeue_one: mpsc::UnboundedSender<PlacementKey>,
    /// Consecutive failures per placement, for the backoff.
    pub failures: std::sync::Mutex<HashMap<PlacementKey, u32>>,
    /// Devices each placement's pods hold and do not use, as its last reconcile judged them
    /// (plan conformance), for `hwaccel_placement_idle_devices`.
    pub idle_devices: std::sync::Mutex<HashMap<PlacementKey, u32>>,
    /// When each placement's pods were last judged (plan conformance): at most once per
    /// `--device-health-interval`, so a burst of reconciles lists no pods twice.
    pub conformance_checked: std::sync::Mutex<HashMap<PlacementKey, Instant>>,
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
    /// Plan conformance lists a Planned placement's labelled pods (`--conformance-list-pods`).
    pub conformance_list_pods: bool,
    /// Which placements have labelled pods (`pod_index`); `None` without
    /// `--conformance-list-pods`, or in tests, where every due check lists.
    pub pod_index: Option<super::pod_index::PodIndex>,
    /// Wakes the fleet pass (`fleet/pass.rs`): inventories, holdings or states changed.
    pub fleet_changed: Arc<Notify>,
    /// The one namespace whose placements this controller reconciles (`Config::namespace`);
    /// `None` for all. The claim watch is cluster-wide, so this says which claims it may judge.
    pub scope: Option<String>,
}

/// Takes the state lock, adding how long that took to `waited` (a reconcile takes it at
/// least twice: for its snapshot and for its commit).
pub(crate) async fn lock<'a>(
    ctx: &'a Context,
    waited: &std::sync::Mutex<Duration>,
) -> MutexGuard<'a, State> {
    let started = Instant::now();
    let guard = ctx.state.lock().await;
    if let Ok(mut waited) = waited.lock() {
        *waited += started.elapsed();
    }
    guard
}

/// Stripes of Node write locks.
const NODE_WRITE_STRIPES: usize = 64;

/// Placement-label writers, one per Node at a time. A writer computes a Node's labels from
/// the ledger only once it holds that Node's lock, so of two writes to one Node the later
/// one carries the newer ledger: a slow write can never land after, and undo, a newer one.
/// Striped (a Node hashes to one of a fixed set of locks) so that memory does not grow with
/// the fleet; two Nodes sharing a stripe only wait for each other.
#[derive(Debug)]
pub struct NodeWriteLocks {
    stripes: Vec<Mutex<()>>,
}

impl Default for NodeWriteLocks {
    fn default() -> Self {
        Self {
            stripes: (0..NODE_WRITE_STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }
}

impl NodeWriteLocks {
    /// Locks every one of `nodes`. Stripes are taken in ascending order, so two writers
    /// locking overlapping sets cannot deadlock; nobody may hold the state lock meanwhile.
    pub async fn lock(&self, nodes: &BTreeSet<String>) -> Vec<MutexGuard<'_, ()>> {
        let stripes: BTreeSet<usize> = nodes
            .iter()
            .map(|node| {
                let mut hasher = DefaultHasher::new();
                node.hash(&mut hasher);
                usize::try_from(hasher.finish() % NODE_WRITE_STRIPES as u64).unwrap_or(0)
            })
            .collect();
        let mut guards = Vec::with_capacity(stripes.len());
        for stripe in stripes {
            guards.push(self.stripes[stripe].lock().await);
        }
        guards
    }
}

/// Placements being planned on a snapshot right now, in precedence order: a new plan waits
/// for the older ones to commit first, so that "older first" holds between workers too.
#[derive(Debug, Default)]
pub struct InFlightPlans {
    plans: std::sync::Mutex<BTreeSet<Precedence>>,
    done: Notify,
}

impl InFlightPlans {
    /// Waits until no placement older than `me` is being planned, or `bound` has passed,
    /// then registers `me` until the returned guard is dropped (also when the reconcile is
    /// cancelled). The oldest never waits, so every wait ends.
    pub async fn enter(&self, me: &Precedence, bound: Duration) -> InFlight<'_> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            // Registered before looking, so a commit between the look and the wait still
            // wakes this one.
            let notified = self.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Ok(mut plans) = self.plans.lock() {
                let older_planning = plans.first().is_some_and(|oldest| oldest < me);
                if !older_planning || tokio::time::Instant::now() >= deadline {
                    plans.insert(me.clone());
                    break;
                }
            } else {
                // A poisoned set only loses the ordering, never safety (commits decide).
                break;
            }
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
        InFlight {
            plans: self,
            me: me.clone(),
        }
    }
}

/// A placement being planned; dropping it lets younger plans start.
#[derive(Debug)]
pub struct InFlight<'a> {
    plans: &'a InFlightPlans,
    me: Precedence,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Ok(mut plans) = self.plans.plans.lock() {
            plans.remove(&self.me);
        }
        self.plans.done.notify_waiters();
    }
}
