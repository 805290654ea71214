//! `hwaccel plan --emit` against a real control plane: a ModelPlacement is planned by the
//! controller on kwok Nodes that advertise `nvidia.com/gpu`, the CLI renders a workload from
//! the live object (`kubectl get mp -o yaml | hwaccel plan --emit ... --placement -`), the
//! kube-apiserver accepts it, and the real kube-scheduler binds every pod to a planned node.
//!
//! - Deployment: applied as is; kube-controller-manager makes its pods, kube-scheduler binds
//!   them, kwok runs them. A GPU node the plan did not choose stays empty.
//! - LeaderWorkerSet: no LWS controller runs here. The upstream CRD (`fixtures/crds/`, see its
//!   PROVENANCE.md) is installed so the apiserver validates the rendered object on create;
//!   the test then creates the leader pod and the worker pods of one group from the object's
//!   own `leaderTemplate` and `workerTemplate`, as the LWS controller would, and checks the
//!   scheduler binds them to the replica's planned nodes, one pod per node.
//!
//! Run with the full tier: `tests/cluster/up.sh --full && cargo test --test
//! cluster_tier -- --ignored cluster_plan_emit:: --test-threads=1`.

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail, ensure};
use hwaccel::api::ModelPlacement;
use hwaccel::api::placement::{
    EngineSpec, ModelPlacementSpec, ModelPlacementStatus, PrecisionChoice,
};
use hwaccel::controller::HealthTaints;
use hwaccel::testing::{InventoryBuilder, PlacementBuilder};
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplateSpec};
use kube::Api;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::controller::start_controller;
use support::nodes::{apply_inventory, create_kwok_node};
use support::{
    DEFAULT_TIMEOUT, TEST_LABEL, TestCluster, install_crds, wait_crd_established, wait_for,
};

/// GPUs each fixture node (`h100-8x-nvswitch`) has.
const GPUS: u32 = 8;

/// A kwok Node with the fixture's inventory and its GPUs in `status.capacity` and
/// `allocatable`, as the NVIDIA device plugin would advertise them.
async fn add_gpu_node(cluster: &TestCluster) -> Result<String> {
    let name = cluster.unique_name("gpu");
    create_kwok_node(cluster, &name).await?;
    let resources = json!({
        "cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": GPUS.to_string(),
    });
    Api::<Node>::all(cluster.client())
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": resources, "allocatable": resources}})),
        )
        .await?;
    let inventory = InventoryBuilder::fixture("h100-8x-nvswitch")
        .node(&name)
        .label(TEST_LABEL, cluster.prefix())
        .build();
    apply_inventory(&cluster.client(), &inventory).await?;
    Ok(name)
}

/// Creates the placement and waits until it is planned; returns its status.
async fn plan(
    cluster: &TestCluster,
    name: &str,
    spec: ModelPlacementSpec,
) -> Result<ModelPlacementStatus> {
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    api.create(&PostParams::default(), &ModelPlacement::new(name, spec))
        .await?;
    wait_for(DEFAULT_TIMEOUT, &format!("{name} Planned"), || {
        let api = api.clone();
        async move {
            let placement = api.get(name).await?;
            Ok(placement
                .status
                .filter(|s| s.state.as_deref() == Some("Planned") && s.engine.is_some()))
        }
    })
    .await
}

/// The fixture nodes run NVIDIA driver 550.90.07 (a DGX H100 capture): today's vLLM image is a
/// CUDA 13 build that needs 580, so these placements name vLLM 0.20, the last CUDA 12 image,
/// as a user of such nodes must (the controller says so otherwise; checked below).
fn on_cuda_12(mut spec: ModelPlacementSpec) -> ModelPlacementSpec {
    spec.engine = Some(EngineSpec {
        version: Some("0.20.0".into()),
        ..EngineSpec::default()
    });
    spec
}

/// `kubectl get mp NAME -o yaml | hwaccel plan --emit KIND --placement -`; the YAML stream.
async fn render(cluster: &TestCluster, placement: &str, kind: &str) -> Result<String> {
    let live = cluster
        .kubectl_ok(&["get", "modelplacement", placement, "-o", "yaml"])
        .await?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_hwaccel"))
        .args(["plan", "--emit", kind, "--placement", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(live.as_bytes())?;
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "hwaccel plan --emit {kind} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// Writes `text` to a file in the cluster's work dir and creates it with kubectl (the
/// apiserver validates it); returns the file.
async fn create(cluster: &TestCluster, file: &str, text: &str) -> Result<std::path::PathBuf> {
    let path = cluster
        .env()
        .work
        .join(format!("{}-{file}", cluster.prefix()));
    std::fs::write(&path, text)?;
    cluster
        .kubectl_ok(&["create", "-f", &path.to_string_lossy()])
        .await
        .with_context(|| format!("the apiserver refused the rendered workload:\n{text}"))?;
    Ok(path)
}

/// Planned nodes of each replica.
fn nodes_by_replica(status: &ModelPlacementStatus) -> BTreeMap<u32, BTreeSet<String>> {
    let mut out: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
    for a in &status.assignments {
        out.entry(a.replica).or_default().insert(a.node.clone());
    }
    out
}

/// Waits until every pod matching `selector` is bound and Running; returns pod -> node.
async fn running_pods(
    cluster: &TestCluster,
    selector: &str,
    expected: usize,
) -> Result<BTreeMap<String, String>> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    wait_for(DEFAULT_TIMEOUT, &format!("{expected} pods Running"), || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&ListParams::default().labels(selector)).await?;
            let running: BTreeMap<String, String> = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter_map(|p| {
                    Some((
                        p.metadata.name.clone()?,
                        p.spec.as_ref()?.node_name.clone()?,
                    ))
                })
                .collect();
            Ok((running.len() == expected && list.items.len() == expected).then_some(running))
        }
    })
    .await
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_rendered_deployment_is_accepted_and_scheduled_onto_the_planned_nodes() -> Result<()> {
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        bail!("needs the full tier (tests/cluster/up.sh --full): kube-scheduler and kwok");
    }
    install_crds(&cluster.client()).await?;
    let mut gpu_nodes = BTreeSet::new();
    for _ in 0..3 {
        gpu_nodes.insert(add_gpu_node(&cluster).await?);
    }
    let (_controller, _registry) = start_controller(&cluster, HealthTaints::None);

    // Two replicas of a 70B model in bf16: four or more GPUs each.
    let spec = PlacementBuilder::serve("llama-3.1-70b")
        .context(16384)
        .replicas(2)
        .precision(PrecisionChoice::Bf16)
        .spec();
    // Unstated, the engine is today's vLLM, whose image the nodes' driver cannot run: the
    // status says why instead of naming an image that would crash at start-up.
    let today = plan(&cluster, "llama-today", spec.clone()).await?;
    let refusal = today
        .engine
        .as_ref()
        .and_then(|engine| engine.image_refusal.clone())
        .context("a refusal for today's vLLM on driver 550")?;
    ensure!(
        refusal.contains("550.90.07") && refusal.contains("580"),
        "{refusal}"
    );
    // It holds the GPUs it was planned on; give them back before the runnable one.
    Api::<ModelPlacement>::namespaced(cluster.client(), cluster.namespace())
        .delete("llama-today", &Default::default())
        .await?;
    let status = plan(&cluster, "llama", on_cuda_12(spec)).await?;
    assert_eq!(status.allocation.as_deref(), Some("labels"), "{status:?}");
    let planned: BTreeSet<String> = status.assignments.iter().map(|a| a.node.clone()).collect();
    let layout = status.plan.clone().context("a plan")?;
    assert_eq!(layout.replicas, 2);
    ensure!(
        nodes_by_replica(&status).values().all(|n| n.len() == 1),
        "one node per replica"
    );

    let yaml = render(&cluster, "llama", "deployment").await?;
    assert!(yaml.contains("kind: Deployment"), "{yaml}");
    assert!(yaml.contains("vllm/vllm-openai:v0.20.0"), "{yaml}");
    let tp = format!(
        "- --tensor-parallel-size\n        - \"{}\"",
        layout.tensor_parallel
    );
    assert!(yaml.contains(&tp), "{tp} missing:\n{yaml}");
    create(&cluster, "deployment.yaml", &yaml).await?;

    let pods = running_pods(&cluster, "app.kubernetes.io/name=llama", 2).await?;
    for (pod, node) in &pods {
        assert!(
            planned.contains(node),
            "{pod} runs on {node}, not a planned node {planned:?}"
        );
    }
    // The scheduler counted the GPUs: no node holds more pods than its GPUs allow.
    let per_pod = layout.tensor_parallel * layout.pipeline_parallel;
    for node in &gpu_nodes {
        let on_node = u32::try_from(pods.values().filter(|n| *n == node).count())?;
        assert!(
            on_node * per_pod <= GPUS,
            "{node}: {on_node} pods of {per_pod} GPUs"
        );
    }
    // A GPU node the plan did not choose gets nothing.
    let unplanned: Vec<&String> = gpu_nodes.difference(&planned).collect();
    assert!(
        !unplanned.is_empty(),
        "the plan should leave a node free: {planned:?}"
    );
    for node in unplanned {
        assert!(
            !pods.values().any(|n| n == node),
            "a pod landed on unplanned {node}"
        );
    }
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_disaggregated_placement_renders_one_deployment_per_pool_onto_its_role_nodes()
-> Result<()> {
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        bail!("needs the full tier (tests/cluster/up.sh --full): kube-scheduler and kwok");
    }
    install_crds(&cluster.client()).await?;
    for _ in 0..2 {
        add_gpu_node(&cluster).await?;
    }
    let (_controller, _registry) = start_controller(&cluster, HealthTaints::None);

    let spec = PlacementBuilder::serve("llama-3.1-70b")
        .context(8192)
        .concurrency(16)
        .precision(PrecisionChoice::Bf16)
        .disaggregated(Some(2))
        .spec();
    let status = plan(&cluster, "pd", on_cuda_12(spec)).await?;
    let prefill = status
        .prefill
        .clone()
        .context("a prefill pool in the status")?;
    let role_nodes = |names: Option<&String>| -> BTreeSet<String> {
        names
            .map(|n| n.split(',').map(str::to_string).collect())
            .unwrap_or_default()
    };
    let decode_nodes = role_nodes(status.decode.as_ref().and_then(|d| d.node_names.as_ref()));
    let prefill_nodes = role_nodes(prefill.node_names.as_ref());
    ensure!(
        !decode_nodes.is_empty() && !prefill_nodes.is_empty(),
        "{status:?}"
    );
    let decode_replicas = status.plan.as_ref().context("a plan")?.replicas;
    let prefill_replicas = prefill.plan.as_ref().context("a prefill plan")?.replicas;
    assert_eq!(prefill_replicas, 2);

    let yaml = render(&cluster, "pd", "deployment").await?;
    for name in ["name: pd-decode", "name: pd-prefill"] {
        assert!(yaml.contains(name), "{name} missing:\n{yaml}");
    }
    create(&cluster, "pd.yaml", &yaml).await?;
    for (pool, replicas, nodes) in [
        ("pd-decode", decode_replicas, &decode_nodes),
        ("pd-prefill", prefill_replicas, &prefill_nodes),
    ] {
        let selector = format!("app.kubernetes.io/name={pool}");
        let pods = running_pods(&cluster, &selector, usize::try_from(replicas)?).await?;
        for (pod, node) in &pods {
            assert!(
                nodes.contains(node),
                "{pod} of {pool} runs on {node}, outside its role's nodes {nodes:?}"
            );
        }
    }
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_rendered_leader_worker_set_validates_and_its_pods_land_on_the_planned_nodes()
-> Result<()> {
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        bail!("needs the full tier (tests/cluster/up.sh --full): kube-scheduler and kwok");
    }
    install_crds(&cluster.client()).await?;
    install_lws_crd(&cluster).await?;
    let mut gpu_nodes = BTreeSet::new();
    for _ in 0..3 {
        gpu_nodes.insert(add_gpu_node(&cluster).await?);
    }
    let (_controller, _registry) = start_controller(&cluster, HealthTaints::None);

    // 405B in bf16 (810 GB) does not fit one node of 8 x 80 GB: one replica spans two.
    let spec = PlacementBuilder::serve("llama-3.1-405b")
        .context(8192)
        .precision(PrecisionChoice::Bf16)
        .spec();
    let status = plan(&cluster, "big", on_cuda_12(spec)).await?;
    let replicas = nodes_by_replica(&status);
    let group: Vec<String> = replicas
        .get(&0)
        .context("replica 0")?
        .iter()
        .cloned()
        .collect();
    ensure!(group.len() >= 2, "a replica across nodes: {status:?}");

    let yaml = render(&cluster, "big", "lws").await?;
    create(&cluster, "lws.yaml", &yaml).await?;
    let lws = cluster
        .kubectl_ok(&[
            "get",
            "leaderworkersets.leaderworkerset.x-k8s.io",
            "big",
            "-o",
            "json",
        ])
        .await?;
    let lws: Value = serde_json::from_str(&lws)?;
    let template = &lws["spec"]["leaderWorkerTemplate"];
    assert_eq!(template["size"], json!(group.len()), "{lws}");

    // One group, as the LWS controller would make it: a leader and size-1 workers.
    let pods: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    let mut names = vec![("big-0".to_string(), &template["leaderTemplate"])];
    for worker in 1..group.len() {
        names.push((format!("big-0-{worker}"), &template["workerTemplate"]));
    }
    for (name, pod_template) in &names {
        let pod_template: PodTemplateSpec = serde_json::from_value((*pod_template).clone())?;
        let mut labels = pod_template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        labels.insert("lws-test-group".to_string(), "big-0".to_string());
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            spec: pod_template.spec,
            ..Pod::default()
        };
        pods.create(&PostParams::default(), &pod).await?;
    }
    let running = running_pods(&cluster, "lws-test-group=big-0", group.len()).await?;
    let used: BTreeSet<&String> = running.values().collect();
    let expected: BTreeSet<&String> = group.iter().collect();
    assert_eq!(
        used, expected,
        "one pod on each node of the replica: {running:?}"
    );
    Ok(())
}

/// Installs the upstream LeaderWorkerSet CRD and waits until it is Established.
async fn install_lws_crd(cluster: &TestCluster) -> Result<()> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/crds/leaderworkerset.x-k8s.io_leaderworkersets.yaml");
    cluster
        .kubectl_ok(&[
            "apply",
            "--server-side",
            "--field-manager",
            "hwaccel-tests",
            "-f",
            &file.to_string_lossy(),
        ])
        .await?;
    wait_crd_established(
        &cluster.client(),
        "leaderworkersets.leaderworkerset.x-k8s.io",
    )
    .await?;
    Ok(())
}

/// Issue 23: the apiserver enforces `spec.engine`'s bounds (the CRD's CEL rules) and keeps
/// what is in bounds; no controller is needed to judge the schema.
#[tokio::test]
#[ignore = "needs cluster"]
async fn the_apiserver_enforces_the_engine_fields_bounds() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    let with_engine = |engine: Value| -> Result<ModelPlacement> {
        let mut object = serde_json::to_value(ModelPlacement::new(
            "engine",
            PlacementBuilder::serve("llama-3.1-8b").spec(),
        ))?;
        object["spec"]["engine"] = engine;
        Ok(serde_json::from_value(object)?)
    };
    let refusals = [
        (
            json!({"maxNumSeqs": 0}),
            "maxNumSeqs must be between 1 and 65536",
        ),
        (
            json!({"maxNumSeqs": 70000}),
            "maxNumSeqs must be between 1 and 65536",
        ),
        (
            json!({"maxNumBatchedTokens": 5_000_000}),
            "maxNumBatchedTokens must be between 1 and 4194304",
        ),
        (
            json!({"maxNumSeqs": 512, "maxNumBatchedTokens": 256}),
            "maxNumBatchedTokens must be at least maxNumSeqs",
        ),
        (
            json!({"memFractionStaticPercent": 80}),
            "memFractionStaticPercent is SGLang's setting",
        ),
        (
            json!({"name": "sglang", "memFractionStaticPercent": 5}),
            "memFractionStaticPercent must be between 10 and 100",
        ),
        (json!({"version": "one"}), "version must be a release"),
    ];
    for (engine, expected) in refusals {
        let placement = with_engine(engine.clone())?;
        let refused = api.create(&PostParams::default(), &placement).await;
        let message = format!("{refused:?}");
        ensure!(
            refused.is_err() && message.contains(expected),
            "{engine} was not refused with {expected:?}: {message}"
        );
    }
    // A name outside the enum is refused by the schema itself (the typed client cannot send
    // one, so kubectl does).
    let mut object = serde_json::to_value(with_engine(json!({}))?)?;
    object["spec"]["engine"] = json!({"name": "tgi"});
    object["metadata"]["name"] = json!("engine-tgi");
    let file = cluster
        .env()
        .work
        .join(format!("{}-engine-tgi.json", cluster.prefix()));
    std::fs::write(&file, serde_json::to_vec(&object)?)?;
    let path = file.to_str().context("path")?;
    let out = cluster.kubectl(&["create", "-f", path]).await?;
    ensure!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Unsupported value"),
        "engine name tgi accepted: {out:?}"
    );
    // In bounds: accepted and kept as written.
    let good = with_engine(json!({
        "name": "sglang",
        "version": "0.5.2",
        "enforceEager": true,
        "maxNumSeqs": 64,
        "maxNumBatchedTokens": 4096,
        "memFractionStaticPercent": 85,
    }))?;
    let created = api.create(&PostParams::default(), &good).await?;
    let engine = created.spec.engine.context("engine kept")?;
    ensure!(engine.max_num_seqs == Some(64) && engine.mem_fraction_static_percent == Some(85));
    Ok(())
}

/// The placement's `Conformant` condition as (status, reason, message).
async fn conformant(cluster: &TestCluster, name: &str) -> Result<Option<(String, String, String)>> {
    let placement = Api::<ModelPlacement>::namespaced(cluster.client(), cluster.namespace())
        .get(name)
        .await?;
    Ok(placement.status.and_then(|status| {
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Conformant")
            .map(|c| (c.status, c.reason, c.message))
    }))
}

/// Waits until the `Conformant` condition has `status` and `reason`; returns its message.
/// A placement without running pods is re-checked only on its slow resync, so each try
/// nudges it (an annotation: any change of the object is a reconcile).
async fn wait_conformant(
    cluster: &TestCluster,
    name: &str,
    status: &str,
    reason: &str,
) -> Result<String> {
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    let nudges = std::sync::atomic::AtomicU32::new(0);
    wait_for(
        DEFAULT_TIMEOUT,
        &format!("{name} Conformant={status} {reason}"),
        || {
            let api = api.clone();
            let nudges = &nudges;
            async move {
                let nudge = nudges.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                api.patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {"test.hwaccel.io/nudge": nudge.to_string()}}})),
                )
                .await?;
                Ok(conformant(cluster, name)
                    .await?
                    .filter(|(s, r, _)| s == status && r == reason)
                    .map(|(_, _, message)| message))
            }
        },
    )
    .await
}

/// Edits the Deployment's `vllm` container: `edit` gets its args and image.
async fn edit_container(
    cluster: &TestCluster,
    name: &str,
    edit: impl FnOnce(&mut Vec<String>, &mut String),
) -> Result<()> {
    let api: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(cluster.client(), cluster.namespace());
    let deployment = api.get(name).await?;
    let container = deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().find(|c| c.name == "vllm"))
        .context("the vllm container")?;
    let mut args = container.args.unwrap_or_default();
    let mut image = container.image.unwrap_or_default();
    edit(&mut args, &mut image);
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
            {"name": "vllm", "args": args, "image": image},
        ]}}}})),
    )
    .await?;
    Ok(())
}

/// The one pod of the Deployment not being deleted, once its container `runs` what is
/// wanted.
async fn current_pod(
    cluster: &TestCluster,
    app: &str,
    what: &str,
    runs: impl Fn(&k8s_openapi::api::core::v1::Container) -> bool,
) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    let runs = &runs;
    wait_for(DEFAULT_TIMEOUT, &format!("a pod running {what}"), || {
        let pods = pods.clone();
        async move {
            let list = pods
                .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={app}")))
                .await?;
            let live: Vec<&Pod> = list
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let pod_runs = |p: &Pod| {
                p.spec
                    .as_ref()
                    .is_some_and(|s| s.containers.iter().any(runs))
            };
            Ok((live.len() == 1 && pod_runs(live[0]))
                .then(|| live[0].metadata.name.clone())
                .flatten())
        }
    })
    .await
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn an_emitted_deployment_runs_its_plan_until_edited_and_again_once_restored() -> Result<()> {
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        bail!("needs the full tier (tests/cluster/up.sh --full): kube-scheduler and kwok");
    }
    install_crds(&cluster.client()).await?;
    add_gpu_node(&cluster).await?;
    let (_controller, registry) = support::controller::start_controller_with(&cluster, |config| {
        config.device_health_interval = std::time::Duration::from_secs(1);
    });
    // One replica of a 70B model in bf16: TP 4 or more on the 80 GB H100s.
    let spec = PlacementBuilder::serve("llama-3.1-70b")
        .context(8192)
        .replicas(1)
        .precision(PrecisionChoice::Bf16)
        .spec();
    let status = plan(&cluster, "conform", on_cuda_12(spec)).await?;
    let tp = status.plan.as_ref().context("a plan")?.tensor_parallel;
    ensure!(tp >= 2, "TP {tp}");
    let message = wait_conformant(&cluster, "conform", "Unknown", "NoPods").await?;
    assert!(
        message.contains("hwaccel.io/placement=conform"),
        "{message}"
    );

    let yaml = render(&cluster, "conform", "deployment").await?;
    assert!(yaml.contains("hwaccel.io/placement: conform"), "{yaml}");
    create(&cluster, "conform.yaml", &yaml).await?;
    running_pods(&cluster, "app.kubernetes.io/name=conform", 1).await?;
    let message = wait_conformant(&cluster, "conform", "True", "Conformant").await?;
    assert_eq!(message, "1 pod run the plan");
    let table = cluster
        .kubectl_ok(&["get", "modelplacement", "conform"])
        .await?;
    assert!(
        table
            .lines()
            .next()
            .is_some_and(|h| h.contains("CONFORMANT")),
        "{table}"
    );
    assert!(table.contains("True"), "{table}");

    // Fewer tensor-parallel ranks on the same GPUs: half of them idle, the pod named.
    let half = (tp / 2).to_string();
    edit_container(&cluster, "conform", |args, _| {
        let at = args
            .iter()
            .position(|a| a == "--tensor-parallel-size")
            .expect("TP");
        args[at + 1] = half.clone();
    })
    .await?;
    let tp_is = |value: String| {
        move |c: &k8s_openapi::api::core::v1::Container| {
            c.args
                .iter()
                .flatten()
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| w[0] == "--tensor-parallel-size" && *w[1] == value)
        }
    };
    let pod = current_pod(&cluster, "conform", "half the TP", tp_is(half.clone())).await?;
    let message = wait_conformant(&cluster, "conform", "False", "IdleDevices").await?;
    assert!(
        message.contains(&format!(
            "pod {pod} holds {tp} devices and starts {half} rank"
        )),
        "{message}"
    );
    wait_for(
        DEFAULT_TIMEOUT,
        "hwaccel_placement_idle_devices",
        || async {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry)?;
            let series = format!(
                "hwaccel_placement_idle_devices{{namespace=\"{}\",placement=\"conform\"}} {}",
                cluster.namespace(),
                tp - tp / 2
            );
            Ok(text.lines().any(|l| l == series).then_some(()))
        },
    )
    .await?;

    // TP restored, another vendor's image: the wrong image.
    let rocm = "docker.io/vllm/vllm-openai-rocm:v0.20.0".to_string();
    let full = tp.to_string();
    edit_container(&cluster, "conform", |args, image| {
        let at = args
            .iter()
            .position(|a| a == "--tensor-parallel-size")
            .expect("TP");
        args[at + 1] = full.clone();
        *image = rocm.clone();
    })
    .await?;
    current_pod(&cluster, "conform", "the ROCm image", |c| {
        c.image.as_deref() == Some(rocm.as_str())
    })
    .await?;
    let message = wait_conformant(&cluster, "conform", "False", "WrongImage").await?;
    assert!(message.contains("(a rocm build)"), "{message}");

    // Today's vLLM, a CUDA 13 build, on the node's driver 550: too old for it.
    let cuda13 = "docker.io/vllm/vllm-openai:v0.21.0".to_string();
    edit_container(&cluster, "conform", |_, image| *image = cuda13.clone()).await?;
    current_pod(&cluster, "conform", "the CUDA 13 image", |c| {
        c.image.as_deref() == Some(cuda13.as_str())
    })
    .await?;
    let message = wait_conformant(&cluster, "conform", "False", "DriverTooOld").await?;
    assert!(
        message.contains("needs NVIDIA driver 580 or newer) on a node with driver 550.90.07"),
        "{message}"
    );

    // Restored: conformant again.
    let planned_image = status
        .engine
        .as_ref()
        .and_then(|e| e.image.clone())
        .context("the plan's image")?;
    edit_container(&cluster, "conform", |_, image| {
        *image = planned_image.clone()
    })
    .await?;
    current_pod(&cluster, "conform", "the planned image", |c| {
        c.image.as_deref() == Some(planned_image.as_str())
    })
    .await?;
    wait_conformant(&cluster, "conform", "True", "Conformant").await?;
    let events = cluster
        .kubectl_ok(&[
            "get",
            "events",
            "-n",
            cluster.namespace(),
            "--field-selector",
            "involvedObject.name=conform,reason=NotConformant",
            "-o",
            "name",
        ])
        .await?;
    assert!(!events.trim().is_empty(), "no NotConformant Event");
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_claims_placements_pods_are_judged_through_the_claims_they_hold() -> Result<()> {
    let Some((_turn, cluster, _node, _)) = crate::cluster_dra::h100_dra_node().await? else {
        return Ok(());
    };
    let (_controller, _registry) = support::controller::start_controller_with(&cluster, |config| {
        config.device_health_interval = std::time::Duration::from_secs(1);
    });
    let mut spec = PlacementBuilder::serve("llama-3.1-70b")
        .context(8192)
        .replicas(1)
        .precision(PrecisionChoice::Bf16)
        .spec();
    spec.allocation = Some(hwaccel::api::placement::AllocationMode::Claims);
    let status = plan(&cluster, "conformc", on_cuda_12(spec)).await?;
    assert_eq!(status.allocation.as_deref(), Some("claims"), "{status:?}");
    let tp = status.plan.as_ref().context("a plan")?.tensor_parallel;
    ensure!(tp >= 2, "TP {tp}");

    // Without the label --emit stamps: only the claims lead the controller to the pod.
    let yaml = render(&cluster, "conformc", "deployment").await?;
    assert!(yaml.contains("resourceClaimName"), "{yaml}");
    let unlabelled: String = yaml
        .lines()
        .filter(|line| !line.contains("hwaccel.io/placement:"))
        .map(|line| format!("{line}\n"))
        .collect();
    create(&cluster, "conformc.yaml", &unlabelled).await?;
    running_pods(&cluster, "app.kubernetes.io/name=conformc-r0", 1).await?;
    let message = wait_conformant(&cluster, "conformc", "True", "Conformant").await?;
    assert_eq!(message, "1 pod run the plan");

    let half = (tp / 2).to_string();
    edit_container(&cluster, "conformc-r0", |args, _| {
        let at = args
            .iter()
            .position(|a| a == "--tensor-parallel-size")
            .expect("TP");
        args[at + 1] = half.clone();
    })
    .await?;
    let pod = current_pod(&cluster, "conformc-r0", "half the TP", |c| {
        c.args
            .iter()
            .flatten()
            .collect::<Vec<_>>()
            .windows(2)
            .any(|w| w[0] == "--tensor-parallel-size" && *w[1] == half)
    })
    .await?;
    let message = wait_conformant(&cluster, "conformc", "False", "IdleDevices").await?;
    assert!(
        message.contains(&format!("pod {pod} holds {tp} devices")),
        "{message}"
    );
    // TP restored, another vendor's image: the wrong image, through the claims' pod too.
    let full = tp.to_string();
    let rocm = "docker.io/vllm/vllm-openai-rocm:v0.20.0".to_string();
    edit_container(&cluster, "conformc-r0", |args, image| {
        let at = args
            .iter()
            .position(|a| a == "--tensor-parallel-size")
            .expect("TP");
        args[at + 1] = full.clone();
        *image = rocm.clone();
    })
    .await?;
    current_pod(&cluster, "conformc-r0", "the ROCm image", |c| {
        c.image.as_deref() == Some(rocm.as_str())
    })
    .await?;
    let message = wait_conformant(&cluster, "conformc", "False", "WrongImage").await?;
    assert!(message.contains("(a rocm build)"), "{message}");
    let planned_image = status
        .engine
        .as_ref()
        .and_then(|e| e.image.clone())
        .context("the plan's image")?;
    edit_container(&cluster, "conformc-r0", |_, image| {
        *image = planned_image.clone();
    })
    .await?;
    wait_conformant(&cluster, "conformc", "True", "Conformant").await?;
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(
        cluster.client(),
        cluster.namespace(),
    )
    .delete("conformc-r0", &Default::default())
    .await?;
    Api::<ModelPlacement>::namespaced(cluster.client(), cluster.namespace())
        .delete("conformc", &Default::default())
        .await?;
    Ok(())
}
