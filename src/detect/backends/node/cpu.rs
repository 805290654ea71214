//! The host CPU: model, sockets, cores, threads, AI ISA flags, memory, and the cgroup limits of
//! the process.
//!
//! Sources, all read through [`HostRoot`]:
//! - `/proc/cpuinfo`: model and vendor (x86 `model name`/`vendor_id`; arm64 has no model name,
//!   so `CPU implementer`/`CPU part` are mapped to names), topology (`physical id`, `core id`,
//!   `cpu cores`, `siblings`) and the ISA flags (`flags` on x86, `Features` on arm64).
//! - `/proc/sys/kernel/arch` for the instruction set, inferred from cpuinfo when absent.
//! - `/sys/devices/system/cpu/cpu0/topology/*` where cpuinfo has no topology (arm64).
//! - `/proc/meminfo` `MemTotal`.
//! - `/proc/self/cgroup` and `/sys/fs/cgroup/...` for the memory and CPU limits.
//!
//! Cgroup limits belong to the *process that runs detection*, so they are read from
//! `/proc/self/cgroup`. Through a host root of `/` that is the real process. Through any other
//! root the same paths are resolved under the root: a fixture tree then describes the process it
//! was captured from, and in the agent's pod (`/host`) the host's procfs reports our own
//! process relative to our cgroup namespace (`0::/`), so the walk ends at the host's root cgroup
//! and reports no limit, which is the right answer for a node report: the agent pod's own limits
//! say nothing about the node.
//!
//! `/proc/cpuinfo` of a 192-thread machine is about 300 KB, almost all of it repeated `flags`
//! lines, so the parser makes one pass, borrows every value from the input, and reads only the
//! first processor's flags.

use crate::detect::{Backend, Context, Findings, HostRoot, parse_u64};
use crate::hardware::CpuInfo;

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

/// ISA extensions that matter for running models on the CPU, by their `/proc/cpuinfo` names.
/// x86: AVX2/AVX-512 vector paths, VNNI int8 dot products, BF16/FP16 vector math and the AMX
/// tile engine. arm64: SVE/SVE2 vectors, BF16, int8 matrix multiply and dot product.
pub const AI_FLAGS: &[&str] = &[
    "amx_bf16",
    "amx_fp16",
    "amx_int8",
    "amx_tile",
    "asimddp",
    "avx2",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "avx512f",
    "avx_vnni",
    "bf16",
    "i8mm",
    "sve",
    "sve2",
];

/// Parses `/proc/cpuinfo` into model, vendor, an inferred architecture, topology and AI flags.
/// Memory and cgroup limits are left empty.
///
/// Topology: threads are the larger of the `processor` count and `siblings` x sockets, cores
/// the larger of the distinct (`physical id`, `core id`) pairs and `cpu cores` x sockets. On a
/// real machine the two agree; the per-package figures also keep a shortened capture (a few
/// processor entries) honest.
pub fn parse_cpuinfo(text: &str) -> CpuInfo {
    let mut scan = Scan::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        scan.field(key.trim(), value.trim());
    }
    scan.finish()
}

/// What one pass over cpuinfo collected, borrowing from the text.
#[derive(Default)]
struct Scan<'a> {
    processors: u32,
    model_name: Option<&'a str>,
    vendor_id: Option<&'a str>,
    flags: Option<&'a str>,
    cpu_cores: Option<u32>,
    siblings: Option<u32>,
    /// The current processor's `physical id` and `core id`, recorded at the next `processor`.
    package: Option<u32>,
    core: Option<u32>,
    packages: Vec<u32>,
    cores: Vec<(u32, u32)>,
    /// arm64 `CPU implementer`, and distinct (implementer, part) pairs in order of appearance.
    implementer: Option<u32>,
    parts: Vec<(u32, u32)>,
    arm_architecture: Option<u32>,
    riscv_isa: Option<&'a str>,
}

impl<'a> Scan<'a> {
    fn field(&mut self, key: &str, value: &'a str) {
        match key {
            "processor" => {
                self.end_processor();
                self.processors += 1;
            }
            "model name" => first(&mut self.model_name, value),
            "vendor_id" => first(&mut self.vendor_id, value),
            // x86 calls them flags, arm64 features; only the first processor's are read
            // because the kernel prints the same set for every processor.
            "flags" | "Features" => first(&mut self.flags, value),
            "cpu cores" => self.cpu_cores = self.cpu_cores.or_else(|| value.parse().ok()),
            "siblings" => self.siblings = self.siblings.or_else(|| value.parse().ok()),
            "physical id" => self.package = value.parse().ok(),
            "core id" => self.core = value.parse().ok(),
            "CPU implementer" => self.implementer = hex_u32(value),
            "CPU part" => {
                if let (Some(implementer), Some(part)) = (self.implementer, hex_u32(value))
                    && !self.parts.contains(&(implementer, part))
                {
                    self.parts.push((implementer, part));
                }
            }
            "CPU architecture" => {
                self.arm_architecture = self.arm_architecture.or_else(|| value.parse().ok());
            }
            "isa" => first(&mut self.riscv_isa, value),
            _ => {}
        }
    }

    /// Records the (package, core) pair of the processor whose block just ended.
    fn end_processor(&mut self) {
        if let Some(package) = self.package.take() {
            if !self.packages.contains(&package) {
                self.packages.push(package);
            }
            if let Some(core) = self.core.take()
                && !self.cores.contains(&(package, core))
            {
                self.cores.push((package, core));
            }
        }
        self.core = None;
    }

    fn finish(mut self) -> CpuInfo {
        self.end_processor();
        let sockets = u32::try_from(self.packages.len()).ok().filter(|&n| n > 0);
        let per_socket = |per_package: Option<u32>| {
            per_package
                .zip(sockets)
                .and_then(|(n, sockets)| n.checked_mul(sockets))
                .filter(|&n| n > 0)
        };
        let counted_cores = u32::try_from(self.cores.len()).ok().filter(|&n| n > 0);
        let cores = counted_cores.max(per_socket(self.cpu_cores));
        let threads = Some(self.processors)
            .filter(|&n| n > 0)
            .max(per_socket(self.siblings));
        let (vendor, model) = self.identity();
        CpuInfo {
            model,
            vendor,
            arch: self.inferred_arch(),
            sockets,
            cores,
            threads,
            ai_flags: ai_flags(self.flags.unwrap_or_default()),
            ..CpuInfo::default()
        }
    }

    /// Vendor and model: x86 names itself; arm64 gives only MIDR fields to look up.
    fn identity(&self) -> (Option<String>, Option<String>) {
        let model_name = self.model_name.filter(|m| !m.is_empty());
        let vendor_id = self.vendor_id.filter(|v| !v.is_empty());
        if model_name.is_some() || vendor_id.is_some() || self.parts.is_empty() {
            return (
                vendor_id.map(str::to_string),
                model_name.map(str::to_string),
            );
        }
        let (first_implementer, _) = self.parts[0];
        let vendor = implementer_name(first_implementer)
            .map(str::to_string)
            .unwrap_or_else(|| format!("0x{first_implementer:02x}"));
        let names: Vec<String> = self
            .parts
            .iter()
            .map(|&(implementer, part)| {
                part_name(implementer, part)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("part 0x{part:03x}"))
            })
            .collect();
        // big.LITTLE parts list every core type: `Blizzard-M2 + Avalanche-M2`.
        (Some(vendor), Some(names.join(" + ")))
    }

    fn inferred_arch(&self) -> Option<String> {
        if let Some(isa) = self.riscv_isa {
            let bits = if isa.starts_with("rv64") { "64" } else { "32" };
            return Some(format!("riscv{bits}"));
        }
        if self.implementer.is_some() {
            // `CPU architecture: 8` is printed by both arm64 and 32-bit kernels on v8 cores,
            // but a 32-bit kernel also prints a `model name` (`ARMv7 Processor rev 4 (v7l)`).
            let older = matches!(self.arm_architecture, Some(version) if version < 8);
            let arch = if self.model_name.is_some() || older {
                "arm"
            } else {
                "aarch64"
            };
            return Some(arch.to_string());
        }
        let flags = self.flags?;
        self.vendor_id?;
        let long_mode = flags.split_ascii_whitespace().any(|f| f == "lm");
        Some(if long_mode { "x86_64" } else { "i686" }.to_string())
    }
}

fn first<'a>(slot: &mut Option<&'a str>, value: &'a str) {
    if slot.is_none() {
        *slot = Some(value);
    }
}

fn hex_u32(text: &str) -> Option<u32> {
    parse_u64(text).and_then(|n| u32::try_from(n).ok())
}

/// The AI-relevant subset of a flags line, sorted and without duplicates.
pub fn ai_flags(flags: &str) -> Vec<String> {
    let mut found: Vec<String> = flags
        .split_ascii_whitespace()
        .filter(|flag| AI_FLAGS.contains(flag))
        .map(str::to_string)
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Names of arm64 implementers (`CPU implementer`), as `lscpu` prints them.
fn implementer_name(implementer: u32) -> Option<&'static str> {
    Some(match implementer {
        0x41 => "ARM",
        0x42 => "Broadcom",
        0x43 => "Cavium",
        0x46 => "Fujitsu",
        0x48 => "HiSilicon",
        0x4e => "NVIDIA",
        0x50 => "APM",
        0x51 => "Qualcomm",
        0x61 => "Apple",
        0x6d => "Microsoft",
        0xc0 => "Ampere",
        _ => return None,
    })
}

/// Names of the arm64 cores found in servers and AI machines, by (implementer, part). Neoverse
/// cores are what the cloud parts are built on: Graviton2 and Ampere Altra are N1, Graviton3
/// is V1, Graviton4 and NVIDIA Grace are V2, Azure Cobalt 100 is N2.
fn part_name(implementer: u32, part: u32) -> Option<&'static str> {
    Some(match (implementer, part) {
        (0x41, 0xd08) => "Cortex-A72",
        (0x41, 0xd0b) => "Cortex-A76",
        (0x41, 0xd0c) => "Neoverse-N1",
        (0x41, 0xd40) => "Neoverse-V1",
        (0x41, 0xd49) => "Neoverse-N2",
        (0x41, 0xd4f) => "Neoverse-V2",
        (0x41, 0xd84) => "Neoverse-V3",
        (0x41, 0xd8e) => "Neoverse-N3",
        (0x43, 0x0af) => "ThunderX2-99xx",
        (0x46, 0x001) => "A64FX",
        (0x48, 0xd01) => "Kunpeng-920",
        (0x4e, 0x004) => "Carmel",
        (0x4e, 0x010) => "Olympus",
        (0x51, 0x001) => "Oryon",
        (0x61, 0x022) => "Icestorm-M1",
        (0x61, 0x023) => "Firestorm-M1",
        (0x61, 0x024) => "Icestorm-M1-Pro",
        (0x61, 0x025) => "Firestorm-M1-Pro",
        (0x61, 0x028) => "Icestorm-M1-Max",
        (0x61, 0x029) => "Firestorm-M1-Max",
        (0x61, 0x032) => "Blizzard-M2",
        (0x61, 0x033) => "Avalanche-M2",
        (0x61, 0x034) => "Blizzard-M2-Pro",
        (0x61, 0x035) => "Avalanche-M2-Pro",
        (0x61, 0x038) => "Blizzard-M2-Max",
        (0x61, 0x039) => "Avalanche-M2-Max",
        (0x6d, 0xd49) => "Azure-Cobalt-100",
        (0xc0, 0xac3) => "Ampere-1",
        (0xc0, 0xac4) => "Ampere-1a",
        _ => return None,
    })
}

/// Where cpuinfo has no topology (arm64 prints no `physical id`/`core id`), derives cores and
/// sockets from cpu0's sibling lists: threads per core and threads per package. Two reads,
/// rather than one per CPU, because all cores of a package are alike on the machines we see.
fn fill_topology_from_sysfs(host: &HostRoot, cpu: &mut CpuInfo) {
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

/// `MemTotal` from `/proc/meminfo`, in bytes.
pub fn parse_meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    parse_kib_value(line.strip_prefix("MemTotal:")?)
}

/// `  32386544 kB` as bytes. The kernel's `kB` means KiB.
pub(crate) fn parse_kib_value(text: &str) -> Option<u64> {
    let mut words = text.split_ascii_whitespace();
    let number: u64 = words.next()?.parse().ok()?;
    match words.next() {
        None | Some("kB") => number.checked_mul(1024),
        Some(_) => None,
    }
}

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
struct Limits {
    memory_bytes: Option<u64>,
    cpu_millis: Option<u64>,
}

/// Deepest cgroup nesting walked; real hierarchies are a handful of levels deep.
const MAX_CGROUP_DEPTH: usize = 32;

/// The limits that bind this process: the smallest along its cgroup's path to the root, since
/// a parent's limit caps every child. v1 controllers win over the unified hierarchy because a
/// hybrid host lists both and puts the controllers on v1.
fn cgroup_limits(host: &HostRoot) -> Limits {
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
    use crate::detect::testing::detect_on;
    use crate::detect::testing::write_host_file as write;
    use proptest::prelude::*;
    use std::fmt::Write as _;

    const VM_CPUINFO: &str = include_str!("../../../../fixtures/hosts/cpu-only-vm/proc/cpuinfo");

    const GRACE: &str = "processor\t: 0\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm aes \
pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 \
asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg dcpodp sve2 sveaes \
svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svebf16 i8mm bf16 dgh bti\n\
CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd4f\n\
CPU revision\t: 0\n\nprocessor\t: 1\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd\n\
CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd4f\n\
CPU revision\t: 0\n";

    /// A 2-socket, 96-core, 192-thread Sapphire Rapids cpuinfo built from one real entry.
    pub(crate) fn cpuinfo_192_threads() -> String {
        let entry = VM_CPUINFO.split("\n\n").next().unwrap_or_default();
        let mut text = String::new();
        for cpu in 0..192u32 {
            let package = u32::from(cpu % 96 >= 48);
            let core = cpu % 48;
            for line in entry.lines() {
                let line = match line.split_once(':').map(|(k, _)| k.trim()) {
                    Some("processor") => format!("processor\t: {cpu}"),
                    Some("physical id") => format!("physical id\t: {package}"),
                    Some("core id") => format!("core id\t\t: {core}"),
                    Some("siblings") => "siblings\t: 96".to_string(),
                    Some("cpu cores") => "cpu cores\t: 48".to_string(),
                    _ => line.to_string(),
                };
                let _ = writeln!(text, "{line}");
            }
            text.push('\n');
        }
        text
    }

    #[test]
    fn parses_a_sapphire_rapids_vm() {
        let cpu = parse_cpuinfo(VM_CPUINFO);
        assert_eq!(
            cpu.model.as_deref(),
            Some("Intel(R) Xeon(R) Platinum 8488C")
        );
        assert_eq!(cpu.vendor.as_deref(), Some("GenuineIntel"));
        assert_eq!(cpu.arch.as_deref(), Some("x86_64"));
        assert_eq!(
            (cpu.sockets, cpu.cores, cpu.threads),
            (Some(1), Some(4), Some(8))
        );
        assert_eq!(
            cpu.ai_flags,
            [
                "amx_bf16",
                "amx_int8",
                "amx_tile",
                "avx2",
                "avx512_bf16",
                "avx512_fp16",
                "avx512_vnni",
                "avx512f",
                "avx_vnni"
            ]
        );
    }

    #[test]
    fn counts_a_two_socket_box() {
        let cpu = parse_cpuinfo(&cpuinfo_192_threads());
        assert_eq!(
            (cpu.sockets, cpu.cores, cpu.threads),
            (Some(2), Some(96), Some(192))
        );
    }

    #[test]
    fn a_shortened_capture_keeps_per_package_counts() {
        // Two entries of a 2-socket 64-core/128-thread part: one from each package.
        let text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7763 \
64-Core Processor\nphysical id\t: 0\nsiblings\t: 128\ncore id\t\t: 0\ncpu cores\t: 64\n\
flags\t\t: fpu lm avx2\n\nprocessor\t: 128\nphysical id\t: 1\nsiblings\t: 128\ncore id\t\t: 0\n\
cpu cores\t: 64\n";
        let cpu = parse_cpuinfo(text);
        assert_eq!(
            (cpu.sockets, cpu.cores, cpu.threads),
            (Some(2), Some(128), Some(256))
        );
        assert_eq!(cpu.ai_flags, ["avx2"]);
    }

    #[test]
    fn names_arm64_cores_from_midr() {
        let cpu = parse_cpuinfo(GRACE);
        assert_eq!(cpu.vendor.as_deref(), Some("ARM"));
        assert_eq!(cpu.model.as_deref(), Some("Neoverse-V2"));
        assert_eq!(cpu.arch.as_deref(), Some("aarch64"));
        assert_eq!(cpu.threads, Some(2));
        assert_eq!(cpu.sockets, None);
        assert_eq!(cpu.ai_flags, ["asimddp", "bf16", "i8mm", "sve", "sve2"]);

        let graviton3 = GRACE.replace("0xd4f", "0xd40");
        assert_eq!(
            parse_cpuinfo(&graviton3).model.as_deref(),
            Some("Neoverse-V1")
        );
        let unknown = GRACE.replace("0xd4f", "0xfff").replace("0x41", "0x99");
        let cpu = parse_cpuinfo(&unknown);
        assert_eq!(cpu.vendor.as_deref(), Some("0x99"));
        assert_eq!(cpu.model.as_deref(), Some("part 0xfff"));
    }

    #[test]
    fn lists_every_core_type_of_a_hybrid_soc() {
        let m2 = "processor\t: 0\nFeatures\t: fp asimd asimddp\nCPU implementer\t: 0x61\n\
CPU architecture: 8\nCPU part\t: 0x032\n\nprocessor\t: 4\nFeatures\t: fp asimd asimddp\n\
CPU implementer\t: 0x61\nCPU architecture: 8\nCPU part\t: 0x033\n";
        let cpu = parse_cpuinfo(m2);
        assert_eq!(cpu.vendor.as_deref(), Some("Apple"));
        assert_eq!(cpu.model.as_deref(), Some("Blizzard-M2 + Avalanche-M2"));
    }

    #[test]
    fn counts_cpulists() {
        assert_eq!(cpulist_len("0-47,96-143"), Some(96));
        assert_eq!(cpulist_len("0\n"), Some(1));
        assert_eq!(cpulist_len(""), Some(0));
        assert_eq!(cpulist_len("4-2"), None);
        assert_eq!(cpulist_len("a-b"), None);
    }

    #[test]
    fn parses_meminfo() {
        let text = include_str!("../../../../fixtures/hosts/cpu-only-vm/proc/meminfo");
        assert_eq!(parse_meminfo_total(text), Some(32_386_544 * 1024));
        assert_eq!(parse_meminfo_total("MemTotal: lots"), None);
        assert_eq!(parse_meminfo_total("MemTotal: 5 MB"), None);
    }

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

    #[test]
    fn garbage_cpuinfo_gives_nothing_rather_than_nonsense() {
        let cpu = parse_cpuinfo("\0\0: :\nprocessor\nflags avx2\n::::\n");
        assert_eq!(cpu, CpuInfo::default());
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in ".*") {
            let _ = parse_cpuinfo(&s);
            let _ = parse_meminfo_total(&s);
            let _ = parse_proc_cgroup(&s);
            let _ = parse_memory_max(&s);
            let _ = parse_cpu_max(&s);
            let _ = parse_v1_memory_limit(&s);
            let _ = parse_v1_cpu_quota(&s, &s);
            let _ = cpulist_len(&s);
        }

        #[test]
        fn parsers_never_panic_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let s = String::from_utf8_lossy(&bytes);
            let _ = parse_cpuinfo(&s);
            let _ = parse_proc_cgroup(&s);
            let _ = cpulist_len(&s);
        }

        #[test]
        fn cpuinfo_fields_in_any_order_never_panic(
            lines in proptest::collection::vec(
                (prop::sample::select(vec![
                    "processor", "physical id", "core id", "cpu cores", "siblings",
                    "CPU implementer", "CPU part", "flags", "model name", "vendor_id",
                ]), "[0-9a-fx ]{0,12}"),
                0..64,
            )
        ) {
            let text: String = lines.iter().map(|(k, v)| format!("{k}\t: {v}\n")).collect();
            let cpu = parse_cpuinfo(&text);
            if let (Some(cores), Some(threads)) = (cpu.cores, cpu.threads) {
                prop_assert!(cores > 0 && threads > 0);
            }
        }
    }
}
