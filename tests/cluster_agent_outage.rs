//! The agent survives an apiserver outage: kill the apiserver mid-run, change the host while it
//! is away (a driver upgrade), start it again, and the agent recovers and converges with no
//! label lost; restarting the agent removes nothing.
//!
//! A steady agent makes no API calls at all, so the host must change during the outage for the
//! agent to notice it.
//!
//! Its own test binary, because it stops the shared apiserver (cargo runs test binaries one at
//! a time).

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use hwaccel::agent::{Agent, AgentConfig, metrics::AgentMetrics};
use hwaccel::server::Readiness;
use k8s_openapi::api::core::v1::Node;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use support::{DEFAULT_TIMEOUT, TestCluster, install_crds, wait_for};

fn agent_for(client: &Client, node: &str, host: &Path) -> Agent {
    let mut registry = prometheus_client::registry::Registry::default();
    let config = AgentConfig {
        node_name: node.to_string(),
        host_root: host.to_path_buf(),
        backends: "all,-vulkan".parse().expect("valid selection"),
        tool_paths: vec![host.join("commands")],
        tool_timeout: Duration::from_secs(10),
        interval: Duration::from_millis(500),
        hotplug_poll: Duration::from_millis(250),
        misses_to_remove: 3,
        max_backoff: Duration::from_secs(2),
    };
    Agent::new(
        config,
        client.clone(),
        AgentMetrics::register(&mut registry),
    )
}

async fn our_labels(client: &Client, node: &str) -> Result<BTreeMap<String, String>> {
    let node: Node = Api::all(client.clone()).get(node).await?;
    Ok(node
        .metadata
        .labels
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.starts_with("hwaccel.io/"))
        .collect())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn the_agent_rides_out_an_apiserver_outage_and_a_restart_removes_nothing() -> Result<()> {
    let cluster = TestCluster::new().await?;
    let client = cluster.client();
    install_crds(&client).await?;
    let node = cluster.unique_name("outage");
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &Node {
                metadata: ObjectMeta {
                    name: Some(node.clone()),
                    ..ObjectMeta::default()
                },
                ..Node::default()
            },
        )
        .await?;
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hosts/h100-8x-nvswitch");
    let copy = tempfile::tempdir()?;
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", fixture.display()))
        .arg(copy.path())
        .status()?;
    anyhow::ensure!(copied.success(), "copying the fixture");
    let host = copy.path().to_path_buf();

    let readiness = Arc::new(Readiness::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(hwaccel::agent::run::run(
        agent_for(&client, &node, &host),
        readiness.clone(),
        stopped,
    ));
    let published = wait_for(DEFAULT_TIMEOUT, "labels published", || {
        let client = client.clone();
        let node = node.clone();
        async move {
            let labels = our_labels(&client, &node).await?;
            Ok(labels.contains_key("hwaccel.io/count").then_some(labels))
        }
    })
    .await?;

    assert_eq!(
        published
            .get("hwaccel.io/driver.nvidia.version")
            .map(String::as_str),
        Some("550.90.07")
    );

    cluster.apiserver_ctl("stop").await?;
    // Whatever happens while it is away, the apiserver must come back for the other tests.
    let during_outage = async {
        let query = host.join("commands/outputs/query-gpu.csv");
        std::fs::write(
            &query,
            std::fs::read_to_string(&query)?.replace("550.90.07", "550.127.05"),
        )?;
        // The cycles fail while it is away; the agent reports not ready and keeps going.
        wait_for(Duration::from_secs(30), "agent notices the outage", || {
            let readiness = readiness.clone();
            async move { Ok((!readiness.is_ready()).then_some(())) }
        })
        .await?;
        anyhow::Ok(())
    }
    .await;
    cluster.apiserver_ctl("start").await?;
    during_outage?;
    let converged = wait_for(DEFAULT_TIMEOUT, "agent converged after the outage", || {
        let (client, node, readiness) = (client.clone(), node.clone(), readiness.clone());
        async move {
            let labels = our_labels(&client, &node).await?;
            let upgraded = labels
                .get("hwaccel.io/driver.nvidia.version")
                .map(String::as_str)
                == Some("550.127.05");
            Ok((upgraded && readiness.is_ready()).then_some(labels))
        }
    })
    .await?;
    let mut expected = published.clone();
    expected.insert(
        "hwaccel.io/driver.nvidia.version".into(),
        "550.127.05".into(),
    );
    assert_eq!(
        converged, expected,
        "labels lost or changed across the outage"
    );
    let published = converged;

    // Stop the agent; nothing is deleted on exit.
    stop.send(true)?;
    worker.await?;
    assert_eq!(our_labels(&client, &node).await?, published);

    // A restarted agent converges to the same labels without removing any.
    let mut restarted = agent_for(&client, &node, &host);
    let outcome = restarted.cycle().await?;
    assert!(
        !outcome.labels_written,
        "a restart rewrote labels: {outcome:?}"
    );
    assert_eq!(our_labels(&client, &node).await?, published);
    Ok(())
}
