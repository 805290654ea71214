//! The controller's watch caches, read: every question more than one loop asks of them
//! (the planner's view of the fleet, the claims and slices, what allocated claims hold), so
//! no loop reaches into another's files for them. Reads only; the watches that fill the
//! caches are in `dra_watch.rs` and the controller's `run`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use crate::api::ModelPlacement;
use crate::api::projection::Projection;
use crate::dra::claims::{is_allocated, owning_placement};
use crate::dra::slices::published_devices;
use crate::names::keys::is_placement_label;

use super::context::{Context, State};
use super::core::claim_holdings::{OutlivedClaim, held_outside, outlived_claims};
use super::core::counter_book::CounterBook;
use super::core::fleet_view::{FleetView, names_its_node};
use super::core::ledger::{HeldOutside, Ledger};

/// Every claim in the watch cache (none when the cluster serves no DRA).
/// Shared with the cache, not copied: a claim sync used to deep-clone every claim in the
/// cluster (issue 35 High 3).
pub fn claims_in_cache(ctx: &Context) -> Vec<Arc<ResourceClaim>> {
    ctx.claims
        .as_ref()
        .map(|store| store.state())
        .unwrap_or_default()
}

/// The devices the allocated claims in the cache hold beyond what the ledger counts for their
/// own placements, whoever holds them, and those whose DRA counters they used up
/// ([`held_outside`]); none when the cluster serves no DRA or nothing is allocated, and then
/// the fleet view is never asked for.
pub fn claimed_in_cache(
    ctx: &Context,
    ledger: &Ledger,
    fleet: impl FnOnce() -> Arc<FleetView>,
) -> HeldOutside {
    let Some(store) = &ctx.claims else {
        return HeldOutside::default();
    };
    let claims = store.state();
    if !claims.iter().any(|claim| is_allocated(claim)) {
        // Nothing allocated: only the DRA counter sets, which keep the ledger's own
        // partitions apart before their claims are allocated.
        if ctx.slices.is_none() {
            return HeldOutside::default();
        }
        return HeldOutside {
            counters: CounterBook::new(fleet().counters().clone(), []),
            ..HeldOutside::default()
        };
    }
    let slices = slices_in_cache(ctx);
    let claims: Vec<&ResourceClaim> = claims.iter().map(|claim| &**claim).collect();
    let slices: Vec<&ResourceSlice> = slices.iter().map(|slice| &**slice).collect();
    held_outside(&claims, &slices, ledger, &fleet())
}

/// Installs `external` in `ledger` ([`Ledger::set_external`]); each placement that removed
/// for a holding whose DRA counters an older one's use up is logged and reconciled again,
/// to be planned anew.
pub fn set_external(ctx: &Context, ledger: &mut Ledger, external: HeldOutside) {
    ledger.set_external(external);
    for key in ledger.take_counter_dropped() {
        tracing::warn!(
            placement = %key,
            "status holds devices whose DRA counters an older placement's holding uses up; re-planning it"
        );
        let _ = ctx.requeue_one.send(key);
    }
}

/// Every slice in the watch cache (none when the cluster serves no DRA).
pub fn slices_in_cache(ctx: &Context) -> Vec<Arc<ResourceSlice>> {
    ctx.slices
        .as_ref()
        .map(|store| store.state())
        .unwrap_or_default()
}

/// True when some DRA driver publishes devices (a slice is in the cache).
pub fn any_published(ctx: &Context) -> bool {
    ctx.slices
        .as_ref()
        .is_some_and(|store| store.find(|_| true).is_some())
}

/// True when some claim in the cache is allocated (and so may hold a device we know).
pub fn any_allocated(ctx: &Context) -> bool {
    ctx.claims
        .as_ref()
        .is_some_and(|store| store.state().iter().any(|claim| is_allocated(claim)))
}

/// The placement's own claims (labelled for it) in the cache.
pub fn own_claims_in_cache(ctx: &Context, placement: &ModelPlacement) -> Vec<Arc<ResourceClaim>> {
    let Some(store) = &ctx.claims else {
        return Vec::new();
    };
    let namespace = placement.namespace().unwrap_or_default();
    let name = placement.name_any();
    store
        .state()
        .into_iter()
        .filter(|claim| owning_placement(claim) == Some((namespace.as_str(), name.as_str())))
        .collect()
}

/// The allocated claims labelled for a placement that is gone ([`outlived_claims`]), in the
/// namespaces this controller reconciles.
pub fn outlived_in_cache(ctx: &Context) -> Vec<OutlivedClaim> {
    let placements: BTreeMap<(String, String), String> = ctx
        .placements
        .state()
        .iter()
        .filter_map(|p| {
            let p = p.decoded()?;
            Some(((p.namespace()?, p.name_any()), p.uid()?))
        })
        .collect();
    let Some(store) = &ctx.claims else {
        return Vec::new();
    };
    outlived_claims(
        store.state().iter().map(|claim| &**claim),
        |namespace, name| {
            placements
                .get(&(namespace.to_string(), name.to_string()))
                .map(String::as_str)
        },
        |namespace| ctx.scope.as_deref().is_none_or(|scope| scope == namespace),
    )
}

/// Builds the planner's view of the fleet before the first reconcile needs it (converting
/// every inventory is the one slow step, and it belongs to start-up, not to a reconcile).
pub async fn warm_up(ctx: &Context) {
    let mut state = ctx.state.lock().await;
    fleet_view(ctx, &mut state);
}

/// The inventories (and Node labels) as the planner sees them, rebuilt only when the watches
/// saw a change since the last build.
pub fn fleet_view(ctx: &Context, state: &mut State) -> Arc<FleetView> {
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
    let inventories = inventories
        .iter()
        .filter_map(|i| i.decoded())
        .filter(|i| names_its_node(i));
    let mut counted: Vec<ResourceSlice> = Vec::new();
    let parts = match &ctx.slices {
        Some(slices) => {
            // Only slices of Nodes in this controller's view: a controller scoped by a label
            // selector must not plan on nodes outside it because a driver publishes devices
            // there (a DRA-only node has no inventory to be filtered by).
            let slices: Vec<ResourceSlice> = slices
                .state()
                .iter()
                .filter(|s| {
                    s.spec
                        .node_name
                        .as_ref()
                        .is_some_and(|node| ctx.nodes.get(&ObjectRef::new(node)).is_some())
                })
                .map(|s| (**s).clone())
                .collect();
            let published = published_devices(&slices);
            let parts = state
                .parts
                .refresh_with_published(inventories, &published.nodes);
            counted = slices;
            parts
        }
        None => state.parts.refresh(inventories),
    };
    let awaiting = awaited_inventories(ctx, state, &had_inventory);
    let view = Arc::new(
        FleetView::from_parts(parts, &node_labels)
            .with_awaiting(awaiting)
            .with_counters(&counted),
    );
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

/// A placement as the caches keep it: of an inline `config.json` only what the planner reads
/// ([`crate::plan::model::subset`]), so a tenant's 64 KiB config costs the controller about
/// 1 KiB per placement, and plans read exactly as from the whole.
impl Projection for ModelPlacement {
    fn settle(&mut self) {
        if let Some(config) = self.spec.model.hugging_face_config.as_mut() {
            config.reduce_with(crate::plan::model::subset::planning_subset);
        }
    }
}
