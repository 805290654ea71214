//! Placements Kubernetes enforces, against the real control plane (kube-apiserver 1.37,
//! kube-scheduler, kube-controller-manager, kwok nodes): the test publishes NVIDIA-shaped
//! ResourceSlices for a node whose AcceleratorInventory lists the same GPUs (matched by PCI
//! bus id), and the controller holds a placement's devices as ResourceClaims it allocates.
//!
//! - the claims are allocated to exactly the planned devices, the placement's own pod is
//!   scheduled by kube-scheduler onto the planned node, and a rival pod asking for all the
//!   driver's GPUs stays Pending with the scheduler's reason;
//! - deleting the placement frees the devices and the rival schedules;
//! - a restarted controller neither duplicates nor drops claims;
//! - a claim a tenant keeps after deleting its placement keeps its GPU out of
//!   `status.freeDevices` (and gets a `PlacementGone` Event) until it is deleted;
//! - `allocation: labels` makes no claims; `allocation: claims` plans only on published
//!   devices;
//! - with `--health-taints enforce`, a sick published GPU gets a DeviceTaintRule naming
//!   exactly its DRA device (no Node taint), in `resource.k8s.io/v1` on an apiserver started
//!   without DRA feature gates or runtime-config, which kube-scheduler honours and a
//!   controller of another scope leaves alone; the GPU's recovery deletes it.
//!
//! Full tier only (needs the scheduler and kwok): `tests/cluster/up.sh --full && cargo test
//! --test cluster_tier -- --include-ignored cluster_dra::`.

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Result, bail};
use hwaccel::api::placement::{AllocationMode, ModelPlacementSpec, ModelPlacementStatus};
use hwaccel::api::{ModelPlacement, attribute, conditions};
use hwaccel::controller::metrics::ControllerMetrics;
use hwaccel::controller::{self, Config};
use hwaccel::testing::{InventoryBuilder, PlacementBuilder};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::nodes::{apply_inventory, create_kwok_node};
use support::{DEFAULT_TIMEOUT, TEST_LABEL, TestCluster, install_crds, wait_for};

pub(crate) const DRIVER: &str = "gpu.nvidia.com";

/// Held by each test for its whole run. The slices a test publishes are cluster-wide, and
/// a controller selecting its own test's inventories still plans on another test's
/// slice-only devices (a DRA-only node has no inventory to select by), so tests that
/// publish slices take turns, and the claim-template test removes its nodes when done.
pub(crate) static SLICES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const PLACEMENT_LABEL: &str = "hwaccel.io/placement";

/// The set-up of a test that plans against the scheduler on one DRA node: its turn at the
/// slices, a full-tier cluster with the CRDs and the NVIDIA DeviceClass, and an 8x H100 node
/// published by its driver's slice (name, GPUs published). `None` (said on stderr) where the
/// tier has no kube-scheduler or kwok.
pub(crate) async fn h100_dra_node() -> Result<
    Option<(
        tokio::sync::MutexGuard<'static, ()>,
        TestCluster,
        String,
        usize,
    )>,
> {
    let turn = SLICES.lock().await;
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        eprintln!("skipped: needs the full tier (kube-scheduler, kwok)");
        return Ok(None);
    }
    install_crds(&cluster.client()).await?;
    ensure_driver_class(&cluster).await?;
    let (node, gpus) = add_dra_node(&cluster, "h100-8x-nvswitch").await?;
    Ok(Some((turn, cluster, node, gpus)))
}

/// A kwok Node (kube-scheduler can place pods on it) with the fixture host's inventory, and
/// an NVIDIA-shaped ResourceSlice publishing its GPUs under the driver's own names
/// (`gpu-<index>`), matched to the inventory by PCI bus id. Returns the node name and the
/// number of GPUs published.
pub(crate) async fn add_dra_node(cluster: &TestCluster, scenario: &str) -> Result<(String, usize)> {
    let client = cluster.client();
    let name = cluster.unique_name(scenario);
    create_kwok_node(cluster, &name).await?;
    let inventory = InventoryBuilder::fixture(scenario)
        .node(&name)
        .label(TEST_LABEL, cluster.prefix())
        .build();
    let devices: Vec<serde_json::Value> = inventory
        .spec
        .devices
        .iter()
        .filter(|d| d.text(attribute::VENDOR).as_deref() == Some("nvidia"))
        .enumerate()
        .map(|(index, device)| {
            json!({
                "name": format!("gpu-{index}"),
                "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": device.text(attribute::UUID).unwrap_or_default()},
                    "productName": {"string": device.text(attribute::MODEL).unwrap_or_default()},
                    "resource.kubernetes.io/pciBusID": {"string": device.text(attribute::PCI_BUS_ID).unwrap_or_default()},
                },
                "capacity": {"memory": {"value": "80Gi"}},
            })
        })
        .collect();
    let published = devices.len();
    apply_inventory(&client, &inventory).await?;
    let slice: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-{DRIVER}")},
        "spec": {
            "driver": DRIVER,
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }))?;
    Api::<ResourceSlice>::all(client)
        .create(&PostParams::default(), &slice)
        .await?;
    Ok((name, published))
}

/// The vendor chart's DeviceClass for the driver (every NVIDIA DRA install has it).
pub(crate) async fn ensure_driver_class(cluster: &TestCluster) -> Result<()> {
    let class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]},
    }))?;
    Api::<DeviceClass>::all(cluster.client())
        .patch(
            DRIVER,
            &PatchParams::apply("hwaccel-tests").force(),
            &Patch::Apply(&class),
        )
        .await?;
    Ok(())
}

struct Running(tokio::task::JoinHandle<Result<()>>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn start_controller(cluster: &TestCluster) -> Running {
    let mut config = Config::cluster_wide("test-controller");
    config.namespace = Some(cluster.namespace().to_string());
    config.selector = Some(format!("{TEST_LABEL}={}", cluster.prefix()));
    config.debounce = Duration::from_millis(200);
    let metrics =
        ControllerMetrics::register(&mut prometheus_client::registry::Registry::default());
    Running(tokio::spawn(controller::run(
        cluster.client(),
        config,
        metrics,
        std::future::pending(),
    )))
}

pub(crate) async fn create_placement(
    cluster: &TestCluster,
    name: &str,
    mut spec: ModelPlacementSpec,
    allocation: AllocationMode,
) -> Result<()> {
    spec.allocation = Some(allocation);
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    api.create(&PostParams::default(), &ModelPlacement::new(name, spec))
        .await?;
    Ok(())
}

/// Waits until the placement is Ready for its current generation; on a timeout the error
/// carries the placement's last status, which says why it was not.
pub(crate) async fn wait_ready(cluster: &TestCluster, name: &str) -> Result<ModelPlacementStatus> {
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    let ready = wait_for(DEFAULT_TIMEOUT, &format!("{name} Ready"), || {
        let api = api.clone();
        async move {
            let placement = api.get(name).await?;
            let generation = placement.metadata.generation;
            Ok(placement.status.filter(|s| {
                s.observed_generation == generation
                    && conditions::find(&s.conditions, "Ready").is_some_and(|c| c.status == "True")
            }))
        }
    })
    .await;
    match ready {
        Ok(status) => Ok(status),
        Err(err) => {
            let last = api.get(name).await.map(|p| p.status);
            Err(err.context(format!("{name}'s last status: {last:?}")))
        }
    }
}

pub(crate) async fn claims_of(
    cluster: &TestCluster,
    placement: &str,
) -> Result<Vec<ResourceClaim>> {
    let api: Api<ResourceClaim> = Api::namespaced(cluster.client(), cluster.namespace());
    let list = api
        .list(&ListParams::default().labels(&format!("{PLACEMENT_LABEL}={placement}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .collect())
}

/// `(pool, device)` of every allocation result of `claims`.
pub(crate) fn allocated(claims: &[ResourceClaim]) -> BTreeSet<(String, String)> {
    claims
        .iter()
        .filter_map(|c| {
            c.status
                .as_ref()?
                .allocation
                .as_ref()?
                .devices
                .as_ref()?
                .results
                .as_ref()
        })
        .flatten()
        .map(|r| (r.pool.clone(), r.device.clone()))
        .collect()
}

/// A pod with one claim; `claim` is `("resourceClaimName"|"resourceClaimTemplateName", name)`.
/// `node` pins it (through its hostname label) to one node: other tests' nodes publish GPUs
/// of the same driver, and a pod free to go anywhere could take theirs.
pub(crate) async fn create_pod(
    cluster: &TestCluster,
    name: &str,
    claim: (&str, &str),
    node: &str,
) -> Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{
                "name": "model",
                "image": "registry.invalid/model:test",
                "resources": {"claims": [{"name": "accelerators"}]},
            }],
            "resourceClaims": [{"name": "accelerators", claim.0: claim.1}],
        },
    }))?;
    Api::<Pod>::namespaced(cluster.client(), cluster.namespace())
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

/// A claim template asking for `count` GPUs of the driver, any of them.
async fn create_any_gpus_template(cluster: &TestCluster, name: &str, count: usize) -> Result<()> {
    let template = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{
            "name": "gpus",
            "exactly": {"deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": count},
        }]}}},
    });
    let api: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        Api::namespaced(cluster.client(), cluster.namespace());
    api.create(&PostParams::default(), &serde_json::from_value(template)?)
        .await?;
    Ok(())
}

pub(crate) async fn scheduled_node(cluster: &TestCluster, pod: &str) -> Result<Option<String>> {
    let pod = Api::<Pod>::namespaced(cluster.client(), cluster.namespace())
        .get(pod)
        .await?;
    Ok(pod.spec.and_then(|s| s.node_name))
}

/// The scheduler's latest FailedScheduling message for `pod`, if any.
async fn scheduling_failure(cluster: &TestCluster, pod: &str) -> Result<Option<String>> {
    let out = cluster
        .kubectl_ok(&[
            "get",
            "events",
            "-n",
            cluster.namespace(),
            "--field-selector",
            &format!("involvedObject.name={pod},reason=FailedScheduling"),
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .await?;
    Ok((!out.trim().is_empty()).then(|| out.trim().to_string()))
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn claims_hold_exactly_the_planned_devices_against_the_scheduler() -> Result<()> {
    let Some((_turn, cluster, node, gpus)) = h100_dra_node().await? else {
        return Ok(());
    };
    assert!(gpus >= 2, "fixture has {gpus} NVIDIA GPUs");
    let controller = start_controller(&cluster);
    create_placement(
        &cluster,
        "llama",
        PlacementBuilder::serve("llama-3.1-8b").spec(),
        AllocationMode::Claims,
    )
    .await?;
    let status = wait_ready(&cluster, "llama").await?;
    assert_eq!(status.allocation.as_deref(), Some("claims"));
    let claims = claims_of(&cluster, "llama").await?;
    assert_eq!(claims.len(), status.claims.len(), "{status:?}");
    // (a) The allocations name exactly the planned devices, and the status says the same
    // (`kubectl get mp -o wide` prints status.deviceNames).
    let held = allocated(&claims);
    let planned: BTreeSet<(String, String)> = status
        .claims
        .iter()
        .flat_map(|c| c.devices.iter().map(|d| (d.pool.clone(), d.device.clone())))
        .collect();
    assert_eq!(held, planned);
    let planned_devices: usize = status.assignments.iter().map(|a| a.devices.len()).sum();
    assert_eq!(held.len(), planned_devices);
    let wide: BTreeSet<(String, String)> = status
        .device_names
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .filter_map(|d| d.split_once('/'))
        .map(|(p, d)| (p.to_string(), d.to_string()))
        .collect();
    assert_eq!(wide, held);
    // What people see: `kubectl get mp -o wide` (Devices column) and `kubectl get
    // resourceclaims` name the same devices.
    let mp_wide = cluster
        .kubectl_ok(&[
            "get",
            "mp",
            "llama",
            "-n",
            cluster.namespace(),
            "-o",
            "wide",
        ])
        .await?;
    let claims_view = cluster
        .kubectl_ok(&[
            "get",
            "resourceclaims",
            "-n",
            cluster.namespace(),
            "-l",
            &format!("{PLACEMENT_LABEL}=llama"),
            "-o",
            "custom-columns=POOL:.status.allocation.devices.results[*].pool,DEVICE:.status.allocation.devices.results[*].device",
            "--no-headers",
        ])
        .await?;
    for (pool, device) in &held {
        assert!(mp_wide.contains(&format!("{pool}/{device}")), "{mp_wide}");
        assert!(claims_view.contains(device.as_str()), "{claims_view}");
    }
    assert!(status.claims.iter().all(|c| c.node == node && c.allocated));

    // The placement's own pod, built from the status's fragment, lands on the planned node.
    let claim_name = status.claims[0].pod_template.resource_claims[0]
        .resource_claim_name
        .clone();
    create_pod(
        &cluster,
        "model-0",
        ("resourceClaimName", &claim_name),
        &node,
    )
    .await?;
    wait_for(DEFAULT_TIMEOUT, "model-0 scheduled", || async {
        scheduled_node(&cluster, "model-0").await
    })
    .await
    .map(|n| assert_eq!(n, node))?;

    // A rival asking for all the driver's GPUs cannot get the held ones and stays Pending.
    create_any_gpus_template(&cluster, "all-gpus", gpus).await?;
    create_pod(
        &cluster,
        "rival",
        ("resourceClaimTemplateName", "all-gpus"),
        &node,
    )
    .await?;
    let reason = wait_for(DEFAULT_TIMEOUT, "rival FailedScheduling", || async {
        scheduling_failure(&cluster, "rival").await
    })
    .await?;
    assert!(reason.contains("cannot allocate all claims"), "{reason}");
    assert_eq!(scheduled_node(&cluster, "rival").await?, None);

    // (d) A restarted controller finds its claims: none added, none dropped.
    let before: BTreeMap<String, Option<String>> = claims
        .iter()
        .map(|c| {
            (
                c.metadata.name.clone().unwrap_or_default(),
                c.metadata.uid.clone(),
            )
        })
        .collect();
    drop(controller);
    let restarted = start_controller(&cluster);
    // Give the new controller time to reconcile everything at least once.
    tokio::time::sleep(Duration::from_secs(5)).await;
    wait_ready(&cluster, "llama").await?;
    let after: BTreeMap<String, Option<String>> = claims_of(&cluster, "llama")
        .await?
        .iter()
        .map(|c| {
            (
                c.metadata.name.clone().unwrap_or_default(),
                c.metadata.uid.clone(),
            )
        })
        .collect();
    assert_eq!(before, after, "claims changed across a controller restart");

    // (b) Deleting the placement (and its pod) frees the devices: the rival schedules.
    Api::<ModelPlacement>::namespaced(cluster.client(), cluster.namespace())
        .delete("llama", &DeleteParams::default())
        .await?;
    Api::<Pod>::namespaced(cluster.client(), cluster.namespace())
        .delete("model-0", &DeleteParams::default().grace_period(0))
        .await?;
    let rival_node = wait_for(DEFAULT_TIMEOUT, "rival scheduled", || async {
        scheduled_node(&cluster, "rival").await
    })
    .await?;
    assert_eq!(rival_node, node);
    drop(restarted);
    Ok(())
}

/// `status.freeDevices` of the inventory of `node` (`None` until the controller wrote it).
async fn free_devices(cluster: &TestCluster, node: &str) -> Result<Option<u32>> {
    let inventories: Api<hwaccel::api::AcceleratorInventory> = Api::all(cluster.client());
    Ok(inventories
        .get(node)
        .await?
        .status
        .and_then(|s| s.free_devices))
}

/// Issue 27 (Low): a tenant kept the claim the controller allocated for its placement (here
/// by taking the ownerReference off, so neither the finalizer nor the garbage collector
/// deletes it), deleted the placement, and the device still held by the claim was counted
/// free. Now it stays reserved in `status.freeDevices` while the claim holds it, the claim
/// gets a `PlacementGone` Warning Event, and the device is free once the claim is gone.
#[tokio::test]
#[ignore = "needs cluster"]
async fn a_claim_kept_past_its_placement_keeps_its_device_out_of_free_devices() -> Result<()> {
    let Some((_turn, cluster, node, _)) = h100_dra_node().await? else {
        return Ok(());
    };
    let _controller = start_controller(&cluster);
    let free_at_first = wait_for(DEFAULT_TIMEOUT, "freeDevices written", || async {
        free_devices(&cluster, &node).await
    })
    .await?;
    create_placement(
        &cluster,
        "llama",
        PlacementBuilder::serve("llama-3.1-8b").spec(),
        AllocationMode::Claims,
    )
    .await?;
    wait_ready(&cluster, "llama").await?;
    let claims = claims_of(&cluster, "llama").await?;
    assert_eq!(claims.len(), 1, "one GPU, one claim");
    let claim = claims[0].metadata.name.clone().unwrap_or_default();
    let held = free_at_first - 1;
    wait_for(DEFAULT_TIMEOUT, "one GPU held", || async {
        Ok(free_devices(&cluster, &node)
            .await?
            .filter(|free| *free == held))
    })
    .await?;

    // The tenant keeps the claim: the ownerReference off, then the placement deleted.
    let claim_api: Api<ResourceClaim> = Api::namespaced(cluster.client(), cluster.namespace());
    claim_api
        .patch(
            &claim,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": null}})),
        )
        .await?;
    let placements: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    placements.delete("llama", &DeleteParams::default()).await?;
    wait_for(DEFAULT_TIMEOUT, "the placement gone", || async {
        Ok(placements.get_opt("llama").await?.is_none().then_some(()))
    })
    .await?;
    // The controller reports the claim that outlived its placement...
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(cluster.client(), cluster.namespace());
    wait_for(
        DEFAULT_TIMEOUT,
        "a PlacementGone Event on the claim",
        || async {
            let list = events.list(&ListParams::default()).await?;
            Ok(list
                .items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("PlacementGone")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&claim)
                })
                .then_some(()))
        },
    )
    .await?;
    // ...and while it is allocated, its GPU is not free (before: freeDevices went back up
    // within the next fleet pass, a second after the placement went).
    assert!(
        claim_api
            .get(&claim)
            .await?
            .status
            .is_some_and(|s| s.allocation.is_some()),
        "the kept claim is still allocated"
    );
    for _ in 0..10 {
        assert_eq!(free_devices(&cluster, &node).await?, Some(held));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Once the tenant lets go, the GPU is free again.
    claim_api.delete(&claim, &DeleteParams::default()).await?;
    wait_for(DEFAULT_TIMEOUT, "the GPU free again", || async {
        Ok(free_devices(&cluster, &node)
            .await?
            .filter(|free| *free == free_at_first))
    })
    .await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn labels_mode_makes_no_claims_and_claims_mode_plans_only_published_devices() -> Result<()> {
    let _turn = SLICES.lock().await;
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    ensure_driver_class(&cluster).await?;
    let (_node, _) = add_dra_node(&cluster, "h100-8x-nvswitch").await?;
    // A node whose GPUs no DRA driver publishes (an inventory, no slice).
    let plain = cluster.unique_name("plain");
    let node: Node = serde_json::from_value(json!({
        "metadata": {
            "name": plain,
            "labels": {TEST_LABEL: cluster.prefix(), "kubernetes.io/hostname": plain},
        },
    }))?;
    Api::<Node>::all(cluster.client())
        .create(&PostParams::default(), &node)
        .await?;
    let inventory = InventoryBuilder::fixture("mi300x-8x")
        .node(&plain)
        .label(TEST_LABEL, cluster.prefix())
        .build();
    apply_inventory(&cluster.client(), &inventory).await?;
    let _controller = start_controller(&cluster);
    create_placement(
        &cluster,
        "by-labels",
        PlacementBuilder::serve("llama-3.1-8b").spec(),
        AllocationMode::Labels,
    )
    .await?;
    create_placement(
        &cluster,
        "on-amd",
        PlacementBuilder::serve("llama-3.1-8b")
            .node_selector("kubernetes.io/hostname", &plain)
            .spec(),
        AllocationMode::Claims,
    )
    .await?;
    let labels = wait_ready(&cluster, "by-labels").await?;
    assert_eq!(labels.allocation.as_deref(), Some("labels"));
    assert!(labels.claims.is_empty());
    assert!(claims_of(&cluster, "by-labels").await?.is_empty());
    // Only the plain node is allowed and no driver publishes its GPUs: claims cannot hold it.
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    let refused = wait_for(DEFAULT_TIMEOUT, "on-amd Pending", || {
        let api = api.clone();
        async move {
            Ok(api
                .get("on-amd")
                .await?
                .status
                .filter(|s| s.state.as_deref() == Some("Pending")))
        }
    })
    .await?;
    if !claims_of(&cluster, "on-amd").await?.is_empty() {
        bail!("a refused placement holds claims: {refused:?}");
    }
    Ok(())
}

/// A kwok Node, known from its vendor slices alone (no AcceleratorInventory, as on a
/// DRA-only cluster): the AMD driver's two-slice pool from `fixtures/dra/amd-mi300x-8x.yaml`
/// (8x MI300X, 196,592 MiB each; provenance in `fixtures/dra/PROVENANCE.md`), moved to the
/// new node. Returns the node name.
async fn add_amd_slice_node(cluster: &TestCluster) -> Result<String> {
    let client = cluster.client();
    let name = cluster.unique_name("mi300x");
    create_kwok_node(cluster, &name).await?;
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/dra/amd-mi300x-8x.yaml");
    let slices = hwaccel::cli::plan_dra::load_resource_slices(&[path])?;
    for (index, mut slice) in slices.into_iter().enumerate() {
        slice.metadata = kube::core::ObjectMeta {
            name: Some(format!("{name}-gpu.amd.com-{index}")),
            ..Default::default()
        };
        slice.spec.node_name = Some(name.clone());
        slice.spec.pool.name = name.clone();
        Api::<ResourceSlice>::all(client.clone())
            .create(&PostParams::default(), &slice)
            .await?;
    }
    Ok(name)
}

/// The hwaccel DeviceClasses (a claim template's subrequests name the family class).
pub(crate) async fn apply_hwaccel_classes(cluster: &TestCluster) -> Result<()> {
    let api: Api<DeviceClass> = Api::all(cluster.client());
    for class in hwaccel::dra::device_classes::device_classes() {
        let name = class.metadata.name.clone().unwrap_or_default();
        let mut body = serde_json::to_value(&class)?;
        body["apiVersion"] = json!("resource.k8s.io/v1");
        body["kind"] = json!("DeviceClass");
        api.patch(
            &name,
            &PatchParams::apply("hwaccel-tests").force(),
            &Patch::Apply(body),
        )
        .await?;
    }
    Ok(())
}

/// A pod using the placement's template fragment, free to go to either of this test's
/// nodes (selected by the test label, so other tests' GPUs stay out).
pub(crate) async fn create_template_pod(
    cluster: &TestCluster,
    name: &str,
    fragment: &hwaccel::api::placement::PodTemplateClaimFragment,
) -> Result<()> {
    create_template_pod_on(cluster, name, fragment, None).await
}

/// [`create_template_pod`], kept to `node` when one is given.
async fn create_template_pod_on(
    cluster: &TestCluster,
    name: &str,
    fragment: &hwaccel::api::placement::PodTemplateClaimFragment,
    node: Option<&str>,
) -> Result<()> {
    let mut selector = serde_json::Map::new();
    selector.insert(TEST_LABEL.to_string(), json!(cluster.prefix()));
    if let Some(node) = node {
        selector.insert("kubernetes.io/hostname".to_string(), json!(node));
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": selector,
            "containers": [{
                "name": "model",
                "image": "registry.invalid/model:test",
                "resources": {"claims": [{"name": "accelerators"}]},
            }],
            "resourceClaims": serde_json::to_value(&fragment.resource_claims)?,
        },
    }))?;
    Api::<Pod>::namespaced(cluster.client(), cluster.namespace())
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

/// `(request, pool)` of each allocation result of the claim the pod's template made.
async fn pod_claim_results(cluster: &TestCluster, pod: &str) -> Result<Vec<(String, String)>> {
    let results = allocation_results(cluster, pod).await?;
    Ok(results.into_iter().map(|r| (r.request, r.pool)).collect())
}

/// The allocation results of the claim the pod's template made, once it is allocated.
pub(crate) async fn allocation_results(
    cluster: &TestCluster,
    pod: &str,
) -> Result<Vec<k8s_openapi::api::resource::v1::DeviceRequestAllocationResult>> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client(), cluster.namespace());
    wait_for(DEFAULT_TIMEOUT, &format!("{pod}'s claim allocated"), || {
        let (pods, claims) = (pods.clone(), claims.clone());
        async move {
            let Some(claim) = pods
                .get(pod)
                .await?
                .status
                .and_then(|s| s.resource_claim_statuses)
                .and_then(|s| s.into_iter().find_map(|c| c.resource_claim_name))
            else {
                return Ok(None);
            };
            let results = claims
                .get(&claim)
                .await?
                .status
                .and_then(|s| s.allocation)
                .and_then(|a| a.devices)
                .and_then(|d| d.results)
                .unwrap_or_default();
            Ok((!results.is_empty()).then_some(results))
        }
    })
    .await
}

/// (c) `allocation: claimTemplate` on an NVIDIA node (8x H100 80GB, with an inventory) and
/// an AMD node (8x MI300X, slices only): the controller writes one template whose
/// alternatives follow the planner (1x MI300X first for 70B at bf16, then an H100 group),
/// holds nothing itself, and the real scheduler gives a pod on the AMD node the first choice,
/// then a pod free to go to either node the second once another claim holds the rest of the
/// first choice's devices.
#[tokio::test]
#[ignore = "needs cluster"]
async fn claim_template_lists_the_planners_alternatives_and_the_scheduler_falls_back() -> Result<()>
{
    let _turn = SLICES.lock().await;
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        eprintln!("skipped: needs the full tier (kube-scheduler, kwok)");
        return Ok(());
    }
    install_crds(&cluster.client()).await?;
    apply_hwaccel_classes(&cluster).await?;
    let (nvidia, _) = add_dra_node(&cluster, "h100-8x-nvswitch").await?;
    let amd = add_amd_slice_node(&cluster).await?;
    let result = template_fallback(&cluster, &nvidia, &amd).await;
    let removed = remove_nodes(&cluster, &[&nvidia, &amd]).await;
    result.and(removed)
}

/// Deletes `nodes` and every ResourceSlice published for them.
pub(crate) async fn remove_nodes(cluster: &TestCluster, nodes: &[&str]) -> Result<()> {
    let slices: Api<ResourceSlice> = Api::all(cluster.client());
    for slice in slices.list(&ListParams::default()).await?.items {
        if slice
            .spec
            .node_name
            .as_deref()
            .is_some_and(|n| nodes.contains(&n))
        {
            let name = slice.metadata.name.unwrap_or_default();
            slices.delete(&name, &DeleteParams::default()).await?;
        }
    }
    for node in nodes {
        Api::<Node>::all(cluster.client())
            .delete(node, &DeleteParams::default())
            .await?;
    }
    Ok(())
}

async fn template_fallback(cluster: &TestCluster, nvidia: &str, amd: &str) -> Result<()> {
    let (nvidia, amd) = (nvidia.to_string(), amd.to_string());
    let _controller = start_controller(cluster);
    let spec = bf16_at_8k("llama-3.1-70b");
    create_placement(cluster, "llama", spec, AllocationMode::ClaimTemplate).await?;
    let status = wait_ready(cluster, "llama").await?;
    assert_eq!(status.allocation.as_deref(), Some("claimTemplate"));
    assert_eq!(status.claim_template.as_deref(), Some("llama"));
    let ready = conditions::find(&status.conditions, "Ready").expect("Ready");
    assert_eq!(ready.reason, "ClaimTemplateWritten");
    assert!(status.assignments.is_empty() && status.node_selector.is_empty());
    assert!(
        claims_of(cluster, "llama").await?.is_empty(),
        "no claims of ours"
    );
    assert_eq!(status.alternatives.len(), 2, "{:?}", status.alternatives);
    assert!(
        status.alternatives[0].starts_with("1x gpu.amd.com >="),
        "{:?}",
        status.alternatives
    );
    assert!(
        status.alternatives[1].contains("x gpu.nvidia.com >="),
        "{:?}",
        status.alternatives
    );

    // The template: ours (label, owner), the alternatives in the planner's order.
    let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        Api::namespaced(cluster.client(), cluster.namespace());
    let template = templates.get("llama").await?;
    let labels = template.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get(PLACEMENT_LABEL).map(String::as_str),
        Some("llama")
    );
    let owners = template
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    assert!(
        owners
            .iter()
            .any(|o| o.kind == "ModelPlacement" && o.name == "llama")
    );
    let subrequests: Vec<(String, String)> = template
        .spec
        .spec
        .devices
        .and_then(|d| d.requests)
        .and_then(|r| r.into_iter().next())
        .and_then(|r| r.first_available)
        .unwrap_or_default()
        .into_iter()
        .map(|s| {
            let selector = s
                .selectors
                .and_then(|s| s.into_iter().next())
                .and_then(|s| s.cel)
                .map(|c| c.expression)
                .unwrap_or_default();
            (s.name, selector)
        })
        .collect();
    assert_eq!(subrequests.len(), 2);
    assert!(
        subrequests[0]
            .1
            .starts_with("device.driver == 'gpu.amd.com'"),
        "{subrequests:?}"
    );
    assert!(
        subrequests[1]
            .1
            .starts_with("device.driver == 'gpu.nvidia.com'"),
        "{subrequests:?}"
    );
    let fragment = status.pod_template.clone().expect("a pod fragment");

    // On a node where the first choice is available, a pod gets it. (Which node a pod free to
    // go to either lands on is the scheduler's scoring: `firstAvailable` orders the choices
    // on each node, not the nodes; a CI run saw such a pod bound to the H100 node.)
    create_template_pod_on(cluster, "first", &fragment, Some(&amd)).await?;
    let node = wait_for(DEFAULT_TIMEOUT, "first scheduled", || async {
        scheduled_node(cluster, "first").await
    })
    .await?;
    let results = pod_claim_results(cluster, "first").await?;
    assert_eq!(node, amd, "{results:?}");
    let first_request = format!("accelerators/{}", subrequests[0].0);
    assert_eq!(results, [(first_request, amd.clone())]);

    // Another workload takes the other seven MI300X: the next pod falls back to the H100s.
    let blocker_template = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "seven-mi300x"},
        "spec": {"spec": {"devices": {"requests": [{
            "name": "gpus",
            "exactly": {"deviceClassName": "gpu.hwaccel.io", "allocationMode": "ExactCount", "count": 7},
        }]}}},
    });
    templates
        .create(
            &PostParams::default(),
            &serde_json::from_value(blocker_template)?,
        )
        .await?;
    create_pod(
        cluster,
        "blocker",
        ("resourceClaimTemplateName", "seven-mi300x"),
        &amd,
    )
    .await?;
    let held = pod_claim_results(cluster, "blocker").await?;
    assert_eq!(held.len(), 7);
    create_template_pod(cluster, "second", &fragment).await?;
    let node = wait_for(DEFAULT_TIMEOUT, "second scheduled", || async {
        scheduled_node(cluster, "second").await
    })
    .await?;
    let results = pod_claim_results(cluster, "second").await?;
    assert_eq!(node, nvidia, "{results:?}");
    let second_request = format!("accelerators/{}", subrequests[1].0);
    assert!(
        !results.is_empty()
            && results
                .iter()
                .all(|r| *r == (second_request.clone(), nvidia.clone())),
        "{results:?}"
    );

    // Switching to labels deletes the template; switching back writes it again.
    let placements: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    // Pinned to the NVIDIA node: with labels, the plan needs a Node this test labels.
    let switch = |mode: &str| {
        json!({"spec": {"allocation": mode,
            "constraints": {"nodeSelector": {"kubernetes.io/hostname": nvidia}}}})
    };
    placements
        .patch(
            "llama",
            &PatchParams::default(),
            &Patch::Merge(switch("labels")),
        )
        .await?;
    let labelled = wait_ready(cluster, "llama").await?;
    assert_eq!(labelled.allocation.as_deref(), Some("labels"));
    assert!(labelled.claim_template.is_none() && labelled.alternatives.is_empty());
    wait_for(DEFAULT_TIMEOUT, "template deleted on the switch", || {
        let templates = templates.clone();
        async move { Ok(templates.get_opt("llama").await?.is_none().then_some(())) }
    })
    .await?;
    placements
        .patch(
            "llama",
            &PatchParams::default(),
            &Patch::Merge(switch("claimTemplate")),
        )
        .await?;
    let again = wait_ready(cluster, "llama").await?;
    assert_eq!(again.claim_template.as_deref(), Some("llama"));
    templates.get("llama").await?;

    // Deleting the placement deletes its template (the finalizer; pods keep their claims).
    placements.delete("llama", &DeleteParams::default()).await?;
    wait_for(DEFAULT_TIMEOUT, "template deleted", || {
        let templates = templates.clone();
        async move { Ok(templates.get_opt("llama").await?.is_none().then_some(())) }
    })
    .await?;
    Ok(())
}

/// The fixture's inventory for `node`, written as the agent writes it, with its first NVIDIA
/// GPU's health `health` and every other one healthy (the fixture reports one degraded).
/// Returns that first GPU's inventory name.
async fn set_first_gpu_health(cluster: &TestCluster, node: &str, health: &str) -> Result<String> {
    let mut inventory = InventoryBuilder::fixture("h100-8x-nvswitch")
        .node(node)
        .label(TEST_LABEL, cluster.prefix())
        .build();
    let mut first = None;
    for gpu in inventory
        .spec
        .devices
        .iter_mut()
        .filter(|d| d.text(attribute::VENDOR).as_deref() == Some("nvidia"))
    {
        let value = if first.is_none() { health } else { "healthy" };
        first.get_or_insert_with(|| gpu.name.clone());
        gpu.attributes.insert(
            attribute::HEALTH.to_string(),
            hwaccel::api::DeviceAttribute::String(value.to_string()),
        );
    }
    let id = first.expect("the fixture has NVIDIA GPUs");
    apply_inventory(&cluster.client(), &inventory).await?;
    Ok(id)
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_sick_published_gpu_gets_a_device_taint_rule_the_scheduler_honours() -> Result<()> {
    use hwaccel::controller::HealthTaints;
    use hwaccel::controller::taints::core::{TAINT_KEY, rule_name};
    use hwaccel::controller::taints::rules_resource;
    use kube::api::DynamicObject;

    let _turn = SLICES.lock().await;
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    ensure_driver_class(&cluster).await?;
    let (node, published) = add_dra_node(&cluster, "h100-8x-nvswitch").await?;
    let (_controller, _registry) = support::controller::start_controller_with(&cluster, |c| {
        c.health_taints = HealthTaints::Enforce;
    });

    // One GPU turns unhealthy: a NoSchedule rule names exactly its DRA device, and the Node
    // itself stays untainted (its other seven GPUs remain schedulable).
    // A stock apiserver: nothing turns DeviceTaintRules or an older resource.k8s.io version on.
    let apiserver = std::fs::read_to_string(cluster.env().work.join("run/kube-apiserver.cmd"))?;
    for flag in ["DRADeviceTaintRules", "resource.k8s.io/v1beta2"] {
        assert!(
            !apiserver.contains(flag),
            "the test apiserver sets {flag}: {apiserver}"
        );
    }
    let sick = set_first_gpu_health(&cluster, &node, "unhealthy").await?;
    if support::served_rule_versions(&cluster.client())
        .await
        .is_empty()
    {
        // The oldest supported minors (the compat tier) serve no DeviceTaintRule without a
        // gate: the controller must fall back to its Node taint, and take it back.
        let minor = support::apiserver_minor(&cluster.client()).await?;
        assert!(minor < 37, "1.{minor} serves no DeviceTaintRule");
        return node_taint_fallback(&cluster, &node).await;
    }
    // 1.37 serves DeviceTaintRule in v1 (GA) with no flag; the controller must use it.
    let rules: Api<DynamicObject> = Api::all_with(cluster.client(), &rules_resource("v1"));
    let name = rule_name(&node, &sick);
    let rule = wait_for(DEFAULT_TIMEOUT, "the DeviceTaintRule", || {
        let (rules, name) = (rules.clone(), name.clone());
        async move { Ok(rules.get_opt(&name).await?) }
    })
    .await?;
    let taint = &rule.data["spec"]["taint"];
    assert_eq!(
        (&taint["key"], &taint["effect"]),
        (&json!(TAINT_KEY), &json!("NoSchedule"))
    );
    let selector = &rule.data["spec"]["deviceSelector"];
    assert_eq!(
        selector,
        &json!({"driver": DRIVER, "pool": node, "device": "gpu-0"})
    );
    let taints = Api::<Node>::all(cluster.client())
        .get(&node)
        .await?
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default();
    assert!(taints.iter().all(|t| t.key != TAINT_KEY), "{taints:?}");

    // A controller watching other nodes (a canary) leaves this scope's rule alone.
    {
        let (_canary, _registry) = support::controller::start_controller_with(&cluster, |c| {
            c.health_taints = HealthTaints::Enforce;
            c.selector = Some(format!("{TEST_LABEL}=nobody-{}", cluster.prefix()));
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            rules.get_opt(&name).await?.is_some(),
            "the canary deleted it"
        );
    }

    // The scheduler honours the rule: every GPU of the node is more than it will give.
    create_any_gpus_template(&cluster, "every-gpu", published).await?;
    create_pod(
        &cluster,
        "every-gpu",
        ("resourceClaimTemplateName", "every-gpu"),
        &node,
    )
    .await?;
    let failure = wait_for(DEFAULT_TIMEOUT, "the pod refused", || {
        let cluster = &cluster;
        async move { scheduling_failure(cluster, "every-gpu").await }
    })
    .await?;
    assert_eq!(
        scheduled_node(&cluster, "every-gpu").await?,
        None,
        "{failure}"
    );

    eprintln!("scheduler: {failure}");

    // Healthy again: the rule goes, and the same request is scheduled on the node. (A pod
    // the scheduler parked as unschedulable is retried on its own clock, minutes later, so
    // the test asks again with a new pod rather than wait.)
    set_first_gpu_health(&cluster, &node, "healthy").await?;
    wait_for(DEFAULT_TIMEOUT, "the rule deleted", || {
        let (rules, name) = (rules.clone(), name.clone());
        async move { Ok(rules.get_opt(&name).await?.is_none().then_some(())) }
    })
    .await?;
    let pods = Api::<Pod>::namespaced(cluster.client(), cluster.namespace());
    pods.delete("every-gpu", &DeleteParams::default().grace_period(0))
        .await?;
    // The scheduler may still hold the deleted rule in its cache when the new pod arrives,
    // and then parks the pod for minutes (CI saw it under load): a pod that is not bound
    // within 30 s is replaced by a fresh one, four times at most.
    let mut placed = None;
    for attempt in 0..4 {
        let pod = format!("every-gpu-again-{attempt}");
        create_pod(
            &cluster,
            &pod,
            ("resourceClaimTemplateName", "every-gpu"),
            &node,
        )
        .await?;
        let bound = wait_for(Duration::from_secs(30), "the pod scheduled", || {
            let (cluster, pod) = (&cluster, pod.clone());
            async move { scheduled_node(cluster, &pod).await }
        })
        .await;
        if let Ok(bound) = bound {
            placed = Some(bound);
            break;
        }
        pods.delete(&pod, &DeleteParams::default().grace_period(0))
            .await?;
    }
    assert_eq!(placed.as_deref(), Some(node.as_str()));
    remove_nodes(&cluster, &[&node]).await?;
    Ok(())
}

/// Where no DeviceTaintRule is served: the node with the sick GPU gets the controller's Node
/// taint (NoSchedule), which goes once the GPU is healthy again.
async fn node_taint_fallback(cluster: &TestCluster, node: &str) -> Result<()> {
    use hwaccel::controller::taints::core::TAINT_KEY;
    let nodes = Api::<Node>::all(cluster.client());
    let ours = |node: Node| {
        node.spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .find(|t| t.key == TAINT_KEY)
    };
    let taint = wait_for(DEFAULT_TIMEOUT, "the Node taint", || {
        let nodes = nodes.clone();
        async move { Ok(ours(nodes.get(node).await?)) }
    })
    .await?;
    assert_eq!(taint.effect, "NoSchedule", "{taint:?}");
    set_first_gpu_health(cluster, node, "healthy").await?;
    wait_for(DEFAULT_TIMEOUT, "the Node taint removed", || {
        let nodes = nodes.clone();
        async move { Ok(ours(nodes.get(node).await?).is_none().then_some(())) }
    })
    .await?;
    remove_nodes(cluster, &[node]).await?;
    Ok(())
}

/// The Degraded condition of placement `name`, once `done` holds for it.
pub(crate) async fn degraded_when(
    cluster: &TestCluster,
    name: &str,
    what: &str,
    done: impl Fn(&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition) -> bool,
) -> Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    wait_for(DEFAULT_TIMEOUT, what, || {
        let (api, done) = (api.clone(), &done);
        async move {
            let status = api.get(name).await?.status.unwrap_or_default();
            Ok(conditions::find(&status.conditions, "Degraded")
                .filter(|c| done(c))
                .cloned())
        }
    })
    .await
}

/// A driver reports a held device unhealthy in its claim's `status.devices` (written as a
/// driver writes it, through the status subresource): the placement's Degraded condition
/// names the device and the driver's message and Ready is taken back; once the driver says
/// the device is Ready again, both clear.
#[tokio::test]
#[ignore = "needs cluster"]
async fn a_device_its_driver_reports_unhealthy_degrades_the_placement_until_it_recovers()
-> Result<()> {
    let _turn = SLICES.lock().await;
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    ensure_driver_class(&cluster).await?;
    let (node, _) = add_dra_node(&cluster, "h100-8x-nvswitch").await?;
    let _controller = start_controller(&cluster);
    create_placement(
        &cluster,
        "sick",
        PlacementBuilder::serve("llama-3.1-8b").spec(),
        AllocationMode::Claims,
    )
    .await?;
    wait_ready(&cluster, "sick").await?;
    let claims = claims_of(&cluster, "sick").await?;
    let claim = claims.first().expect("a claim");
    let claim_name = claim.metadata.name.clone().expect("named");
    let device = allocated(std::slice::from_ref(claim))
        .into_iter()
        .next()
        .expect("an allocated device");
    assert_eq!(device.0, node);
    let api: Api<ResourceClaim> = Api::namespaced(cluster.client(), cluster.namespace());
    let report = |status: &str, reason: &str, message: &str| {
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": claim_name},
            "status": {"devices": [{
                "driver": DRIVER, "pool": device.0, "device": device.1,
                "conditions": [{
                    "type": "Ready", "status": status, "reason": reason, "message": message,
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }],
            }]},
        })
    };
    // The driver's own field manager: our allocation (another manager's) stays as it is.
    let driver = PatchParams::apply("gpu.nvidia.com-kubelet-plugin").force();
    api.patch_status(
        &claim_name,
        &driver,
        &Patch::Apply(report(
            "False",
            "XidError",
            "Xid 79: GPU has fallen off the bus",
        )),
    )
    .await?;
    let degraded = degraded_when(&cluster, "sick", "Degraded names the device", |c| {
        c.status == "True"
    })
    .await?;
    assert_eq!(degraded.reason, "DeviceUnhealthy", "{degraded:?}");
    let named = format!("{DRIVER}/{}/{}", device.0, device.1);
    assert!(degraded.message.contains(&named), "{}", degraded.message);
    assert!(
        degraded
            .message
            .contains("Xid 79: GPU has fallen off the bus"),
        "{}",
        degraded.message
    );
    assert!(
        degraded.message.contains(&claim_name),
        "{}",
        degraded.message
    );
    let status = Api::<ModelPlacement>::namespaced(cluster.client(), cluster.namespace())
        .get("sick")
        .await?
        .status
        .unwrap_or_default();
    assert!(
        !conditions::is_true(&status.conditions, "Ready"),
        "{status:?}"
    );
    assert!(
        allocated(&[api.get(&claim_name).await?]).contains(&device),
        "the driver's status write kept the allocation"
    );

    // Ready again: the condition clears and the placement is Ready.
    api.patch_status(
        &claim_name,
        &driver,
        &Patch::Apply(report("True", "Prepared", "")),
    )
    .await?;
    degraded_when(&cluster, "sick", "Degraded cleared", |c| {
        c.status == "False"
    })
    .await?;
    wait_ready(&cluster, "sick").await?;
    Api::<ModelPlacement>::namespaced(cluster.client(), cluster.namespace())
        .delete("sick", &DeleteParams::default())
        .await?;
    Ok(())
}

/// Issue 39 on the real scheduler: a kwok node whose two H100s the driver publishes shareable
/// by memory (`fixtures/dra/nvidia-h100-shareable.yaml`: 80Gi, shares in 8Gi steps). Three
/// claim-template placements of an 8B model each get a share sized to the model; pods made
/// from their templates are bound by kube-scheduler with that share in their claims'
/// `consumedCapacity`, two of them on one GPU; pods keep coming until both GPUs are full and
/// the next one stays Pending; deleting one frees its share and the Pending one is bound. A
/// 70B placement on the same GPUs asks for all of each (no share lands beside it). A
/// placement holding its own claims counts the scheduler's shares: nothing while both GPUs
/// are full; once two pods go, a share in the room they left, allocated by the controller
/// with `consumedCapacity` and a `shareID`, which the scheduler then counts (one more pod
/// fits beside it, the next does not until the placement is deleted).
#[tokio::test]
#[ignore = "needs cluster"]
async fn claim_template_placements_share_a_gpu_through_the_scheduler() -> Result<()> {
    let _turn = SLICES.lock().await;
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        eprintln!("skipped: needs the full tier (kube-scheduler, kwok)");
        return Ok(());
    }
    install_crds(&cluster.client()).await?;
    apply_hwaccel_classes(&cluster).await?;
    let node = cluster.unique_name("h100-shared");
    create_kwok_node(&cluster, &node).await?;
    publish_fixture(&cluster, "nvidia-h100-shareable.yaml", &node).await?;
    // An apiserver without consumable capacity (the compat tier's 1.35, where it is alpha and
    // off) drops `allowMultipleAllocations` and `requestPolicy`: the GPUs are then plain whole
    // devices, and a small model must get one whole.
    let result = if serves_shares(&cluster, &format!("{node}-gpu.nvidia.com-0")).await? {
        shares_on(&cluster, &node).await
    } else {
        whole_without_consumable_capacity(&cluster).await
    };
    let removed = remove_nodes(&cluster, &[&node]).await;
    result.and(removed)
}

/// True when the apiserver kept `allowMultipleAllocations` on the published slice `slice`:
/// it serves consumable capacity (1.36 and later; 1.35, the compat tier, drops the field).
pub(crate) async fn serves_shares(cluster: &TestCluster, slice: &str) -> Result<bool> {
    Ok(Api::<ResourceSlice>::all(cluster.client())
        .get(slice)
        .await?
        .spec
        .devices
        .unwrap_or_default()
        .iter()
        .any(|d| d.allow_multiple_allocations == Some(true)))
}

/// A placement serving `model` at 8k context in BF16, the shape the template tests ask for.
pub(crate) fn bf16_at_8k(model: &str) -> ModelPlacementSpec {
    PlacementBuilder::serve(model)
        .context(8192)
        .precision(hwaccel::api::placement::PrecisionChoice::Bf16)
        .spec()
}

/// Publishes the pool of `fixtures/dra/<fixture>` (every slice of it) for kwok node `node`.
pub(crate) async fn publish_fixture(
    cluster: &TestCluster,
    fixture: &str,
    node: &str,
) -> Result<()> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/dra")
        .join(fixture);
    for (index, mut slice) in hwaccel::cli::plan_dra::load_resource_slices(&[path])?
        .into_iter()
        .enumerate()
    {
        slice.metadata = kube::core::ObjectMeta {
            name: Some(format!("{node}-{}-{index}", slice.spec.driver)),
            ..Default::default()
        };
        slice.spec.node_name = Some(node.to_string());
        slice.spec.pool.name = node.to_string();
        Api::<ResourceSlice>::all(cluster.client())
            .create(&PostParams::default(), &slice)
            .await?;
    }
    Ok(())
}

/// Issue 39, partitions on the real scheduler: a kwok node whose two H100s NVIDIA's driver
/// publishes with dynamic MIG (`fixtures/dra/nvidia-h100-dynamic-mig.yaml`, counters and
/// all). A claim-template placement of an 8B model asks first for the smallest MIG profile
/// that holds it (3g.40gb, through the chart's `mig.nvidia.com` class), then for a whole GPU;
/// a pod made from the template is bound by kube-scheduler to a 3g.40gb partition.
#[tokio::test]
#[ignore = "needs cluster"]
async fn claim_template_placements_take_the_smallest_mig_profile() -> Result<()> {
    let _turn = SLICES.lock().await;
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        eprintln!("skipped: needs the full tier (kube-scheduler, kwok)");
        return Ok(());
    }
    install_crds(&cluster.client()).await?;
    apply_hwaccel_classes(&cluster).await?;
    // The class NVIDIA's chart installs for MIG devices.
    let mig_class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": "mig.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}}]},
    }))?;
    Api::<DeviceClass>::all(cluster.client())
        .patch(
            "mig.nvidia.com",
            &PatchParams::apply("hwaccel-tests").force(),
            &Patch::Apply(&mig_class),
        )
        .await?;
    let node = cluster.unique_name("h100-mig");
    create_kwok_node(&cluster, &node).await?;
    publish_fixture(&cluster, "nvidia-h100-dynamic-mig.yaml", &node).await?;
    let result = mig_profile_on(&cluster, &node).await;
    let removed = remove_nodes(&cluster, &[&node]).await;
    let class_removed = Api::<DeviceClass>::all(cluster.client())
        .delete("mig.nvidia.com", &DeleteParams::default())
        .await
        .map(|_| ())
        .map_err(anyhow::Error::from);
    result.and(removed).and(class_removed)
}

async fn mig_profile_on(cluster: &TestCluster, node: &str) -> Result<()> {
    let _controller = start_controller(cluster);
    let spec = bf16_at_8k("llama-3.1-8b");
    create_placement(cluster, "chat", spec, AllocationMode::ClaimTemplate).await?;
    let status = wait_ready(cluster, "chat").await?;
    let fraction = status
        .plan
        .as_ref()
        .and_then(|p| p.fraction.clone())
        .expect("a fraction in the status");
    assert_eq!(
        (fraction.kind.as_str(), fraction.profile.as_deref()),
        ("partition", Some("3g.40gb")),
        "{status:?}"
    );
    assert!(
        status.alternatives[0].ends_with("profile=3g.40gb")
            && status.alternatives.len() >= 2
            && !status.alternatives[1].contains("profile="),
        "{:?}",
        status.alternatives
    );
    let fragment = status.pod_template.clone().expect("a pod fragment");
    // Placements holding their own claims take three of the node's four 3g.40gb devices
    // first: each step below waits only on what the controller and the scheduler count as
    // taken, never on them having seen a release or an allocation of the other's in time.
    let taken = held_mig_devices(cluster).await?;
    create_template_pod(cluster, "on-mig", &fragment).await?;
    let bound = wait_for(DEFAULT_TIMEOUT, "on-mig scheduled", || async {
        scheduled_node(cluster, "on-mig").await
    })
    .await?;
    assert_eq!(bound, node);
    let results = allocation_results(cluster, "on-mig").await?;
    assert_eq!(results.len(), 1);
    assert!(results[0].device.contains("-mig-3g40gb-"), "{results:?}");
    assert!(
        !taken.contains(&results[0].device),
        "the scheduler counts the controller's MIG devices: {results:?} {taken:?}"
    );
    eprintln!("bound to MIG device {}", results[0].device);
    // Deleting a placement frees its MIG device (its claim goes with it): the next pod is
    // bound to it.
    Api::<ModelPlacement>::namespaced(cluster.client(), cluster.namespace())
        .delete("mig-a", &DeleteParams::default())
        .await?;
    create_template_pod(cluster, "on-freed-mig", &fragment).await?;
    wait_for(DEFAULT_TIMEOUT, "on-freed-mig scheduled", || async {
        scheduled_node(cluster, "on-freed-mig").await
    })
    .await?;
    let freed = allocation_results(cluster, "on-freed-mig").await?;
    // Without partitionable devices (the compat tier drops the counters) the scheduler sees
    // no tie between a GPU and its MIG devices and may take the GPU whole instead.
    let counters_served = Api::<ResourceSlice>::all(cluster.client())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .any(|slice| {
            slice.spec.node_name.as_deref() == Some(node)
                && slice
                    .spec
                    .shared_counters
                    .as_ref()
                    .is_some_and(|c| !c.is_empty())
        });
    if counters_served {
        assert_eq!(freed[0].device, taken[0], "the MIG device mig-a gave back");
    }
    Ok(())
}

/// Issue 39, claims-mode partitions: three placements holding their own claims take three
/// 3g.40gb MIG devices of the node, one each: each claim names the MIG class and the
/// controller allocates a MIG device no other holds, which the apiserver accepts. Returns
/// the devices, in order.
async fn held_mig_devices(cluster: &TestCluster) -> Result<Vec<String>> {
    let claims = Api::<ResourceClaim>::namespaced(cluster.client(), cluster.namespace());
    let mut taken: Vec<String> = Vec::new();
    for name in ["mig-a", "mig-b", "mig-c"] {
        create_placement(
            cluster,
            name,
            bf16_at_8k("llama-3.1-8b"),
            AllocationMode::Claims,
        )
        .await?;
        let status = wait_ready(cluster, name).await?;
        let fraction = status.plan.as_ref().and_then(|p| p.fraction.clone());
        assert_eq!(
            fraction
                .as_ref()
                .map(|f| (f.kind.as_str(), f.profile.as_deref())),
            Some(("partition", Some("3g.40gb"))),
            "{status:?}"
        );
        let held = status.claims.first().expect("a claim").clone();
        assert!(held.allocated, "{status:?}");
        let (class, device) = class_and_device(claims.get(&held.name).await?);
        assert_eq!(class.as_deref(), Some("mig.nvidia.com"));
        let device = device.expect("the controller's allocation");
        assert!(device.contains("-mig-3g40gb-"), "{device}");
        assert!(
            !taken.contains(&device),
            "{device} handed out twice: {taken:?}"
        );
        taken.push(device);
    }
    eprintln!("three 3g.40gb MIG devices, one per holder: {taken:?}");
    Ok(taken)
}

/// The DeviceClass a one-request claim names, and the device its allocation holds.
pub(crate) fn class_and_device(claim: ResourceClaim) -> (Option<String>, Option<String>) {
    let class = claim
        .spec
        .devices
        .and_then(|d| d.requests)
        .and_then(|r| r.into_iter().next())
        .and_then(|r| r.exactly)
        .map(|e| e.device_class_name);
    let device = claim
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .and_then(|r| r.into_iter().next())
        .map(|r| r.device);
    (class, device)
}

/// Without consumable capacity served, a small model's template asks for a whole GPU.
async fn whole_without_consumable_capacity(cluster: &TestCluster) -> Result<()> {
    let _controller = start_controller(cluster);
    let spec = bf16_at_8k("llama-3.1-8b");
    create_placement(cluster, "chat", spec, AllocationMode::ClaimTemplate).await?;
    let status = wait_ready(cluster, "chat").await?;
    assert_eq!(status.plan.as_ref().and_then(|p| p.fraction.clone()), None);
    assert!(
        !status.alternatives[0].contains("memory="),
        "{:?}",
        status.alternatives
    );
    eprintln!(
        "no consumable capacity served: whole devices, {:?}",
        status.alternatives
    );
    Ok(())
}

/// `(device, memory consumed)` of the claim `pod`'s template made, once allocated.
async fn consumed_by(cluster: &TestCluster, pod: &str) -> Result<(String, String)> {
    let result = allocation_results(cluster, pod)
        .await?
        .into_iter()
        .next()
        .expect("an allocated claim has a result");
    let memory = result
        .consumed_capacity
        .and_then(|c| c.get("memory").map(|q| q.0.clone()))
        .unwrap_or_default();
    Ok((result.device, memory))
}

async fn shares_on(cluster: &TestCluster, node: &str) -> Result<()> {
    let _controller = start_controller(cluster);
    let small = || bf16_at_8k("llama-3.1-8b");
    let mut fragments = Vec::new();
    let mut share = None;
    for name in ["chat-a", "chat-b", "chat-c"] {
        create_placement(cluster, name, small(), AllocationMode::ClaimTemplate).await?;
        let status = wait_ready(cluster, name).await?;
        let fraction = status
            .plan
            .as_ref()
            .and_then(|p| p.fraction.clone())
            .expect("a fraction in the status");
        assert_eq!(fraction.kind, "share", "{status:?}");
        assert!(
            status.alternatives[0].contains("memory="),
            "{:?}",
            status.alternatives
        );
        share = Some(fraction.bytes);
        fragments.push(status.pod_template.clone().expect("a pod fragment"));
    }
    let share = share.expect("three placements");
    let expected = hwaccel::api::quantity::bytes(share).0;
    let per_gpu = (80u64 << 30) / share;
    assert!(per_gpu >= 2, "two shares fit one GPU ({expected})");

    // Pods from the three templates, round robin, until both GPUs are full: every one bound
    // to the node with the share in its claim, at least two on one GPU.
    let fitting = usize::try_from(per_gpu * 2)?;
    let mut on_device: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for index in 0..fitting {
        let pod = format!("share-{index}");
        create_template_pod(cluster, &pod, &fragments[index % 3]).await?;
        let bound = wait_for(DEFAULT_TIMEOUT, &format!("{pod} scheduled"), || async {
            scheduled_node(cluster, &pod).await
        })
        .await?;
        assert_eq!(bound, node);
        let (device, consumed) = consumed_by(cluster, &pod).await?;
        assert_eq!(consumed, expected, "{pod} on {device}");
        on_device.entry(device).or_default().push(pod);
    }
    assert!(
        on_device.values().any(|pods| pods.len() >= 2),
        "{on_device:?}"
    );
    eprintln!("shares of {expected} bound by the scheduler, per GPU: {on_device:?}");
    // One more does not fit: its share would overflow either GPU.
    create_template_pod(cluster, "share-overflow", &fragments[0]).await?;
    let refused = wait_for(DEFAULT_TIMEOUT, "share-overflow refused", || async {
        scheduling_failure(cluster, "share-overflow").await
    })
    .await?;
    assert!(
        scheduled_node(cluster, "share-overflow").await?.is_none(),
        "{refused}"
    );
    // Deleting a pod frees its share (its claim goes with it): the waiting pod is bound.
    Api::<Pod>::namespaced(cluster.client(), cluster.namespace())
        .delete("share-0", &DeleteParams::default().grace_period(0))
        .await?;
    let bound = wait_for(DEFAULT_TIMEOUT, "share-overflow scheduled", || async {
        scheduled_node(cluster, "share-overflow").await
    })
    .await?;
    assert_eq!(bound, node);

    // A 70B model spans both GPUs: whole devices, each asked for in full.
    let big = bf16_at_8k("llama-3.1-70b");
    create_placement(cluster, "big", big, AllocationMode::ClaimTemplate).await?;
    let status = wait_ready(cluster, "big").await?;
    let fraction = status.plan.as_ref().and_then(|p| p.fraction.clone());
    assert_eq!(fraction.map(|f| f.kind).as_deref(), Some("device"));
    assert!(
        status.alternatives[0].ends_with("memory=80Gi"),
        "{:?}",
        status.alternatives
    );
    // A placement holding its own claims plans shares too, counting what the scheduler's
    // claims consume: with both GPUs full of the templates' pods it plans nothing.
    create_placement(cluster, "held", small(), AllocationMode::Claims).await?;
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    let planned = |api: Api<ModelPlacement>| async move {
        let status = api.get("held").await?.status;
        Ok(status
            .and_then(|s| conditions::find(&s.conditions, "Planned").cloned())
            .map(|c| c.status))
    };
    let phase = wait_for(DEFAULT_TIMEOUT, "held evaluated", || planned(api.clone())).await?;
    assert_eq!(phase, "False", "both GPUs are full of shares");

    // Two pods on one GPU go (share-0 went already; the overflow pod took its place): their
    // claims go with them, and the controller plans a share in the room they leave.
    on_device
        .values_mut()
        .for_each(|pods| pods.retain(|pod| pod != "share-0"));
    let (freed_gpu, pods) = on_device
        .iter()
        .find(|(_, pods)| pods.len() >= 2)
        .map(|(gpu, pods)| (gpu.clone(), pods[..2].to_vec()))
        .expect("a GPU with two of the first pods on it");
    for pod in &pods {
        Api::<Pod>::namespaced(cluster.client(), cluster.namespace())
            .delete(pod, &DeleteParams::default().grace_period(0))
            .await?;
    }
    let status = wait_ready(cluster, "held").await?;
    let fraction = status.plan.as_ref().and_then(|p| p.fraction.clone());
    assert_eq!(
        fraction.as_ref().map(|f| (f.kind.as_str(), f.bytes)),
        Some(("share", share)),
        "{status:?}"
    );
    let held = &status.claims[0];
    assert!(held.allocated, "{status:?}");
    let claim = Api::<ResourceClaim>::namespaced(cluster.client(), cluster.namespace())
        .get(&held.name)
        .await?;
    let result = claim
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .and_then(|r| r.into_iter().next())
        .expect("the controller's allocation");
    assert_eq!(result.device, freed_gpu, "the room the two pods left");
    assert_eq!(
        result
            .consumed_capacity
            .as_ref()
            .and_then(|c| c.get("memory"))
            .map(|q| q.0.as_str()),
        Some(expected.as_str())
    );
    assert!(result.share_id.is_some(), "{result:?}");

    // The scheduler counts the controller's share: one more template pod fits beside it, the
    // next would overflow every GPU.
    let room = usize::try_from(((80u64 << 30) - 2 * share) / share)?;
    assert!(room >= 1, "a share of {expected} leaves room for one more");
    for index in 0..=room {
        let pod = format!("after-held-{index}");
        create_template_pod(cluster, &pod, &fragments[0]).await?;
        if index < room {
            let bound = wait_for(DEFAULT_TIMEOUT, &format!("{pod} scheduled"), || async {
                scheduled_node(cluster, &pod).await
            })
            .await?;
            assert_eq!(bound, node);
            assert_eq!(consumed_by(cluster, &pod).await?.0, freed_gpu);
        } else {
            let refused = wait_for(DEFAULT_TIMEOUT, &format!("{pod} refused"), || async {
                scheduling_failure(cluster, &pod).await
            })
            .await?;
            assert!(scheduled_node(cluster, &pod).await?.is_none(), "{refused}");
        }
    }
    // Deleting the placement frees its share (its claim goes with it): the refused pod is
    // bound in the room it leaves.
    api.delete("held", &DeleteParams::default()).await?;
    let last = format!("after-held-{room}");
    let bound = wait_for(DEFAULT_TIMEOUT, &format!("{last} scheduled"), || async {
        scheduled_node(cluster, &last).await
    })
    .await?;
    assert_eq!(bound, node);
    assert_eq!(consumed_by(cluster, &last).await?.0, freed_gpu);
    eprintln!(
        "the controller's own claim held a {expected} share of {freed_gpu} beside the scheduler's, and gave it back"
    );
    Ok(())
}

/// Issue 39, item 4: a taint of effect `None` on a published GPU (NVIDIA's driver publishes
/// XID events this way) is informational: the GPU stays free in `status.freeDevices`, where
/// a `NoSchedule` taint on the same GPU takes it out. Skipped where the apiserver refuses the
/// effect.
#[tokio::test]
#[ignore = "needs cluster"]
async fn an_informational_device_taint_leaves_the_gpu_free() -> Result<()> {
    let Some((_turn, cluster, node, gpus)) = h100_dra_node().await? else {
        return Ok(());
    };
    let _controller = start_controller(&cluster);
    let slices: Api<ResourceSlice> = Api::all(cluster.client());
    let name = format!("{node}-{DRIVER}");
    let published = slices.get(&name).await?;
    let taint = |effect: &str| -> Result<ResourceSlice> {
        let mut slice = published.clone();
        let devices = slice.spec.devices.as_mut().expect("published devices");
        devices[3].taints = Some(vec![serde_json::from_value(json!({
            "key": "gpu.nvidia.com/xid", "value": "79", "effect": effect,
        }))?]);
        Ok(slice)
    };
    let all = u32::try_from(gpus)?;
    let free_is = |wanted: u32| {
        let cluster = &cluster;
        let node = &node;
        async move {
            wait_for(
                DEFAULT_TIMEOUT,
                &format!("freeDevices {wanted}"),
                || async {
                    Ok(free_devices(cluster, node)
                        .await?
                        .filter(|free| *free == wanted))
                },
            )
            .await
        }
    };
    // A NoSchedule taint takes the GPU out of the free count...
    let stored = slices
        .replace(&name, &PostParams::default(), &taint("NoSchedule")?)
        .await?;
    let kept = stored
        .spec
        .devices
        .as_ref()
        .and_then(|devices| devices[3].taints.as_ref())
        .is_some_and(|taints| !taints.is_empty());
    if !kept {
        // 1.35 (the compat tier) drops device taints from slices unless DRADeviceTaints is on.
        eprintln!("skipped: the apiserver does not keep device taints in slices");
        return remove_nodes(&cluster, &[&node]).await;
    }
    free_is(all - 1).await?;
    // ...and the same taint made informational gives it back.
    let latest = slices.get(&name).await?;
    let mut informational = taint("None")?;
    informational.metadata.resource_version = latest.metadata.resource_version;
    let result = match slices
        .replace(&name, &PostParams::default(), &informational)
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 422 => {
            eprintln!(
                "skipped: the apiserver refuses effect None: {}",
                status.message
            );
            Ok(())
        }
        Err(other) => Err(other.into()),
        Ok(_) => free_is(all).await.map(|_| ()),
    };
    let removed = remove_nodes(&cluster, &[&node]).await;
    result.and(removed)
}
