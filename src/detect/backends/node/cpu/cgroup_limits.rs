//! The memory and CPU limits of the process that runs detection, from `/proc/self/cgroup` and
//! the cgroup files under `/sys/fs/cgroup`: `memory.max`/`cpu.max` (v2) or
//! `memory.limit_in_bytes`/`cpu.cfs_quota_us` (v1), the smallest along the path to the root.
//!
//! Cgroup limits belong to the *process that runs detection*, so they are read from
//! `/proc/self/cgroup`. Through a host root of `/` that is the real process. Through any other
//! root the same paths are resolved under the root: a fixture tree then describes the process it
//! was captured from, and in the agent's pod (`/host`) the host's procfs reports our own
//! process relative to our cgroup namespace (`0::/`), so the walk ends at the host's root cgroup
//! and reports no limit, which is the right answer for a node report: the agent pod's own limits
//! say nothing about the node.

use crate::detect::HostRoot;

/// The cgroups a process belongs to, from `/proc/<pid>/cgroup`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupPaths {
    /// The unified (v2) hierarchy path, from the `0::/path` line.
    pub unified: Option<String>,
    /// The v1 `memory` controller path.
    pub memory: Option<String>,
    /// The v1 `cpu` controller path.
    pub cpu: Option<String>,
}

/// Parses `/proc/self/cgroup`: lines of `hierarchy-id:controllers:path`.
pub fn parse_proc_cgroup(text: &str) -> CgroupPaths {
    let mut paths = CgroupPaths::default();
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.trim();
        if !path.starts_with('/') {
            continue;
        }
        if id == "0" && controllers.is_empty() {
            paths.unified.get_or_insert_with(|| path.to_string());
            continue;
        }
        for controller in controllers.split(',') {
            let slot = match controller {
                "memory" => &mut paths.memory,
                "cpu" => &mut paths.cpu,
                _ => continue,
            };
            slot.get_or_insert_with(|| path.to_string());
        }
    }
    paths
}

/// A v2 `memory.max`: a byte count, or `max` for none.
pub fn parse_memory_max(text: &str) -> Option<u64> {
    let text = text.trim();
    if text == "max" {
        return None;
    }
    text.parse().ok()
}

/// A v2 `cpu.max` (`quota period`, quota `max` for none) in millicores:
/// `200000 100000` is 2000.
pub fn parse_cpu_max(text: &str) -> Option<u64> {
    let mut words = text.split_ascii_whitespace();
    let quota = words.next()?;
    let period: u64 = words.next().map_or(Some(100_000), |p| p.parse().ok())?;
    if quota == "max" {
        return None;
    }
    millicores(quota.parse().ok()?, period)
}

/// A v1 `memory.limit_in_bytes`. Unlimited is printed as the largest page-aligned counter
/// (9223372036854771712 on 4 KiB pages), so anything from 2^60 up means no limit.
pub fn parse_v1_memory_limit(text: &str) -> Option<u64> {
    let limit: u64 = text.trim().parse().ok()?;
    (limit < 1 << 60).then_some(limit)
}

/// A v1 CFS quota and period (`cpu.cfs_quota_us`, `-1` for none; `cpu.cfs_period_us`) in
/// millicores.
pub fn parse_v1_cpu_quota(quota: &str, period: &str) -> Option<u64> {
    let quota: i64 = quota.trim().parse().ok()?;
    let period: u64 = period.trim().parse().ok()?;
    millicores(u64::try_from(quota).ok()?, period)
}

fn millicores(quota: u64, period: u64) -> Option<u64> {
    if period == 0 || quota == 0 {
        return None;
    }
    quota.checked_mul(1000).map(|q| q / period)
}

/// The effective limits of the detecting process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Limits {
    pub(super) memory_bytes: Option<u64>,
    pub(super) cpu_millis: Option<u64>,
}

/// Deepest cgroup nesting walked; real hierarchies are a handful of levels deep.
const MAX_CGROUP_DEPTH: usize = 32;

/// The limits that bind this process: the smallest along its cgroup's path to the root, since
/// a parent's limit caps every child. v1 controllers win over the unified hierarchy because a
/// hybrid host lists both and puts the controllers on v1.
pub(super) fn cgroup_limits(host: &HostRoot) -> Limits {
    let Some(text) = host.read("/proc/self/cgroup") else {
        return Limits::default();
    };
    let paths = parse_proc_cgroup(&text);
    if paths.memory.is_some() || paths.cpu.is_some() {
        let memory = paths.memory.as_deref().and_then(|path| {
            smallest_on_path("/sys/fs/cgroup/memory", path, |dir| {
                host.read(format!("{dir}/memory.limit_in_bytes"))
                    .and_then(|t| parse_v1_memory_limit(&t))
            })
        });
        let cpu = paths.cpu.as_deref().and_then(|path| {
            // `cpu` is usually a link to the co-mounted `cpu,cpuacct`; try both.
            ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"]
                .iter()
                .find(|mount| host.exists(mount))
                .and_then(|mount| {
                    smallest_on_path(mount, path, |dir| {
                        let quota = host.read(format!("{dir}/cpu.cfs_quota_us"))?;
                        let period = host.read(format!("{dir}/cpu.cfs_period_us"))?;
                        parse_v1_cpu_quota(&quota, &period)
                    })
                })
        });
        return Limits {
            memory_bytes: memory,
            cpu_millis: cpu,
        };
    }
    let Some(path) = paths.unified.as_deref() else {
        return Limits::default();
    };
    Limits {
        memory_bytes: smallest_on_path("/sys/fs/cgroup", path, |dir| {
            host.read(format!("{dir}/memory.max"))
                .and_then(|t| parse_memory_max(&t))
        }),
        cpu_millis: smallest_on_path("/sys/fs/cgroup", path, |dir| {
            host.read(format!("{dir}/cpu.max"))
                .and_then(|t| parse_cpu_max(&t))
        }),
    }
}

/// The smallest limit found in `mount/path` and each of its ancestors up to `mount`. Walking
/// up also finds the limit inside a v1 container, where `/proc/self/cgroup` shows the host's
/// path but the mount holds only the container's own subtree.
fn smallest_on_path(
    mount: &str,
    path: &str,
    limit_in: impl Fn(&str) -> Option<u64>,
) -> Option<u64> {
    let components: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != "." && *c != "..")
        .take(MAX_CGROUP_DEPTH)
        .collect();
    (0..=components.len())
        .rev()
        .filter_map(|depth| {
            let mut dir = mount.to_string();
            for component in &components[..depth] {
                dir.push('/');
                dir.push_str(component);
            }
            limit_in(&dir)
        })
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_cgroup_membership() {
        let v2 = parse_proc_cgroup("0::/system.slice/hwaccel-detect.service\n");
        assert_eq!(
            v2.unified.as_deref(),
            Some("/system.slice/hwaccel-detect.service")
        );
        let v1 = parse_proc_cgroup(
            "12:cpu,cpuacct:/kubepods/pod1/abc\n4:memory:/kubepods/pod1/abc\n0::/\n",
        );
        assert_eq!(v1.cpu.as_deref(), Some("/kubepods/pod1/abc"));
        assert_eq!(v1.memory.as_deref(), Some("/kubepods/pod1/abc"));
        assert_eq!(v1.unified.as_deref(), Some("/"));
        assert_eq!(
            parse_proc_cgroup("garbage\n1:name=systemd\n"),
            CgroupPaths::default()
        );
    }

    #[test]
    fn parses_limits() {
        assert_eq!(parse_memory_max("max\n"), None);
        assert_eq!(parse_memory_max("536870912\n"), Some(536_870_912));
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("200000 100000\n"), Some(2000));
        assert_eq!(parse_cpu_max("50000 100000"), Some(500));
        assert_eq!(parse_cpu_max("50000 0"), None);
        assert_eq!(parse_v1_memory_limit("9223372036854771712\n"), None);
        assert_eq!(parse_v1_memory_limit("1073741824\n"), Some(1 << 30));
        assert_eq!(parse_v1_cpu_quota("-1\n", "100000\n"), None);
        assert_eq!(parse_v1_cpu_quota("150000\n", "100000\n"), Some(1500));
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in ".*") {
            let _ = parse_proc_cgroup(&s);
            let _ = parse_memory_max(&s);
            let _ = parse_cpu_max(&s);
            let _ = parse_v1_memory_limit(&s);
            let _ = parse_v1_cpu_quota(&s, &s);
        }

        #[test]
        fn parse_proc_cgroup_never_panics_on_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..4096)
        ) {
            let _ = parse_proc_cgroup(&String::from_utf8_lossy(&bytes));
        }
    }
}
