//! A controller running inside a test: scoped to the test's namespace and to Nodes and
//! inventories labelled with its prefix, stopped when the handle drops.

use std::time::Duration;

use hwaccel::controller::metrics::ControllerMetrics;
use hwaccel::controller::{self, Config, HealthTaints};
use prometheus_client::registry::Registry;

use super::{TEST_LABEL, TestCluster};

/// Runs a controller for this test until dropped.
pub struct Running(tokio::task::JoinHandle<anyhow::Result<()>>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A controller scoped to this test, with health taints `mode`; its metrics registry for
/// "scrapes".
pub fn start_controller(cluster: &TestCluster, mode: HealthTaints) -> (Running, Registry) {
    start_controller_with(cluster, |config| config.health_taints = mode)
}

/// A controller scoped to this test, its configuration changed by `tune`.
pub fn start_controller_with(
    cluster: &TestCluster,
    tune: impl FnOnce(&mut Config),
) -> (Running, Registry) {
    let mut registry = Registry::default();
    let metrics = ControllerMetrics::register(&mut registry);
    let mut config = Config::cluster_wide("fleet-test-controller");
    config.namespace = Some(cluster.namespace().to_string());
    config.selector = Some(format!("{TEST_LABEL}={}", cluster.prefix()));
    config.debounce = Duration::from_millis(200);
    tune(&mut config);
    let running = Running(tokio::spawn(controller::run(
        cluster.client(),
        config,
        metrics,
        std::future::pending(),
    )));
    (running, registry)
}

/// The registry's metrics in the text exposition format, as a scrape reads them.
pub fn scrape(registry: &Registry) -> String {
    let mut text = String::new();
    #[allow(clippy::expect_used)] // encoding into a String cannot fail
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encodes");
    text
}
