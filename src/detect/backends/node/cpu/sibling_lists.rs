//! Cores and sockets from sysfs, for kernels whose `/proc/cpuinfo` has no topology (arm64
//! prints no `physical id`/`core id`): cpu0's sibling lists under
//! `/sys/devices/system/cpu/cpu0/topology/`, and the kernel's CPU-list format they use.

use crate::detect::HostRoot;
use crate::hardware::CpuInfo;

/// Where cpuinfo has no topology (arm64 prints no `physical id`/`core id`), derives cores and
/// sockets from cpu0's sibling lists: threads per core and threads per package. Two reads,
/// rather than one per CPU, because all cores of a package are alike on the machines we see.
pub(super) fn fill_topology_from_sysfs(host: &HostRoot, cpu: &mut CpuInfo) {
    if cpu.cores.is_some() && cpu.sockets.is_some() {
        return;
    }
    let Some(threads) = cpu.threads else {
        return;
    };
    const TOPOLOGY: &str = "/sys/devices/system/cpu/cpu0/topology";
    let count = |names: &[&str]| {
        names.iter().find_map(|name| {
            host.read_trimmed(format!("{TOPOLOGY}/{name}"))
                .and_then(|list| cpulist_len(&list))
                .filter(|&n| n > 0)
        })
    };
    if cpu.cores.is_none()
        && let Some(per_core) = count(&["core_cpus_list", "thread_siblings_list"])
    {
        cpu.cores = Some(threads / per_core).filter(|&n| n > 0);
    }
    if cpu.sockets.is_none()
        && let Some(per_package) = count(&["package_cpus_list", "core_siblings_list"])
    {
        cpu.sockets = Some(threads.div_ceil(per_package)).filter(|&n| n > 0);
    }
}

/// Counts the CPUs in a kernel CPU list (`0-47,96-143` has 96). `None` when malformed.
pub fn cpulist_len(list: &str) -> Option<u32> {
    let mut total: u32 = 0;
    for range in list.trim().split(',').filter(|r| !r.is_empty()) {
        let count = match range.split_once('-') {
            Some((start, end)) => {
                let start: u32 = start.trim().parse().ok()?;
                let end: u32 = end.trim().parse().ok()?;
                end.checked_sub(start)?.checked_add(1)?
            }
            None => {
                range.trim().parse::<u32>().ok()?;
                1
            }
        };
        total = total.checked_add(count)?;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn counts_cpulists() {
        assert_eq!(cpulist_len("0-47,96-143"), Some(96));
        assert_eq!(cpulist_len("0\n"), Some(1));
        assert_eq!(cpulist_len(""), Some(0));
        assert_eq!(cpulist_len("4-2"), None);
        assert_eq!(cpulist_len("a-b"), None);
    }

    proptest! {
        #[test]
        fn cpulist_len_never_panics(s in ".*") {
            let _ = cpulist_len(&s);
        }

        #[test]
        fn cpulist_len_never_panics_on_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..4096)
        ) {
            let _ = cpulist_len(&String::from_utf8_lossy(&bytes));
        }
    }
}
