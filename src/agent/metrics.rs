//! The agent's Prometheus metrics: how long detection takes per backend, how often we write to
//! the API (it should be ~zero on a steady node), errors by stage, and what we publish.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Label set naming a detection backend.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabel {
    /// Backend name.
    pub backend: String,
}

/// Label set naming what was written.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    /// `node_labels`, `inventory` or `inventory_status`.
    pub object: String,
}

/// Label set naming the stage that failed.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    /// `detect`, `node_labels`, `inventory`, `inventory_status` or `seed`.
    pub stage: String,
}

fn backend_histogram() -> Histogram {
    // 100 µs to ~6.5 s: backends range from a few sysfs reads to a slow vendor tool.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0001, 4.0, 9,
    ))
}

/// Every metric the agent exports.
#[derive(Debug, Clone)]
pub struct AgentMetrics {
    /// Detection cycles run.
    pub detections: Counter,
    /// Per-backend detection duration in seconds.
    pub backend_seconds: Family<BackendLabel, Histogram, fn() -> Histogram>,
    /// API writes by object.
    pub api_writes: Family<WriteLabel, Counter>,
    /// Errors by stage.
    pub errors: Family<StageLabel, Counter>,
    /// Devices published in the inventory.
    pub devices: Gauge,
    /// Devices kept although the last detection missed them.
    pub stale_devices: Gauge,
    /// Warnings in the last detection.
    pub warnings: Gauge,
}

impl AgentMetrics {
    /// Creates the metrics and registers them under the `hwaccel_agent` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            detections: Counter::default(),
            backend_seconds: Family::new_with_constructor(backend_histogram),
            api_writes: Family::default(),
            errors: Family::default(),
            devices: Gauge::default(),
            stale_devices: Gauge::default(),
            warnings: Gauge::default(),
        };
        let registry = registry.sub_registry_with_prefix("hwaccel_agent");
        registry.register(
            "detections",
            "Detection cycles run",
            metrics.detections.clone(),
        );
        registry.register(
            "backend_duration_seconds",
            "Time each detection backend took",
            metrics.backend_seconds.clone(),
        );
        registry.register(
            "api_writes",
            "Writes to the Kubernetes API",
            metrics.api_writes.clone(),
        );
        registry.register("errors", "Errors by stage", metrics.errors.clone());
        registry.register(
            "devices",
            "Accelerators published for this node",
            metrics.devices.clone(),
        );
        registry.register(
            "stale_devices",
            "Devices kept although the last detection did not see them",
            metrics.stale_devices.clone(),
        );
        registry.register(
            "warnings",
            "Warnings raised by the last detection",
            metrics.warnings.clone(),
        );
        metrics
    }

    /// Counts an API write.
    pub fn wrote(&self, object: &str) {
        self.api_writes
            .get_or_create(&WriteLabel {
                object: object.to_string(),
            })
            .inc();
    }

    /// Counts an error.
    pub fn failed(&self, stage: &str) {
        self.errors
            .get_or_create(&StageLabel {
                stage: stage.to_string(),
            })
            .inc();
    }
}
