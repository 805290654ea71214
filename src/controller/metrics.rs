//! The controller's Prometheus metrics: how long reconciles take, which step failed, which
//! writes failed, how many placements are in each state, and how many devices are reserved.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// Reconcile and decide buckets, in seconds. Hand-picked rather than exponential so that the
/// 50 ms target is a bucket bound (a p99 can be read against it without interpolation) and
/// the range a reconcile spends most of its time in (1–100 ms) is finely cut.
const RECONCILE_BUCKETS: [f64; 18] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.25, 0.5, 1.0,
];
use prometheus_client::registry::Registry;

use super::core::step::Step;

pub mod fleet;

fn step_label(step: Step) -> StepLabel {
    StepLabel {
        step: step.as_label().to_string(),
    }
}

/// Label set naming which write failed.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The object written: `status`, `node_labels`, `event`, `inventory_status`...
    pub reason: String,
}

/// Label set naming the step of a reconcile that failed.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabel {
    /// [`Step::as_label`]: `dereference`, `claims`, `template`, `apply`, `status`, `finalizer`.
    pub step: String,
}

/// Label set naming a placement state.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// `Planned`, `Pending` or `Invalid`.
    pub state: String,
}

/// Label set naming a kind of object and why one was skipped.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkipLabel {
    /// `ModelPlacement` or `AcceleratorInventory`.
    pub kind: String,
    /// `undecodable`, or `name_mismatch` (an inventory whose `spec.nodeName` is not its name).
    pub reason: String,
}

/// The start-up phases, in the order they end ([`PhaseLabel`]).
pub const STARTUP_PHASES: [&str; 3] = ["watches", "ledger", "ready"];

/// Label set naming a phase of the controller's start as leader.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// `watches` (every watch cache listed), `ledger` (placements listed, the ledger rebuilt),
    /// `ready` (stale labels cleaned, references resolved: reconciles may start).
    pub phase: String,
}

/// Label set naming what was written.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    /// `status`, `node_labels`, `inventory_status` (freeDevices), `node_taint`,
    /// `device_taint_rule`...
    pub object: String,
}

fn reconcile_histogram() -> Histogram {
    Histogram::new(RECONCILE_BUCKETS)
}

/// Every metric the controller exports.
#[derive(Debug, Clone)]
pub struct ControllerMetrics {
    /// Reconcile duration in seconds, not counting the wait for the reconcile lock.
    pub reconcile_seconds: Histogram,
    /// Time the decision took (planning, without API calls).
    pub decide_seconds: Histogram,
    /// Time rebuilding the planner's view of the fleet took (after inventories or Node labels
    /// changed; part of the decide time of the reconcile that found it stale).
    pub fleet_view_seconds: Histogram,
    /// Time a reconcile waited for the state lock, for its snapshot and its commit together
    /// (reconciles run in parallel and hold it only for those moments).
    pub lock_wait_seconds: Histogram,
    /// Plans refused at commit because another reconcile's commit collided with them.
    pub commit_conflicts: Counter,
    /// Reconciles run.
    pub reconciles: Counter,
    /// Failed API writes by the object written (reconciles and fleet passes).
    pub errors: Family<ReasonLabel, Counter>,
    /// Failed reconciles by the step that failed.
    pub failures: Family<StepLabel, Counter>,
    /// Placements by state, as last reconciled.
    pub placements: Family<StateLabel, Gauge>,
    /// Devices reserved by placements.
    pub devices_reserved: Gauge,
    /// API writes by object.
    pub api_writes: Family<WriteLabel, Counter>,
    /// How long API writes took, by object: the part of a reconcile the apiserver decides.
    pub api_write_seconds: Family<WriteLabel, Histogram, fn() -> Histogram>,
    /// Stored objects the controller skipped, by kind and reason.
    pub skipped: Family<SkipLabel, Counter>,
    /// The fleet's gauges (`hwaccel_fleet_*`, `hwaccel_placement_*`).
    pub fleet: fleet::FleetMetrics,
    /// Nodes and devices health taints cover (`enforce`) or would cover (`dryRun`): Node
    /// taints plus DeviceTaintRules.
    pub health_taint_targets: Gauge,
    /// Seconds from taking the lead to the end of each start-up phase ([`PhaseLabel`]).
    pub startup_seconds: Family<PhaseLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

impl ControllerMetrics {
    /// Creates the metrics and registers them under the `hwaccel_controller` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            reconcile_seconds: reconcile_histogram(),
            decide_seconds: reconcile_histogram(),
            fleet_view_seconds: reconcile_histogram(),
            lock_wait_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 18)),
            reconciles: Counter::default(),
            commit_conflicts: Counter::default(),
            errors: Family::default(),
            failures: Family::default(),
            placements: Family::default(),
            devices_reserved: Gauge::default(),
            api_writes: Family::default(),
            api_write_seconds: Family::new_with_constructor(reconcile_histogram),
            skipped: Family::default(),
            fleet: fleet::FleetMetrics::register(registry),
            health_taint_targets: Gauge::default(),
            startup_seconds: Family::default(),
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
            "fleet_view_build_duration_seconds",
            "Time rebuilding the planner's view of the fleet took",
            metrics.fleet_view_seconds.clone(),
        );
        registry.register(
            "reconcile_lock_wait_seconds",
            "Time a reconcile waited for the ledger lock (snapshot and commit)",
            metrics.lock_wait_seconds.clone(),
        );
        registry.register(
            "commit_conflicts",
            "Plans refused at commit because another reconcile's commit collided with them",
            metrics.commit_conflicts.clone(),
        );
        registry.register(
            "reconciles",
            "ModelPlacement reconciles run",
            metrics.reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed API writes of reconciles and fleet passes, by the object written",
            metrics.errors.clone(),
        );
        registry.register(
            "reconcile_failures",
            "Failed ModelPlacement reconciles, by the step that failed",
            metrics.failures.clone(),
        );
        // Every step's series exists from the start, so a rate over it is 0 rather than absent.
        for step in Step::ALL {
            metrics.failures.get_or_create(&step_label(step)).inc_by(0);
        }
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
        registry.register(
            "api_write_duration_seconds",
            "Time one write to the Kubernetes API took",
            metrics.api_write_seconds.clone(),
        );
        registry.register(
            "health_taint_targets",
            "Node taints plus DeviceTaintRules the health taints hold (enforce) or would hold (dryRun)",
            metrics.health_taint_targets.clone(),
        );
        registry.register(
            "startup_seconds",
            "Seconds from taking the lead to the end of a start-up phase: watches (caches listed), ledger, ready; 0 until the phase ends",
            metrics.startup_seconds.clone(),
        );
        // Every phase's series exists from the start (0 until it ends), so a standby and a
        // replica still starting export it too.
        for phase in STARTUP_PHASES {
            metrics
                .startup_seconds
                .get_or_create(&PhaseLabel {
                    phase: phase.to_string(),
                })
                .set(0.0);
        }
        registry.register(
            "skipped_objects",
            "Watch events carrying a stored object the controller skips: one it cannot decode, or an inventory naming another node",
            metrics.skipped.clone(),
        );
        metrics
    }

    /// Records that start-up `phase` ended `since` the lead was taken, and logs it.
    pub fn started(&self, phase: &str, since: std::time::Instant) {
        let seconds = since.elapsed().as_secs_f64();
        self.startup_seconds
            .get_or_create(&PhaseLabel {
                phase: phase.to_string(),
            })
            .set(seconds);
        tracing::info!(phase, seconds, "controller start-up phase done");
    }

    /// Counts and logs an object of `kind` that did not decode; decoded ones pass silently.
    pub fn observe_decoding<K>(&self, kind: &str, object: &crate::api::Lenient<K>) {
        if let crate::api::Lenient::Undecodable { metadata, error } = object {
            self.skipped(kind, "undecodable");
            tracing::warn!(
                kind,
                namespace = metadata.namespace.as_deref().unwrap_or(""),
                name = metadata.name.as_deref().unwrap_or(""),
                error,
                "skipping a stored object that cannot be decoded"
            );
        }
    }

    /// Counts a skipped object.
    pub fn skipped(&self, kind: &str, reason: &str) {
        self.skipped
            .get_or_create(&SkipLabel {
                kind: kind.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts a failed reconcile under the step that failed.
    pub fn reconcile_failed(&self, step: Step) {
        self.failures.get_or_create(&step_label(step)).inc();
    }

    /// Counts a failed API write of `reason` (the object written).
    pub fn failed(&self, reason: &str) {
        self.errors
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts an API write that took `took`.
    pub fn wrote(&self, object: &str, took: std::time::Duration) {
        let label = WriteLabel {
            object: object.to_string(),
        };
        self.api_writes.get_or_create(&label).inc();
        self.api_write_seconds
            .get_or_create(&label)
            .observe(took.as_secs_f64());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(metrics: impl FnOnce(&ControllerMetrics)) -> String {
        let mut registry = Registry::default();
        let registered = ControllerMetrics::register(&mut registry);
        metrics(&registered);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn the_reconcile_target_is_a_bucket_bound() {
        let text = exposition(|m| m.reconcile_seconds.observe(0.049));
        assert!(
            text.contains("hwaccel_controller_reconcile_duration_seconds_bucket{le=\"0.05\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("hwaccel_controller_reconcile_duration_seconds_bucket{le=\"0.04\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn writes_are_counted_and_timed_by_object() {
        let text = exposition(|m| {
            m.wrote("status", std::time::Duration::from_millis(3));
            m.wrote("status", std::time::Duration::from_millis(30));
        });
        assert!(
            text.contains("hwaccel_controller_api_writes_total{object=\"status\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "hwaccel_controller_api_write_duration_seconds_bucket{le=\"0.005\",object=\"status\"} 1"
            ),
            "{text}"
        );
    }
}
