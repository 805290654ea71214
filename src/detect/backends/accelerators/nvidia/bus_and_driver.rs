//! NVIDIA GPUs as the PCI bus and the driver's `/proc` files show them, for when neither NVML
//! nor `nvidia-smi` answers (or a GPU is missing from what they list).
//!
//! Only display and 3D controller functions count: the NVSwitch bridges (class 0x0680) and the
//! HDMI audio functions of NVIDIA cards (0x0403) are not GPUs. The driver's
//! `/proc/driver/nvidia/gpus/<bus>/information` names the model, UUID and VBIOS when the
//! driver is loaded; otherwise a table of device ids (data-centre parts from Volta to
//! Blackwell, and the Blackwell workstation and GeForce cards) names the part.

use crate::detect::{Context, HostRoot, PciFunction};

use super::GpuRecord;

/// NVIDIA's PCI vendor id.
const NVIDIA: u16 = 0x10de;

/// Parts by PCI device id, with the name the driver reports for them and their CUDA compute
/// capability: the model of last resort when the driver's `/proc` files are missing.
///
/// Sources (checked 2026-11-24):
/// - device ids and names: the `Compatible GPUs` table of NVIDIA/open-gpu-kernel-modules'
///   README.md at 595.45.04 (commit df1c9a3de2be4b130f4fc7680f7198193d8ac6ad), which gives
///   the driver's own product names. Ids it does not list (Volta, which the open modules do not
///   drive, and `0x20b1`) are checked against pciutils/pciids pci.ids version 2026.08.22
///   (commit c1c12547d626) and keep the names the proprietary driver prints.
/// - compute capabilities: NVIDIA's "CUDA GPU Compute Capability" page
///   (developer.nvidia.com/cuda-gpus): 9.0 Hopper, 10.0 B200/GB200, 10.3 B300/GB300, 12.0
///   RTX PRO Blackwell and GeForce RTX 50, 12.1 GB10.
///
/// Where one device id is sold under several names told apart only by the subsystem id
/// (`0x2342` is GH200 120GB or 480GB), the name is the common part of the family.
///
/// Rubin: pci.ids 2026.08.22 lists only "Vera Rubin CPU" functions (`0x2f95`-`0x2f98`), no
/// Rubin GPU id, and the 595.45.04 README lists none, so there is no Rubin entry yet.
const KNOWN_PARTS: &[(u16, &str, (u32, u32))] = &[
    // Volta and Turing.
    (0x1db1, "Tesla V100-SXM2-16GB", (7, 0)),
    (0x1db4, "Tesla V100-PCIE-16GB", (7, 0)),
    (0x1db5, "Tesla V100-SXM2-32GB", (7, 0)),
    (0x1db6, "Tesla V100-PCIE-32GB", (7, 0)),
    (0x1df6, "Tesla V100S-PCIE-32GB", (7, 0)),
    (0x1eb8, "Tesla T4", (7, 5)),
    // Ampere.
    (0x20b0, "NVIDIA A100-SXM4-40GB", (8, 0)),
    (0x20b1, "NVIDIA A100-PCIE-40GB", (8, 0)),
    (0x20b2, "NVIDIA A100-SXM4-80GB", (8, 0)),
    (0x20b3, "NVIDIA A100-SXM-64GB", (8, 0)),
    (0x20b5, "NVIDIA A100 80GB PCIe", (8, 0)),
    (0x20b7, "NVIDIA A30", (8, 0)),
    (0x20f1, "NVIDIA A100-PCIE-40GB", (8, 0)),
    (0x2236, "NVIDIA A10", (8, 6)),
    (0x2237, "NVIDIA A10G", (8, 6)),
    // Ada.
    (0x26b5, "NVIDIA L40", (8, 9)),
    (0x26b9, "NVIDIA L40S", (8, 9)),
    (0x27b8, "NVIDIA L4", (8, 9)),
    // Hopper.
    (0x230e, "NVIDIA H20 NVL16", (9, 0)),
    (0x2321, "NVIDIA H100 NVL", (9, 0)),
    (0x2322, "NVIDIA H800 PCIe", (9, 0)),
    (0x2324, "NVIDIA H800", (9, 0)),
    (0x2329, "NVIDIA H20", (9, 0)),
    (0x232c, "NVIDIA H20-3e", (9, 0)),
    (0x2330, "NVIDIA H100 80GB HBM3", (9, 0)),
    (0x2331, "NVIDIA H100 PCIe", (9, 0)),
    (0x2335, "NVIDIA H200", (9, 0)),
    (0x2339, "NVIDIA H100", (9, 0)),
    (0x233a, "NVIDIA H800 NVL", (9, 0)),
    (0x233b, "NVIDIA H200 NVL", (9, 0)),
    (0x2342, "NVIDIA GH200", (9, 0)),
    (0x2348, "NVIDIA GH200 144G HBM3e", (9, 0)),
    // Blackwell data centre.
    (0x2901, "NVIDIA B200", (10, 0)),
    (0x2941, "NVIDIA GB200", (10, 0)),
    (0x3182, "NVIDIA B300 SXM6 AC", (10, 3)),
    (0x31c2, "NVIDIA GB300", (10, 3)),
    // Blackwell workstation and consumer.
    (0x2b85, "NVIDIA GeForce RTX 5090", (12, 0)),
    (0x2b87, "NVIDIA GeForce RTX 5090 D", (12, 0)),
    (
        0x2bb1,
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        (12, 0),
    ),
    (
        0x2bb5,
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        (12, 0),
    ),
    (0x2c02, "NVIDIA GeForce RTX 5080", (12, 0)),
];

/// The NVIDIA GPU functions on the bus (display or 3D controllers), sorted by address.
pub(super) fn gpu_functions(ctx: &Context) -> Vec<PciFunction> {
    ctx.pci_by_vendor(NVIDIA)
        .filter(|function| function.class_code() >> 8 == 0x03)
        .cloned()
        .collect()
}

/// What the bus and the driver's `/proc` files say about one GPU function.
pub(super) fn record(host: &HostRoot, function: &PciFunction) -> GpuRecord {
    let device_id = function.device_id(host);
    let known = device_id.and_then(known_part);
    let info = host
        .read(format!(
            "/proc/driver/nvidia/gpus/{}/information",
            function.address
        ))
        .map(|text| parse_information(&text))
        .unwrap_or_default();
    let name = info
        .model
        .or_else(|| known.map(|(name, _)| name.to_string()))
        .or_else(|| device_id.map(|id| format!("NVIDIA GPU (0x{id:04x})")));
    GpuRecord {
        source: "sysfs",
        bus_id: function.address.clone(),
        name,
        uuid: info.uuid,
        vbios: info.vbios,
        driver_version: host
            .read("/proc/driver/nvidia/version")
            .and_then(|text| parse_driver_version(&text)),
        compute_capability: known.map(|(_, capability)| capability),
        ..GpuRecord::default()
    }
}

/// The table entry for a device id.
fn known_part(device_id: u16) -> Option<(&'static str, (u32, u32))> {
    KNOWN_PARTS
        .iter()
        .find(|(id, _, _)| *id == device_id)
        .map(|&(_, name, capability)| (name, capability))
}

/// The driver's per-GPU `information` file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Information {
    /// `Model:`.
    pub model: Option<String>,
    /// `GPU UUID:`.
    pub uuid: Option<String>,
    /// `Video BIOS:`.
    pub vbios: Option<String>,
}

/// Parses `/proc/driver/nvidia/gpus/<bus>/information` (`Key: \t value` lines).
pub(super) fn parse_information(text: &str) -> Information {
    let mut info = Information::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if value.is_empty() || value.eq_ignore_ascii_case("N/A") || value.starts_with('?') {
            continue;
        }
        let slot = match key.trim() {
            "Model" => &mut info.model,
            "GPU UUID" => &mut info.uuid,
            "Video BIOS" => &mut info.vbios,
            _ => continue,
        };
        *slot = Some(value.to_string());
    }
    info
}

/// The version in `/proc/driver/nvidia/version`
/// (`NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 ...`, or
/// `... Open Kernel Module for x86_64  550.90.07  Release Build ...`).
pub(super) fn parse_driver_version(text: &str) -> Option<String> {
    let line = text
        .lines()
        .find(|line| line.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|token| {
            token.contains('.')
                && token.chars().next().is_some_and(|c| c.is_ascii_digit())
                && token.chars().all(|c| c.is_ascii_digit() || c == '.')
        })
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const H100_INFORMATION: &str = include_str!(
        "../../../../../fixtures/hosts/h100-8x-nvswitch/proc/driver/nvidia/gpus/0000:1b:00.0/information"
    );
    const H100_VERSION: &str =
        include_str!("../../../../../fixtures/hosts/h100-8x-nvswitch/proc/driver/nvidia/version");

    #[test]
    fn parses_the_information_file() {
        let info = parse_information(H100_INFORMATION);
        assert_eq!(info.model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(info.vbios.as_deref(), Some("96.00.99.00.01"));
        assert!(info.uuid.as_deref().is_some_and(|u| u.starts_with("GPU-")));
        let info = parse_information("Model: \t\t N/A\nGPU UUID: \t ??????\n");
        assert_eq!(info, Information::default());
    }

    #[test]
    fn parses_driver_versions() {
        assert_eq!(
            parse_driver_version(H100_VERSION).as_deref(),
            Some("550.90.07")
        );
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build  (dvs-builder@U16-I3-B03-4-3)  Fri Aug 16 21:47:34 UTC 2024\n";
        assert_eq!(parse_driver_version(open).as_deref(), Some("560.35.03"));
        assert_eq!(parse_driver_version("GCC version: 12.3.0\n"), None);
    }

    #[test]
    fn table_covers_the_common_data_centre_parts() {
        assert_eq!(known_part(0x2330).map(|p| p.1), Some((9, 0)));
        assert_eq!(known_part(0x27b8).map(|p| p.0), Some("NVIDIA L4"));
        assert_eq!(known_part(0x2901).map(|p| p.1), Some((10, 0)));
        assert_eq!(known_part(0x22a3), None, "an NVSwitch is not a GPU");
        let mut ids: Vec<u16> = KNOWN_PARTS.iter().map(|p| p.0).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), KNOWN_PARTS.len(), "duplicate device id");
    }

    /// Hopper and Blackwell rows of the open-gpu-kernel-modules 595.45.04 README's
    /// `Compatible GPUs` table (product name, PCI device id), and the compute capability the
    /// CUDA GPUs page gives each product.
    #[test]
    fn hopper_and_blackwell_ids_name_the_driver_products() {
        let readme: &[(u16, &str, (u32, u32))] = &[
            (0x2324, "NVIDIA H800", (9, 0)),
            (0x2329, "NVIDIA H20", (9, 0)),
            (0x2335, "NVIDIA H200", (9, 0)),
            (0x233b, "NVIDIA H200 NVL", (9, 0)),
            (0x2348, "NVIDIA GH200 144G HBM3e", (9, 0)),
            (0x2901, "NVIDIA B200", (10, 0)),
            (0x2941, "NVIDIA GB200", (10, 0)),
            (0x3182, "NVIDIA B300 SXM6 AC", (10, 3)),
            (0x31c2, "NVIDIA GB300", (10, 3)),
            (0x2b85, "NVIDIA GeForce RTX 5090", (12, 0)),
            (0x2c02, "NVIDIA GeForce RTX 5080", (12, 0)),
            (
                0x2bb1,
                "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
                (12, 0),
            ),
            (
                0x2bb5,
                "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                (12, 0),
            ),
        ];
        for &(id, name, capability) in readme {
            assert_eq!(known_part(id), Some((name, capability)), "0x{id:04x}");
        }
        // `0x2342` is "GH200 120GB" or "GH200 480GB" depending on the subsystem id.
        assert_eq!(known_part(0x2342).map(|p| p.0), Some("NVIDIA GH200"));
        // pci.ids 2026.08.22: "2f95  Vera Rubin CPU" is not a GPU.
        assert_eq!(known_part(0x2f95), None);
    }

    proptest! {
        #[test]
        fn proc_parsers_never_panic(s in ".*") {
            let _ = parse_information(&s);
            let _ = parse_driver_version(&s);
        }

        #[test]
        fn proc_parsers_never_panic_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let s = String::from_utf8_lossy(&bytes);
            let _ = parse_information(&s);
            let _ = parse_driver_version(&s);
        }
    }
}
