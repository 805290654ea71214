//! Expected versus present accelerators on this node: what the `DevicesMissing` condition,
//! the `hwaccel.io/devices-missing` label and the `hwaccel_node_devices_*` series say.
//!
//! "Present" is what the last detection really saw. The presence tracker keeps a device that
//! detection misses published for a few cycles (so labels and placements do not flap); such a
//! kept device counts as missing here, so the condition fires on the first clean miss. A
//! backend that failed is no evidence of absence: the tracker does not count its devices as
//! missed, so neither does this.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::conditions::{self, DEVICES_MISSING};
use crate::api::{InventoryDevice, attribute};
use crate::fleet::expected::{EXPECTED_DEVICES_ANNOTATION, Expected, ExpectedSource};
use crate::hardware::Report;

/// The condition's reason while devices are missing.
pub const REASON_MISSING: &str = "DevicesMissing";
/// The condition's reason while every expected device is seen.
pub const REASON_PRESENT: &str = "AllDevicesPresent";

/// Device names listed in the condition message; the rest are counted.
const NAMES_IN_MESSAGE: usize = 8;

/// The comparison for one node after one detection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicesMissing {
    /// What the node should have, and from where.
    pub expected: Expected,
    /// The instance type when that is the source, for the message.
    pub instance_type: Option<String>,
    /// Accelerators the last detection saw.
    pub present: u32,
    /// Inventory names of the published devices the last detection did not see, sorted.
    pub not_seen: Vec<String>,
}

impl DevicesMissing {
    /// Compares `expected` with `published` (the tracker's output), of which `stale` (ids)
    /// were not seen by the last detection; `devices` are the inventory's entries, for names.
    pub fn new(
        expected: Expected,
        instance_type: Option<&str>,
        published: &Report,
        stale: &[String],
        devices: &[InventoryDevice],
    ) -> Self {
        let stale: BTreeSet<&str> = stale.iter().map(String::as_str).collect();
        let names: BTreeMap<String, &str> = devices
            .iter()
            .map(|d| {
                let id = d.text(attribute::ID).unwrap_or_else(|| d.name.clone());
                (id, d.name.as_str())
            })
            .collect();
        let mut present = 0u32;
        let mut not_seen = Vec::new();
        for device in published.accelerators() {
            if stale.contains(device.id.as_str()) {
                let name = names.get(&device.id).copied().unwrap_or(device.id.as_str());
                not_seen.push(name.to_string());
            } else {
                present = present.saturating_add(1);
            }
        }
        not_seen.sort();
        Self {
            expected,
            instance_type: (expected.source == ExpectedSource::InstanceType)
                .then(|| instance_type.unwrap_or_default().to_string()),
            present,
            not_seen,
        }
    }

    /// Expected minus present, never below zero.
    pub fn missing(&self) -> u32 {
        self.expected.missing(self.present)
    }

    /// Where the expected count comes from, in words.
    fn source_text(&self) -> String {
        match self.expected.source {
            ExpectedSource::Annotation => {
                format!("the Node annotation {EXPECTED_DEVICES_ANNOTATION}")
            }
            ExpectedSource::InstanceType => format!(
                "instance type {}",
                self.instance_type.as_deref().unwrap_or("")
            ),
            ExpectedSource::Seen => "the most this node has been seen with".to_string(),
        }
    }

    /// The `DevicesMissing` condition: `True` with a message naming what is missing and how
    /// to acknowledge a permanent removal, or `False`.
    pub fn condition(&self, node: &str, generation: Option<i64>, now: &Time) -> Condition {
        let missing = self.missing();
        let expected = self.expected.count;
        let source = self.source_text();
        if missing == 0 {
            let message = format!(
                "{} accelerators seen, {expected} expected (from {source})",
                self.present
            );
            return conditions::condition(
                DEVICES_MISSING,
                Some(false),
                REASON_PRESENT,
                &message,
                generation,
                now,
            );
        }
        let mut message = format!(
            "{missing} of {expected} expected accelerators (from {source}) are not seen by the \
             last detection; {} seen.",
            self.present
        );
        if !self.not_seen.is_empty() {
            let listed: Vec<&str> = self
                .not_seen
                .iter()
                .take(NAMES_IN_MESSAGE)
                .map(String::as_str)
                .collect();
            message.push_str(&format!(" Not seen: {}", listed.join(", ")));
            if self.not_seen.len() > listed.len() {
                message.push_str(&format!(" and {} more", self.not_seen.len() - listed.len()));
            }
            message.push('.');
        }
        let unnamed = usize::try_from(missing)
            .unwrap_or(usize::MAX)
            .saturating_sub(self.not_seen.len());
        if unnamed > 0 {
            message.push_str(&format!(" {unnamed} no longer listed in this inventory."));
        }
        message.push_str(&format!(
            " If the removal is permanent, acknowledge it with `kubectl annotate node {node} \
             {EXPECTED_DEVICES_ANNOTATION}={} --overwrite`.",
            self.present
        ));
        conditions::condition(
            DEVICES_MISSING,
            Some(true),
            REASON_MISSING,
            &message,
            generation,
            now,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::AcceleratorInventorySpec;
    use crate::testing::report::h100_x8;
    use k8s_openapi::jiff::Timestamp;

    fn now() -> Time {
        Time(Timestamp::UNIX_EPOCH)
    }

    fn seen(count: u32) -> Expected {
        Expected {
            count,
            source: ExpectedSource::Seen,
        }
    }

    #[test]
    fn a_kept_device_counts_as_missing_and_is_named() {
        let report = h100_x8();
        let spec = AcceleratorInventorySpec::from_report("n", &report);
        let stale = vec![report.devices[7].id.clone()];
        let result = DevicesMissing::new(seen(8), None, &report, &stale, &spec.devices);
        assert_eq!((result.present, result.missing()), (7, 1));
        let condition = result.condition("node-a", Some(3), &now());
        assert_eq!(condition.status, "True");
        assert_eq!(condition.reason, REASON_MISSING);
        assert_eq!(condition.observed_generation, Some(3));
        assert!(
            condition.message.contains("1 of 8"),
            "{}",
            condition.message
        );
        assert!(
            condition.message.contains("gpu-0000-db-00-0"),
            "{}",
            condition.message
        );
        assert!(
            condition
                .message
                .contains("kubectl annotate node node-a hwaccel.io/expected-devices=7"),
            "{}",
            condition.message
        );
    }

    #[test]
    fn devices_already_dropped_are_counted_and_the_source_is_named() {
        let mut report = h100_x8();
        report.devices.truncate(6);
        let spec = AcceleratorInventorySpec::from_report("n", &report);
        let expected = Expected {
            count: 8,
            source: ExpectedSource::InstanceType,
        };
        let result =
            DevicesMissing::new(expected, Some("p5.48xlarge"), &report, &[], &spec.devices);
        assert_eq!(result.missing(), 2);
        let message = result.condition("n", None, &now()).message;
        assert!(message.contains("instance type p5.48xlarge"), "{message}");
        assert!(message.contains("2 no longer listed"), "{message}");
    }

    #[test]
    fn all_present_is_false_and_more_than_expected_is_not_missing() {
        let report = h100_x8();
        let spec = AcceleratorInventorySpec::from_report("n", &report);
        let expected = Expected {
            count: 4,
            source: ExpectedSource::Annotation,
        };
        let result = DevicesMissing::new(expected, None, &report, &[], &spec.devices);
        assert_eq!(result.missing(), 0);
        let condition = result.condition("n", None, &now());
        assert_eq!(condition.status, "False");
        assert_eq!(condition.reason, REASON_PRESENT);
        assert!(
            condition.message.contains(EXPECTED_DEVICES_ANNOTATION),
            "{}",
            condition.message
        );
    }

    #[test]
    fn a_long_list_of_names_is_cut() {
        let report = h100_x8();
        let spec = AcceleratorInventorySpec::from_report("n", &report);
        let stale: Vec<String> = report.devices.iter().map(|d| d.id.clone()).collect();
        let result = DevicesMissing::new(
            Expected {
                count: 1024,
                source: ExpectedSource::Annotation,
            },
            None,
            &report,
            &stale,
            &spec.devices,
        );
        let message = result.condition("n", None, &now()).message;
        assert!(message.contains("1024 of 1024"), "{message}");
        assert!(message.contains("1016 no longer listed"), "{message}");
        assert!(message.chars().count() <= conditions::MAX_MESSAGE_CHARS);
    }
}
