//! Apple silicon under Linux (Asahi): the SoC from the device tree, reported as its GPU
//! (`apple:gpu0`) and its Neural Engine (`apple:ane0`).
//!
//! `/proc/device-tree/compatible` is a NUL-separated list, board first
//! (`apple,j413\0apple,t8112\0apple,arm-platform\0` on a MacBook Air M2), and
//! `/proc/device-tree/model` names the machine. The SoC code (`t8112`) gives the chip (M2),
//! the GPU generation (G14) and the Neural Engine's core count. Apple silicon has unified
//! memory, so the GPU's memory is the host's `MemTotal`. The Asahi GPU driver (`asahi`) shows
//! as the driver of a DRM render node; there is no Neural Engine driver to look for.
//!
//! On macOS this backend never runs: detection reads a Linux host's `/proc` and `/sys`.

use std::collections::BTreeSet;

use crate::detect::{Backend, Context, Findings, HostRoot};
use crate::hardware::{Device, Family, Precision, Vendor};

/// Where the device tree is found: the procfs link on a bare machine, its sysfs target in a
/// pod that mounts only the host's `/sys`.
const DEVICE_TREES: [&str; 2] = ["/proc/device-tree", "/sys/firmware/devicetree/base"];

/// The `apple` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Apple;

impl Backend for Apple {
    fn name(&self) -> &'static str {
        "apple"
    }

    fn detect(&self, ctx: &Context) -> Findings {
        let host = ctx.host();
        // `/proc/device-tree` is a link to the sysfs copy; the agent's pod mounts only `/sys`.
        let tree = DEVICE_TREES
            .iter()
            .copied()
            .find(|dir| host.exists(format!("{dir}/compatible")));
        let Some(compatible) = tree.and_then(|dir| host.read(format!("{dir}/compatible"))) else {
            return Findings::default();
        };
        let Some(platform) = parse_compatible(&compatible) else {
            return Findings::default();
        };
        let machine = tree.and_then(|dir| host.read_trimmed(format!("{dir}/model")));
        let memory = host
            .read("/proc/meminfo")
            .and_then(|text| parse_mem_total(&text));
        let mut gpu = gpu_device(&platform, machine.as_deref(), memory);
        if let Some((driver, node)) = gpu_driver(host) {
            gpu.attributes.insert("driver".into(), driver);
            if let Some(node) = node {
                gpu.attributes.insert("device-node".into(), node);
            }
        }
        let ane = ane_device(&platform, machine.as_deref());
        Findings {
            devices: vec![ane, gpu],
            ..Findings::default()
        }
    }
}

/// What the device tree says about the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplePlatform {
    /// The SoC code (`t8112`).
    pub soc: String,
    /// The board code (`j413`), when listed.
    pub board: Option<String>,
    /// The chip, when the SoC is known.
    pub chip: Option<AppleChip>,
}

/// Facts about one Apple SoC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppleChip {
    /// Marketing name (`M2 Pro`).
    pub name: &'static str,
    /// GPU generation (`g14`: M2 family).
    pub gpu_generation: &'static str,
    /// Neural Engine cores (32 on the Ultra parts, two dies of 16).
    pub ane_cores: u32,
}

/// Apple SoC codes as the device trees (and Asahi) name them.
const CHIPS: &[(&str, AppleChip)] = &[
    ("t8103", chip("M1", "g13", 16)),
    ("t6000", chip("M1 Pro", "g13", 16)),
    ("t6001", chip("M1 Max", "g13", 16)),
    ("t6002", chip("M1 Ultra", "g13", 32)),
    ("t8112", chip("M2", "g14", 16)),
    ("t6020", chip("M2 Pro", "g14", 16)),
    ("t6021", chip("M2 Max", "g14", 16)),
    ("t6022", chip("M2 Ultra", "g14", 32)),
    ("t8122", chip("M3", "g15", 16)),
    ("t6030", chip("M3 Pro", "g15", 16)),
    ("t6031", chip("M3 Max", "g15", 16)),
    ("t6034", chip("M3 Max", "g15", 16)),
    ("t8132", chip("M4", "g16", 16)),
    ("t6040", chip("M4 Pro", "g16", 16)),
    ("t6041", chip("M4 Max", "g16", 16)),
];

const fn chip(name: &'static str, gpu_generation: &'static str, ane_cores: u32) -> AppleChip {
    AppleChip {
        name,
        gpu_generation,
        ane_cores,
    }
}

impl AppleChip {
    /// The Neural Engine computes in FP16; Apple's Core ML tools document INT8 activation
    /// compute on the Neural Engine from A17 Pro and M4 on.
    fn ane_precisions(self) -> BTreeSet<Precision> {
        let mut set: BTreeSet<Precision> = [Precision::Fp16].into();
        if self.gpu_generation == "g16" {
            set.insert(Precision::Int8);
        }
        set
    }
}

/// Parses the device tree's `compatible` list. `None` unless it is an Apple silicon
/// machine (`apple,arm-platform`, or an `apple,t...` SoC entry).
pub fn parse_compatible(text: &str) -> Option<ApplePlatform> {
    let entries: Vec<&str> = text
        .split('\0')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    let apple_codes: Vec<&str> = entries
        .iter()
        .filter_map(|e| e.strip_prefix("apple,"))
        .collect();
    let soc = apple_codes.iter().find(|code| is_code(code, 't'))?;
    let board = apple_codes
        .iter()
        .find(|code| is_code(code, 'j'))
        .map(|code| (*code).to_string());
    let chip = CHIPS
        .iter()
        .find(|(code, _)| code == soc)
        .map(|(_, chip)| *chip);
    Some(ApplePlatform {
        soc: (*soc).to_string(),
        board,
        chip,
    })
}

/// `t8112`-style codes: a letter then digits, optionally a letter (`j314c`).
fn is_code(code: &str, letter: char) -> bool {
    let mut chars = code.chars();
    if chars.next() != Some(letter) {
        return false;
    }
    let rest: &str = chars.as_str();
    let digits = rest.trim_end_matches(|c: char| c.is_ascii_lowercase());
    digits.len() >= 3
        && digits.chars().all(|c| c.is_ascii_digit())
        && rest.len() - digits.len() <= 1
}

/// `MemTotal` from `/proc/meminfo`, in bytes.
pub fn parse_mem_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut parts = line["MemTotal:".len()..].split_whitespace();
    let amount: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => amount.checked_mul(1024),
        _ => None,
    }
}

fn chip_name(platform: &ApplePlatform) -> String {
    platform
        .chip
        .map_or_else(|| platform.soc.clone(), |c| c.name.to_string())
}

fn describe(device: &mut Device, platform: &ApplePlatform, machine: Option<&str>) {
    device.attributes.insert("soc".into(), platform.soc.clone());
    if let Some(board) = &platform.board {
        device.attributes.insert("board".into(), board.clone());
    }
    if let Some(machine) = machine {
        device
            .attributes
            .insert("machine".into(), machine.to_string());
    }
}

fn gpu_device(platform: &ApplePlatform, machine: Option<&str>, memory: Option<u64>) -> Device {
    let model = format!("Apple {} GPU", chip_name(platform));
    let mut device = Device::new("apple:gpu0", Vendor::Apple, Family::Gpu, model, "apple");
    device.index = Some(0);
    device.memory_bytes = memory;
    if let Some(chip) = platform.chip {
        device.architecture = Some(format!("agx-{}", chip.gpu_generation));
        // Every Apple GPU computes FP32 and FP16 natively.
        device.precisions = [Precision::Fp32, Precision::Fp16].into();
    }
    device.attributes.insert("memory".into(), "unified".into());
    describe(&mut device, platform, machine);
    device
}

fn ane_device(platform: &ApplePlatform, machine: Option<&str>) -> Device {
    let model = format!("Apple {} Neural Engine", chip_name(platform));
    let mut device = Device::new("apple:ane0", Vendor::Apple, Family::Npu, model, "apple");
    device.index = Some(0);
    if let Some(chip) = platform.chip {
        device.compute_units = Some(chip.ane_cores);
        device.precisions = chip.ane_precisions();
    }
    describe(&mut device, platform, machine);
    device
}

/// The GPU's kernel driver and render node, from the DRM class: the render node whose device
/// is driven by `asahi`.
fn gpu_driver(host: &HostRoot) -> Option<(String, Option<String>)> {
    let nodes = host.list("/sys/class/drm");
    let node = nodes.iter().find(|name| {
        name.starts_with("renderD")
            && host
                .link_name(format!("/sys/class/drm/{name}/device/driver"))
                .as_deref()
                == Some("asahi")
    })?;
    let path = format!("/dev/dri/{node}");
    let path = host.exists(&path).then_some(path);
    Some(("asahi".to_string(), path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::testing::{detect_on, fixture_dir};
    use proptest::prelude::*;

    const COMPATIBLE: &str =
        include_str!("../../../../fixtures/hosts/asahi-m2/proc/device-tree/compatible");

    #[test]
    fn reads_the_sysfs_device_tree_when_proc_is_not_mounted() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("sys/firmware/devicetree/base");
        std::fs::create_dir_all(&tree).unwrap();
        std::fs::copy(
            fixture_dir("asahi-m2").join("proc/device-tree/compatible"),
            tree.join("compatible"),
        )
        .unwrap();
        let runner = crate::detect::CommandRunner::new(Vec::new());
        let ctx = crate::detect::Context::new(crate::detect::HostRoot::new(dir.path()), runner);
        let findings = Apple.detect(&ctx);
        assert_eq!(findings.devices.len(), 2, "{findings:?}");
    }

    #[test]
    fn parses_device_tree_compatible() {
        let air = parse_compatible(COMPATIBLE).unwrap();
        assert_eq!(air.soc, "t8112");
        assert_eq!(air.board.as_deref(), Some("j413"));
        let platform = parse_compatible("apple,j316c\0apple,t6001\0apple,arm-platform\0").unwrap();
        assert_eq!(platform.soc, "t6001");
        assert_eq!(platform.board.as_deref(), Some("j316c"));
        assert_eq!(platform.chip.map(|c| c.name), Some("M1 Max"));
        let ultra = parse_compatible("apple,j375d\0apple,t6002\0apple,arm-platform\0").unwrap();
        assert_eq!(ultra.chip.map(|c| c.ane_cores), Some(32));
        let future = parse_compatible("apple,j999\0apple,t9999\0apple,arm-platform\0").unwrap();
        assert_eq!(future.chip, None);
        assert_eq!(
            parse_compatible("raspberrypi,5-model-b\0brcm,bcm2712\0"),
            None
        );
        assert_eq!(parse_compatible(""), None);
    }

    #[test]
    fn parses_mem_total() {
        assert_eq!(
            parse_mem_total("MemTotal:       15824704 kB\nMemFree: 1 kB\n"),
            Some(15_824_704 * 1024)
        );
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_total("MemTotal: lots\n"), None);
    }

    #[test]
    fn macbook_air_m2_fixture() {
        let findings = detect_on(&Apple, "asahi-m2");
        assert!(findings.warnings.is_empty());
        let [ane, gpu] = findings.devices.as_slice() else {
            panic!("a GPU and a Neural Engine expected: {:?}", findings.devices)
        };
        assert_eq!(gpu.id, "apple:gpu0");
        assert_eq!(gpu.model, "Apple M2 GPU");
        assert_eq!(gpu.family, Family::Gpu);
        assert_eq!(gpu.architecture.as_deref(), Some("agx-g14"));
        assert_eq!(gpu.memory_bytes, Some(15_824_704 * 1024));
        assert_eq!(
            gpu.attributes.get("driver").map(String::as_str),
            Some("asahi")
        );
        assert_eq!(
            gpu.attributes.get("device-node").map(String::as_str),
            Some("/dev/dri/renderD128")
        );
        assert_eq!(
            gpu.attributes.get("machine").map(String::as_str),
            Some("Apple MacBook Air (13-inch, M2, 2022)")
        );
        assert_eq!(ane.id, "apple:ane0");
        assert_eq!(ane.family, Family::Npu);
        assert_eq!(ane.compute_units, Some(16));
        let precisions: Vec<_> = ane.precisions.iter().map(|p| p.as_str()).collect();
        assert_eq!(precisions, ["fp16"]);
    }

    #[test]
    fn non_apple_hosts_find_nothing() {
        assert_eq!(detect_on(&Apple, "laptop-npu"), Findings::default());
    }

    proptest! {
        #[test]
        fn compatible_parser_never_panics(s in ".*") {
            let _ = parse_compatible(&s);
            let _ = parse_mem_total(&s);
        }

        #[test]
        fn parsers_survive_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let text = String::from_utf8_lossy(&bytes);
            let _ = parse_compatible(&text);
            let _ = parse_mem_total(&text);
        }

        #[test]
        fn compatible_lists_of_apple_codes(codes in proptest::collection::vec("apple,[a-z0-9]{0,7}", 0..6)) {
            let _ = parse_compatible(&codes.join("\0"));
        }
    }
}
