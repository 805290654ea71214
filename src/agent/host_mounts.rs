//! Which of the agent's host mounts are writable: every mount point at or under the host root
//! (`/host`) that `/proc/self/mountinfo` does not show read-only.
//!
//! The chart mounts the host's `/sys`, `/dev` and a few files read-only, but on a runtime
//! without recursive read-only mounts (containerd < 2.0: `recursiveReadOnly: Disabled` in the
//! pod status) only the top of each mount is read-only: submounts such as the host's
//! `/dev/shm`, `/dev/mqueue` or the cgroup hierarchies under `/sys/fs/cgroup` stay writable
//! (issue 28). The agent checks this once at start, without side effects (it reads its own
//! mountinfo; it never tries a write), and reports the paths: a log line, the
//! `hwaccel_agent_writable_host_mounts` gauge and the inventory's `HostMountsWritable`
//! condition.
//!
//! A mount is read-only when its per-mount options or its superblock options say `ro`.
//! Whether the agent's user may write to a writable mount is a matter of file permissions
//! (`/dev/shm` is world-writable, cgroup files need root); the report names the mounts and
//! leaves that to the reader, which errs on the side of saying too much.

use std::path::{Component, Path};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::conditions;

/// The condition type the agent sets from this check.
pub const HOST_MOUNTS_WRITABLE: &str = "HostMountsWritable";

/// Most paths named in the condition message; the rest are counted.
const MAX_NAMED: usize = 10;

/// Most mountinfo lines read: a node has hundreds, a hostile or broken one is cut here.
const MAX_LINES: usize = 65_536;

/// The writable mount points at or under `host_root`, as host paths (`/dev/shm`), sorted and
/// without duplicates, from the text of `/proc/self/mountinfo`. Empty for a host root of `/`
/// (the agent run on the host itself has nothing mounted for it) or a relative one.
pub fn writable_under(mountinfo: &str, host_root: &Path) -> Vec<String> {
    let Some(root) = normal_root(host_root) else {
        return Vec::new();
    };
    let mut found: Vec<String> = mountinfo
        .lines()
        .take(MAX_LINES)
        .filter_map(parse_line)
        .filter(|mount| !mount.read_only)
        .filter_map(|mount| host_path(&mount.point, &root))
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Reads this process's mountinfo and returns [`writable_under`] `host_root`; empty when it
/// cannot be read (not Linux), which is said in a debug line.
pub fn check(host_root: &Path) -> Vec<String> {
    match crate::detect::read_at_most(Path::new("/proc/self/mountinfo"), 16 << 20) {
        Ok((bytes, _cut)) => writable_under(&String::from_utf8_lossy(&bytes), host_root),
        Err(err) => {
            tracing::debug!(error = %err, "cannot read /proc/self/mountinfo; host mounts not checked");
            Vec::new()
        }
    }
}

/// The `HostMountsWritable` condition for `writable` (paths named up to `MAX_NAMED`).
pub fn condition(writable: &[String], generation: Option<i64>, now: &Time) -> Condition {
    if writable.is_empty() {
        return conditions::condition(
            HOST_MOUNTS_WRITABLE,
            Some(false),
            "ReadOnly",
            "no mount under the agent's host root is writable",
            generation,
            now,
        );
    }
    let shown: Vec<&str> = writable
        .iter()
        .take(MAX_NAMED)
        .map(String::as_str)
        .collect();
    let mut message = format!(
        "{} host path(s) are mounted writable in the agent's pod (recursive read-only mounts \
         need containerd >= 2.0 or CRI-O >= 1.30; see docs/security.md): {}",
        writable.len(),
        shown.join(", ")
    );
    if writable.len() > MAX_NAMED {
        message.push_str(&format!(" and {} more", writable.len() - MAX_NAMED));
    }
    conditions::condition(
        HOST_MOUNTS_WRITABLE,
        Some(true),
        "WritableSubmounts",
        &message,
        generation,
        now,
    )
}

/// One mountinfo line, the parts this check needs.
struct Mount {
    point: String,
    read_only: bool,
}

/// `id parent major:minor root mountpoint options [optional...] - fstype source superoptions`
fn parse_line(line: &str) -> Option<Mount> {
    let (before, after) = line.split_once(" - ")?;
    let mut fields = before.split_ascii_whitespace();
    let point = unescape(fields.nth(4)?);
    let options = fields.next()?;
    let super_options = after.split_ascii_whitespace().nth(2).unwrap_or("");
    let has_ro = |opts: &str| opts.split(',').any(|o| o == "ro");
    Some(Mount {
        point,
        read_only: has_ro(options) || has_ro(super_options),
    })
}

/// Mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Some(value) = std::str::from_utf8(&bytes[i + 1..i + 4])
                .ok()
                .and_then(|digits| u8::from_str_radix(digits, 8).ok())
        {
            out.push(value);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `host_root` as a normal absolute path without a trailing slash, or `None` for `/` (or a
/// relative path, which mountinfo never shows).
fn normal_root(host_root: &Path) -> Option<String> {
    let mut normal = String::new();
    let mut components = host_root.components();
    if components.next() != Some(Component::RootDir) {
        return None;
    }
    for component in components {
        match component {
            Component::Normal(part) => {
                normal.push('/');
                normal.push_str(&part.to_string_lossy());
            }
            Component::CurDir => {}
            _ => return None,
        }
    }
    (!normal.is_empty()).then_some(normal)
}

/// The host path of mount point `point` when it is `root` or under it.
fn host_path(point: &str, root: &str) -> Option<String> {
    if point == root {
        return Some("/".to_string());
    }
    let rest = point.strip_prefix(root)?;
    rest.starts_with('/').then(|| rest.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The agent's pod on containerd 1.7 (cgroup v1): the tops are read-only, what the host
    /// has mounted below them is not.
    const CONTAINERD_1: &str = "\
1590 1450 0:163 / / ro,relatime master:400 - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
1600 1590 0:22 / /host/sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs rw
1601 1600 0:26 / /host/sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755
1602 1601 0:27 / /host/sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,pids
1603 1601 0:28 / /host/sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory
1610 1590 0:5 / /host/dev ro,nosuid,relatime - devtmpfs udev rw,size=8G
1611 1610 0:23 / /host/dev/shm rw,nosuid,nodev - tmpfs tmpfs rw
1612 1610 0:24 / /host/dev/pts rw,nosuid,noexec,relatime - devpts devpts rw,gid=5,mode=620
1620 1590 0:25 /cpuinfo /host/proc/cpuinfo ro,nosuid - proc proc rw
1630 1590 0:30 / /tmp rw,relatime - tmpfs tmpfs rw
1631 1590 0:31 / /host-other rw,relatime - tmpfs tmpfs rw
1632 1610 0:32 / /host/dev/odd\\040name rw - tmpfs tmpfs rw
";

    #[test]
    fn submounts_left_writable_are_named_as_host_paths() {
        assert_eq!(
            writable_under(CONTAINERD_1, Path::new("/host")),
            [
                "/dev/odd name",
                "/dev/pts",
                "/dev/shm",
                "/sys/fs/cgroup/memory",
                "/sys/fs/cgroup/pids"
            ]
        );
        // The same with a trailing slash or `.`; nothing outside the host root counts.
        assert_eq!(writable_under(CONTAINERD_1, Path::new("/host/./")).len(), 5);
    }

    #[test]
    fn recursive_read_only_mounts_are_not_reported() {
        let rro: String = CONTAINERD_1
            .lines()
            .map(|line| {
                line.replacen(" rw,", " ro,", 1)
                    .replacen(" rw - ", " ro - ", 1)
            })
            .map(|line| format!("{line}\n"))
            .collect();
        let left = writable_under(&rro, Path::new("/host"));
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn the_superblock_read_only_flag_counts() {
        let line = "1 0 0:1 / /host/boot rw - ext4 /dev/sda1 ro,relatime\n";
        assert!(writable_under(line, Path::new("/host")).is_empty());
    }

    #[test]
    fn the_hosts_own_root_or_a_relative_root_reports_nothing() {
        assert!(writable_under(CONTAINERD_1, Path::new("/")).is_empty());
        assert!(writable_under(CONTAINERD_1, Path::new("host")).is_empty());
        assert!(writable_under(CONTAINERD_1, Path::new("/host/../etc")).is_empty());
    }

    #[test]
    fn the_condition_names_a_bounded_list() {
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(0).unwrap());
        let clean = condition(&[], Some(1), &now);
        assert_eq!(
            (clean.status.as_str(), clean.reason.as_str()),
            ("False", "ReadOnly")
        );
        let many: Vec<String> = (0..25).map(|i| format!("/sys/fs/cgroup/c{i:02}")).collect();
        let c = condition(&many, Some(1), &now);
        assert_eq!(c.status, "True");
        assert!(c.message.starts_with("25 host path(s)"), "{}", c.message);
        assert!(
            c.message.ends_with("/sys/fs/cgroup/c09 and 15 more"),
            "{}",
            c.message
        );
        let long = vec!["/x".repeat(5000)];
        assert!(
            condition(&long, None, &now).message.chars().count() <= conditions::MAX_MESSAGE_CHARS
        );
    }

    proptest! {
        #[test]
        fn never_panics(text in ".*") {
            let _ = writable_under(&text, Path::new("/host"));
        }
    }
}
