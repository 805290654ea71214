//! The controller's Prometheus metrics: how long reconciles take, why they fail, how many
//! placements are in each state, and how many devices are reserved.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label set naming why a reconcile failed.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// `status`, `node_labels`, `finalizer`, `event`...
    pub reason: String,
}

/// Label set naming a placement state.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// `Planned`, `Pending` or `Invalid`.
    pub state: String,
}

/// Label set naming what was written.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    /// `status` or `node_labels`.
    pub object: String,
}

fn reconcile_histogram() -> Histogram {
    // 100 µs to ~1.6 s: a reconcile is a planner run plus at most a few API writes.
    Histogram::new(exponential_buckets(0.0001, 2.0, 15))
}

/// Every metric the controller exports.
#[derive(Debug, Clone)]
pub struct ControllerMetrics {
    /// Reconcile duration in seconds, not counting the wait for the reconcile lock.
    pub reconcile_seconds: Histogram,
    /// Time the decision took (planning, without API calls).
    pub decide_seconds: Histogram,
    /// Time a reconcile waited for the lock (reconciles run one at a time).
    pub lock_wait_seconds: Histogram,
    /// Reconciles run.
    pub reconciles: Counter,
    /// Failed reconciles by reason.
    pub errors: Family<ReasonLabel, Counter>,
    /// Placements by state, as last reconciled.
    pub placements: Family<StateLabel, Gauge>,
    /// Devices reserved by placements.
    pub devices_reserved: Gauge,
    /// API writes by object.
    pub api_writes: Family<WriteLabel, Counter>,
}

impl ControllerMetrics {
    /// Creates the metrics and registers them under the `hwaccel_controller` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            reconcile_seconds: reconcile_histogram(),
            decide_seconds: reconcile_histogram(),
            lock_wait_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 18)),
            reconciles: Counter::default(),
            errors: Family::default(),
            placements: Family::default(),
            devices_reserved: Gauge::default(),
            api_writes: Family::default(),
        };
        let registry = registry.sub_registry_with_prefix("hwaccel_controller");
        registry.register(
            "reconcile_duration_seconds",
            "Time one ModelPlacement reconcile took",
            metrics.reconcile_seconds.clone(),
        );
        registry.register(
            "decide_duration_seconds",
            "Time the pure part of a reconcile took (planning, ledger), without API calls",
            metrics.decide_seconds.clone(),
        );
        registry.register(
            "reconcile_lock_wait_seconds",
            "Time a reconcile waited for the others to finish",
            metrics.lock_wait_seconds.clone(),
        );
        registry.register(
            "reconciles",
            "ModelPlacement reconciles run",
            metrics.reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles by reason",
            metrics.errors.clone(),
        );
        registry.register(
            "placements",
            "ModelPlacements by state",
            metrics.placements.clone(),
        );
        registry.register(
            "devices_reserved",
            "Accelerators reserved by ModelPlacements",
            metrics.devices_reserved.clone(),
        );
        registry.register(
            "api_writes",
            "Writes to the Kubernetes API",
            metrics.api_writes.clone(),
        );
        metrics
    }

    /// Counts a failed reconcile.
    pub fn failed(&self, reason: &str) {
        self.errors
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts an API write.
    pub fn wrote(&self, object: &str) {
        self.api_writes
            .get_or_create(&WriteLabel {
                object: object.to_string(),
            })
            .inc();
    }

    /// Sets the per-state gauges from counts.
    pub fn set_states<'a>(&self, counts: impl IntoIterator<Item = (&'a str, i64)>) {
        for state in ["Planned", "Pending", "Invalid"] {
            self.placements
                .get_or_create(&StateLabel {
                    state: state.to_string(),
                })
                .set(0);
        }
        for (state, count) in counts {
            self.placements
                .get_or_create(&StateLabel {
                    state: state.to_string(),
                })
                .set(count);
        }
    }
}
