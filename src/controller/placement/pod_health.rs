//! Reads the pods a placement's ResourceClaims are reserved for, so their
//! `allocatedResourcesStatus` (the kubelet's device health) reaches the placement's
//! `Degraded` condition ([`super::core::device_health`] judges them).
//!
//! Why this way and not a pod watch: a cluster-wide pod watch would keep every pod of a
//! 10,000-node cluster in memory and need `list`/`watch` on all pods, to find the handful
//! using our claims. The claims themselves say which pods those are: kube-scheduler writes
//! each pod it binds into the claim's `status.reservedFor` (name and uid), and the kubelet
//! runs only pods listed there. So a reconcile reads, by name, only those pods (at most
//! [`MAX_PODS`] per placement, [`READS_AT_ONCE`] at a time, all within [`READ_TIMEOUT`]),
//! from the claim watch the controller already has; the only new right is `get` on pods.
//! A pod's status change is no event the controller sees, so a placement whose claims have
//! pods is re-checked every `--device-health-interval` instead.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;

use super::core::device_health::{self, Consumer, MAX_PODS};
use crate::controller::context::Context;

/// Pod reads in flight at once for one placement.
pub const READS_AT_ONCE: usize = 4;
/// All of one placement's pod reads end within this, or the ones not done are skipped: the
/// reconcile holds no lock meanwhile, but it is on the way to one.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What [`consumer_pods`] found.
#[derive(Debug, Default)]
pub struct ConsumerPods {
    /// True when some claim is reserved for a pod: the placement's device health is then
    /// re-checked every `--device-health-interval`, even when a read failed this time.
    pub any: bool,
    /// The pods read.
    pub pods: Vec<Pod>,
}

/// The pods `claims` (one placement's, from the cache) are reserved for, as the apiserver
/// has them now. A pod gone meanwhile is skipped; a read the apiserver refuses (the chart's
/// `get pods` grant removed) or that fails is logged and skipped: device health from pods is
/// a report, and never stops a reconcile.
pub async fn consumer_pods(ctx: &Context, claims: &[&ResourceClaim]) -> ConsumerPods {
    let (consumers, more) = device_health::consumers(claims.iter().copied());
    if consumers.is_empty() {
        return ConsumerPods::default();
    }
    if more > 0 {
        tracing::debug!(
            read = MAX_PODS,
            skipped = more,
            "more pods use the placement's claims than are read for device health"
        );
    }
    let reads = futures::stream::iter(consumers)
        .map(|consumer| read(ctx, consumer))
        .buffer_unordered(READS_AT_ONCE)
        .filter_map(|pod| async move { pod })
        .collect::<Vec<Pod>>();
    let pods = match tokio::time::timeout(READ_TIMEOUT, reads).await {
        Ok(pods) => pods,
        Err(_) => {
            tracing::warn!(
                timeout = ?READ_TIMEOUT,
                "reading the pods of the placement's claims timed out; device health from pods skipped on this reconcile"
            );
            Vec::new()
        }
    };
    ConsumerPods { any: true, pods }
}

/// One consumer pod, or `None` (logged) when it cannot be read.
async fn read(ctx: &Context, consumer: Consumer) -> Option<Pod> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &consumer.namespace);
    match api.get_opt(&consumer.name).await {
        Ok(pod) => pod,
        Err(kube::Error::Api(status)) if status.code == 403 => {
            tracing::warn!(
                pod = %consumer.name,
                namespace = %consumer.namespace,
                message = %status.message,
                "may not get the pod a claim is reserved for: its device health is not read (the chart grants `get` on pods)"
            );
            None
        }
        Err(err) => {
            tracing::warn!(
                pod = %consumer.name,
                namespace = %consumer.namespace,
                error = %err,
                "reading the pod a claim is reserved for failed; the next reconcile tries again"
            );
            None
        }
    }
}
