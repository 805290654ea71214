//! `helm install` of the chart on the full test tier: the agent DaemonSet is scheduled onto kwok
//! fake nodes, GPU-tainted ones included, and the controller Deployment becomes available.
//! Pods do not really run under kwok; the test checks the objects and the scheduling.

mod support;

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;
use support::{DEFAULT_TIMEOUT, TestCluster, wait_for};

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
