//! What one node agent costs the apiserver at steady state, measured on the real apiserver,
//! and what that makes at 10,000 nodes: the requests of one cycle by verb (from the audit log,
//! which `scripts/scale.sh` starts with every verb logged), the watches it holds instead
//! (counted apart: a watch is one long-running request, re-made every 5 to 10 minutes), the
//! stored inventory's size for an 8-GPU node, and the extrapolation docs/benchmarks.md records.
//! Goals (issue 26): 0 writes and at most 1 read per cycle; see
//! docs/decisions/0010-the-agent-watches-its-own-objects.md.
//!
//! Runs with the scale harness (`SCALE_RUN=1`, audit log of reads: `TC_AUDIT_READS=1`);
//! without `SCALE_RUN` it returns at once. `AGENT_COST_GAP_SECONDS` (default 1) spaces the
//! steady cycles: 60 runs them at the shipped interval, long enough for the watches' bookmarks
//! and re-watches to show in the counts.

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use std::time::Duration;

use anyhow::{Context as _, Result};
use hwaccel::agent::{Agent, metrics::AgentMetrics};
use hwaccel::api::AcceleratorInventory;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use support::agent::{fixture_agent_config, watches_current};
use support::apiserver_load::AuditCursor;
use support::hosts::copy_fixture;
use support::nodes::create_node;
use support::{TestCluster, install_crds};

/// Cycles measured after the first (which writes everything).
const STEADY_CYCLES: usize = 10;
/// The most reads (get, list) a steady cycle may make.
const READS_PER_CYCLE_BUDGET: f64 = 1.0;
/// The size the issue sets for an 8-GPU node's stored inventory.
const INVENTORY_BUDGET_BYTES: usize = 16 * 1024;
/// The fleet the figures are extrapolated to.
const FLEET_NODES: f64 = 10_000.0;

/// The test cluster's admin client, sending the agent's User-Agent so the audit log tells its
/// requests apart from the harness's.
async fn agent_client(cluster: &TestCluster) -> Result<Client> {
    let kubeconfig = Kubeconfig::read_from(&cluster.env().kubeconfig)?;
    let mut config =
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(&hwaccel::kube_client::user_agent("agent"))?,
    ));
    Ok(hwaccel::kube_client::client_from(
        config,
        hwaccel::kube_client::DEFAULT_API_TIMEOUT,
    )?)
}

#[tokio::test]
#[ignore = "scale run: scripts/scale.sh"]
async fn one_agent_at_steady_state() -> Result<()> {
    if !support::scale_run("measure the agent") {
        return Ok(());
    }
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let node = cluster.unique_name("h100");
    create_node(&cluster.client(), &node, &[]).await?;
    let host = copy_fixture("h100-8x-nvswitch")?;
    let config = fixture_agent_config(&node, host.path(), 3);
    let interval = Duration::from_secs(60);
    let mut registry = prometheus_client::registry::Registry::default();
    let mut agent = Agent::new(
        config,
        agent_client(&cluster).await?,
        AgentMetrics::register(&mut registry),
    );

    let first = agent.cycle().await?;
    assert!(
        first.inventory_written,
        "the first cycle writes the inventory"
    );
    // Steady means the agent's watches have listed and delivered its own first writes; one
    // unmeasured cycle takes up whatever arrived after them.
    watches_current(&agent).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    agent.cycle().await?;
    let gap = Duration::from_secs(
        std::env::var("AGENT_COST_GAP_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1),
    );
    let before = agent.own_objects().map(|own| own.stats());
    let audit = AuditCursor::now(&cluster.env().work)?;
    let started = std::time::Instant::now();
    for cycle in 0..STEADY_CYCLES {
        if cycle > 0 {
            tokio::time::sleep(gap).await;
        }
        let outcome = agent.cycle().await?;
        assert_eq!(outcome, Default::default(), "a steady node writes nothing");
    }
    let measured = started.elapsed();
    // The audit log's writer may lag the responses by a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let requests = audit.requests_since()?;
    print!(
        "agent cost: {STEADY_CYCLES} steady cycles of one 8-GPU agent over {:.0} s, by caller and verb:\n{}",
        measured.as_secs_f64(),
        requests.table()
    );
    let mut per_cycle = Vec::new();
    let (mut writes, mut reads, mut watches) = (0.0, 0.0, 0.0);
    for ((caller, verb), latencies) in &requests.by_caller_verb {
        if caller != "hwaccel-agent" {
            continue;
        }
        let n = latencies.len() as f64 / STEADY_CYCLES as f64;
        match verb.as_str() {
            "get" | "list" => reads += n,
            "watch" => watches += latencies.len() as f64,
            _ => writes += n,
        }
        if verb != "watch" {
            per_cycle.push(format!("{n:.1} {verb}"));
        }
    }
    let cycles_per_hour = 3600.0 / interval.as_secs_f64();
    println!(
        "agent cost: per cycle {} ({:.1} reads, {writes:.1} writes); at one cycle a minute: \
         {:.0} requests per node per hour, {:.0} per second from {FLEET_NODES} nodes",
        if per_cycle.is_empty() {
            "no request".to_string()
        } else {
            per_cycle.join(", ")
        },
        reads,
        (reads + writes) * cycles_per_hour,
        (reads + writes) * FLEET_NODES / interval.as_secs_f64()
    );
    let after = agent.own_objects().map(|own| own.stats());
    if let (Some(before), Some(after)) = (before, after) {
        for ((what, b), (_, a)) in before.iter().zip(after.iter()) {
            println!(
                "agent cost: watch of its {what}: {} watch requests, {} events, {} bookmarks, \
                 {} lists, {} failures in {:.0} s",
                a.watches - b.watches,
                a.events - b.events,
                a.bookmarks - b.bookmarks,
                a.lists - b.lists,
                a.failures - b.failures,
                measured.as_secs_f64()
            );
        }
    }
    // Each watch asks for 5 to 10 minutes (7.5 on average), so each is re-made 8 times an
    // hour; the audit log counts the re-watches that fell in this run apart.
    let held = hwaccel::agent::own_objects::WATCHES;
    let watches_per_hour = held as f64 * 3600.0 / 450.0;
    println!(
        "agent cost: {watches} watch requests in the run; held: {held} watches, re-made about \
         {watches_per_hour:.0} times per node per hour, {:.0} per second from {FLEET_NODES} nodes",
        watches_per_hour * FLEET_NODES / 3600.0
    );
    assert_eq!(writes, 0.0, "a steady agent writes nothing");
    assert!(
        reads <= READS_PER_CYCLE_BUDGET,
        "a steady agent reads {reads:.1} times per cycle (budget {READS_PER_CYCLE_BUDGET})"
    );

    let stored = Api::<AcceleratorInventory>::all(cluster.client())
        .get(&node)
        .await
        .context("the inventory")?;
    let bytes = serde_json::to_vec(&stored)?.len();
    if let Ok(path) = std::env::var("AGENT_COST_DUMP") {
        std::fs::write(path, serde_json::to_vec_pretty(&stored)?)?;
    }
    println!(
        "agent cost: the stored inventory of an 8-GPU node is {bytes} bytes as JSON (budget {INVENTORY_BUDGET_BYTES})"
    );
    assert!(
        bytes <= INVENTORY_BUDGET_BYTES,
        "inventory {bytes} bytes > {INVENTORY_BUDGET_BYTES}"
    );
    Ok(())
}
