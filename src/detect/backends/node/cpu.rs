//! The `cpu` backend: the host CPU's model, sockets, cores, threads, AI ISA flags, memory, and
//! the cgroup limits of the process.
//!
//! Sources, all read through [`HostRoot`](crate::detect::HostRoot), each parsed in a file of its own:
//! - `/proc/cpuinfo` (`cpuinfo.rs`): model and vendor, with arm64 core names from
//!   `arm_core_names.rs`, IBM Z machine types from `s390_machines.rs`; topology; the ISA
//!   flags, filtered in `isa_flags.rs`.
//! - `/proc/sys/kernel/arch` for the instruction set, inferred from cpuinfo when absent.
//! - `/sys/devices/system/cpu/cpu0/topology/*` where cpuinfo has no topology (arm64;
//!   `sibling_lists.rs`).
//! - `/proc/meminfo` `MemTotal` (`meminfo.rs`).
//! - `/proc/self/cgroup` and `/sys/fs/cgroup/...` for the memory and CPU limits
//!   (`cgroup_limits.rs`, which explains whose limits they are under each host root).

mod arm_core_names;
mod cgroup_limits;
mod cpuinfo;
mod isa_flags;
mod meminfo;
mod s390_machines;
mod sibling_lists;

pub use cgroup_limits::{
    CgroupPaths, parse_cpu_max, parse_memory_max, parse_proc_cgroup, parse_v1_cpu_quota,
    parse_v1_memory_limit,
};
pub use cpuinfo::parse_cpuinfo;
pub use isa_flags::{AI_FLAGS, ai_flags};
pub(crate) use meminfo::parse_kib_value;
pub use meminfo::parse_meminfo_total;
pub use sibling_lists::cpulist_len;

use crate::detect::{Backend, Context, Findings};
use crate::hardware::CpuInfo;

use cgroup_limits::cgroup_limits;
use sibling_lists::fill_topology_from_sysfs;

/// The `cpu` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu;

impl Backend for Cpu {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn detect(&self, ctx: &Context) -> Findings {
        let host = ctx.host();
        let cpuinfo = host.read("/proc/cpuinfo");
        let memory_bytes = host
            .read("/proc/meminfo")
            .and_then(|text| parse_meminfo_total(&text));
        let Some(cpuinfo) = cpuinfo else {
            // No procfs at all (an empty or foreign host root): nothing to say about the CPU.
            return match memory_bytes {
                Some(bytes) => Findings {
                    cpu: Some(CpuInfo {
                        memory_bytes: Some(bytes),
                        ..CpuInfo::default()
                    }),
                    ..Findings::default()
                },
                None => Findings::default(),
            };
        };
        let mut cpu = parse_cpuinfo(&cpuinfo);
        if let Some(arch) = host.read_trimmed("/proc/sys/kernel/arch") {
            cpu.arch = Some(arch);
        }
        fill_topology_from_sysfs(host, &mut cpu);
        cpu.memory_bytes = memory_bytes;
        let limits = cgroup_limits(host);
        cpu.cgroup_memory_limit_bytes = limits.memory_bytes;
        cpu.cgroup_cpu_limit_millis = limits.cpu_millis;
        Findings {
            cpu: Some(cpu),
            ..Findings::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::cpuinfo::tests::{GRACE, VM_CPUINFO};
    use super::*;
    use crate::detect::HostRoot;
    use crate::detect::testing::detect_on;
    use crate::detect::testing::write_host_file as write;

    #[test]
    fn detects_the_fixture_vm() {
        let findings = detect_on(&Cpu, "cpu-only-vm");
        let cpu = findings.cpu.expect("cpu facts");
        assert_eq!(
            cpu.model.as_deref(),
            Some("Intel(R) Xeon(R) Platinum 8488C")
        );
        assert_eq!(cpu.arch.as_deref(), Some("x86_64"));
        assert_eq!(cpu.threads, Some(8));
        assert_eq!(cpu.memory_bytes, Some(32_386_544 * 1024));
        assert_eq!(cpu.cgroup_memory_limit_bytes, Some(512 << 20));
        assert_eq!(cpu.cgroup_cpu_limit_millis, Some(2000));
        assert!(findings.warnings.is_empty());
    }

    #[test]
    fn the_tightest_ancestor_limit_binds() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "proc/cpuinfo", GRACE);
        write(root, "proc/self/cgroup", "0::/kubepods.slice/pod1/ctr\n");
        write(
            root,
            "sys/fs/cgroup/kubepods.slice/memory.max",
            "1073741824\n",
        );
        write(
            root,
            "sys/fs/cgroup/kubepods.slice/pod1/memory.max",
            "max\n",
        );
        write(
            root,
            "sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.max",
            "max\n",
        );
        write(
            root,
            "sys/fs/cgroup/kubepods.slice/pod1/cpu.max",
            "max 100000\n",
        );
        write(
            root,
            "sys/fs/cgroup/kubepods.slice/pod1/ctr/cpu.max",
            "150000 100000\n",
        );
        let topology = "sys/devices/system/cpu/cpu0/topology";
        write(root, &format!("{topology}/core_cpus_list"), "0\n");
        write(root, &format!("{topology}/package_cpus_list"), "0-1\n");
        let ctx = crate::detect::Context::new(
            HostRoot::new(root),
            crate::detect::CommandRunner::new(Vec::new()),
        );
        let cpu = Cpu.detect(&ctx).cpu.unwrap();
        assert_eq!(cpu.cgroup_memory_limit_bytes, Some(1 << 30));
        assert_eq!(cpu.cgroup_cpu_limit_millis, Some(1500));
        // arm64 topology comes from sysfs: one thread per core, both CPUs in one package.
        assert_eq!(
            (cpu.sockets, cpu.cores, cpu.threads),
            (Some(1), Some(2), Some(2))
        );
    }

    #[test]
    fn v1_limits_are_found_inside_a_container_mount() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "proc/cpuinfo", VM_CPUINFO);
        // The host path is listed, but the container's mount holds only its own cgroup.
        write(
            root,
            "proc/self/cgroup",
            "4:memory:/docker/0123abcd\n3:cpu,cpuacct:/docker/0123abcd\n",
        );
        write(
            root,
            "sys/fs/cgroup/memory/memory.limit_in_bytes",
            "2147483648\n",
        );
        write(root, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
        write(
            root,
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us",
            "100000\n",
        );
        let ctx = crate::detect::Context::new(
            HostRoot::new(root),
            crate::detect::CommandRunner::new(Vec::new()),
        );
        let cpu = Cpu.detect(&ctx).cpu.unwrap();
        assert_eq!(cpu.cgroup_memory_limit_bytes, Some(2 << 30));
        assert_eq!(cpu.cgroup_cpu_limit_millis, None);
    }

    #[test]
    fn an_empty_host_has_no_cpu_facts() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = crate::detect::Context::new(
            HostRoot::new(dir.path()),
            crate::detect::CommandRunner::new(Vec::new()),
        );
        assert_eq!(Cpu.detect(&ctx), Findings::default());
    }
}
