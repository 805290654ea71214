//! `helm install` of the chart on the full test tier: the agent DaemonSet is scheduled onto kwok
//! fake nodes, GPU-tainted ones included, and the controller Deployment becomes available.
//! Pods do not really run under kwok; the test checks the objects and the scheduling.
//!
//! The uninstall test runs what kwok cannot: the controller as a local task with the chart's
//! controller identity (stopped, as the kubelet would stop its pod, once its Deployment is
//! scaled to 0), and the pre-delete hook's exact command as a local `hwaccel` process with
//! the hook's identity and rights.

use crate::helm;
use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use hwaccel::api::{AcceleratorInventory, ModelPlacement};
use hwaccel::controller::leader::LeaseConfig;
use hwaccel::controller::metrics::ControllerMetrics;
use hwaccel::controller::{self, Config};
use hwaccel::testing::{InventoryBuilder, PlacementBuilder};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{DEFAULT_TIMEOUT, TestCluster, install_crds, wait_for};

#[tokio::test]
#[ignore = "needs cluster"]
async fn helm_install_schedules_agents_on_every_node_and_the_controller_becomes_available()
-> Result<()> {
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        eprintln!("skipped: needs the full tier (scheduler, controller-manager, kwok)");
        return Ok(());
    }
    let client = cluster.client();
    let namespace = cluster.namespace().to_string();

    // Two fake nodes: a plain one and a GPU node with the usual NoSchedule taint.
    let nodes: Api<Node> = Api::all(client.clone());
    let mut names = BTreeSet::new();
    for (what, taints) in [
        ("plain", json!([])),
        (
            "gpu",
            json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
        ),
    ] {
        let name = cluster.unique_name(what);
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"},
            },
            "spec": {"taints": taints},
        }))?;
        nodes.create(&PostParams::default(), &node).await?;
        names.insert(name);
    }

    let release = format!(
        "h{}",
        &cluster.prefix()[cluster.prefix().len().saturating_sub(6)..]
    );
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/hwaccel-operator");
    let helm_home = tempfile::tempdir()?;
    let output = std::process::Command::new(cluster.bin("helm"))
        .args(["install", &release])
        .arg(&chart)
        .args(["--namespace", &namespace, "--kubeconfig"])
        .arg(&cluster.env().kubeconfig)
        // Other tests install the CRDs themselves; a second owner would conflict.
        .args(["--set", "crds.install=false"])
        .env("HELM_CACHE_HOME", helm_home.path().join("cache"))
        .env("HELM_CONFIG_HOME", helm_home.path().join("config"))
        .env("HELM_DATA_HOME", helm_home.path().join("data"))
        .output()
        .context("running helm install")?;
    if !output.status.success() {
        bail!(
            "helm install failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &namespace);
    let daemonset = daemonsets.list(&ListParams::default()).await?.items;
    let agent = daemonset
        .first()
        .context("the chart created no DaemonSet")?;
    let selector = agent
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .context("DaemonSet without a selector")?
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    wait_for(
        DEFAULT_TIMEOUT,
        "an agent pod scheduled on each fake node",
        || {
            let (pods, selector, names) = (pods.clone(), selector.clone(), names.clone());
            async move {
                let scheduled: BTreeSet<String> = pods
                    .list(&ListParams::default().labels(&selector))
                    .await?
                    .items
                    .into_iter()
                    .filter_map(|pod| pod.spec.and_then(|s| s.node_name))
                    .collect();
                Ok(names.is_subset(&scheduled).then_some(()))
            }
        },
    )
    .await?;

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    wait_for(
        DEFAULT_TIMEOUT,
        "the controller Deployment available",
        || {
            let deployments = deployments.clone();
            async move {
                let items = deployments.list(&ListParams::default()).await?.items;
                let available = items.iter().any(|d| {
                    let wanted = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                    let status = d.status.clone().unwrap_or_default();
                    status.available_replicas.unwrap_or(0) >= wanted
                });
                Ok(available.then_some(()))
            }
        },
    )
    .await?;
    Ok(())
}

/// `helm <args>` against the test cluster, with helm's own state in a scratch directory.
fn helm(cluster: &TestCluster, home: &Path, args: &[&str]) -> Result<String> {
    let output = std::process::Command::new(cluster.bin("helm"))
        .args(args)
        .arg("--kubeconfig")
        .arg(&cluster.env().kubeconfig)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .context("running helm")?;
    if !output.status.success() {
        bail!(
            "helm {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A fresh token of `service_account` in the test namespace.
async fn token_of(cluster: &TestCluster, service_account: &str) -> Result<String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client(), cluster.namespace());
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            bound_object_ref: None,
            expiration_seconds: Some(3600),
        }),
        ..TokenRequest::default()
    };
    let response = accounts
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("TokenRequest for {service_account}"))?;
    response
        .status
        .and_then(|status| status.token)
        .context("TokenRequest without a token")
}

/// The admin kubeconfig with its user replaced by `token`, written to `dir`.
fn kubeconfig_with_token(cluster: &TestCluster, dir: &Path, token: &str) -> Result<PathBuf> {
    let text = std::fs::read_to_string(&cluster.env().kubeconfig)?;
    let mut config: serde_json::Value = serde_saphyr::from_str(&text)?;
    for user in config["users"]
        .as_array_mut()
        .context("kubeconfig without users")?
    {
        user["user"] = json!({ "token": token });
    }
    let path = dir.join("kubeconfig.json");
    std::fs::write(&path, serde_json::to_vec(&config)?)?;
    Ok(path)
}

/// Every label under our two prefixes, per node.
async fn labels_of_ours(
    cluster: &TestCluster,
    nodes: &BTreeSet<String>,
) -> Result<BTreeMap<String, Vec<String>>> {
    let api: Api<Node> = Api::all(cluster.client());
    let mut found = BTreeMap::new();
    for name in nodes {
        let node = api.get(name).await?;
        let ours: Vec<String> = node
            .metadata
            .labels
            .unwrap_or_default()
            .into_keys()
            .filter(|key| {
                key.starts_with("hwaccel.io/") || key.starts_with("placement.hwaccel.io/")
            })
            .collect();
        if !ours.is_empty() {
            found.insert(name.clone(), ours);
        }
    }
    Ok(found)
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn uninstall_stops_the_writers_then_leaves_no_label_of_ours() -> Result<()> {
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        eprintln!("skipped: needs the full tier (scheduler, controller-manager, kwok)");
        return Ok(());
    }
    let admin = cluster.client();
    let namespace = cluster.namespace().to_string();
    install_crds(&admin).await?;
    // Nodes are selected by a label outside our prefixes, so "no label of ours left" is exact.
    // The release's pods go only to these kwok nodes: a Node of another test that no kubelet
    // or kwok serves would keep a deleted pod Terminating forever.
    let pool = ("e2e-pool".to_string(), cluster.prefix().to_string());
    let agent_pool = format!("agent.nodeSelector.e2e-pool={}", pool.1);
    let controller_pool = format!("controller.nodeSelector.e2e-pool={}", pool.1);

    // Two kwok GPU nodes with inventories, as their agents would publish them.
    let nodes_api: Api<Node> = Api::all(admin.clone());
    let mut nodes = BTreeSet::new();
    for scenario in ["h100-8x-nvswitch", "h100-8x-nvswitch"] {
        let name = cluster.unique_name("gpu");
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                           "type": "kwok", pool.0.clone(): pool.1.clone()},
            },
        }))?;
        nodes_api.create(&PostParams::default(), &node).await?;
        let inventory = InventoryBuilder::fixture(scenario)
            .node(&name)
            .label(&pool.0, &pool.1)
            .build();
        Api::<AcceleratorInventory>::all(admin.clone())
            .patch(
                &name,
                &PatchParams::apply("hwaccel-agent").force(),
                &Patch::Apply(&inventory),
            )
            .await?;
        // The agent's own label, owned by its field manager.
        let labels = json!({"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": name, "labels": {"hwaccel.io/present": "true"}}});
        nodes_api
            .patch(
                &name,
                &PatchParams::apply("hwaccel-agent"),
                &Patch::Apply(&labels),
            )
            .await?;
        nodes.insert(name);
    }

    let release = format!(
        "h{}",
        &cluster.prefix()[cluster.prefix().len().saturating_sub(6)..]
    );
    let fullname = format!("{release}-hwaccel");
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/hwaccel-operator");
    let chart = chart.to_string_lossy().into_owned();
    let scratch = tempfile::tempdir()?;
    let release_args = [
        release.as_str(),
        chart.as_str(),
        "--namespace",
        namespace.as_str(),
        "--set",
        "crds.install=false",
        "--set",
        agent_pool.as_str(),
        "--set",
        controller_pool.as_str(),
    ];
    let mut install = vec!["install"];
    install.extend_from_slice(&release_args);
    helm(&cluster, scratch.path(), &install)?;

    // The controller, with the chart's identity and rights, elected through the same Lease
    // the hook waits for; it stops when its Deployment goes to 0, as its pod would.
    let controller_client = cluster
        .env()
        .client_with_token(&token_of(&cluster, &format!("{fullname}-controller")).await?)
        .await?;
    let mut config = Config::cluster_wide("test-controller");
    config.namespace = Some(namespace.clone());
    config.selector = Some(format!("{}={}", pool.0, pool.1));
    config.debounce = Duration::from_millis(200);
    let lease = LeaseConfig::new(&namespace, "hwaccel-controller", "test-controller");
    let metrics =
        ControllerMetrics::register(&mut prometheus_client::registry::Registry::default());
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let controller_task = tokio::spawn(controller::run_elected(
        controller_client,
        config,
        lease,
        metrics,
        || {},
        async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        },
    ));
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &namespace);
    let controller_deployment = format!("{fullname}-controller");
    let kubelet = {
        let deployments = deployments.clone();
        let name = controller_deployment.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(deployment) = deployments.get(&name).await
                    && deployment.spec.and_then(|spec| spec.replicas) == Some(0)
                {
                    let _ = stop.send(true);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    let placements: Api<ModelPlacement> = Api::namespaced(admin.clone(), &namespace);
    let placement = PlacementBuilder::serve("llama-3.1-8b")
        .name("llama")
        .build();
    placements
        .create(&PostParams::default(), &placement)
        .await?;
    let labelled = wait_for(DEFAULT_TIMEOUT, "a placement label on a node", || {
        let (cluster, nodes) = (&cluster, &nodes);
        async move {
            let found = labels_of_ours(cluster, nodes).await?;
            Ok(found.into_iter().find_map(|(node, keys)| {
                keys.into_iter()
                    .find(|key| key.starts_with("placement.hwaccel.io/"))
                    .map(|key| (node, key))
            }))
        }
    })
    .await?;
    // The controller repairs a label removed behind its back: it is a live writer.
    let (node, key) = labelled;
    nodes_api
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {key.clone(): null}}})),
        )
        .await?;
    wait_for(DEFAULT_TIMEOUT, "the controller repairs the label", || {
        let (nodes_api, node, key) = (&nodes_api, &node, &key);
        async move {
            let labels = nodes_api
                .get(node)
                .await?
                .metadata
                .labels
                .unwrap_or_default();
            Ok(labels.contains_key(key).then_some(()))
        }
    })
    .await?;

    // The pre-delete hook: its objects as helm would create them, then its exact command
    // with its own identity.
    let mut template = vec!["template"];
    template.extend_from_slice(&release_args);
    template.extend_from_slice(&["--show-only", "templates/cleanup-hook.yaml"]);
    let hook_yaml = helm(&cluster, scratch.path(), &template)?;
    let hook_docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&hook_yaml)?;
    let job = hook_docs
        .iter()
        .find(|doc| doc["kind"] == "Job")
        .context("the hook Job")?;
    let args: Vec<String> = job["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .context("Job args")?
        .iter()
        .filter_map(|arg| arg.as_str().map(str::to_string))
        .collect();
    let rights = scratch.path().join("hook-rights.yaml");
    let without_job: Vec<&serde_json::Value> = hook_docs
        .iter()
        .filter(|doc| !doc.is_null() && doc["kind"] != "Job")
        .collect();
    std::fs::write(
        &rights,
        serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": without_job}))?,
    )?;
    cluster
        .kubectl_ok(&["apply", "-f", &rights.to_string_lossy()])
        .await?;
    let kubeconfig = kubeconfig_with_token(
        &cluster,
        scratch.path(),
        &token_of(&cluster, &format!("{fullname}-cleanup")).await?,
    )?;
    let cleanup = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_hwaccel"))
            .args(&args)
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
    })
    .await??;
    let stdout = String::from_utf8_lossy(&cleanup.stdout);
    let stderr = String::from_utf8_lossy(&cleanup.stderr);
    assert!(
        cleanup.status.success(),
        "the cleanup failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("summary:"), "{stdout}");
    kubelet.await?;
    controller_task.await??;

    // Nothing of ours is left, and nothing puts it back. A controller still running re-adds a
    // released placement label within about 10 s (seen with the old hook, which did not stop
    // it): watch for 15 s.
    let left = labels_of_ours(&cluster, &nodes).await?;
    assert!(left.is_empty(), "labels left after the cleanup: {left:?}");
    for second in 1..=15 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let left = labels_of_ours(&cluster, &nodes).await?;
        assert!(
            left.is_empty(),
            "labels came back after {second} s: {left:?}"
        );
    }
    let deployment = deployments.get(&controller_deployment).await?;
    assert_eq!(deployment.spec.and_then(|spec| spec.replicas), Some(0));
    let daemonsets: Api<DaemonSet> = Api::namespaced(admin.clone(), &namespace);
    assert!(
        daemonsets
            .get_opt(&format!("{fullname}-agent"))
            .await?
            .is_none()
    );

    // The rest of the uninstall (the hook already ran above; kwok runs no container).
    let mut uninstall = vec![
        "uninstall",
        release.as_str(),
        "--namespace",
        namespace.as_str(),
    ];
    uninstall.push("--no-hooks");
    helm(&cluster, scratch.path(), &uninstall)?;
    // No controller is left to remove the placement's finalizer.
    placements
        .patch(
            "llama",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    Ok(())
}

/// The dashboard ConfigMap the chart renders is one the apiserver takes (label key and value,
/// object size) and stores unchanged.
#[tokio::test]
#[ignore = "needs cluster"]
async fn apiserver_stores_the_dashboard_config_map_as_rendered() -> anyhow::Result<()> {
    let Some(helm) = helm::find_helm() else {
        helm::skip_notice("apiserver_stores_the_dashboard_config_map_as_rendered");
        return Ok(());
    };
    let cluster = TestCluster::new().await?;
    let namespace = cluster.namespace().to_string();
    let target = format!("metrics.dashboard.namespace={namespace}");
    let yaml = helm::template(
        &helm,
        &helm::chart_dir(),
        "hwaccel",
        "hwaccel-system",
        &["--set", "metrics.dashboard.enabled=true", "--set", &target],
    )
    .map_err(anyhow::Error::msg)?;
    let docs = helm::documents(&yaml);
    let rendered = helm::of_kind(&docs, "ConfigMap")
        .into_iter()
        .find(|map| map["metadata"]["labels"]["grafana_dashboard"] == "1")
        .ok_or_else(|| anyhow::anyhow!("no dashboard ConfigMap rendered"))?;
    let map: ConfigMap = serde_json::from_value(rendered.clone())?;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), &namespace);
    // The apiserver validates the label key and value and the object's size.
    api.create(&PostParams::default(), &map).await?;
    let stored = api
        .get(&map.metadata.name.clone().unwrap_or_default())
        .await?;
    let labels = stored.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("grafana_dashboard").map(String::as_str),
        Some("1")
    );
    let json = stored
        .data
        .unwrap_or_default()
        .remove("hwaccel-fleet.json")
        .ok_or_else(|| anyhow::anyhow!("no hwaccel-fleet.json key"))?;
    let stored_dashboard: Value = serde_json::from_str(&json)?;
    let file: Value = serde_json::from_str(&std::fs::read_to_string(
        helm::chart_dir().join("dashboards/hwaccel-fleet.json"),
    )?)?;
    assert_eq!(stored_dashboard, file);
    Ok(())
}
