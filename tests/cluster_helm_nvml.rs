//! `helm install` with `agent.nvml.enabled` on the full test tier: the real kube-apiserver
//! admits both agent DaemonSets (the NVML one with its RuntimeClass and environment), and the
//! real DaemonSet controller and scheduler put exactly one agent on every kwok node: the NVML
//! agent on nodes NFD or GFD labelled as NVIDIA, the default agent everywhere else. Pods do
//! not really run under kwok; the test checks the objects and where they were placed.

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;
use support::{DEFAULT_TIMEOUT, TestCluster, wait_for};

/// Node labels: `(key, value)`.
type Labels = &'static [(&'static str, &'static str)];

/// The nodes of this test: `(what, NVIDIA labels, the agent DaemonSet suffix expected there)`.
const NODES: &[(&str, Labels, &str)] = &[
    ("plain", &[], ""),
    (
        "nfd-gpu",
        &[("feature.node.kubernetes.io/pci-10de.present", "true")],
        "-nvml",
    ),
    ("gfd-gpu", &[("nvidia.com/gpu.present", "true")], "-nvml"),
    (
        "labelled-false",
        &[
            ("feature.node.kubernetes.io/pci-10de.present", "false"),
            ("nvidia.com/gpu.present", "false"),
        ],
        "",
    ),
];

#[tokio::test]
#[ignore = "needs cluster"]
async fn helm_install_with_nvml_puts_exactly_one_agent_on_every_node() -> Result<()> {
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        eprintln!("skipped: needs the full tier (scheduler, controller-manager, kwok)");
        return Ok(());
    }
    let client = cluster.client();
    let namespace = cluster.namespace().to_string();

    // A RuntimeClass of this test's own: the API server refuses pods naming a missing one.
    let runtime_class = cluster.unique_name("nvidia");
    let class: RuntimeClass = serde_json::from_value(json!({
        "metadata": {"name": runtime_class},
        "handler": "nvidia",
    }))?;
    Api::<RuntimeClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await?;

    let nodes: Api<Node> = Api::all(client.clone());
    let mut expected = BTreeMap::new();
    for (what, labels, suffix) in NODES {
        let name = cluster.unique_name(what);
        let mut node_labels = json!({
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "type": "kwok",
        });
        for (key, value) in *labels {
            node_labels[*key] = json!(value);
        }
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": node_labels,
            },
        }))?;
        nodes.create(&PostParams::default(), &node).await?;
        expected.insert(name, *suffix);
    }

    let release = format!(
        "n{}",
        &cluster.prefix()[cluster.prefix().len().saturating_sub(6)..]
    );
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/hwaccel-operator");
    let helm_home = tempfile::tempdir()?;
    let runtime_value = format!("agent.nvml.runtimeClassName={runtime_class}");
    let output = std::process::Command::new(cluster.bin("helm"))
        .args(["install", &release])
        .arg(&chart)
        .args(["--namespace", &namespace, "--kubeconfig"])
        .arg(&cluster.env().kubeconfig)
        // Other tests install the CRDs themselves; a second owner would conflict.
        .args([
            "--set",
            "crds.install=false",
            "--set",
            "agent.nvml.enabled=true",
        ])
        .args(["--set", &runtime_value])
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
    let names: Vec<String> = daemonsets
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|ds| ds.metadata.name)
        .collect();
    let agent = names
        .iter()
        .find(|name| name.ends_with("-agent"))
        .context("no agent DaemonSet")?
        .clone();
    assert!(
        names.contains(&format!("{agent}-nvml")),
        "no NVML agent DaemonSet: {names:?}"
    );

    // Both DaemonSets have created every pod they want (their desired counts include other
    // tests' nodes), so no second agent can still be on its way to one of our nodes.
    wait_for(DEFAULT_TIMEOUT, "both agent DaemonSets settled", || {
        let daemonsets = daemonsets.clone();
        async move {
            let items = daemonsets.list(&ListParams::default()).await?.items;
            let settled = items.len() == 2
                && items.iter().all(|ds| {
                    let status = ds.status.clone().unwrap_or_default();
                    status.observed_generation == ds.metadata.generation
                        && status.desired_number_scheduled > 0
                        && status.current_number_scheduled == status.desired_number_scheduled
                });
            Ok(settled.then_some(()))
        }
    })
    .await?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let selector =
        format!("app.kubernetes.io/instance={release},app.kubernetes.io/component=agent");
    let placed = wait_for(DEFAULT_TIMEOUT, "an agent pod on each of our nodes", || {
        let (pods, selector, expected) = (pods.clone(), selector.clone(), expected.clone());
        async move {
            let mut placed: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
            for pod in pods
                .list(&ListParams::default().labels(&selector))
                .await?
                .items
            {
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                if let Some(node) = node.filter(|node| expected.contains_key(node)) {
                    placed.entry(node).or_default().push(pod);
                }
            }
            Ok((placed.len() == expected.len()).then_some(placed))
        }
    })
    .await?;

    for (node, suffix) in &expected {
        let on_node = &placed[node];
        let owners: Vec<String> = on_node
            .iter()
            .flat_map(|pod| pod.metadata.owner_references.clone().unwrap_or_default())
            .filter(|owner| owner.kind == "DaemonSet")
            .map(|owner| owner.name)
            .collect();
        assert_eq!(
            owners,
            [format!("{agent}{suffix}")],
            "node {node}: exactly one agent, of the right DaemonSet"
        );
        let spec = on_node[0].spec.as_ref().context("pod spec")?;
        let env: BTreeMap<String, String> = spec.containers[0]
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|var| Some((var.name, var.value?)))
            .collect();
        if suffix.is_empty() {
            assert_eq!(spec.runtime_class_name, None, "node {node}");
            assert!(!env.contains_key("HWACCEL_NVML"), "node {node}: {env:?}");
        } else {
            assert_eq!(
                spec.runtime_class_name.as_deref(),
                Some(runtime_class.as_str()),
                "node {node}"
            );
            assert_eq!(
                env.get("HWACCEL_NVML").map(String::as_str),
                Some("container")
            );
            assert_eq!(
                env.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str),
                Some("all")
            );
            let image = spec.containers[0].image.as_deref().unwrap_or_default();
            assert!(image.ends_with("-glibc"), "node {node}: {image}");
        }
    }
    Ok(())
}
