//! Finds the pods that run a placement and reads what [`super::core::conformance`] judges:
//! the engine container's image and command line, the devices the pod holds, and the NVIDIA
//! driver its node's inventory reports.
//!
//! Which pods: those its claims are reserved for (already read for device health,
//! [`super::pod_health`]) and those in the placement's own namespace labelled
//! `hwaccel.io/placement=<name>` (what `hwaccel plan --emit` stamps on its pod templates),
//! listed with that selector, at most [`MAX_LISTED`], within [`LIST_TIMEOUT`], and only when
//! the labelled-pod watch ([`crate::controller::pod_index`]) has seen one. A tenant names
//! only its own placement: the list never leaves the placement's namespace, so no
//! ModelPlacement can make the controller read or report on another namespace's pods. The
//! list runs only for a placement that is already Planned (its first plan costs nothing
//! more), and a refusal (the chart's `list pods` grant removed) leaves pods found through
//! claims only, logged.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::ObjectRef;

use super::core::conformance::{Conformance, PodView, judge, shell_words};
use crate::api::ModelPlacement;
use crate::api::placement::EngineStatus;
use crate::api::{attribute, quantity};
use crate::controller::context::Context;
use crate::controller::pod_index::has_labelled_pods;
use crate::names::keys::PLACEMENT_LABEL;
use crate::plan::engine::images::oldest_driver;

/// Most pods listed by the placement label.
pub const MAX_LISTED: u32 = 32;
/// The list ends within this, or conformance is judged on the claims' pods alone.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// The pods labelled for `placement` in its namespace (none when it is not Planned yet, or
/// the list fails).
pub async fn labelled_pods(ctx: &Context, placement: &ModelPlacement) -> Vec<Pod> {
    let planned = placement.status.as_ref().and_then(|s| s.state.as_deref()) == Some("Planned");
    let Some(namespace) = placement
        .namespace()
        .filter(|_| planned && ctx.conformance_list_pods)
    else {
        return Vec::new();
    };
    // The watch of labelled pods knows when there are none: no list then.
    if let Some(index) = &ctx.pod_index
        && has_labelled_pods(index, &namespace, &placement.name_any()) == Some(false)
    {
        return Vec::new();
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = ListParams::default()
        .labels(&format!("{PLACEMENT_LABEL}={}", placement.name_any()))
        .limit(MAX_LISTED);
    match tokio::time::timeout(LIST_TIMEOUT, api.list(&params)).await {
        Ok(Ok(list)) => list.items,
        Ok(Err(kube::Error::Api(status))) if status.code == 403 => {
            tracing::warn!(
                "listing the placement's pods was refused (the chart grants `list pods`); \
                 conformance is judged on the pods its claims are reserved for only"
            );
            Vec::new()
        }
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "listing the placement's pods failed; conformance is judged on the claims' pods only");
            Vec::new()
        }
        Err(_) => {
            tracing::warn!(timeout = ?LIST_TIMEOUT, "listing the placement's pods timed out");
            Vec::new()
        }
    }
}

/// The verdict on `pods` (the claims' and the labelled ones; a pod in both counts once)
/// against the placement's planned `engine`. Pods being deleted, and finished ones, run
/// nothing and are left out.
pub fn verdict(
    ctx: &Context,
    placement: &ModelPlacement,
    engine: &EngineStatus,
    pods: impl IntoIterator<Item = Pod>,
) -> Conformance {
    let mut seen = BTreeSet::new();
    let views: Vec<PodView> = pods
        .into_iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter(|pod| {
            !matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter(|pod| seen.insert(pod.name_any()))
        .map(|pod| view(ctx, &pod, engine))
        .collect();
    let mut verdict = judge(engine, &views);
    verdict.label = placement.name_any();
    verdict
}

/// What conformance reads of one pod.
fn view(ctx: &Context, pod: &Pod, engine: &EngineStatus) -> PodView {
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or(&[]);
    let main = containers
        .iter()
        .find(|c| {
            argv(c)
                .iter()
                .any(|w| w.contains("vllm") || w.contains("sglang"))
        })
        .or_else(|| containers.first());
    let from_claims = claimed_devices(ctx, pod);
    let from_limits = main.and_then(|container| {
        let resource = engine.device_resource.as_deref()?;
        let limits = container.resources.as_ref()?.limits.as_ref()?;
        quantity::parse_whole(limits.get(resource)?).and_then(|n| u32::try_from(n).ok())
    });
    PodView {
        name: pod.name_any(),
        image: main.and_then(|c| c.image.clone()),
        argv: main.map(argv).unwrap_or_default(),
        held: from_claims.filter(|n| *n > 0).or(from_limits),
        driver: node_driver(ctx, pod),
    }
}

/// The oldest NVIDIA driver the inventory of the pod's node reports, when it is bound and
/// its inventory says.
fn node_driver(ctx: &Context, pod: &Pod) -> Option<String> {
    let node = pod.spec.as_ref()?.node_name.as_deref()?;
    let object = ctx.inventories.get(&ObjectRef::new(node))?;
    let inventory = object.decoded()?;
    let versions = inventory.spec.devices.iter().filter_map(|device| {
        let text = |name: &str| device.attributes.get(name).and_then(|a| a.as_str());
        (text(attribute::VENDOR) == Some("nvidia"))
            .then(|| text(attribute::DRIVER_VERSION))
            .flatten()
    });
    oldest_driver(versions).map(str::to_string)
}

/// A container's command and arguments; a `sh -c LINE` (or `bash -c`) line split into words.
fn argv(container: &Container) -> Vec<String> {
    let mut words: Vec<String> = container
        .command
        .iter()
        .flatten()
        .chain(container.args.iter().flatten())
        .cloned()
        .collect();
    if let Some(at) = words.iter().position(|w| w == "-c")
        && words.first().is_some_and(|shell| shell.ends_with("sh"))
        && let Some(line) = words.get(at + 1).cloned()
    {
        words.truncate(at + 1);
        words.extend(shell_words(&line));
    }
    words
}

/// Devices the pod's ResourceClaims hold, from the claim cache: each claim named in its spec
/// (directly, or generated from a template and named in its status), counted by allocation
/// results. `None` when the pod uses no claim, or none is in the cache.
fn claimed_devices(ctx: &Context, pod: &Pod) -> Option<u32> {
    let store = ctx.claims.as_ref()?;
    let namespace = pod.namespace()?;
    let spec = pod.spec.as_ref()?;
    let generated = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref());
    let mut total: Option<u32> = None;
    for reference in spec.resource_claims.iter().flatten() {
        let name = reference.resource_claim_name.clone().or_else(|| {
            generated?
                .iter()
                .find(|s| s.name == reference.name)
                .and_then(|s| s.resource_claim_name.clone())
        });
        let Some(name) = name else {
            continue;
        };
        let Some(claim) = store.get(&ObjectRef::<ResourceClaim>::new(&name).within(&namespace))
        else {
            continue;
        };
        let results = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .map_or(0, Vec::len);
        let results = u32::try_from(results).unwrap_or(u32::MAX);
        total = Some(total.unwrap_or(0).saturating_add(results));
    }
    total
}
