//! Any GPU with a Vulkan driver, from `vulkaninfo --summary`: a safety net for GPUs whose
//! vendor tool is missing (an NVIDIA laptop GPU without `nvidia-smi`, a Mesa-driven iGPU).
//!
//! The summary lists `GPU<n>:` blocks of `key = value` lines (`vendorID = 0x10de`,
//! `deviceType = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU`, `deviceName`, `driverInfo`...), after
//! loader warnings and instance extension/layer lists. Software rasterisers (llvmpipe,
//! `PHYSICAL_DEVICE_TYPE_CPU`) are skipped.
//!
//! The summary does not show PCI bus ids (`VK_EXT_pci_bus_info` is only in the full report),
//! so a Vulkan device takes the bus id of the display-class PCI function with the same vendor
//! and device id when that match is unambiguous, and `vulkan:<n>` otherwise. Identical GPUs
//! (same ids, as many Vulkan devices as PCI functions) are paired in order: they are
//! indistinguishable, so any pairing describes them equally well. Using bus ids lets the
//! merge drop these devices wherever a vendor backend reported the same GPU.
//!
//! `vulkaninfo` only runs when `/dev/dri` has a render node, so a host without GPUs never
//! spawns it.

use std::collections::BTreeMap;

use crate::detect::backends::shared::tool_output::{Tool, Wording};
use crate::detect::{Backend, Context, Findings, PciFunction};
use crate::hardware::{Device, Family, vendor_from_pci_id};

/// The `vulkan` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Vulkan;

impl Backend for Vulkan {
    fn name(&self) -> &'static str {
        "vulkan"
    }

    fn detect(&self, ctx: &Context) -> Findings {
        let has_render_node = ctx
            .host()
            .list("/dev/dri")
            .iter()
            .any(|name| name.starts_with("renderD"));
        if !has_render_node {
            return Findings::default();
        }
        let mut warnings = Vec::new();
        let parse = parse_vulkaninfo_summary;
        let Some(gpus) = VULKANINFO.run_parsed(ctx, &["--summary"], parse, &mut warnings) else {
            return Findings {
                warnings,
                ..Findings::default()
            };
        };
        let gpus: Vec<VulkanGpu> = gpus.into_iter().filter(|g| !g.is_software()).collect();
        let ids = assign_ids(ctx, &gpus);
        let devices = gpus
            .iter()
            .zip(ids)
            .map(|(gpu, (id, matched))| vulkan_device(gpu, id, matched))
            .collect();
        Findings {
            devices,
            ..Findings::default()
        }
    }
}

/// The Vulkan loader's device summary tool.
const VULKANINFO: Tool = Tool::new("vulkaninfo", Wording::PrintedUnparsable);

/// One `GPU<n>:` block of `vulkaninfo --summary`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VulkanGpu {
    /// The `n` of `GPU<n>`.
    pub index: u32,
    /// `key = value` pairs of the block, keys as printed (`vendorID`, `deviceName`...).
    pub fields: BTreeMap<String, String>,
}

impl VulkanGpu {
    fn field(&self, key: &str) -> Option<&str> {
        self.fields
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// The `vendorID` (Mesa's software devices use ids above 16 bits, like 0x10005).
    pub fn vendor_id(&self) -> Option<u32> {
        self.field("vendorID").and_then(parse_hex)
    }

    /// The `deviceID`.
    pub fn device_id(&self) -> Option<u32> {
        self.field("deviceID").and_then(parse_hex)
    }

    /// The device type without its `PHYSICAL_DEVICE_TYPE_` prefix, lowercase
    /// (`discrete_gpu`, `integrated_gpu`, `virtual_gpu`, `cpu`, `other`).
    pub fn device_type(&self) -> Option<String> {
        let raw = self.field("deviceType")?;
        let short = raw.strip_prefix("PHYSICAL_DEVICE_TYPE_").unwrap_or(raw);
        Some(short.to_ascii_lowercase())
    }

    /// CPU rasterisers (llvmpipe, lavapipe, SwiftShader) are not accelerators.
    fn is_software(&self) -> bool {
        self.device_type().as_deref() == Some("cpu")
    }

    /// The PCI (vendor, device) pair, when both fit PCI's 16 bits.
    fn pci_ids(&self) -> Option<(u16, u16)> {
        let vendor = u16::try_from(self.vendor_id()?).ok()?;
        let device = u16::try_from(self.device_id()?).ok()?;
        Some((vendor, device))
    }
}

/// Parses `vulkaninfo --summary`. Lines outside `GPU<n>:` blocks (loader warnings, the
/// `DISPLAY` notice, extension and layer lists) are ignored. An output without the
/// `VULKANINFO` banner or a `Devices:` section is not a summary at all and is an error.
pub fn parse_vulkaninfo_summary(text: &str) -> Result<Vec<VulkanGpu>, String> {
    let mut recognised = false;
    let mut gpus: Vec<VulkanGpu> = Vec::new();
    let mut in_devices = false;
    for raw in text.lines() {
        let line = raw.trim_matches(|c: char| c.is_whitespace() || c == '\u{feff}');
        if line == "VULKANINFO" {
            recognised = true;
        }
        if line == "Devices:" {
            recognised = true;
            in_devices = true;
            continue;
        }
        if let Some(index) = gpu_header(line) {
            in_devices = true;
            gpus.push(VulkanGpu {
                index,
                fields: BTreeMap::new(),
            });
            continue;
        }
        if !in_devices {
            continue;
        }
        if let (Some(gpu), Some((key, value))) = (gpus.last_mut(), line.split_once(" = ")) {
            let key = key.trim();
            if !key.is_empty() && !key.contains(' ') {
                gpu.fields.insert(key.to_string(), value.trim().to_string());
            }
        }
    }
    if !recognised && gpus.is_empty() {
        return Err("no VULKANINFO banner and no GPU blocks".into());
    }
    Ok(gpus)
}

/// `GPU3:` gives 3.
fn gpu_header(line: &str) -> Option<u32> {
    line.strip_prefix("GPU")?.strip_suffix(':')?.parse().ok()
}

fn parse_hex(text: &str) -> Option<u32> {
    let text = text.trim();
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))?;
    u32::from_str_radix(digits, 16).ok()
}

/// A device id for every GPU, with how it was matched to the PCI bus (`None` when it was
/// not). Candidates are display-class functions with the GPU's vendor and device id.
fn assign_ids(ctx: &Context, gpus: &[VulkanGpu]) -> Vec<(String, Option<&'static str>)> {
    let mut ids: Vec<(String, Option<&'static str>)> = gpus
        .iter()
        .map(|gpu| (format!("vulkan:{}", gpu.index), None))
        .collect();
    let mut groups: BTreeMap<(u16, u16), Vec<usize>> = BTreeMap::new();
    for (position, gpu) in gpus.iter().enumerate() {
        if let Some(pair) = gpu.pci_ids() {
            groups.entry(pair).or_default().push(position);
        }
    }
    for ((vendor, device), positions) in groups {
        let candidates = display_functions(ctx, vendor, device);
        if candidates.len() != positions.len() {
            continue;
        }
        let how = if positions.len() == 1 {
            "device-id"
        } else {
            "device-id-in-order"
        };
        for (position, function) in positions.into_iter().zip(candidates) {
            ids[position] = (function.address.clone(), Some(how));
        }
    }
    ids
}

/// Display-class PCI functions with the given ids, by bus id. Reads `device` only for
/// display functions of the vendor.
fn display_functions(ctx: &Context, vendor: u16, device: u16) -> Vec<&PciFunction> {
    ctx.pci_by_vendor(vendor)
        .filter(|f| f.class_code() >> 8 == 0x03)
        .filter(|f| f.device_id(ctx.host()) == Some(device))
        .collect()
}

fn vulkan_device(gpu: &VulkanGpu, id: String, matched: Option<&str>) -> Device {
    let vendor = gpu
        .vendor_id()
        .and_then(|v| u16::try_from(v).ok())
        .map_or(crate::hardware::Vendor::Other, vendor_from_pci_id);
    let model = gpu.field("deviceName").unwrap_or("Vulkan device");
    let mut device = Device::new(id, vendor, Family::Gpu, model, "vulkan");
    device.index = Some(gpu.index);
    device.driver_version = gpu
        .field("driverInfo")
        .or_else(|| gpu.field("driverVersion"))
        .map(str::to_string);
    device.uuid = gpu.field("deviceUUID").map(str::to_string);
    let attributes = &mut device.attributes;
    for (key, attribute) in [
        ("apiVersion", "vulkan-api-version"),
        ("driverName", "vulkan-driver"),
        ("driverID", "vulkan-driver-id"),
    ] {
        if let Some(value) = gpu.field(key) {
            attributes.insert(attribute.into(), value.to_string());
        }
    }
    if let Some(kind) = gpu.device_type() {
        attributes.insert("vulkan-device-type".into(), kind);
    }
    if let Some((vendor_id, device_id)) = gpu.pci_ids() {
        attributes.insert("pci-id".into(), format!("{vendor_id:04x}:{device_id:04x}"));
    }
    if let Some(how) = matched {
        attributes.insert("pci-match".into(), how.into());
    }
    device
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::testing::detect_on;
    use crate::detect::{CommandRunner, HostRoot};
    use crate::hardware::Vendor;
    use proptest::prelude::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    const SUMMARY: &str = include_str!(
        "../../../../fixtures/hosts/laptop-npu/commands/outputs/vulkaninfo-summary.txt"
    );

    #[test]
    fn parses_the_summary_past_warnings() {
        let gpus = parse_vulkaninfo_summary(SUMMARY).unwrap();
        assert_eq!(gpus.len(), 3);
        assert_eq!(gpus[1].vendor_id(), Some(0x10de));
        assert_eq!(gpus[1].device_id(), Some(0x28e0));
        assert_eq!(gpus[1].device_type().as_deref(), Some("discrete_gpu"));
        assert_eq!(
            gpus[0].field("deviceName"),
            Some("Intel(R) Arc(tm) Graphics (MTL)")
        );
        assert_eq!(gpus[2].vendor_id(), Some(0x10005));
        assert_eq!(gpus[2].pci_ids(), None);
        assert!(gpus[2].is_software());
    }

    #[test]
    fn crlf_and_space_indented_output_parses_too() {
        let text = "Devices:\r\n========\r\nGPU0:\r\n    vendorID           = 0x1002\r\n    \
                    deviceID           = 0x164e\r\n    deviceType         = \
                    PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU\r\n";
        let gpus = parse_vulkaninfo_summary(text).unwrap();
        assert_eq!(gpus[0].pci_ids(), Some((0x1002, 0x164e)));
        assert!(parse_vulkaninfo_summary("Segmentation fault\n").is_err());
        assert_eq!(
            parse_vulkaninfo_summary("Devices:\n========\n").unwrap(),
            []
        );
    }

    #[test]
    fn laptop_fixture_matches_gpus_to_the_bus_and_skips_llvmpipe() {
        let findings = detect_on(&Vulkan, "laptop-npu");
        assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
        let ids: Vec<&str> = findings.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["0000:00:02.0", "0000:01:00.0"]);
        let nvidia = &findings.devices[1];
        assert_eq!(nvidia.vendor, Vendor::Nvidia);
        assert_eq!(nvidia.model, "NVIDIA GeForce RTX 4060 Laptop GPU");
        assert_eq!(nvidia.driver_version.as_deref(), Some("550.120"));
        assert_eq!(nvidia.index, Some(1));
        assert_eq!(
            nvidia
                .attributes
                .get("vulkan-device-type")
                .map(String::as_str),
            Some("discrete_gpu")
        );
        assert_eq!(
            nvidia.attributes.get("pci-match").map(String::as_str),
            Some("device-id")
        );
        assert_eq!(findings.devices[0].vendor, Vendor::Intel);
    }

    #[test]
    fn no_render_node_means_no_process() {
        // pci-misc has a vulkaninfo that fails loudly, and only a BMC's card0: not running
        // it is the only way to stay silent.
        let findings = detect_on(&Vulkan, "pci-misc");
        assert_eq!(findings, Findings::default());
    }

    fn host_with_tool(body: &str, functions: &[&str]) -> (tempfile::TempDir, Context) {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("dev/dri")).unwrap();
        fs::write(dir.path().join("dev/dri/renderD128"), "").unwrap();
        for address in functions {
            let f = dir.path().join("sys/bus/pci/devices").join(address);
            fs::create_dir_all(&f).unwrap();
            fs::write(f.join("vendor"), "0x10de\n").unwrap();
            fs::write(f.join("device"), "0x2330\n").unwrap();
            fs::write(f.join("class"), "0x030200\n").unwrap();
        }
        let commands = dir.path().join("commands");
        fs::create_dir_all(&commands).unwrap();
        let tool = commands.join("vulkaninfo");
        fs::write(&tool, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&tool, fs::Permissions::from_mode(0o755)).unwrap();
        let ctx = Context::new(
            HostRoot::new(dir.path()),
            CommandRunner::new(vec![commands]),
        );
        (dir, ctx)
    }

    #[test]
    fn failing_or_garbage_vulkaninfo_is_a_warning() {
        let (_dir, ctx) = host_with_tool(
            "echo 'ERROR: [Loader Message] Code 0 : vkCreateInstance: Found no drivers!' >&2\n\
             echo 'Cannot create Vulkan instance.' >&2; exit 1",
            &[],
        );
        let findings = Vulkan.detect(&ctx);
        assert_eq!(findings.warnings.len(), 1);
        assert!(findings.warnings[0].contains("Cannot create Vulkan instance"));
        let (_dir, ctx) = host_with_tool("echo 'Illegal instruction'", &[]);
        let findings = Vulkan.detect(&ctx);
        assert!(
            findings.warnings[0].contains("unparsable"),
            "{:?}",
            findings.warnings
        );
    }

    #[test]
    fn identical_gpus_pair_in_order_and_extra_ones_stay_unmatched() {
        let block = |n: u32| {
            format!(
                "GPU{n}:\n\tvendorID = 0x10de\n\tdeviceID = 0x2330\n\
                 \tdeviceType = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU\n\tdeviceName = NVIDIA H100 80GB HBM3\n"
            )
        };
        let two = format!("Devices:\n========\n{}{}", block(0), block(1));
        let (_dir, ctx) = host_with_tool(
            &format!("cat <<'EOF'\n{two}EOF"),
            &["0000:18:00.0", "0000:2a:00.0"],
        );
        let findings = Vulkan.detect(&ctx);
        let ids: Vec<&str> = findings.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["0000:18:00.0", "0000:2a:00.0"]);
        let (_dir, ctx) = host_with_tool(&format!("cat <<'EOF'\n{two}EOF"), &["0000:18:00.0"]);
        let findings = Vulkan.detect(&ctx);
        let ids: Vec<&str> = findings.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["vulkan:0", "vulkan:1"]);
    }

    proptest! {
        #[test]
        fn parser_never_panics(s in ".*") {
            let _ = parse_vulkaninfo_summary(&s);
        }

        #[test]
        fn parser_survives_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let _ = parse_vulkaninfo_summary(&String::from_utf8_lossy(&bytes));
        }

        #[test]
        fn parser_survives_block_shaped_noise(
            lines in proptest::collection::vec("(GPU[0-9]{0,3}:|[a-zA-Z]{0,8} = [0-9a-fx]{0,12}|Devices:)", 0..30)
        ) {
            if let Ok(gpus) = parse_vulkaninfo_summary(&lines.join("\n")) {
                for gpu in gpus {
                    let _ = (gpu.vendor_id(), gpu.device_id(), gpu.device_type(), gpu.pci_ids());
                }
            }
        }
    }
}
