//! The ModelPlacement controller: `hwaccel controller`. Three control loops, one folder each,
//! each a pure core beside a thin driver, plus what they share.
//!
//! | module | job |
//! |---|---|
//! | [`placement`] | the placement loop: one reconcile per ModelPlacement (dereference → validate → build → apply → status) |
//! | [`fleet`] | the fleet loop: gauges, `status.freeDevices`, Node Events, model capacity |
//! | [`taints`] | the health-taint loop (`--health-taints`): Node taints, DeviceTaintRules |
//! | [`core`] | the pure core they share: the planner's view of the fleet |
//! | [`context`] | what the loops share: client, caches, metrics, the state lock |
//! | [`crds`] | start-up check: our CRDs are served, or the controller exits saying so |
//! | [`events`] | Events with names valid for any object name (series as kube-runtime makes them) |
//! | [`node_changes`] | which Node watch events matter: fleet labels, placement labels |
//! | `dra_watch` | the ResourceClaim and ResourceSlice watches, where the apiserver serves them |
//! | [`leader`] | Lease-based leader election |
//! | [`metrics`] | Prometheus metrics |
//!
//! [`run`] wires it together: watch caches of AcceleratorInventories and Node metadata, the
//! reservation ledger rebuilt from every placement's status, and a kube-runtime `Controller`
//! over ModelPlacements that reconciles all of them again (debounced) whenever an inventory
//! changes. See `docs/controller.md`.

pub mod cache;
#[cfg(test)]
mod claims_in_loops_tests;
pub mod context;
pub mod core;
pub mod crds;
mod dra_watch;
pub mod events;
#[cfg(test)]
pub(crate) mod fake_apiserver;
pub mod fleet;
mod fleet_loop;
pub mod inventory_changes;
pub mod leader;
pub mod metrics;
pub mod node_changes;
pub(crate) mod node_events;
mod passes;
pub mod placement;
pub mod pod_index;
#[cfg(test)]
mod spans_tests;
pub mod taints;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, watcher};
use tokio::sync::{Mutex, mpsc};

use crate::api::{AcceleratorInventory, Lenient, ModelPlacement};

use self::context::Context;
use self::core::placement_key::PlacementKey;
use self::dra_watch::dra_watches;
use self::events::Recorder;
pub use self::fleet::CapacityCounting;
pub use self::fleet::core::model_capacity::CountedModel;
use self::inventory_changes::InventoryChanges;
use self::metrics::ControllerMetrics;
use self::node_changes::NodeChanges;
pub use self::taints::HealthTaints;
pub use self::taints::core::UnknownMode;
use crate::api::projection::drop_managed_fields;

use self::placement::run::SHUTDOWN_GRACE;

/// Placements reconciled at once unless configured (`--placement-workers`).
pub const DEFAULT_PLACEMENT_WORKERS: u16 = 4;
/// The most placement workers allowed: each holds a snapshot of the ledger while it plans,
/// and beyond a few dozen they only collide more at commit on a 2 to 16-core controller.
pub const MAX_PLACEMENT_WORKERS: u16 = 64;

/// What the controller watches and how.
#[derive(Debug, Clone)]
pub struct Config {
    /// Only placements in this namespace; `None` for all (the deployed controller).
    pub namespace: Option<String>,
    /// Only Nodes and AcceleratorInventories with these labels (`hwaccel.io/test=x`); `None`
    /// for all.
    pub selector: Option<String>,
    /// This replica's name, for Events.
    pub identity: String,
    /// How long inventory changes are gathered before everything is reconciled again.
    pub debounce: Duration,
    /// How long plans on a Node whose AcceleratorInventory disappeared (while the Node
    /// stayed) are kept before they are planned elsewhere: the node's agent writes a deleted
    /// inventory again on its next cycle, and moving workloads for a missing record would
    /// be worse than waiting. A Node that is gone frees its devices at once.
    pub inventory_grace: Duration,
    /// How often a placement whose claims are reserved for pods is reconciled again to read
    /// the pods' `allocatedResourcesStatus`: a pod's status change is no event the controller
    /// watches (see `placement/pod_health.rs`).
    pub device_health_interval: Duration,
    /// Plan conformance lists the pods labelled for a Planned placement in its namespace.
    pub conformance_list_pods: bool,
    /// Reconciles in flight, for `/healthz` ([`crate::health`]); unwatched by default.
    pub reconciles: crate::health::Work,
    /// What to do about unhealthy nodes (`--health-taints`).
    pub health_taints: HealthTaints,
    /// How often the Nodes the controller taints are read again, so a taint removed by hand
    /// comes back.
    pub taint_check: Duration,
    /// Models to count in units of replicas for the fleet gauges (`--capacity-model`).
    pub capacity: CapacityCounting,
    /// Placements reconciled at once (`--placement-workers`, 1 to
    /// [`MAX_PLACEMENT_WORKERS`]): they plan in parallel and serialise only their commits.
    pub placement_workers: u16,
}

impl Config {
    /// Cluster-wide, as deployed.
    pub fn cluster_wide(identity: &str) -> Self {
        Self {
            namespace: None,
            selector: None,
            identity: identity.to_string(),
            debounce: Duration::from_millis(500),
            inventory_grace: Duration::from_secs(300),
            device_health_interval: Duration::from_secs(60),
            conformance_list_pods: true,
            reconciles: crate::health::Work::default(),
            health_taints: HealthTaints::None,
            taint_check: taints::sync::TAINT_CHECK,
            capacity: CapacityCounting::default(),
            placement_workers: DEFAULT_PLACEMENT_WORKERS,
        }
    }

    fn watch_config(&self) -> watcher::Config {
        match &self.selector {
            Some(selector) => watcher::Config::default().labels(selector),
            None => watcher::Config::default(),
        }
    }
}

/// Runs the controller until `shutdown` resolves (or a watch fails for good). Fails at once
/// when the apiserver does not serve our CRDs ([`crds::ensure_served`]).
pub async fn run(
    client: Client,
    config: Config,
    metrics: ControllerMetrics,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    crds::ensure_served(&client).await?;
    run_served(client, config, metrics, shutdown).await
}

/// [`run`], once the CRDs are known to be served.
async fn run_served(
    client: Client,
    config: Config,
    metrics: ControllerMetrics,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let (inventories, inventory_writer) = reflector::store::<Lenient<AcceleratorInventory>>();
    let (nodes, node_writer) = reflector::store();
    // One trigger for "reconcile everything": inventory changes, freed devices, and older
    // placements planned on another's turn (kube-runtime's per-object `reconcile_on` is
    // still an unstable feature; a full pass is cheap because held plans are only checked).
    let (changed_tx, changed_rx) = mpsc::unbounded_channel::<()>();
    let requeue_tx = changed_tx.clone();
    let node_changed_tx = changed_tx.clone();
    // Bumped after the watch caches took in a change the planner's view depends on, so a
    // reconcile can tell in O(1) whether its cached view of the fleet is still current.
    let fleet_epoch = Arc::new(AtomicU64::new(0));
    let inventory_epoch = fleet_epoch.clone();
    let inventory_metrics = metrics.clone();
    let fleet_changed = Arc::new(tokio::sync::Notify::new());
    let inventory_fleet_changed = fleet_changed.clone();
    let node_epoch = fleet_epoch.clone();
    let (relabel_tx, relabel_rx) = mpsc::unbounded_channel::<String>();
    let node_relabel_tx = relabel_tx.clone();
    let mut inventory_changes = InventoryChanges::new();
    let inventory_events = reflector::reflector(
        inventory_writer,
        watcher(
            Api::<Lenient<AcceleratorInventory>>::all(client.clone()),
            config.watch_config(),
        )
        .modify(drop_managed_fields),
    )
    .default_backoff()
    .for_each(move |event| {
        if let Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) = &event {
            inventory_metrics.observe_decoding("AcceleratorInventory", object);
            if let Some(inventory) = object.decoded()
                && !core::fleet_view::names_its_node(inventory)
            {
                inventory_metrics.skipped("AcceleratorInventory", "name_mismatch");
                tracing::warn!(
                    name = inventory.metadata.name.as_deref().unwrap_or(""),
                    node = %inventory.spec.node_name,
                    "skipping an inventory whose spec.nodeName is not its own name"
                );
            }
        }
        if let Ok(event) = &event {
            // Only a change of what the planner reads stales its view of the fleet; the
            // fleet pass, which counts from statuses too, hears of every event.
            if inventory_changes.observe(event) {
                inventory_epoch.fetch_add(1, Ordering::Release);
                let _ = changed_tx.send(());
            }
            inventory_fleet_changed.notify_one();
        }
        async {}
    });
    let mut node_changes = NodeChanges::new();
    let node_events = reflector::reflector(
        node_writer,
        watcher(
            Api::<kube::api::PartialObjectMeta<Node>>::all(client.clone()),
            config.watch_config(),
        )
        .modify(drop_managed_fields),
    )
    .default_backoff()
    .for_each(move |event| {
        if let Ok(event) = &event {
            let change = node_changes.observe(event);
            if change.fleet {
                node_epoch.fetch_add(1, Ordering::Release);
                let _ = node_changed_tx.send(());
            }
            for node in change.placement_labels {
                let _ = node_relabel_tx.send(node);
            }
        }
        async {}
    });
    let dra = dra_watches(&client, &fleet_epoch, &requeue_tx).await;
    let (pod_index, pod_events) = if config.conformance_list_pods {
        let (index, events) = pod_index::watch(&client, config.namespace.as_deref());
        (Some(index), events)
    } else {
        (None, futures::future::pending().boxed())
    };
    let watches = Watches {
        pod_index,
        inventories,
        nodes,
        claims: dra.claims,
        slices: dra.slices,
        changes: changed_rx,
        requeue: requeue_tx,
        fleet_epoch,
        relabel: (relabel_tx, relabel_rx),
        fleet_changed,
        started,
    };
    let controller = run_controller(client, config, metrics, watches, shutdown);
    // The watches live exactly as long as the controller: dropping this future ends them all.
    tokio::select! {
        result = controller => result,
        () = inventory_events => anyhow::bail!("the AcceleratorInventory watch ended"),
        () = node_events => anyhow::bail!("the Node watch ended"),
        () = dra.events => anyhow::bail!("the ResourceClaim/ResourceSlice watch ended"),
        () = pod_events => anyhow::bail!("the labelled-pod watch ended"),
    }
}

/// The watch caches and what they trigger.
struct Watches {
    inventories: Store<Lenient<AcceleratorInventory>>,
    nodes: Store<kube::api::PartialObjectMeta<Node>>,
    claims: Option<Store<k8s_openapi::api::resource::v1::ResourceClaim>>,
    slices: Option<Store<k8s_openapi::api::resource::v1::ResourceSlice>>,
    /// The labelled pods' metadata, for plan conformance (`--conformance-list-pods`).
    pod_index: Option<pod_index::PodIndex>,
    /// "Reconcile everything".
    changes: mpsc::UnboundedReceiver<()>,
    requeue: mpsc::UnboundedSender<()>,
    /// Bumped when inventories or Nodes' non-placement labels changed.
    fleet_epoch: Arc<AtomicU64>,
    /// Nodes whose placement labels changed (someone may have edited ours).
    relabel: (
        mpsc::UnboundedSender<String>,
        mpsc::UnboundedReceiver<String>,
    ),
    /// Wakes the fleet pass.
    fleet_changed: Arc<tokio::sync::Notify>,
    /// When this replica began to start as leader (the start-up phases count from here).
    started: std::time::Instant,
}

async fn run_controller(
    client: Client,
    config: Config,
    metrics: ControllerMetrics,
    watches: Watches,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let Watches {
        inventories,
        nodes,
        claims,
        slices,
        pod_index,
        changes: inventory_changes,
        requeue: requeue_tx,
        fleet_epoch,
        relabel: (relabel_tx, relabel_rx),
        fleet_changed,
        started,
    } = watches;
    inventories.wait_until_ready().await?;
    nodes.wait_until_ready().await?;
    for store in claims.iter() {
        store.wait_until_ready().await?;
    }
    for store in slices.iter() {
        store.wait_until_ready().await?;
    }
    metrics.started("watches", started);
    let api: Api<Lenient<ModelPlacement>> = match &config.namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let state = placement::run::initial_state(&api).await?;
    tracing::info!(
        placements = state.ledger.len(),
        devices = state.ledger.devices_reserved(),
        "reservation ledger rebuilt from placement statuses"
    );
    metrics.started("ledger", started);
    let (requeue_one_tx, requeue_one_rx) = mpsc::unbounded_channel::<PlacementKey>();
    let controller = placement::run::controller(
        api,
        config.debounce,
        config.placement_workers.clamp(1, MAX_PLACEMENT_WORKERS),
    );
    let ctx = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: context::FIELD_MANAGER.to_string(),
                instance: Some(config.identity.clone()),
            },
        ),
        client,
        placements: controller.store(),
        inventories,
        nodes,
        claims,
        slices,
        state: Mutex::new(state),
        node_writes: context::NodeWriteLocks::default(),
        in_flight: Default::default(),
        metrics,
        requeue: requeue_tx,
        requeue_one: requeue_one_tx,
        failures: std::sync::Mutex::new(HashMap::new()),
        idle_devices: std::sync::Mutex::new(HashMap::new()),
        conformance_checked: std::sync::Mutex::new(HashMap::new()),
        fleet_epoch,
        inventory_grace: config.inventory_grace,
        device_health_interval: config.device_health_interval,
        conformance_list_pods: config.conformance_list_pods,
        pod_index,
        fleet_changed,
        scope: config.namespace.clone(),
    });
    placement::run::clean_stale_labels(&ctx).await?;
    cache::warm_up(&ctx).await;
    ctx.metrics.started("ready", started);
    let placements = placement::run::run(
        controller,
        ctx.clone(),
        placement::run::Triggers {
            reconcile_all: passes::spaced(inventory_changes, passes::gap_for(config.debounce)),
            reconcile_one: requeue_one_rx,
            relabel: (relabel_tx, relabel_rx),
        },
        config.reconciles.clone(),
        shutdown,
    );
    // The fleet loop lives exactly as long as the placement loop (both write, so only while
    // this replica leads).
    let fleet = fleet_loop::run(
        ctx.clone(),
        (config.health_taints, config.taint_check),
        config.selector.clone(),
        config.capacity.clone(),
    );
    tokio::select! {
        () = placements => {}
        () = fleet => {}
    }
    tracing::info!("controller stopped");
    Ok(())
}

/// Runs the controller only while this replica holds the Lease. Returns an error when
/// leadership is lost (the caller exits so that nothing more is written), `Ok` on shutdown.
pub async fn run_elected(
    client: Client,
    config: Config,
    lease: leader::LeaseConfig,
    metrics: ControllerMetrics,
    on_contact: impl Fn(),
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut stop_rx_wait = stop_rx.clone();
    let stopped = async move {
        let _ = stop_rx_wait.wait_for(|s| *s).await;
    };
    tokio::pin!(shutdown);
    // Before the Lease: a standby replica without CRDs exits too, rather than wait to lead.
    tokio::select! {
        served = crds::ensure_served(&client) => served?,
        () = &mut shutdown => return Ok(()),
    }
    let mut leadership = tokio::select! {
        leadership = leader::acquire(client.clone(), lease, on_contact) => leadership?,
        () = &mut shutdown => return Ok(()),
    };
    let controller = run_served(client, config, metrics, stopped);
    tokio::pin!(controller);
    tokio::select! {
        result = &mut controller => { leadership.release().await; result }
        () = leadership.lost() => anyhow::bail!("lost the leader Lease; stopping so that only the leader writes"),
        () = &mut shutdown => {
            let _ = stop_tx.send(true);
            // In-flight reconciles finish; past the grace period the controller is dropped,
            // which cancels them. That is safe: the next leader rebuilds its ledger from the
            // statuses, and a status not yet written reserved nothing.
            let result = tokio::time::timeout(SHUTDOWN_GRACE * 2, controller)
                .await
                .unwrap_or(Ok(()));
            leadership.release().await;
            drop(stop_rx);
            result
        }
    }
}
