//! The node agent inside a test, on a fixture host tree with the fixture's stand-in tools.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};
use hwaccel::agent::{Agent, AgentConfig, PublishOutcome, metrics::AgentMetrics};
use hwaccel::detect::BackendSelection;
use kube::Client;

/// The configuration of an agent for `node` on the host tree `host`: every backend but Vulkan,
/// the host's `commands/` on the tool path, a device removed after `misses` clean misses.
pub fn fixture_agent_config(node: &str, host: &Path, misses: u32) -> AgentConfig {
    AgentConfig {
        node_name: node.to_string(),
        host_root: host.to_path_buf(),
        #[allow(clippy::expect_used)] // a constant selection
        backends: "all,-vulkan"
            .parse::<BackendSelection>()
            .expect("valid selection"),
        tool_paths: vec![host.join("commands")],
        tool_timeout: Duration::from_secs(10),
        interval: Duration::from_secs(60),
        hotplug_poll: Duration::from_secs(5),
        misses_to_remove: misses,
        max_backoff: Duration::from_secs(2),
    }
}

/// An agent run cycle by cycle by the test (its metrics go to a registry of its own).
pub fn agent_for(client: &Client, node: &str, host: &Path, misses: u32) -> Agent {
    let mut registry = prometheus_client::registry::Registry::default();
    Agent::new(
        fixture_agent_config(node, host, misses),
        client.clone(),
        AgentMetrics::register(&mut registry),
    )
}

/// How long a change made outside the agent may take to reach its watches.
const WATCH_DELIVERY: Duration = Duration::from_secs(10);

/// Waits until `agent`'s watches of its own objects are current (started by its first cycle),
/// so that its next cycles read their caches.
pub async fn watches_current(agent: &Agent) -> Result<()> {
    let start = std::time::Instant::now();
    while start.elapsed() < WATCH_DELIVERY {
        if agent.own_objects().is_some_and(|own| own.current()) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!(
        "the agent's watches were not current within {WATCH_DELIVERY:?}: {:?}",
        agent.own_objects().map(|own| own.stats())
    )
}

/// Waits until `agent`'s watched copy of its Node satisfies `seen`: for a test that changes the
/// Node and expects the agent's next cycle to act on it.
pub async fn node_seen(
    agent: &Agent,
    what: &str,
    seen: impl Fn(&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool,
) -> Result<()> {
    let start = std::time::Instant::now();
    while start.elapsed() < WATCH_DELIVERY {
        if agent
            .own_objects()
            .and_then(|own| own.node())
            .is_some_and(|node| seen(&node))
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{what}: the agent's Node watch did not show it within {WATCH_DELIVERY:?}")
}

/// Cycles `agent` every 100 ms until an outcome satisfies `done`, for a change made outside the
/// agent: it is seen on the first cycle after the agent's watch delivers it (milliseconds),
/// which may not be the cycle that starts right after the change.
pub async fn cycle_until(
    agent: &mut Agent,
    what: &str,
    done: impl Fn(&PublishOutcome) -> bool,
) -> Result<PublishOutcome> {
    let start = std::time::Instant::now();
    let mut last = None;
    while start.elapsed() < WATCH_DELIVERY {
        let outcome = agent.cycle().await?;
        if done(&outcome) {
            return Ok(outcome);
        }
        last = Some(outcome);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{what}: not within {WATCH_DELIVERY:?}; last cycle {last:?}")
}
