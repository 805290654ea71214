//! The DRA watches: every ResourceSlice (devices vendor drivers publish, part of the fleet)
//! and every ResourceClaim (what is allocated, ours and everyone else's, as a projection of
//! what the controller reads), on clusters that
//! serve `resource.k8s.io/v1`. On clusters that do not, or where the controller may not read
//! them, DRA is off and placements are held by Node labels only.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::{Future, StreamExt, TryStreamExt};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Client;
use kube::api::{Api, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, watcher};
use tokio::sync::mpsc;

use crate::api::projection::{Projected, drop_managed_fields};

/// The DRA caches, and the future that keeps them filled (pending forever when DRA is off).
pub(super) struct DraWatches {
    pub claims: Option<Store<ResourceClaim>>,
    pub slices: Option<Store<ResourceSlice>>,
    pub events: Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// Starts the DRA watches when the cluster serves DRA and the controller may read it.
/// A slice change is a fleet change (the epoch moves, everything is reconciled); a claim
/// change may free or take devices, so everything is reconciled too.
pub(super) async fn dra_watches(
    client: &Client,
    fleet_epoch: &Arc<AtomicU64>,
    changed: &mpsc::UnboundedSender<()>,
) -> DraWatches {
    if !dra_served(client).await {
        return DraWatches {
            claims: None,
            slices: None,
            events: Box::pin(futures::future::pending()),
        };
    }
    let (claims, claim_writer) = reflector::store::<ResourceClaim>();
    let (slices, slice_writer) = reflector::store::<ResourceSlice>();
    let claim_changed = changed.clone();
    // Claims are anyone's (the ordinary DRA right to create one is enough), so the cache
    // keeps only what the controller reads of them (`api::projection`), decoded a page of
    // CLAIM_PAGE at a time (issue 35 High 3: 40 claims grown to the size limit took a fresh
    // controller to 546 MB through one default 500-object page and whole cached labels).
    let claim_events = reflector::reflector(
        claim_writer,
        watcher(
            Api::<Projected<ResourceClaim>>::all(client.clone()),
            watcher::Config::default().page_size(CLAIM_PAGE),
        )
        .map_ok(|event| unwrap_event(event, Projected::into_inner)),
    )
    .default_backoff()
    .for_each(move |event| {
        if event.is_ok() {
            let _ = claim_changed.send(());
        }
        async {}
    });
    let slice_changed = changed.clone();
    let slice_epoch = fleet_epoch.clone();
    let slice_events = reflector::reflector(
        slice_writer,
        watcher(
            Api::<ResourceSlice>::all(client.clone()),
            watcher::Config::default(),
        )
        .modify(drop_managed_fields),
    )
    .default_backoff()
    .for_each(move |event| {
        if event.is_ok() {
            slice_epoch.fetch_add(1, Ordering::Release);
            let _ = slice_changed.send(());
        }
        async {}
    });
    DraWatches {
        claims: Some(claims),
        slices: Some(slices),
        events: Box::pin(async move {
            tokio::select! {
                () = claim_events => {}
                () = slice_events => {}
            }
        }),
    }
}

/// Claims listed per request while the cache fills: a page is decoded whole, and a claim may
/// be as large as the apiserver stores (about 1.5 MiB), so a page costs at most a few tens of
/// MiB however many claims the cluster has.
const CLAIM_PAGE: u32 = 16;

/// `event` with its objects taken through `unwrap`.
fn unwrap_event<P, K>(event: watcher::Event<P>, unwrap: impl Fn(P) -> K) -> watcher::Event<K> {
    match event {
        watcher::Event::Apply(object) => watcher::Event::Apply(unwrap(object)),
        watcher::Event::Delete(object) => watcher::Event::Delete(unwrap(object)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(object) => watcher::Event::InitApply(unwrap(object)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// True when `resource.k8s.io/v1` answers. A 404 means the cluster has no DRA; a 403 means
/// the chart's DRA permissions were left out. Any other failure is taken as "served": the
/// watches retry with backoff, and turning DRA off for a blip would move placements to labels.
async fn dra_served(client: &Client) -> bool {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let claims: Api<ResourceClaim> = Api::all(client.clone());
    let probe = ListParams::default().limit(1);
    let answer = match slices.list_metadata(&probe).await {
        Ok(_) => claims.list_metadata(&probe).await.map(|_| ()),
        Err(err) => Err(err),
    };
    match answer {
        Ok(_) => true,
        Err(kube::Error::Api(status)) if status.code == 404 => {
            tracing::info!(
                "resource.k8s.io/v1 not served: DRA off, placements held by Node labels"
            );
            false
        }
        Err(kube::Error::Api(status)) if status.code == 403 => {
            tracing::warn!(message = %status.message, "may not read ResourceSlices or ResourceClaims: DRA off, placements held by Node labels");
            false
        }
        Err(err) => {
            tracing::warn!(error = %err, "could not check for DRA; assuming it is served");
            true
        }
    }
}
