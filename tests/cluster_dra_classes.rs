//! The generated DRA DeviceClasses and prioritized-list claim templates against the real
//! control plane: the apiserver accepts every class (CEL compiled, cost checked), the real
//! kube-scheduler allocates by them on kwok nodes that publish vendor-shaped ResourceSlices,
//! and a template from `claim_template` falls back to its second alternative when the first
//! is taken; with the classes' extended resource names, a pod asking for
//! `resources.limits: {hwaccel.io/hbm-80g-plus: 1}` gets a device of the class from the
//! scheduler (DRA extended resources, GA in 1.37).
//!
//! Needs the full tier: `tests/cluster/up.sh --full && cargo test --test cluster_tier
//! -- --ignored cluster_dra_classes::`. The classes are cluster-scoped with fixed names, so the tests take turns
//! (one lock) and each removes what it created. Pods are pinned to their own test's nodes by
//! a label, so other tests' devices are never candidates. The chart test at the end needs no
//! cluster, only a helm binary (skipped with a notice without one).

use crate::helm;
use crate::support;

use anyhow::{Context as _, Result, bail, ensure};
use hwaccel::dra::claim_template::{Alternative, REQUEST_NAME, claim_template};
use hwaccel::dra::device_classes::{
    device_classes, extended_resource_name, with_extended_resource_names,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{DEFAULT_TIMEOUT, TestCluster, wait_for};

/// Held by each test for its whole run: the classes are shared, cluster-scoped objects.
static CLASSES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The label pinning a test's pods to its own nodes.
const GROUP_LABEL: &str = "hwaccel.io/test-group";

const NVIDIA: &str = "gpu.nvidia.com";
const H100: &str = "NVIDIA H100 80GB HBM3";
const A100_40: &str = "NVIDIA A100-SXM4-40GB";
const GB200: &str = "NVIDIA GB200";

fn api_error(e: &kube::Error) -> Option<&kube::core::Status> {
    match e {
        kube::Error::Api(s) => Some(s),
        _ => None,
    }
}

fn not_found(e: &kube::Error) -> bool {
    api_error(e).is_some_and(|s| s.code == 404)
}

/// Creates (or takes over) every generated class.
async fn apply_classes(tc: &TestCluster) -> Result<()> {
    apply_these_classes(tc, device_classes()).await
}

/// Server-side applies `classes` (one field manager, so a later apply without a field
/// removes it).
async fn apply_these_classes(tc: &TestCluster, classes: Vec<DeviceClass>) -> Result<()> {
    let api: Api<DeviceClass> = Api::all(tc.client());
    let params = PatchParams::apply("hwaccel-test").force();
    for class in classes {
        let name = class.metadata.name.clone().unwrap_or_default();
        let mut body = serde_json::to_value(&class)?;
        body["apiVersion"] = json!("resource.k8s.io/v1");
        body["kind"] = json!("DeviceClass");
        api.patch(&name, &params, &Patch::Apply(body))
            .await
            .with_context(|| format!("applying DeviceClass {name}"))?;
    }
    Ok(())
}

async fn delete_classes(tc: &TestCluster) -> Result<()> {
    let api: Api<DeviceClass> = Api::all(tc.client());
    for class in device_classes() {
        let name = class.metadata.name.unwrap_or_default();
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if api_error(&e).is_some_and(|s| s.code == 404) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// One NVIDIA GPU as the NVIDIA DRA driver publishes it: attribute and capacity names from
/// kubernetes-sigs/dra-driver-nvidia-gpu `cmd/gpu-kubelet-plugin/deviceinfo.go` (type,
/// uuid, productName, brand, architecture, memory); memory as NVML reports it (an "80GB"
/// H100 has 81,559 MiB, an A100 40GB 40,960 MiB).
fn nvidia_gpu(index: usize, product: &str, memory_mib: u64, pcie_root: &str) -> Value {
    let architecture = if product.contains("H100") {
        "Hopper"
    } else if product.contains("B200") {
        "Blackwell"
    } else {
        "Ampere"
    };
    json!({
        "name": format!("gpu-{index}"),
        "attributes": {
            "type": { "string": "gpu" },
            "uuid": { "string": format!("GPU-4d6f1c2a-0000-4000-8000-00000000000{index}") },
            "productName": { "string": product },
            "brand": { "string": "Nvidia" },
            "architecture": { "string": architecture },
            "resource.kubernetes.io/pcieRoot": { "string": pcie_root },
        },
        "capacity": { "memory": { "value": format!("{memory_mib}Mi") } },
    })
}

/// A kwok node in `group`, Ready, with one NVIDIA ResourceSlice holding `devices`.
async fn gpu_node(
    tc: &TestCluster,
    what: &str,
    group: &str,
    devices: Vec<Value>,
) -> Result<String> {
    let name = tc.unique_name(what);
    let nodes: Api<Node> = Api::all(tc.client());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": { "kwok.x-k8s.io/node": "fake" },
                    "labels": { "kubernetes.io/hostname": name, "type": "kwok", GROUP_LABEL: group },
                },
            }))?,
        )
        .await?;
    let slices: Api<ResourceSlice> = Api::all(tc.client());
    slices
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": { "name": format!("{name}-gpu-nvidia-com") },
                "spec": {
                    "driver": NVIDIA,
                    "nodeName": name,
                    "pool": { "name": name, "generation": 1, "resourceSliceCount": 1 },
                    "devices": devices,
                },
            }))?,
        )
        .await?;
    wait_for(DEFAULT_TIMEOUT, "kwok node Ready", || {
        let (nodes, name) = (nodes.clone(), name.clone());
        async move {
            let n = nodes.get(&name).await?;
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            Ok(ready.then_some(()))
        }
    })
    .await?;
    Ok(name)
}

/// Removes the nodes and their slices.
async fn delete_nodes(tc: &TestCluster, nodes: &[String]) -> Result<()> {
    let node_api: Api<Node> = Api::all(tc.client());
    let slices: Api<ResourceSlice> = Api::all(tc.client());
    for node in nodes {
        for result in [
            slices
                .delete(&format!("{node}-gpu-nvidia-com"), &DeleteParams::default())
                .await
                .map(|_| ()),
            node_api
                .delete(node, &DeleteParams::default())
                .await
                .map(|_| ()),
        ] {
            match result {
                Err(e) if !not_found(&e) => return Err(e.into()),
                _ => {}
            }
        }
    }
    Ok(())
}

/// A pod in `group` that asks for `count` of the extended resource `resource` in its limits,
/// and for no claim.
async fn extended_resource_pod(
    tc: &TestCluster,
    name: &str,
    group: &str,
    (resource, count): (&str, u32),
) -> Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name },
        "spec": {
            "nodeSelector": { GROUP_LABEL: group },
            "containers": [{
                "name": "c",
                "image": "registry.invalid/never-pulled:0",
                "resources": { "limits": { resource: count.to_string() } },
            }],
        },
    }))?;
    create_pod(tc, pod).await
}

/// A pod in `group` using one claim, by claim name or by template name.
async fn claim_pod(tc: &TestCluster, name: &str, group: &str, claim: Value) -> Result<()> {
    let mut source = claim;
    source["name"] = json!("gpus");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name },
        "spec": {
            "nodeSelector": { GROUP_LABEL: group },
            "resourceClaims": [source],
            "containers": [{
                "name": "c",
                "image": "registry.invalid/never-pulled:0",
                "resources": { "claims": [{ "name": "gpus" }] },
            }],
        },
    }))?;
    create_pod(tc, pod).await
}

/// Creates `pod` in the test's namespace.
async fn create_pod(tc: &TestCluster, pod: Pod) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(tc.client(), tc.namespace());
    // The namespace's default ServiceAccount appears a moment after the namespace.
    wait_for(DEFAULT_TIMEOUT, "pod created", || {
        let (pods, pod) = (pods.clone(), pod.clone());
        async move {
            match pods.create(&PostParams::default(), &pod).await {
                Ok(_) => Ok(Some(())),
                Err(e)
                    if api_error(&e)
                        .is_some_and(|s| s.code == 403 && s.message.contains("serviceaccount")) =>
                {
                    Ok(None)
                }
                Err(e) => Err(e.into()),
            }
        }
    })
    .await
}

/// The node the scheduler bound `pod` to.
async fn scheduled_node(tc: &TestCluster, pod: &str) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(tc.client(), tc.namespace());
    wait_for(DEFAULT_TIMEOUT, &format!("pod {pod} scheduled"), || {
        let pods = pods.clone();
        let pod = pod.to_string();
        async move {
            let p = pods.get(&pod).await?;
            Ok(p.spec.and_then(|s| s.node_name))
        }
    })
    .await
}

/// Waits until the scheduler reports `pod` unschedulable; returns its message.
async fn unschedulable(tc: &TestCluster, pod: &str) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(tc.client(), tc.namespace());
    wait_for(DEFAULT_TIMEOUT, &format!("pod {pod} unschedulable"), || {
        let pods = pods.clone();
        let pod = pod.to_string();
        async move {
            let p = pods.get(&pod).await?;
            if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.as_ref()) {
                bail!("pod {pod} was scheduled onto {node}");
            }
            let condition = p
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False");
            Ok(condition
                .filter(|c| c.reason.as_deref() == Some("Unschedulable"))
                .map(|c| c.message.unwrap_or_default()))
        }
    })
    .await
}

/// The allocated claim a pod uses (its own claim, or the one generated from its template).
async fn pod_claim(tc: &TestCluster, pod: &str) -> Result<ResourceClaim> {
    let pods: Api<Pod> = Api::namespaced(tc.client(), tc.namespace());
    let claims: Api<ResourceClaim> = Api::namespaced(tc.client(), tc.namespace());
    let p = pods.get(pod).await?;
    let spec_claim = p
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.resource_claim_name.clone());
    let name = match spec_claim {
        Some(name) => name,
        None => p
            .status
            .and_then(|s| s.resource_claim_statuses)
            .and_then(|s| s.into_iter().next())
            .and_then(|s| s.resource_claim_name)
            .context("pod has no generated claim")?,
    };
    wait_for(DEFAULT_TIMEOUT, &format!("claim {name} allocated"), || {
        let (claims, name) = (claims.clone(), name.clone());
        async move {
            let c = claims.get(&name).await?;
            let allocated = c.status.as_ref().is_some_and(|s| s.allocation.is_some());
            Ok(allocated.then_some(c))
        }
    })
    .await
}

/// `(request, pool, device)` of each allocated device.
fn results(claim: &ResourceClaim) -> Vec<(String, String, String)> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .map(|d| {
            d.results
                .iter()
                .flatten()
                .map(|r| (r.request.clone(), r.pool.clone(), r.device.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// A claim for `count` devices of `class`, optionally with a product selector.
fn claim(name: &str, class: &str, count: i64, product: Option<&str>) -> Result<ResourceClaim> {
    let mut exactly = json!({ "deviceClassName": class, "count": count });
    if let Some(product) = product {
        exactly["selectors"] = json!([{ "cel": { "expression": format!(
            "device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].productName == '{product}'"
        ) } }]);
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": { "name": name },
        "spec": { "devices": { "requests": [{ "name": "gpus", "exactly": exactly }] } },
    }))?)
}

/// Force-deletes pods (kwok nodes have no kubelet to confirm a graceful stop), then the
/// claims, then waits until the claims are gone (their finalizer is removed once unused).
async fn delete_pods_and_claims(tc: &TestCluster, pods: &[&str], claims: &[&str]) -> Result<()> {
    let pod_api: Api<Pod> = Api::namespaced(tc.client(), tc.namespace());
    let claim_api: Api<ResourceClaim> = Api::namespaced(tc.client(), tc.namespace());
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for pod in pods {
        if let Err(e) = pod_api.delete(pod, &now).await
            && !not_found(&e)
        {
            return Err(e.into());
        }
    }
    for claim in claims {
        if let Err(e) = claim_api.delete(claim, &DeleteParams::default()).await
            && !not_found(&e)
        {
            return Err(e.into());
        }
    }
    for claim in claims {
        wait_for(DEFAULT_TIMEOUT, &format!("claim {claim} deleted"), || {
            let (api, claim) = (claim_api.clone(), claim.to_string());
            async move {
                match api.get(&claim).await {
                    Err(e) if api_error(&e).is_some_and(|s| s.code == 404) => Ok(Some(())),
                    Err(e) => Err(e.into()),
                    Ok(_) => Ok(None),
                }
            }
        })
        .await?;
    }
    Ok(())
}

/// Force-deletes every pod left in the test's namespace, then the namespace.
async fn delete_namespace(tc: &TestCluster) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(tc.client(), tc.namespace());
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete_collection(&now, &Default::default()).await?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(tc.client());
    namespaces
        .delete(tc.namespace(), &DeleteParams::default())
        .await?;
    Ok(())
}

fn skip_unless_full(tc: &TestCluster) -> bool {
    if !tc.full() {
        eprintln!("skipped: needs the full tier (tests/cluster/up.sh --full)");
    }
    !tc.full()
}

/// (i) The apiserver accepts every generated class as generated; a class whose CEL does not
/// compile is refused, so acceptance means the CEL compiled and passed the cost check.
#[tokio::test]
#[ignore = "needs cluster"]
async fn every_generated_class_is_accepted() -> Result<()> {
    let _turn = CLASSES.lock().await;
    let tc = TestCluster::new().await?;
    let result = async {
        apply_classes(&tc).await?;
        let api: Api<DeviceClass> = Api::all(tc.client());
        for class in device_classes() {
            let name = class.metadata.name.clone().unwrap_or_default();
            let stored = api.get(&name).await?;
            ensure!(
                stored.spec.selectors == class.spec.selectors,
                "{name} stored with other selectors"
            );
        }
        let broken = DeviceClass {
            metadata: kube::core::ObjectMeta {
                name: Some(format!("{}-broken.hwaccel.io", tc.prefix())),
                ..Default::default()
            },
            spec: serde_json::from_value(json!({ "selectors": [{ "cel": {
                "expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].memory.compareTo('80Gi')"
            } }] }))?,
        };
        match api.create(&PostParams::default(), &broken).await {
            Err(e) if api_error(&e).is_some_and(|s| s.code == 422) => Ok(()),
            Err(e) => Err(e.into()),
            Ok(_) => {
                let _ = api
                    .delete(broken.metadata.name.as_deref().unwrap_or_default(), &DeleteParams::default())
                    .await;
                bail!("a class with a type error in its CEL was accepted")
            }
        }
    }
    .await;
    let cleaned = async {
        delete_classes(&tc).await?;
        delete_namespace(&tc).await
    }
    .await;
    result.and(cleaned)
}

/// (ii) With H100s (80 GB) on one node and A100s (40 GB) on another, a claim for
/// `hbm-80g-plus.hwaccel.io` lands on the H100 node, as does one for `fp8.hwaccel.io`;
/// nothing satisfies `hbm-141g-plus.hwaccel.io`.
#[tokio::test]
#[ignore = "needs cluster"]
async fn memory_and_precision_classes_pick_the_h100_node() -> Result<()> {
    let _turn = CLASSES.lock().await;
    let tc = TestCluster::new().await?;
    if skip_unless_full(&tc) {
        return Ok(());
    }
    let group = tc.prefix().to_string();
    let mut nodes = Vec::new();
    let result = async {
        apply_classes(&tc).await?;
        let h100 = gpu_node(
            &tc,
            "h100",
            &group,
            (0..2)
                .map(|i| nvidia_gpu(i, H100, 81_559, "pci0000:00"))
                .collect(),
        )
        .await?;
        nodes.push(h100.clone());
        let a100 = gpu_node(
            &tc,
            "a100",
            &group,
            (0..2)
                .map(|i| nvidia_gpu(i, A100_40, 40_960, "pci0000:00"))
                .collect(),
        )
        .await?;
        nodes.push(a100);
        let claims: Api<ResourceClaim> = Api::namespaced(tc.client(), tc.namespace());
        for (what, class) in [
            ("big", "hbm-80g-plus.hwaccel.io"),
            ("fp8", "fp8.hwaccel.io"),
            ("huge", "hbm-141g-plus.hwaccel.io"),
        ] {
            claims
                .create(&PostParams::default(), &claim(what, class, 1, None)?)
                .await
                .with_context(|| format!("claim {what}"))?;
            claim_pod(&tc, what, &group, json!({ "resourceClaimName": what })).await?;
        }
        for pod in ["big", "fp8"] {
            let node = scheduled_node(&tc, pod).await?;
            ensure!(
                node == h100,
                "pod {pod} went to {node}, not the H100 node {h100}"
            );
            let allocated = results(&pod_claim(&tc, pod).await?);
            ensure!(
                allocated.len() == 1 && allocated[0].1 == h100,
                "{pod}: allocated {allocated:?}"
            );
        }
        let message = unschedulable(&tc, "huge").await?;
        eprintln!("hbm-141g-plus pod: {message}");
        Ok(())
    }
    .await;
    let cleaned = async {
        delete_pods_and_claims(&tc, &["big", "fp8", "huge"], &["big", "fp8", "huge"]).await?;
        delete_nodes(&tc, &nodes).await?;
        delete_classes(&tc).await?;
        delete_namespace(&tc).await
    }
    .await;
    result.and(cleaned)
}

/// (iv) A GB200 (186 GB, 189,471 MiB as `nvidia-smi` prints it on a GB200 tray) is in the FP4
/// and 141 GB classes but not in the 192 GB one: its memory is above 95 % of an MI300X's, so the
/// generated threshold is raised above it.
#[tokio::test]
#[ignore = "needs cluster"]
async fn a_gb200_is_fp4_and_141g_but_not_192g() -> Result<()> {
    let _turn = CLASSES.lock().await;
    let tc = TestCluster::new().await?;
    if skip_unless_full(&tc) {
        return Ok(());
    }
    let group = tc.prefix().to_string();
    let mut nodes = Vec::new();
    let pods = ["fp4", "hbm141", "hbm192"];
    let result = async {
        apply_classes(&tc).await?;
        let gb200 = gpu_node(
            &tc,
            "gb200",
            &group,
            (0..2)
                .map(|i| nvidia_gpu(i, GB200, 189_471, "pci0000:00"))
                .collect(),
        )
        .await?;
        nodes.push(gb200.clone());
        let claims: Api<ResourceClaim> = Api::namespaced(tc.client(), tc.namespace());
        for (what, class) in [
            ("fp4", "fp4.hwaccel.io"),
            ("hbm141", "hbm-141g-plus.hwaccel.io"),
            ("hbm192", "hbm-192g-plus.hwaccel.io"),
        ] {
            claims
                .create(&PostParams::default(), &claim(what, class, 1, None)?)
                .await
                .with_context(|| format!("claim {what}"))?;
            claim_pod(&tc, what, &group, json!({ "resourceClaimName": what })).await?;
        }
        for pod in ["fp4", "hbm141"] {
            let node = scheduled_node(&tc, pod).await?;
            ensure!(node == gb200, "pod {pod} went to {node}, not {gb200}");
        }
        let message = unschedulable(&tc, "hbm192").await?;
        eprintln!("hbm-192g-plus pod on a GB200 node: {message}");
        Ok(())
    }
    .await;
    let cleaned = async {
        delete_pods_and_claims(&tc, &pods, &pods).await?;
        delete_nodes(&tc, &nodes).await?;
        delete_classes(&tc).await?;
        delete_namespace(&tc).await
    }
    .await;
    result.and(cleaned)
}

/// (iii) A template of [2× H100 on one PCIe root, else 1× A100]: while another claim holds
/// both H100s, a pod using it gets the A100 through the second subrequest; once the H100s
/// are free, the next pod gets both through the first.
#[tokio::test]
#[ignore = "needs cluster"]
async fn prioritized_list_falls_back_when_the_first_choice_is_taken() -> Result<()> {
    let _turn = CLASSES.lock().await;
    let tc = TestCluster::new().await?;
    if skip_unless_full(&tc) {
        return Ok(());
    }
    let group = tc.prefix().to_string();
    let mut nodes = Vec::new();
    let result = async {
        apply_classes(&tc).await?;
        let h100 = gpu_node(
            &tc,
            "h100",
            &group,
            (0..2)
                .map(|i| nvidia_gpu(i, H100, 81_559, "pci0000:10"))
                .collect(),
        )
        .await?;
        nodes.push(h100.clone());
        let a100 = gpu_node(
            &tc,
            "a100",
            &group,
            vec![nvidia_gpu(0, A100_40, 40_960, "pci0000:00")],
        )
        .await?;
        nodes.push(a100.clone());

        let template = claim_template(
            tc.namespace(),
            "fallback",
            None,
            &[
                Alternative {
                    name: "h100-tp2".to_string(),
                    driver: NVIDIA.to_string(),
                    product: Some(H100.to_string()),
                    min_memory_bytes: Some(80_000_000_000),
                    count: 2,
                    same_domain_attribute: Some("resource.kubernetes.io/pcieRoot".to_string()),
                    memory_request: None,
                    partition_profile: None,
                },
                Alternative {
                    name: "a100".to_string(),
                    driver: NVIDIA.to_string(),
                    product: Some(A100_40.to_string()),
                    min_memory_bytes: None,
                    count: 1,
                    same_domain_attribute: None,
                    memory_request: None,
                    partition_profile: None,
                },
            ],
        )?;
        let templates: Api<ResourceClaimTemplate> = Api::namespaced(tc.client(), tc.namespace());
        templates
            .create(&PostParams::default(), &template)
            .await
            .context("creating the template")?;

        // Another workload holds both H100s.
        let claims: Api<ResourceClaim> = Api::namespaced(tc.client(), tc.namespace());
        claims
            .create(
                &PostParams::default(),
                &claim("blocker", "gpu.hwaccel.io", 2, Some(H100))?,
            )
            .await?;
        claim_pod(
            &tc,
            "blocker",
            &group,
            json!({ "resourceClaimName": "blocker" }),
        )
        .await?;
        ensure!(
            scheduled_node(&tc, "blocker").await? == h100,
            "blocker not on the H100 node"
        );
        pod_claim(&tc, "blocker").await?;

        let by_template = json!({ "resourceClaimTemplateName": "fallback" });
        claim_pod(&tc, "second-choice", &group, by_template.clone()).await?;
        let node = scheduled_node(&tc, "second-choice").await?;
        ensure!(
            node == a100,
            "second-choice went to {node}, not the A100 node"
        );
        let allocated = results(&pod_claim(&tc, "second-choice").await?);
        ensure!(
            allocated
                == [(
                    format!("{REQUEST_NAME}/a100"),
                    a100.clone(),
                    "gpu-0".to_string()
                )],
            "second-choice allocated {allocated:?}"
        );

        // The H100s are freed: the first choice is available again.
        delete_pods_and_claims(&tc, &["blocker"], &["blocker"]).await?;
        claim_pod(&tc, "first-choice", &group, by_template).await?;
        let node = scheduled_node(&tc, "first-choice").await?;
        ensure!(
            node == h100,
            "first-choice went to {node}, not the H100 node"
        );
        let mut allocated = results(&pod_claim(&tc, "first-choice").await?);
        allocated.sort();
        let first = format!("{REQUEST_NAME}/h100-tp2");
        ensure!(
            allocated
                == [
                    (first.clone(), h100.clone(), "gpu-0".to_string()),
                    (first, h100.clone(), "gpu-1".to_string()),
                ],
            "first-choice allocated {allocated:?}"
        );
        Ok(())
    }
    .await;
    let cleaned = async {
        let generated: Vec<String> = {
            let claims: Api<ResourceClaim> = Api::namespaced(tc.client(), tc.namespace());
            claims
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .filter_map(|c| c.metadata.name)
                .collect()
        };
        let generated: Vec<&str> = generated.iter().map(String::as_str).collect();
        delete_pods_and_claims(
            &tc,
            &["blocker", "second-choice", "first-choice"],
            &generated,
        )
        .await?;
        delete_nodes(&tc, &nodes).await?;
        delete_classes(&tc).await?;
        delete_namespace(&tc).await
    }
    .await;
    result.and(cleaned)
}

/// (v) DRA extended resources (GA and on by default in 1.37, no feature gate set): with the
/// classes' extended resource names, a pod asking for `hwaccel.io/hbm-80g-plus: 1` in its
/// limits, and for no claim, is scheduled by kube-scheduler onto the H100 node (not the A100
/// one), in a ResourceClaim the scheduler creates for it that holds one H100 by the class.
#[tokio::test]
#[ignore = "needs cluster"]
async fn a_pod_asking_for_a_class_extended_resource_gets_a_device_of_the_class() -> Result<()> {
    let _turn = CLASSES.lock().await;
    let tc = TestCluster::new().await?;
    if skip_unless_full(&tc) {
        return Ok(());
    }
    let group = tc.prefix().to_string();
    let class = "hbm-80g-plus.hwaccel.io";
    let resource = extended_resource_name(class);
    let mut nodes = Vec::new();
    let result = async {
        apply_these_classes(&tc, with_extended_resource_names(device_classes())).await?;
        let stored = Api::<DeviceClass>::all(tc.client()).get(class).await?;
        let minor = support::apiserver_minor(&tc.client()).await?;
        if minor < 37 {
            // Alpha and off before 1.37 (the compat tier): the apiserver drops the field, so
            // the chart's option does nothing there, as docs/dra.md says.
            ensure!(
                stored.spec.extended_resource_name.is_none(),
                "1.{minor} kept extendedResourceName without the DRAExtendedResource gate"
            );
            eprintln!("1.{minor}: extendedResourceName dropped (gated before 1.37), as documented");
            return Ok(());
        }
        ensure!(
            stored.spec.extended_resource_name.as_deref() == Some(resource.as_str()),
            "the apiserver kept no extendedResourceName: {:?}",
            stored.spec
        );
        let h100 = gpu_node(
            &tc,
            "h100",
            &group,
            vec![nvidia_gpu(0, H100, 81_559, "pci0000:00")],
        )
        .await?;
        nodes.push(h100.clone());
        let a100 = gpu_node(
            &tc,
            "a100",
            &group,
            vec![nvidia_gpu(0, A100_40, 40_960, "pci0000:00")],
        )
        .await?;
        nodes.push(a100);
        extended_resource_pod(&tc, "extended", &group, (&resource, 1)).await?;
        let node = scheduled_node(&tc, "extended").await?;
        ensure!(
            node == h100,
            "the pod went to {node}, not the H100 node {h100}"
        );
        // The claim is the scheduler's: named in the pod's status, marked as an
        // extended-resource claim, asking the class for one device, holding the H100.
        let pods: Api<Pod> = Api::namespaced(tc.client(), tc.namespace());
        let claim_name = wait_for(DEFAULT_TIMEOUT, "the pod's extended resource claim", || {
            let pods = pods.clone();
            async move {
                let pod = pods.get("extended").await?;
                Ok(pod
                    .status
                    .and_then(|s| s.extended_resource_claim_status)
                    .map(|s| s.resource_claim_name))
            }
        })
        .await?;
        let claims: Api<ResourceClaim> = Api::namespaced(tc.client(), tc.namespace());
        let claim = claims.get(&claim_name).await?;
        let annotations = claim.metadata.annotations.clone().unwrap_or_default();
        ensure!(
            annotations
                .get("resource.kubernetes.io/extended-resource-claim")
                .map(String::as_str)
                == Some("true"),
            "{claim_name} is not the scheduler's extended-resource claim: {annotations:?}"
        );
        let classes: Vec<String> = claim
            .spec
            .devices
            .as_ref()
            .and_then(|d| d.requests.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|r| r.exactly.as_ref().map(|e| e.device_class_name.clone()))
            .collect();
        ensure!(classes == [class], "{claim_name} asks for {classes:?}");
        let allocated = results(&claim);
        ensure!(
            allocated.len() == 1 && allocated[0].1 == h100 && allocated[0].2 == "gpu-0",
            "{claim_name}: allocated {allocated:?}"
        );
        Ok(())
    }
    .await;
    let cleaned = async {
        delete_namespace(&tc).await?;
        delete_nodes(&tc, &nodes).await?;
        delete_classes(&tc).await
    }
    .await;
    result.and(cleaned)
}

/// The chart renders no DeviceClass by default, exactly the generated ones with
/// `dra.deviceClasses.enabled=true`, and each with its extended resource name when
/// `dra.deviceClasses.extendedResourceNames=true` too.
#[test]
fn chart_renders_the_generated_classes_only_when_enabled() {
    let test = "chart_renders_the_generated_classes_only_when_enabled";
    let Some(helm_bin) = helm::find_helm() else {
        helm::skip_notice(test);
        return;
    };
    let render = |extra: &[&str]| {
        let yaml = helm::template(
            &helm_bin,
            &helm::chart_dir(),
            "hwaccel",
            "hwaccel-system",
            extra,
        )
        .unwrap_or_else(|err| panic!("helm template {extra:?} failed:\n{err}"));
        helm::documents(&yaml)
    };
    let off = render(&[]);
    assert!(helm::of_kind(&off, "DeviceClass").is_empty());
    let on = render(&["--set", "dra.deviceClasses.enabled=true"]);
    let rendered: Vec<Value> = helm::of_kind(&on, "DeviceClass")
        .into_iter()
        .cloned()
        .collect();
    let generated: Vec<Value> = device_classes()
        .iter()
        .map(|c| serde_json::to_value(c).expect("a DeviceClass serialises"))
        .collect();
    assert_eq!(rendered, generated);
    // With extendedResourceNames, the same classes, each with its name.
    let extended = render(&[
        "--set",
        "dra.deviceClasses.enabled=true",
        "--set",
        "dra.deviceClasses.extendedResourceNames=true",
    ]);
    let rendered: Vec<Value> = helm::of_kind(&extended, "DeviceClass")
        .into_iter()
        .cloned()
        .collect();
    let generated: Vec<Value> = with_extended_resource_names(device_classes())
        .iter()
        .map(|c| serde_json::to_value(c).expect("a DeviceClass serialises"))
        .collect();
    assert_eq!(rendered, generated);
}
