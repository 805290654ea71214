//! Notices when devices appear or disappear between detection intervals.
//!
//! sysfs does not emit inotify events, and `/dev` seen through a hostPath mount may not
//! either, so instead of inotify the agent compares a cheap fingerprint — the sorted entry
//! names of `/dev`, `/dev/dri`, `/dev/accel`, `/sys/class/drm` and `/sys/class/accel` — every
//! few seconds. A handful of `readdir` calls is far cheaper than a detection, and the same code
//! works on bare metal, in a pod and on fixture trees.

use crate::detect::HostRoot;

/// The directories whose listings change when accelerators come and go.
pub const WATCHED_DIRS: [&str; 5] = [
    "/dev",
    "/dev/dri",
    "/dev/accel",
    "/sys/class/drm",
    "/sys/class/accel",
];

/// A fingerprint of the watched directories' listings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceFingerprint(Vec<Vec<String>>);

impl DeviceFingerprint {
    /// Reads the current fingerprint under a host root.
    pub fn read(host: &HostRoot) -> Self {
        Self(WATCHED_DIRS.iter().map(|dir| host.list(dir)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_device_node_changes_the_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("dev")).unwrap();
        let host = HostRoot::new(dir.path());
        let before = DeviceFingerprint::read(&host);
        assert_eq!(before, DeviceFingerprint::read(&host));
        std::fs::write(dir.path().join("dev/nvidia0"), "").unwrap();
        assert_ne!(before, DeviceFingerprint::read(&host));
    }
}
