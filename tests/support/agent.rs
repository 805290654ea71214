//! The node agent inside a test, on a fixture host tree with the fixture's stand-in tools.

use std::path::Path;
use std::time::Duration;

use hwaccel::agent::{Agent, AgentConfig, metrics::AgentMetrics};
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
