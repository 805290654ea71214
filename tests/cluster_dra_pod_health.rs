//! Device health from pods, against the real control plane (kube-apiserver 1.37,
//! kube-scheduler, kwok): the controller allocates a placement's ResourceClaim, kube-scheduler
//! binds a pod using it (and reserves the claim for it), and the pod's
//! `allocatedResourcesStatus` says the claim's device is Unhealthy. kwok nodes have no
//! kubelet, so the test writes that status itself, through the pod's status subresource, as a
//! kubelet does. The placement's `Degraded` condition names the device, the pod and the
//! message; once the pod says Healthy again, it clears.
//!
//! Full tier only: `tests/cluster/up.sh --full && scripts/run-cluster-tier.sh
//! cluster_dra_pod_health`.

use crate::support;

use std::time::Duration;

use anyhow::Result;
use hwaccel::api::placement::AllocationMode;
use hwaccel::api::{ModelPlacement, conditions};
use hwaccel::controller::metrics::ControllerMetrics;
use hwaccel::controller::{self, Config};
use hwaccel::testing::PlacementBuilder;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::{DEFAULT_TIMEOUT, TEST_LABEL, TestCluster, wait_for};

use crate::cluster_dra::{
    DRIVER, allocated, claims_of, create_placement, create_pod, degraded_when, wait_ready,
};

struct Running(tokio::task::JoinHandle<Result<()>>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The controller, re-reading the pods of its claims every second.
fn start_controller(cluster: &TestCluster) -> Running {
    let mut config = Config::cluster_wide("test-controller");
    config.namespace = Some(cluster.namespace().to_string());
    config.selector = Some(format!("{TEST_LABEL}={}", cluster.prefix()));
    config.debounce = Duration::from_millis(200);
    config.device_health_interval = Duration::from_secs(1);
    let metrics =
        ControllerMetrics::register(&mut prometheus_client::registry::Registry::default());
    Running(tokio::spawn(controller::run(
        cluster.client(),
        config,
        metrics,
        std::future::pending(),
    )))
}

/// Writes what a kubelet reports about the pod's one container's claim `accelerators`: the
/// device `resource_id` with `health` (and `message`, which the apiserver wants non-empty
/// when present), through the status subresource.
async fn report_health(
    pods: &Api<Pod>,
    pod: &str,
    resource_id: &str,
    health: &str,
    message: Option<&str>,
) -> Result<()> {
    let current = pods.get_status(pod).await?;
    let mut statuses = current
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default();
    anyhow::ensure!(!statuses.is_empty(), "kwok wrote no container status");
    statuses[0].allocated_resources_status = Some(serde_json::from_value(json!([{
        "name": "claim:accelerators",
        "resources": [{"resourceID": resource_id, "health": health, "message": message}],
    }]))?);
    pods.patch_status(
        pod,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"containerStatuses": statuses}})),
    )
    .await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_device_the_pods_kubelet_reports_unhealthy_degrades_the_placement_until_it_recovers()
-> Result<()> {
    let Some((_turn, cluster, node, _)) = crate::cluster_dra::h100_dra_node().await? else {
        return Ok(());
    };
    let _controller = start_controller(&cluster);
    create_placement(
        &cluster,
        "podsick",
        PlacementBuilder::serve("llama-3.1-8b").spec(),
        AllocationMode::Claims,
    )
    .await?;
    wait_ready(&cluster, "podsick").await?;
    let claims = claims_of(&cluster, "podsick").await?;
    let claim = claims.first().expect("a claim");
    let claim_name = claim.metadata.name.clone().expect("named");
    let (pool, device) = allocated(std::slice::from_ref(claim))
        .into_iter()
        .next()
        .expect("an allocated device");
    let resource_id = format!("{DRIVER}/{pool}/{device}");

    // The scheduler binds the pod to the planned node and reserves the claim for it; kwok
    // runs it.
    create_pod(
        &cluster,
        "podsick-0",
        ("resourceClaimName", &claim_name),
        &node,
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    let claim_api: Api<ResourceClaim> = Api::namespaced(cluster.client(), cluster.namespace());
    wait_for(
        DEFAULT_TIMEOUT,
        "the pod running, the claim reserved for it",
        || {
            let (pods, claim_api, claim_name) = (pods.clone(), claim_api.clone(), &claim_name);
            async move {
                let pod = pods.get("podsick-0").await?;
                let running = pod.status.as_ref().is_some_and(|s| {
                    s.phase.as_deref() == Some("Running")
                        && s.container_statuses.as_ref().is_some_and(|c| !c.is_empty())
                });
                let reserved = claim_api
                    .get(claim_name)
                    .await?
                    .status
                    .and_then(|s| s.reserved_for)
                    .unwrap_or_default()
                    .iter()
                    .any(|r| r.name == "podsick-0" && Some(&r.uid) == pod.metadata.uid.as_ref());
                Ok((running && reserved).then_some(()))
            }
        },
    )
    .await?;

    report_health(
        &pods,
        "podsick-0",
        &resource_id,
        "Unhealthy",
        Some("Xid 79: GPU has fallen off the bus"),
    )
    .await?;
    let degraded = degraded_when(
        &cluster,
        "podsick",
        "Degraded names the pod's device",
        |c| c.status == "True",
    )
    .await?;
    assert_eq!(degraded.reason, "DeviceUnhealthy", "{degraded:?}");
    for expected in [
        resource_id.as_str(),
        "Xid 79: GPU has fallen off the bus",
        "podsick-0",
        claim_name.as_str(),
    ] {
        assert!(
            degraded.message.contains(expected),
            "{expected}: {}",
            degraded.message
        );
    }
    let status = Api::<ModelPlacement>::namespaced(cluster.client(), cluster.namespace())
        .get("podsick")
        .await?
        .status
        .unwrap_or_default();
    assert!(
        !conditions::is_true(&status.conditions, "Ready"),
        "{status:?}"
    );

    // Healthy again: the condition clears and the placement is Ready.
    report_health(&pods, "podsick-0", &resource_id, "Healthy", None).await?;
    degraded_when(&cluster, "podsick", "Degraded cleared", |c| {
        c.status == "False"
    })
    .await?;
    wait_ready(&cluster, "podsick").await?;
    pods.delete("podsick-0", &DeleteParams::default().grace_period(0))
        .await?;
    Api::<ModelPlacement>::namespaced(cluster.client(), cluster.namespace())
        .delete("podsick", &DeleteParams::default())
        .await?;
    Ok(())
}
