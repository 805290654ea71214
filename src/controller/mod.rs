//! The ModelPlacement controller: `hwaccel controller`.
//!
//! | module | job |
//! |---|---|
//! | [`build`] | spec → planner request, inventories → planner nodes, plan → status (pure) |
//! | [`ledger`] | which placement holds which devices (pure) |
//! | [`labels`] | placement label keys and nodeSelectors (pure) |
//! | [`reconcile`] | one reconcile: decide, label Nodes, write status, events, finalizer |
//! | [`leader`] | Lease-based leader election |
//! | [`metrics`] | Prometheus metrics |
//!
//! [`run`] wires it together: watch caches of AcceleratorInventories and Node metadata, the
//! reservation ledger rebuilt from every placement's status, and a kube-runtime `Controller`
//! over ModelPlacements that reconciles all of them again (debounced) whenever an inventory
//! changes. See `docs/controller.md`.

pub mod build;
pub mod labels;
pub mod leader;
pub mod ledger;
pub mod metrics;
pub mod reconcile;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::{Controller, WatchStreamExt};
use kube::{Client, Resource};
use tokio::sync::{Mutex, mpsc};

use crate::api::{AcceleratorInventory, ModelPlacement};

use self::ledger::Ledger;
use self::metrics::ControllerMetrics;
use self::reconcile::{Context, State, error_policy, holding_from_status, reconcile};

/// How long a graceful shutdown may take before the controller is dropped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Reconciles in flight at once (they queue on one lock; see `reconcile.rs`).
const RECONCILE_CONCURRENCY: u16 = 4;

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
}

impl Config {
    /// Cluster-wide, as deployed.
    pub fn cluster_wide(identity: &str) -> Self {
        Self {
            namespace: None,
            selector: None,
            identity: identity.to_string(),
            debounce: Duration::from_millis(500),
        }
    }

    fn watch_config(&self) -> watcher::Config {
        match &self.selector {
            Some(selector) => watcher::Config::default().labels(selector),
            None => watcher::Config::default(),
        }
    }
}

/// Runs the controller until `shutdown` resolves (or a watch fails for good).
pub async fn run(
    client: Client,
    config: Config,
    metrics: ControllerMetrics,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let (inventories, inventory_writer) = reflector::store::<AcceleratorInventory>();
    let (nodes, node_writer) = reflector::store();
    // One trigger for "reconcile everything": inventory changes, freed devices, and older
    // placements planned on another's turn (kube-runtime's per-object `reconcile_on` is
    // still an unstable feature; a full pass is cheap because held plans are only checked).
    let (changed_tx, changed_rx) = mpsc::unbounded_channel::<()>();
    let requeue_tx = changed_tx.clone();
    let inventory_events = reflector::reflector(
        inventory_writer,
        watcher(
            Api::<AcceleratorInventory>::all(client.clone()),
            config.watch_config(),
        )
        .modify(drop_managed_fields),
    )
    .default_backoff()
    .for_each(move |event| {
        if event.is_ok() {
            let _ = changed_tx.send(());
        }
        async {}
    });
    let node_events = reflector::reflector(
        node_writer,
        watcher(
            Api::<kube::api::PartialObjectMeta<Node>>::all(client.clone()),
            config.watch_config(),
        )
        .modify(drop_managed_fields),
    )
    .default_backoff()
    .for_each(|_| async {});
    let watches = Watches {
        inventories,
        nodes,
        changes: changed_rx,
        requeue: requeue_tx,
    };
    let controller = run_controller(client, config, metrics, watches, shutdown);
    // The watches live exactly as long as the controller: dropping this future ends them all.
    tokio::select! {
        result = controller => result,
        () = inventory_events => anyhow::bail!("the AcceleratorInventory watch ended"),
        () = node_events => anyhow::bail!("the Node watch ended"),
    }
}

/// The watch caches and the "reconcile everything" trigger.
struct Watches {
    inventories: Store<AcceleratorInventory>,
    nodes: Store<kube::api::PartialObjectMeta<Node>>,
    changes: mpsc::UnboundedReceiver<()>,
    requeue: mpsc::UnboundedSender<()>,
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
        changes: inventory_changes,
        requeue: requeue_tx,
    } = watches;
    inventories.wait_until_ready().await?;
    nodes.wait_until_ready().await?;
    let api: Api<ModelPlacement> = match &config.namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let state = initial_state(&api).await?;
    tracing::info!(
        placements = state.ledger.len(),
        devices = state.ledger.devices_reserved(),
        "reservation ledger rebuilt from placement statuses"
    );
    let controller = Controller::new(api, watcher::Config::default()).with_config(
        kube::runtime::controller::Config::default()
            .debounce(config.debounce)
            // Reconciles run one at a time under the ledger lock anyway; a small window keeps
            // graceful shutdown short (only these finish) and memory flat.
            .concurrency(RECONCILE_CONCURRENCY),
    );
    let placements_store = controller.store();
    let ctx = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: reconcile::FIELD_MANAGER.to_string(),
                instance: Some(config.identity.clone()),
            },
        ),
        client,
        placements: controller.store(),
        inventories,
        nodes,
        state: Mutex::new(state),
        metrics,
        requeue: requeue_tx,
        failures: std::sync::Mutex::new(HashMap::new()),
    });
    clean_stale_labels(&ctx).await?;
    controller
        .reconcile_all_on(receiver_stream(inventory_changes))
        .graceful_shutdown_on(shutdown_after_sync(placements_store, shutdown))
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "controller event");
            }
        })
        .await;
    tracing::info!("controller stopped");
    Ok(())
}

/// The ledger, from every placement's own status.
async fn initial_state(api: &Api<ModelPlacement>) -> anyhow::Result<State> {
    let placements = api.list(&ListParams::default()).await?;
    let (ledger, dropped) =
        Ledger::rebuild(placements.items.iter().filter_map(holding_from_status));
    for key in dropped {
        tracing::warn!(placement = %key, "status claims devices another placement holds; re-planning it");
    }
    let mut state = State::default();
    state.ledger = ledger;
    Ok(state)
}

/// Brings every Node that carries a placement label, or should, to the ledger's label set:
/// labels of placements deleted while no controller ran disappear here.
async fn clean_stale_labels(ctx: &Context) -> anyhow::Result<()> {
    let mut state = ctx.state.lock().await;
    let mut affected: BTreeSet<String> = ctx
        .nodes
        .state()
        .iter()
        .filter(|node| {
            node.meta()
                .labels
                .as_ref()
                .is_some_and(|l| l.keys().any(|k| labels::is_placement_label(k)))
        })
        .filter_map(|node| node.meta().name.clone())
        .collect();
    let held: Vec<String> = state
        .ledger
        .iter()
        .flat_map(|(_, holding)| holding.nodes())
        .collect();
    affected.extend(held);
    reconcile::sync_node_labels(ctx, &mut state, &affected).await?;
    Ok(())
}

/// managedFields are the largest part of an object the agents write by server-side apply,
/// and the controller never reads them: not keeping them in the caches saves most of their
/// memory.
fn drop_managed_fields<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// Shutdown, but not before the controller's own cache has synced: kube-runtime's runner
/// waits for that cache before it can finish, and a shutdown that cuts its watch first would
/// wait forever. Bounded, so a cache that cannot sync does not block shutdown either (the
/// caller then drops the controller).
async fn shutdown_after_sync(
    placements: Store<ModelPlacement>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    shutdown.await;
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, placements.wait_until_ready()).await;
}

fn receiver_stream<T: Send + 'static>(
    receiver: mpsc::UnboundedReceiver<T>,
) -> impl Stream<Item = T> + Send {
    futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    })
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
    let mut leadership = tokio::select! {
        leadership = leader::acquire(client.clone(), lease, on_contact) => leadership?,
        () = &mut shutdown => return Ok(()),
    };
    let controller = run(client, config, metrics, stopped);
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
