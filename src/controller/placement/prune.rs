//! Holdings follow the store: the prune pass frees what placements that no longer exist
//! still hold in the ledger, with their Node labels and ResourceClaims.
//!
//! A placement's devices are normally freed by its cleanup reconcile, which the
//! `hwaccel.io/placement-cleanup` finalizer guarantees. Without that finalizer nothing
//! would ever free them (issue 35): kube-runtime does not reconcile an object that left its
//! cache (a queued reconcile of it ends in `ObjectNotFound`), and a deletion is no trigger.
//! That happens when a tenant removes the finalizer and deletes a Planned placement, and
//! when a placement is deleted before its own first reconcile added the finalizer while it
//! held devices. (Another placement's reconcile no longer plans such a placement as an
//! "older waiting" one, see [`waiting_placements`], but a finalizer removed by hand, a
//! namesake created under a new uid, or a holding rebuilt from a status at start-up still
//! can.)
//!
//! So every [`PRUNE_EVERY`] the pass compares the ledger with the placements' watch cache:
//! a holding whose placement is gone, is there under another uid, or is being deleted
//! without the finalizer is forgotten ([`Ledger::forget_ghosts`]), the waiting placements
//! are reconciled again, the gauges and `status.freeDevices` follow, and the Node labels and
//! claims of the ghost are removed (a failed label write is tried again on the next pass).
//! It reads only the caches and the ledger (a few hundred nanoseconds per holding under the
//! state lock) and writes nothing while nothing is gone.
//! It starts only once the placements' cache has synced: before that the cache is empty
//! and every holding would look like a ghost.
//!
//! [`waiting_placements`]: super::dereference::waiting_placements
//! [`Ledger::forget_ghosts`]: crate::controller::core::ledger::Ledger::forget_ghosts

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;

use super::apply::{nodes_labelled_for, sync_node_labels};
use super::claims::release_claims_of;
use super::dereference::holding_may_stand;
use super::reconcile::{publish_gauges, requeue_waiting};
use crate::controller::context::Context;
use crate::controller::core::ledger::{Holding, PlacementKey};

/// How often the ledger is compared with the placements' watch cache.
pub const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// Runs prune passes until the future is dropped (it lives as long as the controller).
pub async fn run(ctx: Arc<Context>) {
    if ctx.placements.wait_until_ready().await.is_err() {
        // The controller that fills the cache is gone; so is everything this would serve.
        std::future::pending::<()>().await;
    }
    let mut unlabelled = BTreeSet::new();
    loop {
        prune(&ctx, &mut unlabelled).await;
        tokio::time::sleep(PRUNE_EVERY).await;
    }
}

/// One pass: forgets the holdings of placements that no longer exist, then removes their
/// Node labels and claims. Returns the placements pruned. `unlabelled` carries the Nodes
/// whose label write failed to the next pass, which writes them again; a failed claim
/// deletion is left to the garbage collector (the claims' ownerReference names the gone
/// placement). The devices are free in the ledger from the moment it forgets them.
#[tracing::instrument(name = "prune_pass", skip_all)]
pub async fn prune(ctx: &Context, unlabelled: &mut BTreeSet<String>) -> Vec<PlacementKey> {
    let ghosts = {
        let mut state = ctx.state.lock().await;
        // Gauges count placements by state: one that vanished without a cleanup is no
        // longer Pending or Planned anywhere.
        let before = state.states.len();
        state.states.retain(|key, _| {
            let reference = ObjectRef::new(&key.name).within(&key.namespace);
            ctx.placements.get(&reference).is_some()
        });
        let forgot_states = state.states.len() != before;
        let ghosts = state
            .ledger
            .forget_ghosts(|key, uid| holding_may_stand(ctx, key, uid));
        for (key, holding) in &ghosts {
            unlabelled.extend(holding.nodes());
            unlabelled.extend(nodes_labelled_for(ctx, &state, key));
            state.states.remove(key);
        }
        if forgot_states || !ghosts.is_empty() {
            publish_gauges(ctx, &state);
        }
        for (key, _) in &ghosts {
            requeue_waiting(ctx, &state, key);
        }
        ghosts
    };
    for (key, holding) in &ghosts {
        tracing::warn!(
            placement = %key,
            uid = %holding.uid,
            devices = holding.devices().count(),
            "placement no longer exists but held devices (no cleanup ran); its devices are free"
        );
        release_ghost_claims(ctx, key, holding).await;
    }
    if !unlabelled.is_empty() {
        match sync_node_labels(ctx, unlabelled).await {
            Ok(_) => unlabelled.clear(),
            Err(err) => {
                tracing::warn!(error = %err, "removing the labels of placements that no longer exist failed; retrying on the next pass")
            }
        }
    }
    ghosts.into_iter().map(|(key, _)| key).collect()
}

/// Deletes a pruned placement's claims, when the cluster serves DRA.
async fn release_ghost_claims(ctx: &Context, key: &PlacementKey, holding: &Holding) {
    if ctx.claims.is_none() {
        return;
    }
    if let Err(err) = release_claims_of(ctx, key, &holding.uid).await {
        tracing::warn!(placement = %key, error = %err, "deleting the claims of a placement that no longer exists failed; the garbage collector removes them with their owner");
    }
}
