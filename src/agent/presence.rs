//! Debounces device disappearance so labels do not flap.
//!
//! A detection that does not see a device is weak evidence that the device is gone: the driver
//! may be reloading, the vendor tool may have timed out, the backend may have been disabled.
//! The tracker keeps every device it has seen and drops one only after it is missing from
//! `misses_to_remove` consecutive detections in which its backend ran *cleanly*. A detection
//! where the backend failed (raised a warning) or did not run is no evidence at all: the device
//! stays and its miss count does not move. Interconnect groups follow their member devices.
//!
//! While a backend is failing it may still report its devices from a poorer source (sysfs
//! without the vendor tool: no memory, no links); the tracker then publishes the last good copy
//! of each such device, so a broken tool never strips labels.
//!
//! The tracker can be seeded with what was published before a restart, so a restarted agent
//! whose first detection fails removes nothing.

use std::collections::{BTreeMap, BTreeSet};

use crate::detect::Report;
use crate::hardware::{Device, InterconnectGroup};

/// Default number of consecutive clean misses before a device is removed.
pub const DEFAULT_MISSES_TO_REMOVE: u32 = 3;

#[derive(Debug, Clone)]
struct Tracked {
    device: Device,
    misses: u32,
}

/// Remembers devices across detections and decides when a missing one is really gone.
#[derive(Debug, Clone)]
pub struct PresenceTracker {
    misses_to_remove: u32,
    devices: BTreeMap<String, Tracked>,
    interconnects: Vec<InterconnectGroup>,
}

impl PresenceTracker {
    /// A tracker removing devices after `misses_to_remove` clean misses (at least 1).
    pub fn new(misses_to_remove: u32) -> Self {
        Self {
            misses_to_remove: misses_to_remove.max(1),
            devices: BTreeMap::new(),
            interconnects: Vec::new(),
        }
    }

    /// Seeds the tracker with previously published devices and groups, as if they had just
    /// been seen.
    pub fn seed(&mut self, devices: Vec<Device>, interconnects: Vec<InterconnectGroup>) {
        for device in devices {
            self.devices
                .insert(device.id.clone(), Tracked { device, misses: 0 });
        }
        self.interconnects = interconnects;
    }

    /// Ids of devices currently kept although the last detection did not see them.
    pub fn stale_devices(&self) -> impl Iterator<Item = &str> {
        self.devices
            .values()
            .filter(|t| t.misses > 0)
            .map(|t| t.device.id.as_str())
    }

    /// Folds one detection in and returns the report to publish: the detection plus the
    /// devices (and their interconnect groups) that are missing but not yet considered gone.
    pub fn observe(&mut self, detected: &Report) -> Report {
        let failed: BTreeSet<&str> = detected
            .warnings
            .iter()
            .map(|w| w.backend.as_str())
            .collect();
        let ran_cleanly: BTreeSet<&str> = detected
            .backends
            .iter()
            .map(String::as_str)
            .filter(|backend| !failed.contains(backend))
            .collect();
        let seen: BTreeSet<&str> = detected.devices.iter().map(|d| d.id.as_str()).collect();

        let mut kept_missing = Vec::new();
        self.devices.retain(|id, tracked| {
            if seen.contains(id.as_str()) {
                return true;
            }
            if ran_cleanly.contains(tracked.device.backend.as_str()) {
                tracked.misses += 1;
            }
            let keep = tracked.misses < self.misses_to_remove;
            if keep {
                kept_missing.push(tracked.device.clone());
            }
            keep
        });
        let mut current = Vec::with_capacity(detected.devices.len());
        for device in &detected.devices {
            let tracked = self
                .devices
                .entry(device.id.clone())
                .or_insert_with(|| Tracked {
                    device: device.clone(),
                    misses: 0,
                });
            // A failing backend's report is the poorer one: keep the last good copy.
            if !failed.contains(device.backend.as_str()) {
                tracked.device = device.clone();
            }
            tracked.misses = 0;
            current.push(tracked.device.clone());
        }

        let mut published = detected.clone();
        published.devices = current;
        published.devices.extend(kept_missing);
        published.devices.sort_by(|a, b| a.id.cmp(&b.id));

        // Keep a previous group when some of its members are only kept (not seen, or seen only
        // by a failing backend) and the detection has no group of that kind and id any more.
        let kept: BTreeSet<&str> = self.devices.keys().map(String::as_str).collect();
        let freshly_seen: BTreeSet<&str> = detected
            .devices
            .iter()
            .filter(|d| !failed.contains(d.backend.as_str()))
            .map(|d| d.id.as_str())
            .collect();
        let carried: Vec<InterconnectGroup> = self
            .interconnects
            .iter()
            .filter(|group| {
                let has_stale_member = group
                    .devices
                    .iter()
                    .any(|d| !freshly_seen.contains(d.as_str()));
                let all_members_kept = group.devices.iter().all(|d| kept.contains(d.as_str()));
                let replaced = published
                    .interconnects
                    .iter()
                    .any(|g| g.kind == group.kind && g.id == group.id);
                has_stale_member && all_members_kept && !replaced
            })
            .cloned()
            .collect();
        published.interconnects.extend(carried);
        published
            .interconnects
            .sort_by(|a, b| (a.kind, &a.id).cmp(&(b.kind, &b.id)));
        self.interconnects = published.interconnects.clone();
        published
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::Warning;
    use crate::hardware::{Family, InterconnectKind, Vendor};

    fn gpu(id: &str) -> Device {
        Device::new(
            id,
            Vendor::Nvidia,
            Family::Gpu,
            "NVIDIA H100 80GB HBM3",
            "nvidia",
        )
    }

    fn report(ids: &[&str], nvidia_failed: bool) -> Report {
        let mut report = Report::empty();
        report.backends = vec!["nvidia".into(), "cpu".into()];
        report.devices = ids.iter().map(|id| gpu(id)).collect();
        if nvidia_failed {
            report.warnings.push(Warning {
                backend: "nvidia".into(),
                message: "nvidia-smi timed out".into(),
            });
        }
        report
    }

    fn ids(report: &Report) -> Vec<&str> {
        report.devices.iter().map(|d| d.id.as_str()).collect()
    }

    #[test]
    fn a_device_goes_only_after_the_configured_clean_misses() {
        let mut tracker = PresenceTracker::new(3);
        tracker.observe(&report(&["a", "b"], false));
        assert_eq!(ids(&tracker.observe(&report(&["a"], false))), ["a", "b"]);
        assert_eq!(ids(&tracker.observe(&report(&["a"], false))), ["a", "b"]);
        assert_eq!(tracker.stale_devices().collect::<Vec<_>>(), ["b"]);
        assert_eq!(ids(&tracker.observe(&report(&["a"], false))), ["a"]);
    }

    #[test]
    fn a_failing_detector_is_not_a_missing_device() {
        let mut tracker = PresenceTracker::new(2);
        tracker.observe(&report(&["a", "b"], false));
        for _ in 0..10 {
            assert_eq!(ids(&tracker.observe(&report(&[], true))), ["a", "b"]);
        }
        // Once the backend runs cleanly again, absence counts.
        tracker.observe(&report(&["a"], false));
        assert_eq!(ids(&tracker.observe(&report(&["a"], false))), ["a"]);
    }

    #[test]
    fn a_failing_backend_that_still_reports_devices_publishes_the_last_good_copies() {
        let mut tracker = PresenceTracker::new(2);
        let mut good = report(&["a"], false);
        good.devices[0].memory_bytes = Some(80 << 30);
        tracker.observe(&good);
        // The tool broke; sysfs still shows the GPU, but without memory.
        let published = tracker.observe(&report(&["a"], true));
        assert_eq!(published.devices[0].memory_bytes, Some(80 << 30));
    }

    #[test]
    fn a_backend_that_did_not_run_keeps_its_devices() {
        let mut tracker = PresenceTracker::new(1);
        tracker.observe(&report(&["a"], false));
        let mut cpu_only = Report::empty();
        cpu_only.backends = vec!["cpu".into()];
        assert_eq!(ids(&tracker.observe(&cpu_only)), ["a"]);
    }

    #[test]
    fn seeded_devices_survive_a_failing_first_detection() {
        let mut tracker = PresenceTracker::new(3);
        tracker.seed(vec![gpu("a")], Vec::new());
        assert_eq!(ids(&tracker.observe(&report(&[], true))), ["a"]);
    }

    #[test]
    fn a_returning_device_resets_its_count() {
        let mut tracker = PresenceTracker::new(2);
        tracker.observe(&report(&["a"], false));
        tracker.observe(&report(&[], false));
        tracker.observe(&report(&["a"], false));
        assert_eq!(ids(&tracker.observe(&report(&[], false))), ["a"]);
    }

    #[test]
    fn groups_of_kept_devices_are_carried_over() {
        let mut tracker = PresenceTracker::new(3);
        let mut first = report(&["a", "b"], false);
        first.interconnects.push(InterconnectGroup {
            kind: InterconnectKind::Nvswitch,
            id: "domain-0".into(),
            devices: vec!["a".into(), "b".into()],
            links_per_device: Some(18),
            bandwidth_gbps: None,
            topology: None,
        });
        tracker.observe(&first);
        assert_eq!(tracker.observe(&report(&[], true)).interconnects.len(), 1);
        // Also when the failing backend still lists the devices but no longer their links.
        assert_eq!(
            tracker
                .observe(&report(&["a", "b"], true))
                .interconnects
                .len(),
            1
        );
        // A clean detection without the group drops it.
        assert!(
            tracker
                .observe(&report(&["a", "b"], false))
                .interconnects
                .is_empty()
        );
    }
}
