//! Partitionable devices (KEP-4815) against the real control plane (kube-apiserver and
//! kube-scheduler 1.37, no feature gates: `DRAPartitionableDevices` and
//! `DRAConsumableCapacity` are beta and on): the slices of `fixtures/dra/` shaped like
//! NVIDIA's dynamic MIG and AMD's AutoPartition are published on kwok nodes, the real
//! scheduler allocates one partition for a pod, and then
//!
//! - the whole NVIDIA GPU whose counters that partition consumed is neither planned nor
//!   allocated by the controller, and the placement says why (the counter set);
//! - `status.freeDevices` and `hwaccel fleet` count it held, as the scheduler does (it
//!   refuses a pod asking for that whole GPU);
//! - deleting the pod and its claim makes the GPU plannable again: the placement gets it;
//! - on the AMD node, our counter rule read off the live objects blocks exactly the layouts
//!   the scheduler refuses, and the shared AutoPartition devices are never planned.
//!
//! Full tier only: `tests/cluster/up.sh --full && scripts/run-cluster-tier.sh
//! cluster_dra_counters`.

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;
use hwaccel::api::placement::{AllocationMode, ModelPlacementStatus};
use hwaccel::api::{AcceleratorInventory, ModelPlacement, attribute, conditions};
use hwaccel::controller::metrics::ControllerMetrics;
use hwaccel::controller::{self, Config};
use hwaccel::dra::DeviceRef;
use hwaccel::dra::claims::allocated_devices;
use hwaccel::dra::counters::blocked_by_counters;
use hwaccel::testing::{InventoryBuilder, PlacementBuilder};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::nodes::{apply_inventory, create_kwok_node};
use support::{DEFAULT_TIMEOUT, TEST_LABEL, TestCluster, install_crds, wait_for};

const NVIDIA: &str = "gpu.nvidia.com";
const AMD: &str = "gpu.amd.com";

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

/// The vendor chart's DeviceClass named after `driver`.
async fn ensure_driver_class(cluster: &TestCluster, driver: &str) -> Result<()> {
    let class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": driver},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{driver}'")}}]},
    }))?;
    Api::<DeviceClass>::all(cluster.client())
        .patch(
            driver,
            &PatchParams::apply("hwaccel-tests").force(),
            &Patch::Apply(&class),
        )
        .await?;
    Ok(())
}

/// Publishes the pool of `fixture` (a counter slice and a device slice) for `node`; whole
/// GPU `gpu-<i>`, and every entry of GPU `i` that carries a PCI address (AMD's layouts
/// `gpu-<i>-<layout>`), gets PCI bus id `bus_ids[i]` (the inventory's, so the two are one
/// device).
async fn publish(
    cluster: &TestCluster,
    fixture: &str,
    node: &str,
    bus_ids: &[String],
) -> Result<()> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/dra")
        .join(fixture);
    let slices = hwaccel::cli::plan_dra::load_resource_slices(&[path])?;
    for (index, mut slice) in slices.into_iter().enumerate() {
        slice.metadata = kube::core::ObjectMeta {
            name: Some(format!("{node}-{}-{index}", slice.spec.driver)),
            ..Default::default()
        };
        slice.spec.node_name = Some(node.to_string());
        slice.spec.pool.name = node.to_string();
        for device in slice.spec.devices.iter_mut().flatten() {
            let rest = device.name.strip_prefix("gpu-").unwrap_or_default();
            let index = rest.split('-').next().and_then(|i| i.parse::<usize>().ok());
            let whole = rest.parse::<usize>().is_ok();
            let addressed = device
                .attributes
                .as_ref()
                .is_some_and(|a| a.contains_key(attribute::PCI_BUS_ID));
            if let (Some(bus), Some(attributes), true) = (
                index.and_then(|i| bus_ids.get(i)),
                device.attributes.as_mut(),
                whole || addressed,
            ) {
                attributes.insert(
                    attribute::PCI_BUS_ID.to_string(),
                    k8s_openapi::api::resource::v1::DeviceAttribute {
                        string: Some(bus.clone()),
                        ..Default::default()
                    },
                );
            }
        }
        Api::<ResourceSlice>::all(cluster.client())
            .create(&PostParams::default(), &slice)
            .await?;
    }
    Ok(())
}

/// A kwok node with the h100-8x-nvswitch inventory cut to its first two GPUs, and the MIG
/// fixture's slices publishing those two (matched by PCI bus id). Returns the node and the
/// inventory names of GPU 0 and GPU 1.
async fn add_mig_node(cluster: &TestCluster) -> Result<(String, Vec<String>)> {
    let name = cluster.unique_name("h100-mig");
    create_kwok_node(cluster, &name).await?;
    let mut inventory = InventoryBuilder::fixture("h100-8x-nvswitch")
        .node(&name)
        .label(TEST_LABEL, cluster.prefix())
        .build();
    let mut kept = 0;
    inventory.spec.devices.retain(|d| {
        let gpu = d.text(attribute::VENDOR).as_deref() == Some("nvidia");
        kept += usize::from(gpu);
        !gpu || kept <= 2
    });
    let gpus: Vec<&hwaccel::api::InventoryDevice> = inventory
        .spec
        .devices
        .iter()
        .filter(|d| d.text(attribute::VENDOR).as_deref() == Some("nvidia"))
        .collect();
    let bus_ids: Vec<String> = gpus
        .iter()
        .map(|d| d.text(attribute::PCI_BUS_ID).expect("a bus id"))
        .collect();
    let names: Vec<String> = gpus.iter().map(|d| d.name.clone()).collect();
    apply_inventory(&cluster.client(), &inventory).await?;
    publish(cluster, "nvidia-h100-dynamic-mig.yaml", &name, &bus_ids).await?;
    Ok((name, names))
}

/// A ResourceClaim asking `driver`'s class for one device the CEL `selector` picks, and a pod
/// on `node` using it.
async fn claim_and_pod(
    cluster: &TestCluster,
    name: &str,
    driver: &str,
    selector: &str,
    node: &str,
) -> Result<()> {
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{
            "name": "part",
            "exactly": {
                "deviceClassName": driver,
                "selectors": [{"cel": {"expression": selector}}],
            },
        }]}},
    }))?;
    Api::<ResourceClaim>::namespaced(cluster.client(), cluster.namespace())
        .create(&PostParams::default(), &claim)
        .await?;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{
                "name": "work",
                "image": "registry.invalid/work:test",
                "resources": {"claims": [{"name": "part"}]},
            }],
            "resourceClaims": [{"name": "part", "resourceClaimName": name}],
        },
    }))?;
    Api::<Pod>::namespaced(cluster.client(), cluster.namespace())
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

/// Waits until the scheduler allocated claim `name`; its devices.
async fn allocated_to(cluster: &TestCluster, name: &str) -> Result<Vec<DeviceRef>> {
    let api: Api<ResourceClaim> = Api::namespaced(cluster.client(), cluster.namespace());
    wait_for(DEFAULT_TIMEOUT, &format!("claim {name} allocated"), || {
        let api = api.clone();
        async move {
            let devices = allocated_devices(&api.get(name).await?);
            Ok((!devices.is_empty()).then_some(devices))
        }
    })
    .await
}

/// The scheduler's latest FailedScheduling message for `pod`, once it has one.
async fn scheduling_failure(cluster: &TestCluster, pod: &str) -> Result<String> {
    wait_for(
        DEFAULT_TIMEOUT,
        &format!("{pod} FailedScheduling"),
        || async {
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
        },
    )
    .await
}

async fn delete_claim_and_pod(cluster: &TestCluster, name: &str) -> Result<()> {
    Api::<Pod>::namespaced(cluster.client(), cluster.namespace())
        .delete(name, &DeleteParams::default().grace_period(0))
        .await?;
    Api::<ResourceClaim>::namespaced(cluster.client(), cluster.namespace())
        .delete(name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// The placement's status once `done` says it is what the test waits for.
async fn wait_status(
    cluster: &TestCluster,
    name: &str,
    what: &str,
    done: impl Fn(&ModelPlacementStatus) -> bool,
) -> Result<ModelPlacementStatus> {
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    wait_for(DEFAULT_TIMEOUT, &format!("{name} {what}"), || {
        let api = api.clone();
        let done = &done;
        async move {
            let placement = api.get(name).await?;
            let generation = placement.metadata.generation;
            Ok(placement
                .status
                .filter(|s| s.observed_generation == generation && done(s)))
        }
    })
    .await
}

fn ready(status: &ModelPlacementStatus) -> bool {
    conditions::find(&status.conditions, "Ready").is_some_and(|c| c.status == "True")
}

/// `(devices, reserved, free)` of `node` in `hwaccel fleet -o json` over the cluster.
async fn fleet_counts(cluster: &TestCluster, node: &str) -> Result<(i64, i64, i64)> {
    let report = support::process::hwaccel_json(
        cluster,
        &["fleet", "--model", "llama-3.1-8b", "-o", "json"],
    )
    .await?;
    let entry = report["health"]["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["name"] == node)
        .cloned()
        .unwrap_or_default();
    let field = |key: &str| entry[key].as_i64().unwrap_or(-1);
    Ok((field("devices"), field("reserved"), field("free")))
}

async fn free_devices(cluster: &TestCluster, node: &str) -> Result<Option<u32>> {
    let api: Api<AcceleratorInventory> = Api::all(cluster.client());
    Ok(api.get(node).await?.status.and_then(|s| s.free_devices))
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_partition_the_scheduler_allocated_keeps_its_whole_gpu_from_us_until_freed() -> Result<()>
{
    let _turn = crate::cluster_dra::SLICES.lock().await;
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        eprintln!("skipped: needs the full tier (kube-scheduler, kwok)");
        return Ok(());
    }
    install_crds(&cluster.client()).await?;
    ensure_driver_class(&cluster, NVIDIA).await?;
    let (node, gpu_names) = add_mig_node(&cluster).await?;
    assert_eq!(gpu_names.len(), 2, "{gpu_names:?}");

    // The real scheduler gives one 1g.10gb slice of GPU 0 to a pod.
    let gpu0_uuid = "GPU-5c2a1e0f-0000-0000-0000-000000000000";
    claim_and_pod(
        &cluster,
        "mig-user",
        NVIDIA,
        &format!(
            "device.attributes['{NVIDIA}'].type == 'mig' \
             && device.attributes['{NVIDIA}'].profile == '1g.10gb' \
             && device.attributes['{NVIDIA}'].parentUUID == '{gpu0_uuid}'"
        ),
        &node,
    )
    .await?;
    let slice = allocated_to(&cluster, "mig-user").await?;
    assert_eq!(slice.len(), 1);
    assert!(
        slice[0].device.starts_with("gpu-0-mig-1g10gb-"),
        "{slice:?}"
    );

    // A placement that needs both GPUs whole (two replicas of one GPU each, no fractions: a
    // small model would otherwise take MIG devices beside the pod's) on that node: GPU 0 is
    // reserved although no claim names it, so it does not fit, and the status says why.
    let controller = start_controller(&cluster);
    let spec = PlacementBuilder::serve("llama-3.1-8b")
        .replicas(2)
        .node_selector("kubernetes.io/hostname", &node)
        .spec();
    let mut spec = spec;
    spec.allocation = Some(AllocationMode::Claims);
    spec.constraints
        .get_or_insert_with(Default::default)
        .whole_devices = Some(true);
    Api::<ModelPlacement>::namespaced(cluster.client(), cluster.namespace())
        .create(&PostParams::default(), &ModelPlacement::new("both", spec))
        .await?;
    let status = wait_status(&cluster, "both", "refused naming the counter set", |s| {
        s.reasons.iter().any(|r| r.contains("gpu-0-counter-set"))
    })
    .await?;
    assert!(!ready(&status), "{status:?}");
    let why = status
        .reasons
        .iter()
        .find(|r| r.contains("gpu-0-counter-set"))
        .expect("the counter reason");
    assert!(why.contains(&slice[0].device), "names the holder: {why}");
    assert!(
        why.starts_with(&format!("{node}/{} cannot", gpu_names[0])),
        "names the GPU by its inventory name: {why}"
    );
    let ours = Api::<ResourceClaim>::namespaced(cluster.client(), cluster.namespace())
        .list(&ListParams::default().labels("hwaccel.io/placement=both"))
        .await?;
    let gpu0_taken_by_us = ours
        .items
        .iter()
        .flat_map(allocated_devices)
        .any(|d| d.device == "gpu-0");
    assert!(!gpu0_taken_by_us, "the controller allocated GPU 0");

    // The counts agree with the scheduler: GPU 0 is held, GPU 1 free; a pod asking for the
    // whole GPU 0 is refused by the scheduler too.
    wait_for(DEFAULT_TIMEOUT, "freeDevices 1", || async {
        Ok(free_devices(&cluster, &node)
            .await?
            .filter(|free| *free == 1))
    })
    .await?;
    assert_eq!(fleet_counts(&cluster, &node).await?, (2, 1, 1));
    claim_and_pod(
        &cluster,
        "whole-gpu-0",
        NVIDIA,
        &format!(
            "device.attributes['{NVIDIA}'].type == 'gpu' \
             && device.attributes['{NVIDIA}'].uuid == '{gpu0_uuid}'"
        ),
        &node,
    )
    .await?;
    let refusal = scheduling_failure(&cluster, "whole-gpu-0").await?;
    assert!(refusal.contains("cannot allocate all claims"), "{refusal}");
    delete_claim_and_pod(&cluster, "whole-gpu-0").await?;

    // Freeing the slice makes GPU 0 plannable again: the placement gets both whole GPUs.
    delete_claim_and_pod(&cluster, "mig-user").await?;
    let status = wait_status(&cluster, "both", "Ready", ready).await?;
    let held: BTreeSet<String> = status
        .claims
        .iter()
        .flat_map(|c| c.devices.iter().map(|d| d.device.clone()))
        .collect();
    assert_eq!(held, BTreeSet::from(["gpu-0".into(), "gpu-1".into()]));
    wait_for(DEFAULT_TIMEOUT, "freeDevices 0", || async {
        Ok(free_devices(&cluster, &node)
            .await?
            .filter(|free| *free == 0))
    })
    .await?;
    drop(controller);
    Api::<ModelPlacement>::namespaced(cluster.client(), cluster.namespace())
        .delete("both", &DeleteParams::default())
        .await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn amd_autopartition_layouts_block_each_other_as_the_scheduler_says() -> Result<()> {
    let _turn = crate::cluster_dra::SLICES.lock().await;
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        eprintln!("skipped: needs the full tier (kube-scheduler, kwok)");
        return Ok(());
    }
    install_crds(&cluster.client()).await?;
    ensure_driver_class(&cluster, AMD).await?;
    let node = cluster.unique_name("mi300x-ap");
    create_kwok_node(&cluster, &node).await?;
    publish(&cluster, "amd-mi300x-autopartition.yaml", &node, &[]).await?;
    // The 1.37 apiserver keeps the shared devices as published (no feature gate needed).
    let slices = Api::<ResourceSlice>::all(cluster.client())
        .list(&ListParams::default())
        .await?
        .items;
    let shared = slices
        .iter()
        .filter(|s| s.spec.node_name.as_deref() == Some(node.as_str()))
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter(|d| d.allow_multiple_allocations == Some(true) && d.consumes_counters.is_some())
        .count();
    assert_eq!(
        shared, 8,
        "allowMultipleAllocations and consumesCounters kept"
    );

    // One CPX/NPS4 share of GPU 0 for a pod.
    let gpu = |index: u32, compute: &str, memory: &str| {
        format!(
            "device.attributes['{AMD}'].gpuIndex == {index} \
             && device.attributes['{AMD}'].computePartition == '{compute}' \
             && device.attributes['{AMD}'].memoryPartition == '{memory}'"
        )
    };
    claim_and_pod(&cluster, "cpx-user", AMD, &gpu(0, "cpx", "nps4"), &node).await?;
    let share = allocated_to(&cluster, "cpx-user").await?;
    assert_eq!(share[0].device, "gpu-0-cpx-nps4");

    // Our rule on the live objects: the other layouts of GPU 0 are blocked, GPU 1 is not.
    let slices = Api::<ResourceSlice>::all(cluster.client())
        .list(&ListParams::default())
        .await?
        .items;
    let claims = Api::<ResourceClaim>::namespaced(cluster.client(), cluster.namespace())
        .list(&ListParams::default())
        .await?
        .items;
    let allocated = claims.iter().flat_map(|c| {
        allocated_devices(c)
            .into_iter()
            .map(|d| (d, "claim".to_string()))
    });
    let blocked: BTreeSet<String> = blocked_by_counters(&slices, allocated)
        .into_keys()
        .filter(|d| d.pool == node)
        .map(|d| d.device)
        .collect();
    assert_eq!(
        blocked,
        BTreeSet::from([
            "gpu-0-cpx-nps1".to_string(),
            "gpu-0-dpx-nps2".to_string(),
            "gpu-0-spx-nps1".to_string(),
        ])
    );
    // The scheduler agrees: the whole GPU 0 (SPX) is refused, while GPU 1's is given.
    claim_and_pod(&cluster, "spx-0", AMD, &gpu(0, "spx", "nps1"), &node).await?;
    let refusal = scheduling_failure(&cluster, "spx-0").await?;
    assert!(refusal.contains("cannot allocate all claims"), "{refusal}");
    claim_and_pod(&cluster, "spx-1", AMD, &gpu(1, "spx", "nps1"), &node).await?;
    assert_eq!(
        allocated_to(&cluster, "spx-1").await?[0].device,
        "gpu-1-spx-nps1"
    );

    // Shared devices are never ours to plan: an AMD placement on the node gets nothing.
    let controller = start_controller(&cluster);
    let mut spec = PlacementBuilder::serve("llama-3.1-8b")
        .node_selector("kubernetes.io/hostname", &node)
        .spec();
    spec.allocation = Some(AllocationMode::Claims);
    Api::<ModelPlacement>::namespaced(cluster.client(), cluster.namespace())
        .create(&PostParams::default(), &ModelPlacement::new("amd", spec))
        .await?;
    let status = wait_status(&cluster, "amd", "refused", |s| !s.reasons.is_empty()).await?;
    assert!(!ready(&status) && status.claims.is_empty(), "{status:?}");
    drop(controller);
    for name in ["cpx-user", "spx-0", "spx-1"] {
        delete_claim_and_pod(&cluster, name).await?;
    }
    Ok(())
}

/// AMD's AutoPartition publishes every layout of a GPU as a shared device
/// (`allowMultipleAllocations`), the whole one (SPX) at the GPU's PCI address. On a node whose
/// inventory has those GPUs, the planner plans neither, and `status.freeDevices` and
/// `hwaccel fleet` count them neither free nor held.
#[tokio::test]
#[ignore = "needs cluster"]
async fn gpus_their_driver_publishes_as_shared_are_not_counted_free() -> Result<()> {
    let _turn = crate::cluster_dra::SLICES.lock().await;
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let node = cluster.unique_name("mi300x-shared");
    create_kwok_node(&cluster, &node).await?;
    let inventory = InventoryBuilder::fixture("mi300x-8x")
        .node(&node)
        .label(TEST_LABEL, cluster.prefix())
        .build();
    let gpus: Vec<&hwaccel::api::InventoryDevice> = inventory
        .spec
        .devices
        .iter()
        .filter(|d| d.text(attribute::VENDOR).as_deref() == Some("amd"))
        .collect();
    assert!(gpus.len() > 2, "{} AMD GPUs", gpus.len());
    let bus_ids: Vec<String> = gpus
        .iter()
        .take(2)
        .map(|d| d.text(attribute::PCI_BUS_ID).expect("a bus id"))
        .collect();
    let total = gpus.len();
    apply_inventory(&cluster.client(), &inventory).await?;
    publish(&cluster, "amd-mi300x-autopartition.yaml", &node, &bus_ids).await?;
    let _controller = start_controller(&cluster);
    let free = total - 2;
    wait_for(
        DEFAULT_TIMEOUT,
        "freeDevices without the shared GPUs",
        || async {
            Ok(free_devices(&cluster, &node)
                .await?
                .filter(|n| *n as usize == free))
        },
    )
    .await?;
    let (devices, reserved, counted_free) = fleet_counts(&cluster, &node).await?;
    assert_eq!(
        (devices, reserved, counted_free),
        (total as i64, 0, free as i64),
        "hwaccel fleet"
    );
    Ok(())
}

/// Issue 39, AMD partitions on the real scheduler: a kwok node whose inventory has 8 MI300X
/// and whose driver publishes the first two only as partitions, as ROCm's DRA driver does for
/// GPUs partitioned on the node (`fixtures/dra/amd-mi300x-partitioned.yaml`: GPU 0 in CPX,
/// eight 24,574 MiB partitions; GPU 1 in DPX, two 98,296 MiB). Both GPUs count free before
/// anything holds them; two 8B placements holding their own claims take two CPX partitions
/// (the smallest profile that holds them), a 32B one a DPX partition, each claim naming the
/// driver's class and the controller's allocation accepted by the apiserver; the GPUs then
/// count held; a claim-template placement's pod is bound by kube-scheduler to a third CPX
/// partition; deleting a placement frees its GPU's count once nothing else holds it.
#[tokio::test]
#[ignore = "needs cluster"]
async fn amd_partitions_are_planned_as_fractions_and_allocated() -> Result<()> {
    let _turn = crate::cluster_dra::SLICES.lock().await;
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        eprintln!("skipped: needs the full tier (kube-scheduler, kwok)");
        return Ok(());
    }
    install_crds(&cluster.client()).await?;
    crate::cluster_dra::apply_hwaccel_classes(&cluster).await?;
    ensure_driver_class(&cluster, AMD).await?;
    let node = cluster.unique_name("mi300x-split");
    create_kwok_node(&cluster, &node).await?;
    let inventory = InventoryBuilder::fixture("mi300x-8x")
        .node(&node)
        .label(TEST_LABEL, cluster.prefix())
        .build();
    let total = inventory
        .spec
        .devices
        .iter()
        .filter(|d| d.text(attribute::VENDOR).as_deref() == Some("amd"))
        .count();
    apply_inventory(&cluster.client(), &inventory).await?;
    crate::cluster_dra::publish_fixture(&cluster, "amd-mi300x-partitioned.yaml", &node).await?;
    let result = amd_partitions_on(&cluster, &node, total).await;
    let removed = crate::cluster_dra::remove_nodes(&cluster, &[&node]).await;
    result.and(removed)
}

async fn amd_partitions_on(cluster: &TestCluster, node: &str, total: usize) -> Result<()> {
    use crate::cluster_dra::{
        allocation_results, bf16_at_8k, create_placement, create_template_pod, scheduled_node,
        wait_ready,
    };
    let _controller = start_controller(cluster);
    // Partitioned GPUs are plannable through their partitions: every GPU counts free.
    wait_for(DEFAULT_TIMEOUT, "every GPU free", || async {
        Ok(free_devices(cluster, node)
            .await?
            .filter(|n| *n as usize == total))
    })
    .await?;
    let claims = Api::<ResourceClaim>::namespaced(cluster.client(), cluster.namespace());
    let mut taken: Vec<String> = Vec::new();
    for (name, model, profile) in [
        ("amd-a", "llama-3.1-8b", "cpx_nps4"),
        ("amd-b", "llama-3.1-8b", "cpx_nps4"),
        ("amd-big", "qwen2.5-32b", "dpx_nps2"),
    ] {
        create_placement(cluster, name, bf16_at_8k(model), AllocationMode::Claims).await?;
        let status = wait_ready(cluster, name).await?;
        let fraction = status.plan.as_ref().and_then(|p| p.fraction.clone());
        assert_eq!(
            fraction
                .as_ref()
                .map(|f| (f.kind.as_str(), f.profile.as_deref())),
            Some(("partition", Some(profile))),
            "{name}: {status:?}"
        );
        let held = status.claims.first().expect("a claim").clone();
        assert!(held.allocated, "{status:?}");
        let (class, device) = crate::cluster_dra::class_and_device(claims.get(&held.name).await?);
        assert_eq!(class.as_deref(), Some(AMD));
        let device = device.expect("the controller's allocation");
        let card: u32 = device
            .strip_prefix("gpu-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|card| card.parse().ok())
            .expect("gpu-<card>-<render>");
        // Cards 1-8 are GPU 0's CPX partitions, 9-10 GPU 1's DPX partitions.
        let expected = if profile == "cpx_nps4" { 1..=8 } else { 9..=10 };
        assert!(expected.contains(&card), "{name}: {device}");
        assert!(!taken.contains(&device), "{device} handed out twice");
        taken.push(device);
    }
    eprintln!("held AMD partitions: {taken:?}");
    // Both partitioned GPUs are held through their partitions.
    wait_for(DEFAULT_TIMEOUT, "both partitioned GPUs held", || async {
        Ok(free_devices(cluster, node)
            .await?
            .filter(|n| *n as usize == total - 2))
    })
    .await?;

    // A template placement's pod: the scheduler binds it to a CPX partition nobody holds.
    create_placement(
        cluster,
        "amd-chat",
        bf16_at_8k("llama-3.1-8b"),
        AllocationMode::ClaimTemplate,
    )
    .await?;
    let status = wait_ready(cluster, "amd-chat").await?;
    assert!(
        status.alternatives[0].ends_with("profile=cpx_nps4"),
        "{:?}",
        status.alternatives
    );
    let fragment = status.pod_template.clone().expect("a pod fragment");
    create_template_pod(cluster, "on-cpx", &fragment).await?;
    let bound = wait_for(DEFAULT_TIMEOUT, "on-cpx scheduled", || async {
        scheduled_node(cluster, "on-cpx").await
    })
    .await?;
    assert_eq!(bound, node);
    let results = allocation_results(cluster, "on-cpx").await?;
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(
        !taken.contains(&results[0].device),
        "the scheduler counts the controller's partitions: {results:?} {taken:?}"
    );
    eprintln!("pod bound to AMD partition {}", results[0].device);

    // Deleting the 32B placement frees GPU 1 (nothing else holds a partition of it).
    Api::<ModelPlacement>::namespaced(cluster.client(), cluster.namespace())
        .delete("amd-big", &DeleteParams::default())
        .await?;
    wait_for(DEFAULT_TIMEOUT, "GPU 1 free again", || async {
        Ok(free_devices(cluster, node)
            .await?
            .filter(|n| *n as usize == total - 1))
    })
    .await?;

    // A pod of nobody's placement takes a DPX partition through the scheduler: its GPU is
    // held by a claim, though no counter set ties the partition to it, and `hwaccel fleet`
    // counts it reserved.
    claim_and_pod(
        cluster,
        "dpx-pod",
        AMD,
        "device.attributes['gpu.amd.com'].partitionProfile == 'dpx_nps2'",
        node,
    )
    .await?;
    let allocated = allocated_to(cluster, "dpx-pod").await?;
    assert_eq!(allocated.len(), 1, "{allocated:?}");
    wait_for(DEFAULT_TIMEOUT, "GPU 1 held by the pod's claim", || async {
        Ok(free_devices(cluster, node)
            .await?
            .filter(|n| *n as usize == total - 2))
    })
    .await?;
    let (devices, reserved, counted_free) = fleet_counts(cluster, node).await?;
    assert_eq!(
        (devices, counted_free),
        (total as i64, total as i64 - 2),
        "hwaccel fleet (reserved {reserved})"
    );
    assert!(
        reserved >= 1,
        "hwaccel fleet counts the pod's GPU reserved: {reserved}"
    );
    // And counts replicas of an 8B model on the partitions nobody holds: five CPX (eight less
    // the two placements' and the template pod's) and the DPX one the pod left.
    let report = support::process::hwaccel_json(
        cluster,
        &[
            "fleet",
            "--model",
            "llama-3.1-8b",
            "--context",
            "8192",
            "--precision",
            "bf16",
            "-o",
            "json",
        ],
    )
    .await?;
    let on_partitions: u64 = report["capacity"][0]["packing"]
        .as_array()
        .expect("packing")
        .iter()
        .filter(|p| p.get("partition").is_some())
        .map(|p| p["replicas"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(on_partitions, 6, "{}", report["capacity"][0]);
    Ok(())
}
