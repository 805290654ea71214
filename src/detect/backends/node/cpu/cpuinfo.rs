//! `/proc/cpuinfo` in one pass: model and vendor (x86 `model name`/`vendor_id`; arm64 has no
//! model name, so `CPU implementer`/`CPU part` are looked up in `arm_core_names.rs`), the
//! instruction set where `/proc/sys/kernel/arch` is missing, sockets, cores and threads
//! (`physical id`, `core id`, `cpu cores`, `siblings`), and the first processor's ISA flags
//! (`flags` on x86, `Features` on arm64).
//!
//! POWER and IBM Z print neither `model name` nor the arm64 MIDR fields. POWER names the core
//! in `cpu` (`POWER9 (raw), altivec supported`); IBM Z prints one header for the machine
//! (`vendor_id : IBM/S390`, `# processors : 4`, `max thread id : 0`) and a
//! `processor N: ... machine = 2964` line per CPU, whose machine type names the generation
//! (`s390_machines.rs`).
//!
//! `/proc/cpuinfo` of a 192-thread machine is about 300 KB, almost all of it repeated `flags`
//! lines, so the parser makes one pass, borrows every value from the input, and reads only the
//! first processor's flags.

use crate::detect::parse_u64;
use crate::hardware::CpuInfo;

use super::arm_core_names::{implementer_name, part_name};
use super::isa_flags::ai_flags;
use super::s390_machines::machine_name;

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
    /// POWER's `cpu` line (`POWER8E (raw), altivec supported`).
    power_cpu: Option<&'a str>,
    /// IBM Z: `# processors`, the `processor N:` lines seen, the first machine type, and
    /// `max thread id` (0 when SMT is off).
    s390_declared: Option<u32>,
    s390_lines: u32,
    s390_machine: Option<&'a str>,
    s390_max_thread: Option<u32>,
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
            // Only POWER's `cpu` names a core; other architectures do not print the key.
            "cpu" if value.starts_with("POWER") => first(&mut self.power_cpu, value),
            "# processors" => self.s390_declared = value.parse().ok(),
            "max thread id" => self.s390_max_thread = value.parse().ok(),
            _ => {
                if let Some(id) = key.strip_prefix("processor ")
                    && id.trim().parse::<u32>().is_ok()
                {
                    self.s390_processor(value);
                }
            }
        }
    }

    /// One `processor N: version = FF,  identification = 2733E8,  machine = 2964` line.
    fn s390_processor(&mut self, value: &'a str) {
        self.s390_lines += 1;
        if self.s390_machine.is_none() {
            self.s390_machine = value
                .split(',')
                .filter_map(|part| part.split_once('='))
                .find(|(name, _)| name.trim() == "machine")
                .map(|(_, machine)| machine.trim())
                .filter(|machine| !machine.is_empty());
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
        let threads = Some(self.processors)
            .filter(|&n| n > 0)
            .max(per_socket(self.siblings))
            .max(Some(self.s390_lines).filter(|&n| n > 0))
            .max(self.s390_declared.filter(|&n| n > 0));
        // IBM Z says how many threads each core runs (`max thread id` + 1); other
        // architectures without `core id` get their cores from sysfs.
        let s390_cores = self
            .s390_max_thread
            .and_then(|max| threads.map(|threads| threads / (max + 1)))
            .filter(|&n| n > 0);
        let cores = counted_cores.max(per_socket(self.cpu_cores)).or(s390_cores);
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

    /// Vendor and model: x86 names itself, POWER names its core, IBM Z its machine type, and
    /// arm64 gives only MIDR fields to look up.
    fn identity(&self) -> (Option<String>, Option<String>) {
        let model_name = self.model_name.filter(|m| !m.is_empty());
        let vendor_id = self.vendor_id.filter(|v| !v.is_empty());
        if model_name.is_some() || (vendor_id.is_some() && self.s390_machine.is_none()) {
            return (
                vendor_id.map(str::to_string),
                model_name.map(str::to_string),
            );
        }
        if let Some(machine) = self.s390_machine {
            return (vendor_id.map(str::to_string), Some(machine_name(machine)));
        }
        if let Some(cpu) = self.power_cpu {
            return (Some("IBM".to_string()), Some(power_core(cpu).to_string()));
        }
        if self.parts.is_empty() {
            return (None, None);
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
        if let Some(cpu) = self.power_cpu {
            // Little-endian Linux needs POWER8 or later, and every current distribution for
            // POWER8+ is little-endian; older cores only ran big-endian Linux.
            let generation: u32 = cpu
                .trim_start_matches("POWER")
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap_or(0);
            let arch = if generation >= 8 { "ppc64le" } else { "ppc64" };
            return Some(arch.to_string());
        }
        if self.vendor_id == Some("IBM/S390") {
            // 31-bit s390 kernels are long gone; every IBM Z Linux is s390x.
            return Some("s390x".to_string());
        }
        let flags = self.flags?;
        self.vendor_id?;
        let long_mode = flags.split_ascii_whitespace().any(|f| f == "lm");
        Some(if long_mode { "x86_64" } else { "i686" }.to_string())
    }
}

/// `POWER8E (raw), altivec supported` → `POWER8E`: the core, without the compatibility mode
/// (`raw`, `architected`) or the vector unit note.
fn power_core(cpu: &str) -> &str {
    let core = cpu.split(',').next().unwrap_or(cpu);
    core.split(" (").next().unwrap_or(core).trim()
}

fn first<'a>(slot: &mut Option<&'a str>, value: &'a str) {
    if slot.is_none() {
        *slot = Some(value);
    }
}

fn hex_u32(text: &str) -> Option<u32> {
    parse_u64(text).and_then(|n| u32::try_from(n).ok())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::fmt::Write as _;

    pub(in crate::detect::backends::node::cpu) const VM_CPUINFO: &str =
        include_str!("../../../../../fixtures/hosts/cpu-only-vm/proc/cpuinfo");

    pub(in crate::detect::backends::node::cpu) const GRACE: &str = "processor\t: 0\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm aes \
pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 \
asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg dcpodp sve2 sveaes \
svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svebf16 i8mm bf16 dgh bti\n\
CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd4f\n\
CPU revision\t: 0\n\nprocessor\t: 1\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd\n\
CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd4f\n\
CPU revision\t: 0\n";

    /// A 2-socket, 96-core, 192-thread Sapphire Rapids cpuinfo built from one real entry.
    fn cpuinfo_192_threads() -> String {
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
    fn garbage_cpuinfo_gives_nothing_rather_than_nonsense() {
        let cpu = parse_cpuinfo("\0\0: :\nprocessor\nflags avx2\n::::\n");
        assert_eq!(cpu, CpuInfo::default());
    }

    proptest! {
        #[test]
        fn parse_cpuinfo_never_panics(s in ".*") {
            let _ = parse_cpuinfo(&s);
        }

        #[test]
        fn parse_cpuinfo_never_panics_on_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..4096)
        ) {
            let _ = parse_cpuinfo(&String::from_utf8_lossy(&bytes));
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
