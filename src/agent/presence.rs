//! Debounces device disappearance so labels do not flap, and lets nothing stay that no
//! detection can see.
//!
//! A detection that does not see a device is weak evidence that the device is gone: the driver
//! may be reloading, the vendor tool may have timed out. The tracker keeps every device it has
//! seen and drops one only after it is missing from `misses_to_remove` consecutive detections.
//! A detection where the device's backend failed (raised a warning, or its thread never
//! reported) is no evidence at all: the device stays and its miss count does not move.
//! Interconnect groups follow their member devices.
//!
//! A device is kept only while a backend that runs can still report it. A device whose
//! backend is not among the detector's backends (switched off with `--backends`, or a name no
//! backend has, as a forged inventory entry may carry) can never be seen again, so every
//! detection counts as a miss and it goes after the same grace as any missing device. Before,
//! such a device was kept for ever, and the agent wrote it back even into a deleted inventory.
//!
//! While a backend is failing it may still report its devices from a poorer source (sysfs
//! without the vendor tool: no memory, no links); the tracker then publishes the last good copy
//! of each such device, so a broken tool never strips labels.
//!
//! The tracker can be seeded with what was published before a restart, so a restarted agent
//! whose first detection fails does not drop the node's labels at once. The stored inventory
//! is not evidence, though (anyone who can write it may have forged it): only devices of
//! backends this detector runs are seeded, a seeded device counts a miss on every detection
//! that does not see it, failing backend or not, so it lasts at most the grace unless a
//! detection confirms it, and the first sighting replaces the stored copy with the detected
//! one (even from a failing backend), so no stored attribute outlives a detection.

use std::collections::{BTreeMap, BTreeSet};

use crate::hardware::Report;
use crate::hardware::{Device, InterconnectGroup};

/// Default number of consecutive clean misses before a device is removed.
pub const DEFAULT_MISSES_TO_REMOVE: u32 = 3;

#[derive(Debug, Clone)]
struct Tracked {
    device: Device,
    misses: u32,
    /// Seeded from the stored inventory and not seen by a detection since.
    unconfirmed: bool,
}

/// Remembers devices across detections and decides when a missing one is really gone.
#[derive(Debug, Clone)]
pub struct PresenceTracker {
    misses_to_remove: u32,
    /// The backends the detector runs: the only ones that can see a device again.
    backends: BTreeSet<String>,
    devices: BTreeMap<String, Tracked>,
    interconnects: Vec<InterconnectGroup>,
}

impl PresenceTracker {
    /// A tracker removing devices after `misses_to_remove` misses (at least 1), for a
    /// detector running `backends`.
    pub fn new<I, S>(misses_to_remove: u32, backends: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            misses_to_remove: misses_to_remove.max(1),
            backends: backends.into_iter().map(Into::into).collect(),
            devices: BTreeMap::new(),
            interconnects: Vec::new(),
        }
    }

    /// Seeds the tracker with previously published devices and groups: those of backends
    /// this detector runs, as unconfirmed (see the module docs); the others are dropped and
    /// their ids returned, for the log.
    pub fn seed(
        &mut self,
        devices: Vec<Device>,
        interconnects: Vec<InterconnectGroup>,
    ) -> Vec<String> {
        let mut dropped = Vec::new();
        for device in devices {
            if !self.backends.contains(&device.backend) {
                dropped.push(device.id);
                continue;
            }
            self.devices.insert(
                device.id.clone(),
                Tracked {
                    device,
                    misses: 0,
                    unconfirmed: true,
                },
            );
        }
        // A group is carried only while all its members are kept (see `observe`), so the
        // groups of dropped devices go on the first detection.
        self.interconnects = interconnects;
        dropped
    }

    /// Ids of devices currently kept although the last detection did not see them.
    pub fn stale_devices(&self) -> impl Iterator<Item = &str> {
        self.devices
            .values()
            .filter(|t| t.misses > 0)
            .map(|t| t.device.id.as_str())
    }

    /// Ids of devices seeded from the stored inventory that no detection has seen since: kept
    /// for the grace, but no evidence that the node has them (they must not raise the most
    /// devices the node has been seen with, see `fleet::expected`).
    pub fn unconfirmed_devices(&self) -> impl Iterator<Item = &str> {
        self.devices
            .values()
            .filter(|t| t.unconfirmed)
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
        let reported: BTreeSet<&str> = detected.backends.iter().map(String::as_str).collect();
        // No evidence either way: a backend of ours that failed or did not report at all (the
        // detection thread failed). A backend that is not ours is never excused.
        let ours = &self.backends;
        let excused = |backend: &str| {
            ours.contains(backend) && (failed.contains(backend) || !reported.contains(backend))
        };
        let seen: BTreeSet<&str> = detected.devices.iter().map(|d| d.id.as_str()).collect();

        let mut kept_missing = Vec::new();
        self.devices.retain(|id, tracked| {
            if seen.contains(id.as_str()) {
                return true;
            }
            if tracked.unconfirmed || !excused(&tracked.device.backend) {
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
                    unconfirmed: false,
                });
            // A failing backend's report is the poorer one: keep the last good copy, but
            // only one a detection made (a seeded copy is the stored inventory's).
            if tracked.unconfirmed || !failed.contains(device.backend.as_str()) {
                tracked.device = device.clone();
            }
            tracked.misses = 0;
            tracked.unconfirmed = false;
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
    use crate::hardware::Warning;
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

    /// A tracker for a detector running the nvidia and cpu backends.
    fn tracker(misses: u32) -> PresenceTracker {
        PresenceTracker::new(misses, ["nvidia", "cpu"])
    }

    fn ids(report: &Report) -> Vec<&str> {
        report.devices.iter().map(|d| d.id.as_str()).collect()
    }

    #[test]
    fn a_device_goes_only_after_the_configured_clean_misses() {
        let mut tracker = tracker(3);
        tracker.observe(&report(&["a", "b"], false));
        assert_eq!(ids(&tracker.observe(&report(&["a"], false))), ["a", "b"]);
        assert_eq!(ids(&tracker.observe(&report(&["a"], false))), ["a", "b"]);
        assert_eq!(tracker.stale_devices().collect::<Vec<_>>(), ["b"]);
        assert_eq!(ids(&tracker.observe(&report(&["a"], false))), ["a"]);
    }

    #[test]
    fn a_failing_detector_is_not_a_missing_device() {
        let mut tracker = tracker(2);
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
        let mut tracker = tracker(2);
        let mut good = report(&["a"], false);
        good.devices[0].memory_bytes = Some(80 << 30);
        tracker.observe(&good);
        // The tool broke; sysfs still shows the GPU, but without memory.
        let published = tracker.observe(&report(&["a"], true));
        assert_eq!(published.devices[0].memory_bytes, Some(80 << 30));
    }

    #[test]
    fn a_backend_of_ours_that_did_not_report_keeps_its_devices() {
        // The detection thread failed: no backend reported, one warning from the agent.
        let mut tracker = tracker(1);
        tracker.observe(&report(&["a"], false));
        let mut nothing = Report::empty();
        nothing.warnings.push(Warning {
            backend: "agent".into(),
            message: "detection thread failed".into(),
        });
        for _ in 0..5 {
            assert_eq!(ids(&tracker.observe(&nothing)), ["a"]);
        }
    }

    /// A detection by a detector without the nvidia backend (switched off).
    fn cpu_only() -> Report {
        let mut cpu_only = Report::empty();
        cpu_only.backends = vec!["cpu".into()];
        cpu_only
    }

    #[test]
    fn a_switched_off_backends_devices_expire_after_the_same_grace() {
        // Seen while nvidia ran; then the agent runs without it. Before, "a" stayed for ever.
        let mut tracker = tracker(3);
        tracker.observe(&report(&["a"], false));
        let mut tracker = PresenceTracker {
            backends: ["cpu".to_string()].into(),
            ..tracker
        };
        assert_eq!(ids(&tracker.observe(&cpu_only())), ["a"]);
        assert_eq!(ids(&tracker.observe(&cpu_only())), ["a"]);
        assert_eq!(tracker.stale_devices().collect::<Vec<_>>(), ["a"]);
        assert!(ids(&tracker.observe(&cpu_only())).is_empty());
        assert!(ids(&tracker.observe(&cpu_only())).is_empty());
    }

    #[test]
    fn a_device_of_an_unknown_backend_expires_even_while_every_backend_fails() {
        // A name no backend has is never excused: failing backends say nothing about it.
        let mut tracker = tracker(2);
        let mut forged = report(&[], false);
        let mut phantom = gpu("phantom");
        phantom.backend = "made-up".into();
        forged.devices.push(phantom);
        tracker.observe(&forged);
        assert_eq!(ids(&tracker.observe(&report(&[], true))), ["phantom"]);
        assert!(ids(&tracker.observe(&report(&[], true))).is_empty());
    }

    #[test]
    fn seeded_devices_survive_a_failing_first_detection() {
        let mut tracker = tracker(3);
        assert!(tracker.seed(vec![gpu("a")], Vec::new()).is_empty());
        assert_eq!(ids(&tracker.observe(&report(&[], true))), ["a"]);
    }

    #[test]
    fn a_seeded_device_lasts_only_the_grace_unless_a_detection_sees_it() {
        // Before, a seeded device stayed as long as its backend kept failing: a forged
        // inventory entry survived the restart for good.
        let mut tracker = tracker(3);
        tracker.seed(vec![gpu("a"), gpu("forged")], Vec::new());
        assert_eq!(
            ids(&tracker.observe(&report(&["a"], true))),
            ["a", "forged"]
        );
        assert_eq!(
            ids(&tracker.observe(&report(&["a"], true))),
            ["a", "forged"]
        );
        assert_eq!(tracker.stale_devices().collect::<Vec<_>>(), ["forged"]);
        assert_eq!(ids(&tracker.observe(&report(&["a"], true))), ["a"]);
        // "a" was seen, so from now on it is a device like any other: a failing backend
        // keeps it.
        for _ in 0..5 {
            assert_eq!(ids(&tracker.observe(&report(&[], true))), ["a"]);
        }
    }

    #[test]
    fn seeding_drops_devices_no_backend_of_this_detector_can_see() {
        let mut unknown = gpu("unknown");
        unknown.backend = "made-up".into();
        let mut gaudi = gpu("gaudi");
        gaudi.backend = "intel-gaudi".into();
        let mut tracker = tracker(3);
        let dropped = tracker.seed(vec![gpu("a"), unknown, gaudi], Vec::new());
        assert_eq!(dropped, ["unknown", "gaudi"]);
        assert_eq!(ids(&tracker.observe(&report(&[], true))), ["a"]);
    }

    #[test]
    fn a_seeded_copy_never_outlives_a_detection_even_a_failing_ones() {
        // The stored inventory says 800 GB; the failing tool's sysfs fallback has no memory.
        // The stored copy is not a "last good copy": the detected one is published.
        let mut forged = gpu("a");
        forged.memory_bytes = Some(800 << 30);
        forged.model = "NVIDIA B300".into();
        let mut tracker = tracker(2);
        tracker.seed(vec![forged], Vec::new());
        let published = tracker.observe(&report(&["a"], true));
        assert_eq!(published.devices[0].memory_bytes, None);
        assert_eq!(published.devices[0].model, "NVIDIA H100 80GB HBM3");
        // And a later good copy is kept while the tool fails again.
        let mut good = report(&["a"], false);
        good.devices[0].memory_bytes = Some(80 << 30);
        tracker.observe(&good);
        let published = tracker.observe(&report(&["a"], true));
        assert_eq!(published.devices[0].memory_bytes, Some(80 << 30));
    }

    #[test]
    fn a_returning_device_resets_its_count() {
        let mut tracker = tracker(2);
        tracker.observe(&report(&["a"], false));
        tracker.observe(&report(&[], false));
        tracker.observe(&report(&["a"], false));
        assert_eq!(ids(&tracker.observe(&report(&[], false))), ["a"]);
    }

    #[test]
    fn groups_of_kept_devices_are_carried_over() {
        let mut tracker = tracker(3);
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
