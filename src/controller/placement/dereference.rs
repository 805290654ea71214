//! Dereference, the first step of a reconcile: everything a decision reads comes from the
//! watch caches — the placement's key and precedence, the other placements still waiting,
//! the fleet view (rebuilt only when the watches saw a change), Nodes that are gone, and the
//! ledger rebuilt from statuses at start-up. Nothing here writes to the apiserver.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use crate::api::placement::ModelPlacementStatus;
use crate::api::{Lenient, ModelPlacement};
use crate::dra::slices::published_devices;

use super::core::decide::Candidate;
use super::core::labels::is_placement_label;
use super::core::ledger::{Holding, PlacementKey, Precedence};
use super::reconcile::FINALIZER;
use crate::controller::context::{Context, State};
use crate::controller::core::fleet_view::{FleetView, names_its_node};

/// A placement the controller cannot order among the others.
#[derive(Debug, thiserror::Error)]
#[error("placement {0} lacks metadata the controller needs")]
pub struct DereferenceError(String);

/// The key and precedence of a placement.
pub fn precedence_of(placement: &ModelPlacement) -> Result<Precedence, DereferenceError> {
    let namespace = placement
        .namespace()
        .ok_or_else(|| DereferenceError(placement.name_any()))?;
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

/// A placement as [`decide`](super::core::decide::decide) sees it.
pub fn candidate(placement: &ModelPlacement) -> Result<Candidate<'_>, DereferenceError> {
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

/// True when the placement carries the cleanup finalizer: its deletion is then seen by a
/// cleanup reconcile, which frees its devices and removes its Node labels.
pub fn has_cleanup_finalizer(placement: &impl Resource) -> bool {
    placement
        .meta()
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}

/// The placements other than `me` that may wait for devices: not being deleted, decodable,
/// not known to be invalid, and carrying the cleanup finalizer. [`decide`] picks those older
/// than `me` that hold nothing. One without the finalizer has not had its own first reconcile
/// (which adds it), or a tenant removed it: given devices on another's turn and then deleted,
/// it would never get the cleanup that frees them, so it is planned on its own turn only.
///
/// [`decide`]: super::core::decide::decide
pub fn waiting_placements(ctx: &Context) -> Vec<Arc<Lenient<ModelPlacement>>> {
    ctx.placements
        .state()
        .into_iter()
        .filter(|p| p.meta().deletion_timestamp.is_none() && has_cleanup_finalizer(&**p))
        .filter(|p| {
            p.decoded().is_some_and(|p| {
                p.status.as_ref().and_then(|s| s.state.as_deref()) != Some("Invalid")
            })
        })
        .collect()
}

/// True when the placement `key` is in the watch cache as the object `holding` was planned
/// for (same uid), is not being deleted and carries the cleanup finalizer: it may still be
/// given devices. A placement whose deletion the cache shows may have had its cleanup
/// already, which nothing would repeat; one without the finalizer would get no cleanup.
pub fn still_placeable(ctx: &Context, key: &PlacementKey, holding: &Holding) -> bool {
    let reference = ObjectRef::new(&key.name).within(&key.namespace);
    ctx.placements.get(&reference).is_some_and(|placement| {
        placement.meta().deletion_timestamp.is_none()
            && has_cleanup_finalizer(&*placement)
            && placement.meta().uid.as_deref().unwrap_or_default() == holding.uid
    })
}

/// True when a holding of the placement `key` planned for `uid` may stand: the watch cache
/// has that object, and if it is being deleted, its cleanup finalizer is still there (the
/// cleanup reconcile frees it). False for a placement deleted from the cache, replaced by a
/// namesake (another uid), or being deleted without the finalizer: no reconcile would ever
/// free what it holds.
pub fn holding_may_stand(ctx: &Context, key: &PlacementKey, uid: &str) -> bool {
    let reference = ObjectRef::new(&key.name).within(&key.namespace);
    ctx.placements.get(&reference).is_some_and(|placement| {
        placement.meta().uid.as_deref() == Some(uid)
            && (placement.meta().deletion_timestamp.is_none() || has_cleanup_finalizer(&*placement))
    })
}

/// True when some placement other than `except` holds nothing, so freed devices may fit it.
pub fn someone_waits(ctx: &Context, state: &State, except: &PlacementKey) -> bool {
    ctx.placements.state().iter().any(|placement| {
        placement.decoded().is_some_and(|placement| {
            precedence_of(placement)
                .is_ok_and(|p| &p.key != except && state.ledger.get(&p.key).is_none())
        })
    })
}

/// The planned Nodes the Node cache does not know: they cannot carry a placement label.
pub fn missing_nodes(ctx: &Context, status: &ModelPlacementStatus) -> Vec<String> {
    status
        .all_assignments()
        .map(|a| a.node.clone())
        .filter(|node| ctx.nodes.get(&ObjectRef::new(node)).is_none())
        .collect::<BTreeSet<String>>()
        .into_iter()
        .collect()
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
            state
                .parts
                .refresh_with_published(inventories, &published.nodes)
        }
        None => state.parts.refresh(inventories),
    };
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
