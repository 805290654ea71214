//! Expected versus present devices against a real kube-apiserver, with the agent running its
//! own loop and serving `/metrics` as it does in the DaemonSet:
//!
//! - `/metrics` has one `hwaccel_device_info` per fixture GPU, with the fixture's UUID and
//!   PCI address;
//! - a GPU disappearing from the host sets `DevicesMissing=True`, the Node label
//!   `hwaccel.io/devices-missing=1` and `hwaccel_node_devices_missing 1` within one detection
//!   interval (plus slack), and its return clears all three;
//! - the `hwaccel.io/expected-devices` annotation overrides what was seen (16 on an 8-GPU node:
//!   8 missing), and setting it to what is there acknowledges the loss; the agent's status
//!   writes keep the controller's `freeDevices`;
//! - `kubectl get accinv` shows the memory as `8×80Gi`.
//!
//! Run with the cluster up: `tests/cluster/up.sh --full && cargo test --test
//! cluster_tier -- --ignored cluster_agent_health:: --test-threads=1`.

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use hwaccel::agent::{Agent, AgentConfig, metrics::AgentMetrics};
use hwaccel::api::{AcceleratorInventory, conditions};
use hwaccel::health::Liveness;
use hwaccel::server::{Limits, Readiness, router, serve_on};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use support::agent::fixture_agent_config;
use support::hosts::{copy_fixture, copy_tree, fixture_host, remove_gpu};
use support::nodes::create_node;
use support::{TestCluster, install_crds};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

const FIXTURE: &str = "h100-8x-nvswitch";
/// The agent's detection interval in these tests.
const INTERVAL: Duration = Duration::from_secs(3);
/// Slack on top of one interval: a detection of the fixture (a few shell-script tool runs) and
/// the apiserver round trips, on a loaded test machine.
const SLACK: Duration = Duration::from_secs(12);
const MISSING_LABEL: &str = "hwaccel.io/devices-missing";
const ANNOTATION: &str = "hwaccel.io/expected-devices";

/// An agent loop and its `/metrics` server, stopped on drop.
struct RunningAgent {
    stop: watch::Sender<bool>,
    metrics: SocketAddr,
    _host: tempfile::TempDir,
    host: PathBuf,
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

impl RunningAgent {
    async fn start(client: &Client, node: &str) -> Result<Self> {
        let host = copy_fixture(FIXTURE)?;
        let mut registry = prometheus_client::registry::Registry::default();
        let config = AgentConfig {
            interval: INTERVAL,
            hotplug_poll: Duration::from_secs(1),
            ..fixture_agent_config(node, host.path(), 3)
        };
        let agent = Agent::new(
            config,
            client.clone(),
            AgentMetrics::register(&mut registry),
        );
        let readiness = Arc::new(Readiness::default());
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(hwaccel::agent::run::run(
            agent,
            Arc::clone(&readiness),
            stopped.clone(),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let metrics = listener.local_addr()?;
        let app = router(Arc::new(registry), readiness, Liveness::default());
        let mut server_stop = stopped;
        tokio::spawn(serve_on(listener, app, Limits::default(), async move {
            let _ = server_stop.changed().await;
        }));
        Ok(Self {
            stop,
            metrics,
            host: host.path().to_path_buf(),
            _host: host,
        })
    }

    /// The `/metrics` body, as a scraper gets it.
    async fn scrape(&self) -> Result<String> {
        let mut stream = tokio::net::TcpStream::connect(self.metrics).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
            .await?;
        let mut response = String::new();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
            .await??;
        anyhow::ensure!(response.starts_with("HTTP/1.1 200"), "{response}");
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
        body.context("no body")
    }
}

/// The fixture's GPUs as `(pci address, uuid)`, read from its `nvidia-smi --query-gpu`
/// capture (`index, pci.bus_id, name, uuid, ...`), bus ids in the lower-case 4-digit-domain
/// form the metrics use.
fn fixture_gpus() -> Result<Vec<(String, String)>> {
    let capture = fixture_host(FIXTURE).join("commands/outputs/query-gpu.csv");
    let text = std::fs::read_to_string(&capture)?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let bus = fields.get(1).context("no bus id")?.to_ascii_lowercase();
            // `00000000:1b:00.0` → `0000:1b:00.0`.
            let bus = bus
                .split_once(':')
                .map(|(domain, rest)| {
                    format!("{:0>4}:{rest}", &domain[domain.len().saturating_sub(4)..])
                })
                .context("bus id without a domain")?;
            let uuid = fields.get(3).context("no uuid")?.to_string();
            Ok((bus, uuid))
        })
        .collect()
}

/// Sets the Node's `hwaccel.io/expected-devices` annotation, as an operator would.
async fn expect_devices(client: &Client, node: &str, value: &str) -> Result<()> {
    let patch = serde_json::json!({ "metadata": { "annotations": { ANNOTATION: value } } });
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The value of the first sample of `metric` whose line contains every one of `having`.
fn sample(body: &str, metric: &str, having: &[&str]) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .find(|l| having.iter().all(|h| l.contains(h)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// What the node shows: (DevicesMissing status, expectedDevices, expectedSource, label,
/// `hwaccel_node_devices_missing`).
#[derive(Debug, Clone, PartialEq)]
struct Shown {
    condition: Option<String>,
    expected: Option<u32>,
    source: Option<String>,
    label: Option<String>,
    metric: Option<f64>,
}

async fn shown(client: &Client, agent: &RunningAgent, node: &str) -> Result<Shown> {
    let inventory = Api::<AcceleratorInventory>::all(client.clone())
        .get_opt(node)
        .await?;
    let status = inventory.and_then(|i| i.status).unwrap_or_default();
    let labels = Api::<Node>::all(client.clone())
        .get(node)
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    let body = agent.scrape().await?;
    let node_label = format!("node=\"{node}\"");
    Ok(Shown {
        condition: conditions::find(&status.conditions, conditions::DEVICES_MISSING)
            .map(|c| c.status.clone()),
        expected: status.expected_devices,
        source: status.expected_source,
        label: labels.get(MISSING_LABEL).cloned(),
        metric: sample(&body, "hwaccel_node_devices_missing", &[&node_label]),
    })
}

async fn wait_shown(
    client: &Client,
    agent: &RunningAgent,
    node: &str,
    limit: Duration,
    what: &str,
    want: &Shown,
) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let last = match shown(client, agent, node).await {
            Ok(now) if now == *want => return Ok(started.elapsed()),
            Ok(now) => format!("{now:?}"),
            Err(err) => format!("{err:#}"),
        };
        anyhow::ensure!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}; last seen: {last}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `status.freeDevices` is still the controller's 5, and the agent does not own it.
async fn assert_free_devices_kept(
    inventories: &Api<AcceleratorInventory>,
    node: &str,
) -> Result<()> {
    let inventory = inventories.get(node).await?;
    let status = inventory.status.clone().unwrap_or_default();
    assert_eq!(status.free_devices, Some(5), "{status:?}");
    for entry in inventory.metadata.managed_fields.iter().flatten() {
        if entry.manager.as_deref() == Some("hwaccel-agent") {
            let fields = entry
                .fields_v1
                .as_ref()
                .map(|f| f.0.to_string())
                .unwrap_or_default();
            assert!(!fields.contains("freeDevices"), "{fields}");
        }
    }
    Ok(())
}

fn present(expected: u32, source: &str) -> Shown {
    Shown {
        condition: Some("False".into()),
        expected: Some(expected),
        source: Some(source.into()),
        label: None,
        metric: Some(0.0),
    }
}

fn missing(n: u32, expected: u32, source: &str) -> Shown {
    Shown {
        condition: Some("True".into()),
        expected: Some(expected),
        source: Some(source.into()),
        label: Some(n.to_string()),
        metric: Some(f64::from(n)),
    }
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_gpu_that_disappears_is_reported_missing_within_one_interval_and_cleared_on_return()
-> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("health");
    create_node(&client, &node, &[]).await?;
    let agent = RunningAgent::start(&client, &node).await?;

    wait_shown(
        &client,
        &agent,
        &node,
        INTERVAL + SLACK,
        "all 8 present",
        &present(8, "seen"),
    )
    .await?;

    // One info series per fixture GPU, carrying its UUID and PCI address.
    let body = agent.scrape().await?;
    let info: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("hwaccel_device_info{"))
        .collect();
    let gpus = fixture_gpus()?;
    assert_eq!(info.len(), gpus.len(), "{body}");
    for (bus, uuid) in &gpus {
        let matching: Vec<&&str> = info
            .iter()
            .filter(|l| {
                l.contains(&format!("pci_address=\"{bus}\""))
                    && l.contains(&format!("uuid=\"{uuid}\""))
                    && l.contains(&format!("node=\"{node}\""))
                    && l.contains("vendor=\"nvidia\"")
            })
            .collect();
        assert_eq!(matching.len(), 1, "{bus} {uuid}: {body}");
        assert!(matching[0].ends_with(" 1"), "{}", matching[0]);
    }
    assert_eq!(
        sample(&body, "hwaccel_node_devices_present", &[]),
        Some(8.0),
        "{body}"
    );
    // Health per device agrees with the inventory (the fixture has a GPU with retired
    // pages, so not every one is healthy).
    let inventory = Api::<AcceleratorInventory>::all(client.clone())
        .get(&node)
        .await?;
    for device in inventory
        .spec
        .devices
        .iter()
        .filter(|d| d.name.starts_with("gpu-"))
    {
        let healthy = device.text("health").as_deref() == Some("healthy");
        let device_label = format!("device=\"{}\"", device.name);
        assert_eq!(
            sample(&body, "hwaccel_device_healthy", &[&device_label]),
            Some(if healthy { 1.0 } else { 0.0 }),
            "{}: {body}",
            device.name
        );
    }
    assert_eq!(
        body.lines()
            .filter(|l| l.starts_with("hwaccel_device_memory_bytes{"))
            .count(),
        8,
        "{body}"
    );

    // People read the memory column.
    let table = cluster.kubectl_ok(&["get", "accinv", &node]).await?;
    assert!(table.contains("8×80Gi"), "{table}");

    // A GPU falls off the bus.
    let gone = "0000:df:00.0";
    remove_gpu(&agent.host, gone)?;
    let took = wait_shown(
        &client,
        &agent,
        &node,
        INTERVAL + SLACK,
        "the missing GPU reported",
        &missing(1, 8, "seen"),
    )
    .await?;
    eprintln!("DevicesMissing after {took:?}");
    let inventory = Api::<AcceleratorInventory>::all(client.clone())
        .get(&node)
        .await?;
    let status = inventory.status.unwrap_or_default();
    let condition = conditions::find(&status.conditions, conditions::DEVICES_MISSING)
        .context("no DevicesMissing")?;
    assert_eq!(condition.reason, "DevicesMissing");
    assert!(
        condition.message.contains("gpu-0000-df-00-0"),
        "{}",
        condition.message
    );
    assert!(
        condition.message.contains(ANNOTATION),
        "{}",
        condition.message
    );

    // It comes back.
    copy_tree(&fixture_host(FIXTURE), &agent.host)?;
    wait_shown(
        &client,
        &agent,
        &node,
        INTERVAL + SLACK,
        "the GPU back",
        &present(8, "seen"),
    )
    .await?;
    let body = agent.scrape().await?;
    assert!(body.contains(&format!("pci_address=\"{gone}\"")), "{body}");
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn the_annotation_sets_the_expected_count_and_acknowledges_a_loss() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("annotated");
    create_node(&client, &node, &[(ANNOTATION, "16")]).await?;
    let agent = RunningAgent::start(&client, &node).await?;

    wait_shown(
        &client,
        &agent,
        &node,
        INTERVAL + SLACK,
        "8 of 16 missing",
        &missing(8, 16, "annotation"),
    )
    .await?;
    let body = agent.scrape().await?;
    let node_label = format!("node=\"{node}\"");
    assert_eq!(
        sample(
            &body,
            "hwaccel_node_devices_expected",
            &[&node_label, "source=\"annotation\""]
        ),
        Some(16.0),
        "{body}"
    );

    // The controller's field: the agent's status writes must leave it alone.
    let free = serde_json::json!({
        "apiVersion": "hwaccel.io/v1alpha1",
        "kind": "AcceleratorInventory",
        "status": { "freeDevices": 5 },
    });
    let inventories = Api::<AcceleratorInventory>::all(client.clone());
    inventories
        .patch_status(
            &node,
            &PatchParams::apply("hwaccel-controller"),
            &Patch::Apply(&free),
        )
        .await?;

    // The operator acknowledges: 8 is what this node has.
    expect_devices(&client, &node, "8").await?;
    wait_shown(
        &client,
        &agent,
        &node,
        INTERVAL + SLACK,
        "the loss acknowledged",
        &present(8, "annotation"),
    )
    .await?;
    assert_free_devices_kept(&inventories, &node).await?;

    // Also after a restart, when the agent seeds itself from a status holding freeDevices.
    drop(agent);
    let agent = RunningAgent::start(&client, &node).await?;
    expect_devices(&client, &node, "7").await?;
    wait_shown(
        &client,
        &agent,
        &node,
        INTERVAL + SLACK,
        "more than expected is nothing missing",
        &present(7, "annotation"),
    )
    .await?;
    assert_free_devices_kept(&inventories, &node).await?;

    // A malformed annotation is ignored: the count falls back to what was seen.
    expect_devices(&client, &node, "lots").await?;
    wait_shown(
        &client,
        &agent,
        &node,
        INTERVAL + SLACK,
        "the bad annotation ignored",
        &present(8, "seen"),
    )
    .await?;
    Ok(())
}

/// Our taint's value on `node`, if it carries it.
async fn health_taint(client: &Client, node: &str) -> Result<Option<String>> {
    let node = Api::<Node>::all(client.clone()).get(node).await?;
    Ok(node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .find(|t| t.key == "hwaccel.io/devices-unhealthy")
        .map(|t| t.value.unwrap_or_default()))
}

/// Waits until `node`'s health taint has the value `reason`.
async fn wait_taint(client: &Client, node: &str, reason: &str, what: &str) -> Result<()> {
    support::wait_for(INTERVAL + SLACK, what, || async move {
        Ok((health_taint(client, node).await?.as_deref() == Some(reason)).then_some(()))
    })
    .await
}

/// Whether Node `node` has an Event `type|reason`.
async fn has_node_event(cluster: &TestCluster, node: &str, type_reason: &str) -> Result<bool> {
    let prefix = format!("{type_reason}|");
    Ok(support::nodes::node_events(cluster, node)
        .await?
        .iter()
        .any(|event| event.starts_with(&prefix)))
}

/// The whole path, agent and controller together: a GPU leaving the host gives, within one
/// detection interval (plus the controller's debounce), the inventory condition, the node
/// label, the agent's gauge, a Warning Event on the Node and (enforce) the taint with reason
/// `DevicesMissing`; its return lifts the taint and records `DevicesRestored`. The fixture's
/// GPU with retired pages is `degraded`: plannable by the one device-state rule, so it never
/// taints the node (issue 24), before, during or after.
#[tokio::test]
#[ignore = "needs cluster"]
async fn a_lost_gpu_taints_its_node_end_to_end_and_its_return_lifts_that_taint() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("e2e");
    create_node(&client, &node, &[]).await?;
    // The test's controller only sees Nodes and inventories carrying the test label.
    let scoped = serde_json::json!({
        "metadata": { "labels": { support::TEST_LABEL: cluster.prefix() } }
    });
    Api::<Node>::all(client.clone())
        .patch(&node, &PatchParams::default(), &Patch::Merge(&scoped))
        .await?;
    let agent = RunningAgent::start(&client, &node).await?;
    wait_shown(
        &client,
        &agent,
        &node,
        INTERVAL + SLACK,
        "all 8 present",
        &present(8, "seen"),
    )
    .await?;
    Api::<AcceleratorInventory>::all(client.clone())
        .patch(&node, &PatchParams::default(), &Patch::Merge(&scoped))
        .await?;
    let (_controller, _registry) =
        support::controller::start_controller(&cluster, hwaccel::controller::HealthTaints::Enforce);
    // The fixture has one GPU with retired pages, degraded and still plannable: once the
    // controller's first pass has run (it writes freeDevices), the node carries no taint.
    support::wait_for(INTERVAL + SLACK, "the first fleet pass", || {
        let client = client.clone();
        let node = node.clone();
        async move {
            let inventory = Api::<AcceleratorInventory>::all(client).get(&node).await?;
            Ok(inventory.status.and_then(|s| s.free_devices))
        }
    })
    .await?;
    assert_eq!(
        health_taint(&client, &node).await?,
        None,
        "a degraded GPU is not tainted"
    );

    remove_gpu(&agent.host, "0000:df:00.0")?;
    let started = Instant::now();
    wait_taint(&client, &node, "DevicesMissing", "DevicesMissing taint").await?;
    eprintln!(
        "tainted DevicesMissing {:?} after the GPU left",
        started.elapsed()
    );
    assert!(has_node_event(&cluster, &node, "Warning|DevicesMissing").await?);
    let labels = Api::<Node>::all(client.clone())
        .get(&node)
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(labels.get(MISSING_LABEL).map(String::as_str), Some("1"));
    let body = agent.scrape().await?;
    assert_eq!(
        sample(&body, "hwaccel_node_devices_missing", &[]),
        Some(1.0)
    );

    copy_tree(&fixture_host(FIXTURE), &agent.host)?;
    support::wait_for(INTERVAL + SLACK, "the taint lifted", || {
        let client = client.clone();
        let node = node.clone();
        async move { Ok(health_taint(&client, &node).await?.is_none().then_some(())) }
    })
    .await?;
    support::wait_for(INTERVAL + SLACK, "DevicesRestored event", || {
        let cluster = &cluster;
        let node = node.clone();
        async move {
            Ok(has_node_event(cluster, &node, "Normal|DevicesRestored")
                .await?
                .then_some(()))
        }
    })
    .await?;
    Ok(())
}
