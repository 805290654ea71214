//! Claims, the DRA writing step of a reconcile: make the placement's ResourceClaims exist,
//! allocate each to exactly its planned devices, and delete the ones a changed plan no
//! longer needs.
//!
//! The double-booking rule: a device is allocated to one of our claims only when no other
//! ResourceClaim in the watch cache holds it, nor used up the DRA counters it consumes (a
//! whole GPU one of whose MIG slices a pod has, [`crate::dra::counters`]). The scheduler allocates claims for other pods
//! from its own cache, so the window between its allocation and our watch seeing it cannot be
//! closed from outside the scheduler; what this step guarantees is that it never writes an
//! allocation over a device it can see taken, and that a claim it finds allocated (by itself
//! before a restart, or by anyone) is never re-pointed: an allocation is immutable, so a
//! changed plan gets new claims and the old ones are deleted.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Resource, ResourceExt};

use crate::api::ModelPlacement;
use crate::dra::DeviceRef;
use crate::dra::claims::{
    ClaimPlan, ClaimShare, allocated_devices, consumed_capacity, is_allocated,
};
use crate::dra::counters::blocked_by_counters;

use super::core::claims::ClaimsReport;
use super::core::device_health;
use super::owner::{made_for, non_blocking_owner};
use crate::controller::cache::{claims_in_cache, own_claims_in_cache, slices_in_cache};
use crate::controller::context::Context;
use crate::controller::core::claim_holdings::devices_with_holder;
use crate::controller::core::ledger::PlacementKey;

/// A claim write the apiserver refused or never answered.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The apiserver refused or did not answer.
    #[error("ResourceClaim {name}: {source}")]
    Api {
        /// The claim.
        name: String,
        /// What went wrong.
        #[source]
        source: kube::Error,
    },
    /// The placement has no uid yet (never the case for a stored object).
    #[error("the placement has no uid")]
    NoUid,
}

/// Makes `plans` the placement's claims: creates, allocates, and deletes stale ones. The
/// report says which are allocated and which devices wait for another claim to let go.
pub async fn sync_claims(
    ctx: &Context,
    placement: &ModelPlacement,
    plans: &[ClaimPlan],
) -> Result<ClaimsReport, ClaimError> {
    let namespace = placement.namespace().unwrap_or_default();
    let owner = owner_reference(placement)?;
    let api: Api<ResourceClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let cached = claims_in_cache(ctx);
    let mine: BTreeMap<String, &ResourceClaim> = cached
        .iter()
        .filter(|claim| is_owned_by(claim, placement))
        .filter_map(|claim| Some((claim.metadata.name.clone()?, &**claim)))
        .collect();
    let wanted: BTreeSet<&str> = plans.iter().map(|p| p.name.as_str()).collect();
    let held_elsewhere = held_by_other_claims(&cached, &namespace, &wanted);
    let counter_blocked = blocked_by_other_claims(ctx, &cached, &namespace, &wanted);
    let mut allocated = BTreeSet::new();
    let mut blocked = Vec::new();
    for plan in plans {
        let existing = match mine.get(&plan.name) {
            Some(claim) => Cow::Borrowed(*claim),
            None => Cow::Owned(create(ctx, &api, plan, owner.clone()).await?),
        };
        if is_allocated(&existing) {
            if allocated_devices(&existing) == plan.devices {
                allocated.insert(plan.name.clone());
            } else {
                // Someone else allocated our claim (a pod named it before we did): the
                // name carries the planned devices, so these are the wrong ones. Delete it;
                // the next reconcile creates it afresh.
                delete(ctx, &api, &existing).await?;
            }
            continue;
        }
        let taken: Vec<String> = plan
            .devices
            .iter()
            .filter_map(|d| {
                let held = held_elsewhere
                    .blocks(d, plan.share)
                    .map(|by| format!("{}/{} held by {by}", d.pool, d.device));
                held.or_else(|| {
                    counter_blocked
                        .get(d)
                        .map(|why| format!("{}/{} blocked: {why}", d.pool, d.device))
                })
            })
            .collect();
        if taken.is_empty() {
            allocate(ctx, &api, plan, &existing).await?;
            allocated.insert(plan.name.clone());
        } else {
            blocked.extend(taken);
        }
    }
    for (name, claim) in &mine {
        if !wanted.contains(name.as_str()) {
            delete(ctx, &api, claim).await?;
        }
    }
    let mut report = ClaimsReport::new(plans, &allocated);
    report.blocked = blocked;
    Ok(report)
}

/// Deletes every claim of a placement that is going away; its devices are free once the
/// claims are gone (or, while a pod still uses one, once that pod ends).
pub async fn release_claims(
    ctx: &Context,
    placement: &ModelPlacement,
) -> Result<usize, ClaimError> {
    let namespace = placement.namespace().unwrap_or_default();
    let api: Api<ResourceClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let mine: Vec<Arc<ResourceClaim>> = claims_in_cache(ctx)
        .into_iter()
        .filter(|claim| is_owned_by(claim, placement))
        .collect();
    for claim in &mine {
        delete(ctx, &api, claim).await?;
    }
    Ok(mine.len())
}

/// Deletes every claim of the placement `key` as the object `uid` (one that left the watch
/// cache without a cleanup reconcile: its holding was pruned). The garbage collector would
/// delete them too, through their ownerReference, but only where one runs and only later;
/// until then an allocated claim keeps its devices out of every plan.
pub async fn release_claims_of(
    ctx: &Context,
    key: &PlacementKey,
    uid: &str,
) -> Result<usize, ClaimError> {
    let api: Api<ResourceClaim> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let theirs: Vec<Arc<ResourceClaim>> = claims_in_cache(ctx)
        .into_iter()
        .filter(|claim| owned_by(claim, &key.namespace, &key.name, uid))
        .collect();
    for claim in &theirs {
        delete(ctx, &api, claim).await?;
    }
    Ok(theirs.len())
}

/// What the drivers say in `status.devices` of the placement's own claims (from the cache)
/// and the kubelets in the `allocatedResourcesStatus` of `pods` (read by
/// [`super::pod_health::consumer_pods`]) about the devices they hold: a line per device
/// reported unhealthy. A claim status write is a claim event, so that part of the condition
/// follows within one reconcile; a pod's follows on the next device-health check.
pub fn device_health_in_cache(
    ctx: &Context,
    placement: &ModelPlacement,
    pods: &[k8s_openapi::api::core::v1::Pod],
) -> Vec<String> {
    let claims = own_claims_in_cache(ctx, placement);
    let ours: Vec<&ResourceClaim> = claims.iter().map(|claim| &**claim).collect();
    let mut problems = device_health::from_claims(ours.iter().copied());
    problems.extend(device_health::from_consumer_pods(pods, &ours));
    problems.sort();
    problems.dedup();
    device_health::lines(&problems)
}

fn is_owned_by(claim: &ResourceClaim, placement: &ModelPlacement) -> bool {
    let (Some(uid), Some(namespace)) = (placement.uid(), placement.meta().namespace.as_deref())
    else {
        return false;
    };
    owned_by(claim, namespace, &placement.name_any(), &uid)
}

/// True when `claim` is in `namespace` and made for the placement `name` there, whose object
/// is `uid` ([`made_for`]).
fn owned_by(claim: &ResourceClaim, namespace: &str, name: &str, uid: &str) -> bool {
    claim.metadata.namespace.as_deref() == Some(namespace) && made_for(claim, name, uid)
}

/// What claims other than ours hold: devices whole, and shares of devices shared by memory.
#[derive(Debug, Default)]
struct HeldElsewhere {
    /// Devices allocated whole, with the holder's name.
    whole: BTreeMap<DeviceRef, String>,
    /// Devices others hold shares of: the bytes they consume together, and one holder.
    shared: BTreeMap<DeviceRef, (u64, String)>,
}

impl HeldElsewhere {
    /// Who keeps our claim from `device`, taking `share` of it (or all of it): a holder of the
    /// whole device, or of shares that leave too little room.
    fn blocks(&self, device: &DeviceRef, share: Option<ClaimShare>) -> Option<String> {
        if let Some(holder) = self.whole.get(device) {
            return Some(holder.clone());
        }
        let (consumed, holder) = self.shared.get(device)?;
        let fits =
            share.is_some_and(|share| consumed.saturating_add(share.bytes) <= share.capacity);
        (!fits).then(|| format!("{holder} (and others' shares: {consumed} bytes)"))
    }
}

/// Devices allocated to claims other than `wanted` in `namespace`, with the holder's name.
fn held_by_other_claims(
    claims: &[Arc<ResourceClaim>],
    namespace: &str,
    wanted: &BTreeSet<&str>,
) -> HeldElsewhere {
    let mut held = HeldElsewhere::default();
    for claim in claims {
        let claim_namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        if claim_namespace == namespace && wanted.contains(name) {
            continue;
        }
        let holder = format!("{claim_namespace}/{name}");
        for (device, consumed) in consumed_capacity(claim) {
            match consumed {
                Some(bytes) => {
                    let entry = held
                        .shared
                        .entry(device)
                        .or_insert_with(|| (0, holder.clone()));
                    entry.0 = entry.0.saturating_add(bytes);
                }
                None => {
                    held.whole.insert(device, holder.clone());
                }
            }
        }
    }
    held
}

/// Devices whose DRA counters the claims other than `wanted` in `namespace` used up, with
/// why: allocating one would over-commit its counter set, which the scheduler never does.
fn blocked_by_other_claims(
    ctx: &Context,
    claims: &[Arc<ResourceClaim>],
    namespace: &str,
    wanted: &BTreeSet<&str>,
) -> BTreeMap<DeviceRef, String> {
    let slices = slices_in_cache(ctx);
    let allocated = claims
        .iter()
        .filter(|claim| {
            let name = claim.metadata.name.as_deref().unwrap_or_default();
            claim.metadata.namespace.as_deref() != Some(namespace) || !wanted.contains(name)
        })
        .flat_map(|claim| devices_with_holder(claim));
    blocked_by_counters(slices.iter().map(|slice| &**slice), allocated)
}

fn owner_reference(placement: &ModelPlacement) -> Result<OwnerReference, ClaimError> {
    non_blocking_owner(placement).ok_or(ClaimError::NoUid)
}

async fn create(
    ctx: &Context,
    api: &Api<ResourceClaim>,
    plan: &ClaimPlan,
    owner: OwnerReference,
) -> Result<ResourceClaim, ClaimError> {
    let writing = Instant::now();
    let claim = plan.claim(Some(owner));
    let created = match api.create(&PostParams::default(), &claim).await {
        Ok(created) => {
            ctx.metrics.wrote("resource_claim", writing.elapsed());
            Ok(created)
        }
        // Created by an earlier reconcile whose result the cache has not shown yet.
        Err(kube::Error::Api(status)) if status.code == 409 => api
            .get(&plan.name)
            .await
            .map_err(|source| failed(ctx, &plan.name, source)),
        Err(source) => Err(failed(ctx, &plan.name, source)),
    };
    // One step of a reconcile that may write hundreds of claims: it is moving.
    crate::health::progress();
    created
}

async fn allocate(
    ctx: &Context,
    api: &Api<ResourceClaim>,
    plan: &ClaimPlan,
    existing: &ResourceClaim,
) -> Result<(), ClaimError> {
    let writing = Instant::now();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    // The resourceVersion makes this a compare-and-swap: if the scheduler allocated the claim
    // meanwhile, the write fails instead of replacing its allocation.
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": existing.metadata.resource_version },
        "status": { "allocation": plan.allocation(now) },
    });
    api.patch_status(&plan.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| failed(ctx, &plan.name, source))?;
    ctx.metrics
        .wrote("resource_claim_allocation", writing.elapsed());
    crate::health::progress();
    tracing::info!(claim = %plan.name, node = %plan.node, devices = plan.devices.len(), "allocated ResourceClaim");
    Ok(())
}

async fn delete(
    ctx: &Context,
    api: &Api<ResourceClaim>,
    claim: &ResourceClaim,
) -> Result<(), ClaimError> {
    delete_exactly(api, claim)
        .await
        .map_err(|source| failed(ctx, &claim.name_any(), source))?;
    crate::health::progress();
    Ok(())
}

/// Deletes exactly `object`: its uid is a precondition, so a namesake created since survives.
/// Already gone (404) or already replaced (409) counts as done.
pub(super) async fn delete_exactly<K>(api: &Api<K>, object: &K) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: object.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&object.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(err) => Err(err),
    }
}

fn failed(ctx: &Context, name: &str, source: kube::Error) -> ClaimError {
    ctx.metrics.failed("resource_claim");
    ClaimError::Api {
        name: name.to_string(),
        source,
    }
}
