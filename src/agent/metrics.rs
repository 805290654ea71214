//! The agent's Prometheus metrics: how long detection takes per backend, how often we write to
//! the API (it should be ~zero on a steady node), errors by stage, and what we publish.
//!
//! Two groups: operational series under `hwaccel_agent_`, and the fleet-facing device series
//! of `docs/observability.md` (`hwaccel_device_*`, `hwaccel_node_devices_*`), which carry the
//! node name so they can be summed across the DaemonSet and joined with vendor exporters on
//! `uuid` or `pci_address`. The device series are replaced as a whole after every detection:
//! a device that left loses its series instead of leaving a stale one behind.

use std::sync::{Arc, Mutex};

use crate::api::quantity;
use crate::api::{DeviceAttribute, InventoryDevice, attribute};
use crate::fleet::expected::Expected;
use crate::hardware::HealthStatus;

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

/// The longest label value the device series carry: vendor strings are not ours to trust, and
/// Prometheus keeps every distinct value in memory.
pub const MAX_LABEL_VALUE_LENGTH: usize = 128;

/// `hwaccel_device_info`'s labels: who the device is, vendor-neutral.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct DeviceInfoLabels {
    /// The Node.
    pub node: String,
    /// `nvidia`, `amd`...
    pub vendor: String,
    /// `gpu`, `tpu`, `npu`, `asic`.
    pub family: String,
    /// The product slug the node labels use.
    pub product: String,
    /// Vendor UUID, empty when unknown.
    pub uuid: String,
    /// Serial number, empty when unknown.
    pub serial: String,
    /// PCI address in lower-case `0000:18:00.0` form, empty for non-PCI devices.
    pub pci_address: String,
    /// The vendor tool's index, empty when it has none.
    pub index: String,
    /// The device's name in the AcceleratorInventory.
    pub device: String,
}

/// The labels of the per-device health and memory gauges.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct DeviceLabels {
    /// The Node.
    pub node: String,
    /// The device's name in the AcceleratorInventory.
    pub device: String,
    /// Vendor UUID, empty when unknown.
    pub uuid: String,
    /// PCI address, empty for non-PCI devices.
    pub pci_address: String,
}

/// A node-level series' labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct NodeLabel {
    /// The Node.
    pub node: String,
}

/// `hwaccel_node_devices_expected`'s labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ExpectedLabels {
    /// The Node.
    pub node: String,
    /// `annotation`, `instanceType` or `seen`.
    pub source: String,
}

/// One device's rows in the device series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRow {
    /// `hwaccel_device_info`'s labels.
    pub info: DeviceInfoLabels,
    /// Health is `healthy` (`Some(true)`), `degraded` or `unhealthy` (`Some(false)`), or not
    /// known (`None`: no series, so an alert on `== 0` fires only on a real finding and a
    /// node whose tools cannot report health does not page anyone).
    pub healthy: Option<bool>,
    /// Device memory in bytes, when known (no memory series otherwise).
    pub memory_bytes: Option<u64>,
}

impl DeviceRow {
    /// The row of one inventory device on `node`; `None` for the CPU, which is not an
    /// accelerator.
    pub fn of(node: &str, device: &InventoryDevice) -> Option<Self> {
        let text = |name: &str| device.text(name).unwrap_or_default();
        let family = text(attribute::FAMILY);
        if family == "cpu" {
            return None;
        }
        let index = match device.attributes.get(attribute::INDEX) {
            Some(DeviceAttribute::Int(i)) => i.to_string(),
            _ => String::new(),
        };
        let info = DeviceInfoLabels {
            node: bounded(node),
            vendor: bounded(&text(attribute::VENDOR)),
            family: bounded(&family),
            product: bounded(&text(attribute::PRODUCT)),
            uuid: bounded(&text(attribute::UUID)),
            serial: bounded(device.details.get("serial").map_or("", String::as_str)),
            pci_address: bounded(&text(attribute::PCI_BUS_ID).to_ascii_lowercase()),
            index,
            device: bounded(&device.name),
        };
        Some(Self {
            info,
            healthy: match crate::hardware::device_state::parse_health(Some(&text(
                attribute::HEALTH,
            ))) {
                HealthStatus::Healthy => Some(true),
                HealthStatus::Unknown => None,
                HealthStatus::Degraded | HealthStatus::Unhealthy => Some(false),
            },
            memory_bytes: device
                .capacity
                .get(attribute::MEMORY)
                .and_then(quantity::parse_whole),
        })
    }

    fn labels(&self) -> DeviceLabels {
        DeviceLabels {
            node: self.info.node.clone(),
            device: self.info.device.clone(),
            uuid: self.info.uuid.clone(),
            pci_address: self.info.pci_address.clone(),
        }
    }
}

/// `value` cut to [`MAX_LABEL_VALUE_LENGTH`] bytes at a character boundary.
fn bounded(value: &str) -> String {
    crate::names::truncate_at_char_boundary(value, MAX_LABEL_VALUE_LENGTH).to_string()
}

/// The node's count of expected, present and missing accelerators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCounts {
    /// What the node should have, and from where.
    pub expected: Expected,
    /// Accelerators the last detection saw.
    pub present: u32,
    /// Expected minus present, never below zero.
    pub missing: u32,
}

/// The device-level series of `docs/observability.md`.
#[derive(Debug, Clone, Default)]
pub struct DeviceMetrics {
    info: Family<DeviceInfoLabels, Gauge>,
    healthy: Family<DeviceLabels, Gauge>,
    memory_bytes: Family<DeviceLabels, Gauge>,
    expected: Family<ExpectedLabels, Gauge>,
    present: Family<NodeLabel, Gauge>,
    missing: Family<NodeLabel, Gauge>,
    /// The label sets set last time, so the ones no longer wanted can be removed.
    last: Arc<Mutex<LastSeries>>,
}

#[derive(Debug, Default)]
struct LastSeries {
    info: Vec<DeviceInfoLabels>,
    devices: Vec<DeviceLabels>,
    expected: Vec<ExpectedLabels>,
    nodes: Vec<NodeLabel>,
}

impl DeviceMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "hwaccel_device_info",
            "One series per published accelerator, always 1; join vendor exporters on uuid or pci_address",
            self.info.clone(),
        );
        registry.register(
            "hwaccel_device_healthy",
            "1 when the device's health is healthy",
            self.healthy.clone(),
        );
        registry.register(
            "hwaccel_device_memory_bytes",
            "Device memory as detected",
            self.memory_bytes.clone(),
        );
        registry.register(
            "hwaccel_node_devices_expected",
            "Accelerators the node should have (status.expectedDevices)",
            self.expected.clone(),
        );
        registry.register(
            "hwaccel_node_devices_present",
            "Accelerators the last detection saw",
            self.present.clone(),
        );
        registry.register(
            "hwaccel_node_devices_missing",
            "Expected minus present accelerators, never below zero",
            self.missing.clone(),
        );
    }

    /// Makes the series exactly `rows` and `counts` for `node`: rows of devices that left are
    /// removed, everything else is set to its current value.
    pub fn set(&self, node: &str, rows: &[DeviceRow], counts: NodeCounts) {
        let Ok(mut last) = self.last.lock() else {
            // A panic while holding the lock elsewhere; the series stay as they were.
            return;
        };
        let info: Vec<DeviceInfoLabels> = rows.iter().map(|r| r.info.clone()).collect();
        let devices: Vec<DeviceLabels> = rows.iter().map(DeviceRow::labels).collect();
        let with_health: Vec<DeviceLabels> = rows
            .iter()
            .filter(|r| r.healthy.is_some())
            .map(DeviceRow::labels)
            .collect();
        let with_memory: Vec<DeviceLabels> = rows
            .iter()
            .filter(|r| r.memory_bytes.is_some())
            .map(DeviceRow::labels)
            .collect();
        let node_label = NodeLabel {
            node: bounded(node),
        };
        let expected = ExpectedLabels {
            node: bounded(node),
            source: counts.expected.source.as_str().to_string(),
        };
        for gone in last.info.iter().filter(|l| !info.contains(l)) {
            self.info.remove(gone);
        }
        for gone in last.devices.iter().filter(|l| !with_health.contains(l)) {
            self.healthy.remove(gone);
        }
        for gone in last.devices.iter().filter(|l| !with_memory.contains(l)) {
            self.memory_bytes.remove(gone);
        }
        for gone in last.expected.iter().filter(|l| **l != expected) {
            self.expected.remove(gone);
        }
        for gone in last.nodes.iter().filter(|l| **l != node_label) {
            self.present.remove(gone);
            self.missing.remove(gone);
        }
        for row in rows {
            self.info.get_or_create(&row.info).set(1);
            let labels = row.labels();
            if let Some(healthy) = row.healthy {
                self.healthy.get_or_create(&labels).set(i64::from(healthy));
            }
            if let Some(bytes) = row.memory_bytes {
                self.memory_bytes
                    .get_or_create(&labels)
                    .set(i64::try_from(bytes).unwrap_or(i64::MAX));
            }
        }
        self.expected
            .get_or_create(&expected)
            .set(i64::from(counts.expected.count));
        self.present
            .get_or_create(&node_label)
            .set(i64::from(counts.present));
        self.missing
            .get_or_create(&node_label)
            .set(i64::from(counts.missing));
        *last = LastSeries {
            info,
            devices,
            expected: vec![expected],
            nodes: vec![node_label],
        };
    }
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
    /// Mount points under the host root that are not read-only (see
    /// [`super::host_mounts`]).
    pub writable_host_mounts: Gauge,
    /// The per-device and per-node accelerator series (not under the `hwaccel_agent` prefix).
    pub device_series: DeviceMetrics,
}

impl AgentMetrics {
    /// Creates the metrics and registers them: the operational ones under the
    /// `hwaccel_agent` prefix, the device series under their own names.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            detections: Counter::default(),
            backend_seconds: Family::new_with_constructor(backend_histogram),
            api_writes: Family::default(),
            errors: Family::default(),
            devices: Gauge::default(),
            stale_devices: Gauge::default(),
            warnings: Gauge::default(),
            writable_host_mounts: Gauge::default(),
            device_series: DeviceMetrics::default(),
        };
        metrics.device_series.register(registry);
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
        registry.register(
            "writable_host_mounts",
            "Mount points under the agent's host root that are not read-only (0 with recursive read-only mounts)",
            metrics.writable_host_mounts.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::AcceleratorInventorySpec;
    use crate::fleet::expected::ExpectedSource;
    use crate::testing::report::h100_x8;

    fn rows(node: &str, spec: &AcceleratorInventorySpec) -> Vec<DeviceRow> {
        spec.devices
            .iter()
            .filter_map(|d| DeviceRow::of(node, d))
            .collect()
    }

    fn exposition(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap_or_default();
        text
    }

    fn counts(expected: u32, present: u32) -> NodeCounts {
        NodeCounts {
            expected: Expected {
                count: expected,
                source: ExpectedSource::Seen,
            },
            present,
            missing: expected.saturating_sub(present),
        }
    }

    #[test]
    fn one_info_series_per_device_and_none_left_for_a_device_that_went() {
        let mut registry = Registry::default();
        let metrics = AgentMetrics::register(&mut registry);
        let report = h100_x8();
        let spec = AcceleratorInventorySpec::from_report("n1", &report);
        metrics
            .device_series
            .set("n1", &rows("n1", &spec), counts(8, 8));
        let text = exposition(&registry);
        let info: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("hwaccel_device_info{"))
            .collect();
        assert_eq!(info.len(), 8, "{text}");
        let first = &report.devices[0];
        let uuid = first.uuid.clone().unwrap_or_default();
        assert!(
            info.iter()
                .any(|l| l.contains("pci_address=\"0000:18:00.0\"")
                    && l.contains(&format!("uuid=\"{uuid}\""))
                    && l.contains("device=\"gpu-0000-18-00-0\"")
                    && l.contains("vendor=\"nvidia\"")
                    && l.contains("index=\"0\"")
                    && l.ends_with(" 1")),
            "{text}"
        );
        assert!(text.contains("hwaccel_device_memory_bytes{"), "{text}");
        assert!(
            text.contains("hwaccel_node_devices_expected{node=\"n1\",source=\"seen\"} 8"),
            "{text}"
        );
        assert!(
            text.contains("hwaccel_node_devices_missing{node=\"n1\"} 0"),
            "{text}"
        );
        // The operational series keep their prefix.
        assert!(text.contains("hwaccel_agent_detections_total"), "{text}");

        // One device leaves; its series go with it, and the source change replaces the old one.
        let mut fewer = report.clone();
        fewer.devices.retain(|d| d.id != "0000:18:00.0");
        let spec = AcceleratorInventorySpec::from_report("n1", &fewer);
        let annotation = NodeCounts {
            expected: Expected {
                count: 8,
                source: ExpectedSource::Annotation,
            },
            present: 7,
            missing: 1,
        };
        metrics
            .device_series
            .set("n1", &rows("n1", &spec), annotation);
        let text = exposition(&registry);
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("hwaccel_device_info{"))
                .count(),
            7
        );
        assert!(!text.contains("gpu-0000-18-00-0"), "{text}");
        assert!(!text.contains("source=\"seen\""), "{text}");
        assert!(
            text.contains("hwaccel_node_devices_missing{node=\"n1\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("hwaccel_node_devices_present{node=\"n1\"} 7"),
            "{text}"
        );
    }

    #[test]
    fn health_memory_and_bounded_labels() {
        let mut report = h100_x8();
        report.devices.truncate(3);
        report.devices[1].health.status = crate::hardware::HealthStatus::Unhealthy;
        report.devices[2].health.status = crate::hardware::HealthStatus::Unknown;
        report.devices[1].memory_bytes = None;
        report.devices[0].uuid = Some("U".repeat(300));
        let spec = AcceleratorInventorySpec::from_report("n1", &report);
        let rows = rows("n1", &spec);
        let health: Vec<Option<bool>> = rows.iter().map(|r| r.healthy).collect();
        assert_eq!(health, [Some(true), Some(false), None]);
        assert!(
            rows.iter()
                .all(|r| r.info.uuid.len() <= MAX_LABEL_VALUE_LENGTH)
        );
        let mut registry = Registry::default();
        let metrics = AgentMetrics::register(&mut registry);
        metrics.device_series.set("n1", &rows, counts(3, 3));
        let text = exposition(&registry);
        let count = |prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();
        assert_eq!(count("hwaccel_device_memory_bytes{"), 2, "{text}");
        // Unknown health is no series, not an unhealthy one.
        assert_eq!(count("hwaccel_device_healthy{"), 2, "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("hwaccel_device_healthy{")
                    && l.contains("gpu-0000-2a-00-0")
                    && l.ends_with(" 0")),
            "{text}"
        );
    }

    #[test]
    fn the_cpu_is_not_a_device_row() {
        let spec = AcceleratorInventorySpec::from_report("n", &crate::testing::report::cpu_only());
        assert!(rows("n", &spec).is_empty());
    }
}
