//! The chart on a real node: `helm install` with the image `make image-static` built, on this
//! machine joined to the test control plane as a real node (containerd 2.x, runc, kubelet,
//! kube-proxy: `tests/cluster/up.sh --node`), next to kwok fixture nodes.
//!
//! What only a kubelet shows, asserted here: the agent and controller pods start from the
//! local image and go Ready through their probes with no Warning event; the agent writes the
//! real node's inventory (the truth being what `hwaccel detect` says on the host) and labels
//! through the in-cluster config; the controller holds the Lease and plans a placement on the
//! mixed fleet; `/metrics` answers through the chart's Services from a pod; every host mount
//! is recursively read-only; a steady node writes nothing over five agent cycles, even after
//! the controller writes `freeDevices`; `helm upgrade` rolls the pods and `helm uninstall`
//! runs the cleanup Job for real.
//!
//! `make node-test` runs it (`#[ignore = "needs real node"]`); it needs the env of
//! `up.sh --node` and `HWACCEL_IMAGE_ARCHIVE`, and fails, never skips, without them.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use hwaccel::api::{AcceleratorInventory, ModelPlacement};
use hwaccel::testing::{InventoryBuilder, PlacementBuilder};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{DEFAULT_TIMEOUT, TestCluster, nodes, wait_for};

/// The agent's interval in this test: short, so five cycles take seconds.
const AGENT_INTERVAL_SECS: u64 = 2;
const RELEASE: &str = "hwaccel";

/// The real node's facts from the env of `up.sh --node`.
struct RealNode {
    name: String,
    containerd_sock: PathBuf,
    busybox_image: String,
    image_archive: PathBuf,
}

impl RealNode {
    fn from_env(cluster: &TestCluster) -> Result<Self> {
        let var = |key: &str| -> Result<String> {
            cluster.env().vars.get(key).cloned().with_context(|| {
                format!(
                    "{key} is not in the cluster's env: start it with tests/cluster/up.sh --node"
                )
            })
        };
        let image_archive = PathBuf::from(std::env::var("HWACCEL_IMAGE_ARCHIVE").context(
            "HWACCEL_IMAGE_ARCHIVE is not set: run `make node-test` (it builds the image first)",
        )?);
        ensure!(
            image_archive.is_file(),
            "no image archive at {}",
            image_archive.display()
        );
        Ok(Self {
            name: var("TESTCLUSTER_NODE")?,
            containerd_sock: var("TESTCLUSTER_CONTAINERD_SOCK")?.into(),
            busybox_image: var("TESTCLUSTER_BUSYBOX_IMAGE")?,
            image_archive,
        })
    }
}

/// Runs a command to completion; its stdout, or an error with its stderr.
fn run(command: &mut Command) -> Result<String> {
    let shown = format!("{command:?}");
    let out = command
        .output()
        .with_context(|| format!("running {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `helm ARGS` against the test cluster, with a throw-away helm home.
fn helm(cluster: &TestCluster, home: &Path, args: &[&str]) -> Result<String> {
    run(Command::new(cluster.bin("helm"))
        .args(args)
        .arg("--kubeconfig")
        .arg(&cluster.env().kubeconfig)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data")))
}

/// The chart's values for this test: the local image, never pulled; both workloads on the
/// real node (kwok nodes run no containers); a short agent interval.
fn values(node: &str, log_level: &str) -> Vec<String> {
    let on_real_node = format!("{{\"kubernetes.io/hostname\":\"{node}\"}}");
    vec![
        "--set".into(),
        "image.pullPolicy=Never".into(),
        "--set".into(),
        format!("agent.interval={AGENT_INTERVAL_SECS}s"),
        "--set".into(),
        format!("logLevel={log_level}"),
        "--set".into(),
        "logFormat=text".into(),
        "--set-json".into(),
        format!("agent.nodeSelector={on_real_node}"),
        "--set-json".into(),
        format!("controller.nodeSelector={on_real_node}"),
    ]
}

/// Pods of one workload (`app.kubernetes.io/component=<component>`) in `namespace`.
async fn pods(cluster: &TestCluster, component: &str) -> Result<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    let list = api
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/component={component}")))
        .await?;
    Ok(list.items)
}

fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until `component` has exactly `count` Ready pods none of which is in `old`; returns them.
async fn wait_ready_pods(
    cluster: &TestCluster,
    component: &str,
    count: usize,
    old: &[String],
) -> Result<Vec<Pod>> {
    wait_for(
        DEFAULT_TIMEOUT,
        &format!("{count} new Ready {component} pod(s)"),
        || async {
            let pods = pods(cluster, component).await?;
            let ready: Vec<Pod> = pods
                .into_iter()
                .filter(|p| {
                    pod_ready(p) && !old.contains(&p.metadata.uid.clone().unwrap_or_default())
                })
                .collect();
            Ok((ready.len() == count).then_some(ready))
        },
    )
    .await
}

fn uids(pods: &[Pod]) -> Vec<String> {
    pods.iter().filter_map(|p| p.metadata.uid.clone()).collect()
}

/// The apiserver's audit log (up.sh logs every write, metadata only): write requests made by
/// `user` after `since` (RFC 3339, compared as text: both are UTC with microseconds).
fn writes_by(cluster: &TestCluster, user: &str, since: &str) -> Result<Vec<String>> {
    let path = cluster.env().work.join("logs/audit.log");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut writes = Vec::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if event["user"]["username"] != user {
            continue;
        }
        let at = event["requestReceivedTimestamp"]
            .as_str()
            .unwrap_or_default();
        if at > since {
            writes.push(format!(
                "{at} {} {}/{} -> {}",
                event["verb"].as_str().unwrap_or("?"),
                event["objectRef"]["resource"].as_str().unwrap_or("?"),
                event["objectRef"]["name"].as_str().unwrap_or("?"),
                event["responseStatus"]["code"]
            ));
        }
    }
    Ok(writes)
}

fn audit_now() -> String {
    // The audit log's own format: RFC 3339 UTC with microseconds.
    let now = k8s_openapi::jiff::Timestamp::now();
    now.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
}

/// Runs a busybox pod on the real node that fetches `urls` and prints each body; its logs.
async fn fetch_from_a_pod(
    cluster: &TestCluster,
    node: &RealNode,
    urls: &[(String, i32)],
) -> Result<String> {
    let name = cluster.unique_name("scrape");
    let script = urls
        .iter()
        // busybox's static wget crashes in a pod without NSS files; nc speaks HTTP/1.0 fine.
        .map(|(ip, port)| {
            format!(
                "echo '### {ip}:{port}'; printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' \
                 | /bin/busybox nc -w 5 {ip} {port} || echo 'FAILED {ip}:{port}'"
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "prometheus"}},
        "spec": {
            "nodeName": node.name,
            "restartPolicy": "Never",
            "enableServiceLinks": false,
            "automountServiceAccountToken": false,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65534,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "scrape",
                "image": node.busybox_image,
                "imagePullPolicy": "Never",
                "command": ["/bin/busybox", "sh", "-c", script],
                "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }))?;
    let api: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    api.create(&PostParams::default(), &pod).await?;
    wait_for(DEFAULT_TIMEOUT, "the scrape pod to finish", || async {
        let phase = api
            .get(&name)
            .await?
            .status
            .and_then(|s| s.phase)
            .unwrap_or_default();
        ensure!(phase != "Failed", "the scrape pod failed");
        Ok((phase == "Succeeded").then_some(()))
    })
    .await?;
    Ok(api.logs(&name, &Default::default()).await?)
}

/// The kubelet's own transient on a loaded node: the service-account token volume
/// (`kube-api-access-*`) waited longer than the kubelet allows for its ConfigMap watch to
/// sync, and the next try mounted it (the pods turn Ready). Nothing the chart asks for; seen
/// once in CI on the 2-core machine (2026-11-29), on all three pods at once.
///
/// Also the kube-apiserver's own ClusterIP repair loop, which checks every Service's IP
/// against the allocator and can run between the Service's create and its IP's allocation
/// record ("Cluster IP [IPv4]: 10.96.0.231 is not allocated; repairing", seen once in CI on
/// 2026-11-29 for the chart's metrics Service): the control plane's bookkeeping, not
/// anything the chart's pods did.
fn is_kubelet_cache_transient(event: &Event) -> bool {
    let kubelet_mount = event.reason.as_deref() == Some("FailedMount")
        && event.message.as_deref().is_some_and(|m| {
            m.contains("volume \"kube-api-access-")
                && m.contains("failed to sync configmap cache: timed out waiting for the condition")
        });
    let ip_repair = event.reason.as_deref() == Some("ClusterIPNotAllocated")
        && event.involved_object.kind.as_deref() == Some("Service")
        && event
            .message
            .as_deref()
            .is_some_and(|m| m.ends_with("is not allocated; repairing"));
    kubelet_mount || ip_repair
}

/// When the containers of each pod in the test's namespace exited (by uid: the latest
/// `finishedAt` among its terminated containers), as a pod watch saw them; kept while the
/// watch runs, through a rollout.
#[derive(Clone, Default)]
struct ContainerExits(
    std::sync::Arc<std::sync::Mutex<BTreeMap<String, k8s_openapi::jiff::Timestamp>>>,
);

impl ContainerExits {
    /// Starts the watch and returns once it has listed the pods; it ends with the returned
    /// task (abort it when done).
    async fn watch(cluster: &TestCluster) -> Result<(Self, tokio::task::JoinHandle<()>)> {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let exits = Self::default();
        let api: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
        let seen = exits.clone();
        let (listed, on_list) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut listed = Some(listed);
            let mut events = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
            while let Some(event) = events.next().await {
                let pod = match event {
                    Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
                    Ok(watcher::Event::Delete(pod)) => pod,
                    Ok(watcher::Event::InitDone) => {
                        if let Some(listed) = listed.take() {
                            let _ = listed.send(());
                        }
                        continue;
                    }
                    _ => continue,
                };
                seen.record(&pod);
            }
        });
        tokio::time::timeout(DEFAULT_TIMEOUT, on_list)
            .await
            .context("the pod watch did not list in time")?
            .context("the pod watch ended before it listed")?;
        Ok((exits, task))
    }

    fn record(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let finished = pod
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
            .map(|t| t.0)
            .max();
        if let (Some(finished), Ok(mut exits)) = (finished, self.0.lock()) {
            exits.insert(uid, finished);
        }
    }

    fn of(&self, uid: &str) -> Option<k8s_openapi::jiff::Timestamp> {
        self.0.lock().ok()?.get(uid).copied()
    }
}

/// A readiness probe the kubelet ran on a pod whose container had already exited: the prober
/// goes on until the kubelet notices the exit (its pod lifecycle relist, about a second), and
/// a probe in that window finds nothing listening (kubernetes/kubernetes#52817, #122824). No
/// process can close that window: it opens when the process exits. The probe must come at or
/// after the exit (both to the second, so a probe refused less than a second before the exit
/// passes too); a refusal while the process ran, or on a pod whose exit the watch did not see,
/// still counts.
fn is_probe_after_exit(event: &Event, exits: &ContainerExits) -> bool {
    let refused_readiness = event.reason.as_deref() == Some("Unhealthy")
        && event.message.as_deref().is_some_and(|m| {
            m.starts_with("Readiness probe failed:") && m.ends_with("connect: connection refused")
        });
    let first = event
        .first_timestamp
        .as_ref()
        .or(event.last_timestamp.as_ref());
    let exited = event
        .involved_object
        .uid
        .as_deref()
        .and_then(|uid| exits.of(uid));
    refused_readiness
        && event.involved_object.kind.as_deref() == Some("Pod")
        && matches!((first, exited), (Some(first), Some(exited)) if first.0 >= exited)
}

/// The Warning events in the test's namespace, as "<kind>/<name>: <reason> at <time>:
/// <message>", less the kubelet's cache transient and its probes of exited containers (both
/// printed, not counted). Those about a pod in `before` (uids of the pods before a rollout)
/// say so, so that a failure tells the old pod's stop from the new one's start.
async fn warnings(
    cluster: &TestCluster,
    before: &[String],
    exits: &ContainerExits,
) -> Result<Vec<String>> {
    let api: Api<Event> = Api::namespaced(cluster.client(), cluster.namespace());
    let list = api.list(&ListParams::default()).await?;
    let mut counted = Vec::new();
    for e in &list.items {
        let name = e.involved_object.name.clone().unwrap_or_default();
        let message = e.message.clone().unwrap_or_default();
        if is_kubelet_cache_transient(e) {
            println!("kubelet transient, not counted: {name}: {message}");
        } else if is_probe_after_exit(e, exits) {
            println!("kubelet probe after the container exited, not counted: {name}: {message}");
        } else if e.type_.as_deref() == Some("Warning") {
            let old = e
                .involved_object
                .uid
                .as_ref()
                .is_some_and(|uid| before.contains(uid));
            counted.push(format!(
                "{}/{name}{}: {} at {:?}: {message}",
                e.involved_object.kind.clone().unwrap_or_default(),
                if old {
                    " (a pod from before the rollout)"
                } else {
                    ""
                },
                e.reason.clone().unwrap_or_default(),
                e.first_timestamp.as_ref().map(|t| t.0),
            ));
        }
    }
    Ok(counted)
}

fn condition_times(inventory: &AcceleratorInventory) -> BTreeMap<String, String> {
    inventory
        .status
        .as_ref()
        .map(|s| {
            s.conditions
                .iter()
                .map(|c| {
                    (
                        c.type_.clone(),
                        format!("{} {:?}", c.status, c.last_transition_time),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The host's own `hwaccel detect`, as the inventory it would make for `node`.
fn host_inventory(node: &str) -> Result<Value> {
    let text = run(Command::new(env!("CARGO_BIN_EXE_hwaccel")).args([
        "detect",
        "--host-root",
        "/",
        "--backends",
        "all",
        "-o",
        "json",
        "--as-inventory",
        node,
    ]))?;
    Ok(serde_json::from_str(&text)?)
}

/// The pid of the agent's process on this host (the pod runs here), from /proc.
fn agent_pid() -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let mut args = cmdline.split(|b| *b == 0);
            let is_agent = args.next() == Some(b"/hwaccel") && args.next() == Some(b"agent");
            is_agent
                .then(|| entry.file_name().to_str()?.parse().ok())
                .flatten()
        })
}

#[tokio::test]
#[ignore = "needs real node"]
async fn real_node_chart_runs_from_the_local_image_and_holds_every_promise() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let node = RealNode::from_env(&cluster)?;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let started = Instant::now();

    // The image, imported as `make demo` and a user without a registry would.
    run(Command::new(cluster.bin("ctr"))
        .arg("--address")
        .arg(&node.containerd_sock)
        .args(["-n", "k8s.io", "images", "import", "--local"])
        .arg(&node.image_archive))?;

    // A fresh namespace's root CA ConfigMap comes from the controller-manager a moment after
    // the namespace: wait for it, as a user's namespace would long have it.
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    wait_for(DEFAULT_TIMEOUT, "kube-root-ca.crt", || async {
        Ok(configmaps.get_opt("kube-root-ca.crt").await?.map(|_| ()))
    })
    .await?;

    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/hwaccel-operator");
    let home = tempfile::tempdir()?;
    let mut install = vec![
        "install",
        RELEASE,
        chart.to_str().context("chart path")?,
        "--namespace",
        &ns,
    ];
    let first_values = values(&node.name, "info");
    install.extend(first_values.iter().map(String::as_str));
    helm(&cluster, home.path(), &install)?;
    eprintln!("helm install returned after {:.1?}", started.elapsed());

    // Two kwok fixture nodes with the inventories their agents would write (the chart
    // installed the CRDs).
    support::wait_crd_established(&client, "acceleratorinventories.hwaccel.io").await?;
    let fixtures = [("h100", "h100-8x-nvswitch"), ("mi300x", "mi300x-8x")];
    let mut fixture_nodes = Vec::new();
    for (what, scenario) in fixtures {
        let name = cluster.unique_name(what);
        nodes::create_kwok_node(&cluster, &name).await?;
        nodes::apply_inventory(
            &client,
            &InventoryBuilder::fixture(scenario).node(&name).build(),
        )
        .await?;
        fixture_nodes.push(name);
    }

    // Agent and controller pods Ready from the local image.
    let agents = wait_ready_pods(&cluster, "agent", 1, &[]).await?;
    let controllers = wait_ready_pods(&cluster, "controller", 2, &[]).await?;
    eprintln!(
        "agent and controllers Ready after {:.1?}",
        started.elapsed()
    );
    for pod in agents.iter().chain(&controllers) {
        let spec = pod.spec.as_ref().context("pod without spec")?;
        ensure!(
            spec.node_name.as_deref() == Some(node.name.as_str()),
            "pod not on the real node"
        );
        let status = pod.status.as_ref().context("pod without status")?;
        for container in status.container_statuses.iter().flatten() {
            ensure!(container.restart_count == 0, "{} restarted", container.name);
            ensure!(
                container.image.contains("hwaccel/hwaccel-operator"),
                "unexpected image {}",
                container.image
            );
        }
    }

    // Every hostPath mount of the agent is recursively read-only (containerd 2.x).
    let agent_pod = &agents[0];
    let host_volumes: Vec<String> = agent_pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|v| v.host_path.is_some())
        .map(|v| v.name)
        .collect();
    ensure!(!host_volumes.is_empty(), "the agent has no host mounts");
    let agent_status = agent_pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default();
    let mounts = agent_status
        .first()
        .and_then(|c| c.volume_mounts.clone())
        .unwrap_or_default();
    let mut checked = 0;
    for mount in &mounts {
        if !host_volumes.contains(&mount.name) {
            continue;
        }
        ensure!(
            mount.read_only == Some(true),
            "host mount {} is not read-only",
            mount.mount_path
        );
        // A file mount has no submounts; Kubernetes reports recursiveReadOnly for directories.
        let is_dir = mount.mount_path == "/host/sys" || mount.mount_path == "/host/dev";
        if is_dir {
            ensure!(
                mount.recursive_read_only.as_deref() == Some("Enabled"),
                "host mount {} reports recursiveReadOnly {:?}, want Enabled",
                mount.mount_path,
                mount.recursive_read_only
            );
            checked += 1;
        }
    }
    ensure!(
        checked == 2,
        "expected /host/sys and /host/dev in the pod's mount status, saw {mounts:?}"
    );

    // The real node's inventory, written from the pod, says what `hwaccel detect` says on
    // the host.
    let inventories: Api<AcceleratorInventory> = Api::all(client.clone());
    let inventory = wait_for(DEFAULT_TIMEOUT, "the real node's inventory", || async {
        Ok(inventories
            .get_opt(&node.name)
            .await?
            .filter(|i| i.status.is_some()))
    })
    .await?;
    let host = host_inventory(&node.name)?;
    let written = serde_json::to_value(&inventory)?;
    for pointer in [
        "/spec/summary/accelerators",
        "/spec/node/cpu/model",
        "/spec/node/cpu/threads",
        "/spec/node/cpu/aiFlags",
        "/spec/node/memory",
        "/spec/node/runtime/kernel",
        "/spec/node/runtime/os",
    ] {
        ensure!(
            written.pointer(pointer) == host.pointer(pointer),
            "{pointer}: the pod wrote {:?}, the host detects {:?}",
            written.pointer(pointer),
            host.pointer(pointer)
        );
    }
    let device_names = |v: &Value| -> Vec<String> {
        v.pointer("/spec/devices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|d| d["name"].as_str().map(str::to_string))
            .collect()
    };
    ensure!(
        device_names(&written) == device_names(&host),
        "devices differ from the host's detect"
    );
    // Process facts come from the process: the agent runs in a container under Kubernetes.
    ensure!(
        written.pointer("/spec/node/runtime/kubernetes") == Some(&json!(true)),
        "the in-pod agent does not know it runs under Kubernetes: {:?}",
        written.pointer("/spec/node/runtime")
    );
    ensure!(
        written
            .pointer("/spec/node/runtime/container")
            .is_some_and(|c| !c.is_null()),
        "the in-pod agent reports no container runtime: {:?}",
        written.pointer("/spec/node/runtime")
    );
    // No host mount is writable from the pod (the agent checks at start and says so).
    let writable = inventory.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "HostMountsWritable")
            .map(|c| (c.status.clone(), c.message.clone()))
    });
    ensure!(
        writable
            .as_ref()
            .is_some_and(|(status, _)| status == "False"),
        "HostMountsWritable condition: {writable:?}"
    );

    // Labels on the real node, from the in-cluster config.
    let node_api: Api<Node> = Api::all(client.clone());
    let labels = node_api
        .get(&node.name)
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    ensure!(
        labels.get("hwaccel.io/present").map(String::as_str) == Some("false"),
        "real node labels: {labels:?}"
    );

    // The controller holds the Lease.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let holder = wait_for(DEFAULT_TIMEOUT, "the controller Lease", || async {
        Ok(leases
            .get_opt("hwaccel-controller")
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty()))
    })
    .await?;
    let controller_names: Vec<String> = controllers
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    ensure!(
        controller_names.iter().any(|n| holder.contains(n.as_str())),
        "Lease holder {holder} is none of {controller_names:?}"
    );

    // A placement on the mixed fleet: planned on a fixture node, not on the CPU-only real node.
    let placements: Api<ModelPlacement> = Api::namespaced(client.clone(), &ns);
    let placement = PlacementBuilder::serve("llama-3.1-8b")
        .name("llama")
        .namespace(&ns)
        .build();
    placements
        .create(&PostParams::default(), &placement)
        .await?;
    let planned = wait_for(DEFAULT_TIMEOUT, "the placement Planned", || async {
        let p = placements.get("llama").await?;
        let status = serde_json::to_value(&p.status)?;
        let planned = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Planned" && c["status"] == "True");
        // The node names follow once the controller has labelled the nodes.
        let named = status["nodeNames"].as_str().is_some_and(|n| !n.is_empty());
        Ok((planned && named).then_some(status))
    })
    .await?;
    // A comma-separated list (the printer column users read).
    let planned_nodes: Vec<String> = planned["nodeNames"]
        .as_str()
        .unwrap_or_default()
        .split(',')
        .map(str::to_string)
        .collect();
    ensure!(
        !planned_nodes.is_empty() && planned_nodes.iter().all(|n| fixture_nodes.contains(n)),
        "planned on {planned_nodes:?}, want fixture nodes {fixture_nodes:?}"
    );

    // /metrics through the chart's Services, from a pod on the pod network.
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let controller_svc = services.get("hwaccel-controller-metrics").await?;
    let cluster_ip = controller_svc
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .context("no ClusterIP")?;
    let port = controller_svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p.first())
        .map(|p| p.port)
        .context("no port")?;
    let agent_ip = agent_pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .context("agent has no pod IP")?;
    let agent_svc = services.get("hwaccel-agent-metrics").await?;
    let agent_port = agent_svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p.first())
        .map(|p| p.port)
        .context("no agent port")?;
    // Up to three scrapes, as Prometheus would retry at its next interval: once (CI,
    // 2026-11-29) the first scrape through the controller's ClusterIP, moments after the pods
    // turned Ready, came back empty while the agent's answered; the next run passed. Every
    // attempt that misses is printed, so a pattern would show.
    let mut scraped = String::new();
    for attempt in 1..=3 {
        scraped = fetch_from_a_pod(
            &cluster,
            &node,
            &[(cluster_ip.clone(), port), (agent_ip.clone(), agent_port)],
        )
        .await?;
        if !scraped.contains("FAILED")
            && scraped.contains("hwaccel_controller_")
            && scraped.contains("hwaccel_agent_")
        {
            break;
        }
        println!("scrape {attempt} of 3 missed:\n{scraped}");
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    ensure!(!scraped.contains("FAILED"), "a scrape failed:\n{scraped}");
    ensure!(
        scraped.contains("hwaccel_controller_"),
        "no controller metrics:\n{scraped}"
    );
    ensure!(
        scraped.contains("hwaccel_agent_"),
        "no agent metrics:\n{scraped}"
    );

    // A steady node writes nothing, even after a write to freeDevices (here a wrong count, which
    // the running controller also corrects: two foreign writes the agent must not answer).
    let agent_sa = agent_pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .context("no SA")?;
    let agent_user = format!("system:serviceaccount:{ns}:{agent_sa}");
    tokio::time::sleep(Duration::from_secs(2 * AGENT_INTERVAL_SECS)).await;
    let before = inventories.get(&node.name).await?;
    let free = before
        .status
        .as_ref()
        .and_then(|s| s.free_devices)
        .unwrap_or(0);
    // Written as the controller writes it: freeDevices with its own DRAPublished condition
    // (an apply under its manager that left the condition out would remove it).
    let own_conditions: Vec<&Condition> = before
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .filter(|c| c.type_ == "DRAPublished")
        .collect();
    ensure!(
        !own_conditions.is_empty(),
        "the controller wrote no DRAPublished condition: {:?}",
        before.status
    );
    inventories
        .patch_status(
            &node.name,
            &PatchParams::apply("hwaccel-controller"),
            &Patch::Apply(json!({
                "apiVersion": "hwaccel.io/v1alpha1",
                "kind": "AcceleratorInventory",
                "status": {"freeDevices": free + 1, "conditions": own_conditions},
            })),
        )
        .await?;
    let since = audit_now();
    tokio::time::sleep(Duration::from_secs(6 * AGENT_INTERVAL_SECS)).await;
    let steady = inventories.get(&node.name).await?;
    let writes = writes_by(&cluster, &agent_user, &since)?;
    ensure!(
        writes.is_empty(),
        "a steady agent wrote over 5+ cycles:\n{}",
        writes.join("\n")
    );
    ensure!(
        condition_times(&steady) == condition_times(&before),
        "condition transition times moved: {:?} -> {:?}",
        condition_times(&before),
        condition_times(&steady)
    );
    if let Some(kib) = agent_pid().and_then(support::process::peak_rss_kib) {
        eprintln!("agent peak RSS (VmHWM) on the real node: {kib} KiB");
    }

    // No Warning event from anything the chart started.
    let seen = warnings(&cluster, &[], &ContainerExits::default()).await?;
    ensure!(seen.is_empty(), "Warning events:\n{}", seen.join("\n"));

    // helm upgrade with a changed value rolls the pods.
    let mut upgrade = vec![
        "upgrade",
        RELEASE,
        chart.to_str().context("chart path")?,
        "--namespace",
        &ns,
    ];
    let second_values = values(&node.name, "debug");
    upgrade.extend(second_values.iter().map(String::as_str));
    // The old pods' exits, seen through the rollout (see `is_probe_after_exit`).
    let (exits, exit_watch) = ContainerExits::watch(&cluster).await?;
    helm(&cluster, home.path(), &upgrade)?;
    wait_ready_pods(&cluster, "agent", 1, &uids(&agents)).await?;
    wait_ready_pods(&cluster, "controller", 2, &uids(&controllers)).await?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    ensure!(
        daemonsets.get("hwaccel-agent").await?.metadata.generation >= Some(2),
        "DaemonSet not updated"
    );
    ensure!(
        deployments
            .get("hwaccel-controller")
            .await?
            .metadata
            .generation
            >= Some(2),
        "Deployment not updated"
    );
    let before: Vec<String> = uids(&agents)
        .into_iter()
        .chain(uids(&controllers))
        .collect();
    let seen = warnings(&cluster, &before, &exits).await?;
    exit_watch.abort();
    ensure!(
        seen.is_empty(),
        "Warning events after the upgrade:\n{}",
        seen.join("\n")
    );

    // helm uninstall runs the pre-delete cleanup Job as a real pod; the labels go.
    helm(
        &cluster,
        home.path(),
        &[
            "uninstall",
            RELEASE,
            "--namespace",
            &ns,
            "--wait",
            "--timeout",
            "180s",
        ],
    )?;
    let left: Vec<String> = node_api
        .get(&node.name)
        .await?
        .metadata
        .labels
        .unwrap_or_default()
        .into_keys()
        .filter(|k| k.starts_with("hwaccel.io/"))
        .collect();
    ensure!(left.is_empty(), "labels left after uninstall: {left:?}");
    // Gone, or going (an empty list passes too).
    ensure!(
        pods(&cluster, "agent")
            .await?
            .iter()
            .all(|p| p.metadata.deletion_timestamp.is_some()),
        "agent pods left after uninstall"
    );
    eprintln!("real-node test done in {:.1?}", started.elapsed());
    Ok(())
}

/// The exception for the kubelet's probe race is that narrow: a refused readiness probe of a
/// pod at or after its container's exit, nothing else.
#[test]
fn only_a_refused_readiness_probe_after_the_exit_is_set_aside() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let at = |s: &str| Time(s.parse().unwrap());
    let exits = ContainerExits::default();
    exits
        .0
        .lock()
        .unwrap()
        .insert("old".into(), at("2026-11-30T07:26:02Z").0);
    let event = |uid: &str, when: &str, message: &str| Event {
        type_: Some("Warning".into()),
        reason: Some("Unhealthy".into()),
        message: Some(message.into()),
        first_timestamp: Some(at(when)),
        last_timestamp: Some(at(when)),
        involved_object: k8s_openapi::api::core::v1::ObjectReference {
            kind: Some("Pod".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let refused = r#"Readiness probe failed: Get "http://10.89.0.10:8081/readyz": dial tcp 10.89.0.10:8081: connect: connection refused"#;
    assert!(is_probe_after_exit(
        &event("old", "2026-11-30T07:26:02Z", refused),
        &exits
    ));
    assert!(is_probe_after_exit(
        &event("old", "2026-11-30T07:26:05Z", refused),
        &exits
    ));
    // While the process ran: counted.
    assert!(!is_probe_after_exit(
        &event("old", "2026-11-30T07:26:01Z", refused),
        &exits
    ));
    // A pod whose exit the watch did not see: counted.
    assert!(!is_probe_after_exit(
        &event("new", "2026-11-30T07:26:05Z", refused),
        &exits
    ));
    // Any other failure: counted.
    let liveness = refused.replacen("Readiness", "Liveness", 1);
    assert!(!is_probe_after_exit(
        &event("old", "2026-11-30T07:26:05Z", &liveness),
        &exits
    ));
    let answered = r#"Readiness probe failed: HTTP probe failed with statuscode: 503"#;
    assert!(!is_probe_after_exit(
        &event("old", "2026-11-30T07:26:05Z", answered),
        &exits
    ));
}
