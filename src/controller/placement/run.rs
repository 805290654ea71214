//! The placement loop's run: the ledger rebuilt from the placements' own statuses, the
//! kube-runtime `Controller` over ModelPlacements, the repair of placement labels others
//! edited, and the prune pass. The controller's runner (`controller/mod.rs`) builds the shared
//! context around this Controller's store and runs the loop beside the fleet loop.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, watcher};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::apply;
use super::reconcile::{error_policy, reconcile};
use crate::api::{Lenient, ModelPlacement};
use crate::controller::context::{Context, State};
use crate::controller::core::ledger::rebuild::holding_from_status;
use crate::controller::core::ledger::{Ledger, PlacementKey};
use crate::names::keys::is_placement_label;

/// How long a graceful shutdown may take before the controller is dropped.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Placements per page when the controller lists them. A page's body is held whole (twice,
/// while it is read and decoded), and a placement may be stored as large as the apiserver
/// takes (about 1.5 MiB: 55,000 labels, issue 35), so a page costs at most a few tens of MiB;
/// at 50 a page 40 such placements were one 57 MB body.
pub const PLACEMENT_PAGE: u32 = 16;

/// The Controller over `api`'s placements: small list pages, `debounce` between a change and
/// its reconcile, at most `workers` reconciles at once.
pub fn controller(
    api: Api<Lenient<ModelPlacement>>,
    debounce: Duration,
    workers: u16,
) -> Controller<Lenient<ModelPlacement>> {
    // Small pages: the first list of a large namespace is decoded a page at a time.
    Controller::new(api, watcher::Config::default().page_size(PLACEMENT_PAGE)).with_config(
        kube::runtime::controller::Config::default()
            .debounce(debounce)
            // Reconciles plan in parallel and serialise only their commits; a bounded
            // window keeps graceful shutdown short (only these finish) and memory flat.
            .concurrency(workers),
    )
}

/// What wakes the loop beyond its own watch.
pub struct Triggers<R> {
    /// "Reconcile every placement" (inventory, Node, claim and slice changes), spaced.
    pub reconcile_all: R,
    /// One placement to reconcile again (`Context::requeue_one`).
    pub reconcile_one: mpsc::UnboundedReceiver<PlacementKey>,
    /// Nodes whose placement labels changed (someone may have edited ours), and the sender
    /// to look at a node again later.
    pub relabel: (
        mpsc::UnboundedSender<String>,
        mpsc::UnboundedReceiver<String>,
    ),
}

/// Runs the loop until `shutdown` (after the Controller's cache synced) or until one of its
/// parts ends: the reconciles, the label repair and the prune pass.
pub async fn run<R>(
    controller: Controller<Lenient<ModelPlacement>>,
    ctx: Arc<Context>,
    triggers: Triggers<R>,
    reconciles: crate::health::Work,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) where
    R: Stream<Item = ()> + Send + 'static,
{
    let placements_store = controller.store();
    let controller = controller
        .reconcile_all_on(triggers.reconcile_all)
        .reconcile_on(
            keys_of(triggers.reconcile_one)
                .map(|key| ObjectRef::new(&key.name).within(&key.namespace)),
        )
        .graceful_shutdown_on(shutdown_after_sync(placements_store, shutdown))
        .run(
            move |placement, ctx| reconciles.track(reconcile(placement, ctx)),
            error_policy,
            ctx.clone(),
        )
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "controller event");
            }
        });
    let (relabel_tx, relabel_rx) = triggers.relabel;
    tokio::select! {
        () = controller => {}
        () = restore_placement_labels(ctx.clone(), relabel_tx, relabel_rx) => {}
        () = super::prune::run(ctx) => {}
    }
}

/// The keys `receiver` is sent, as a stream (ends when every sender is gone).
fn keys_of(receiver: mpsc::UnboundedReceiver<PlacementKey>) -> impl Stream<Item = PlacementKey> {
    futures::stream::unfold(receiver, |mut receiver| async move {
        let key = receiver.recv().await?;
        Some((key, receiver))
    })
}

/// Puts back placement labels someone else removed or edited, as soon as the Node watch
/// shows it, instead of on the placement's next periodic reconcile.
async fn restore_placement_labels(
    ctx: Arc<Context>,
    again: mpsc::UnboundedSender<String>,
    mut changed: mpsc::UnboundedReceiver<String>,
) {
    while let Some(first) = changed.recv().await {
        let mut nodes = BTreeSet::from([first]);
        while let Ok(node) = changed.try_recv() {
            nodes.insert(node);
        }
        let span = tracing::info_span!("label_repair", nodes = ?nodes);
        match apply::sync_node_labels(&ctx, &nodes)
            .instrument(span.clone())
            .await
        {
            // A Node the controller wrote moments ago may show an older label set because
            // the watch lags; look again once the write must have arrived.
            Ok(unconfirmed) => {
                for node in unconfirmed {
                    let again = again.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(apply::CACHE_LAG).await;
                        let _ = again.send(node);
                    });
                }
            }
            Err(err) => span.in_scope(|| {
                tracing::warn!(error = %err, "restoring placement labels failed; the periodic reconcile retries");
            }),
        }
    }
}

/// The ledger, from every placement's own status.
pub async fn initial_state(api: &Api<Lenient<ModelPlacement>>) -> anyhow::Result<State> {
    // Page by page, keeping only the holdings: the whole list at once is every byte tenants
    // stored, decoded at the same moment as the watch's own first list.
    let mut holdings = Vec::new();
    let mut params = ListParams::default().limit(PLACEMENT_PAGE);
    loop {
        let page = list_page(api, &params).await?;
        holdings.extend(
            page.items
                .iter()
                .filter_map(Lenient::decoded)
                .filter_map(holding_from_status),
        );
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    let (ledger, dropped) = Ledger::rebuild(holdings);
    for key in dropped {
        tracing::warn!(placement = %key, "status claims devices another placement holds; re-planning it");
    }
    Ok(State {
        ledger,
        ..State::default()
    })
}

/// Tries the ledger's first list before giving up (a busy apiserver answers 504 or not in
/// time): the controller cannot start without it, and exiting on one slow answer would turn a
/// load spike into a restart that lists everything again.
const INITIAL_LIST_TRIES: u32 = 5;

/// One page of the initial list, retried on transient failures with a doubling backoff
/// (1 s to 8 s); a refusal, or the last failure, is the error.
async fn list_page(
    api: &Api<Lenient<ModelPlacement>>,
    params: &ListParams,
) -> Result<kube::core::ObjectList<Lenient<ModelPlacement>>, kube::Error> {
    let mut retries = crate::backoff::Retries::new(crate::backoff::Backoff::new(
        Duration::from_secs(1),
        Duration::from_secs(8),
    ));
    let mut tries = 0;
    loop {
        tries += 1;
        match api.list(params).await {
            Err(err) if tries < INITIAL_LIST_TRIES && crate::kube_client::is_transient(&err) => {
                let wait = retries.next_wait();
                tracing::warn!(error = %err, retry_in = ?wait, "listing placements for the ledger failed; retrying");
                tokio::time::sleep(wait).await;
            }
            result => return result,
        }
    }
}

/// Brings every Node that carries a placement label, or should, to the ledger's label set:
/// labels of placements deleted while no controller ran disappear here.
pub async fn clean_stale_labels(ctx: &Context) -> anyhow::Result<()> {
    let state = ctx.state.lock().await;
    let mut affected: BTreeSet<String> = ctx
        .nodes
        .state()
        .iter()
        .filter(|node| {
            node.meta()
                .labels
                .as_ref()
                .is_some_and(|l| l.keys().any(|k| is_placement_label(k)))
        })
        .filter_map(|node| node.meta().name.clone())
        .collect();
    let held: Vec<String> = state
        .ledger
        .iter()
        .flat_map(|(_, holding)| holding.nodes())
        .collect();
    affected.extend(held);
    drop(state);
    apply::sync_node_labels(ctx, &affected).await?;
    Ok(())
}

/// Shutdown, but not before the controller's own cache has synced: kube-runtime's runner
/// waits for that cache before it can finish, and a shutdown that cuts its watch first would
/// wait forever. Bounded, so a cache that cannot sync does not block shutdown either (the
/// caller then drops the controller).
async fn shutdown_after_sync(
    placements: Store<Lenient<ModelPlacement>>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    shutdown.await;
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, placements.wait_until_ready()).await;
}
