//! The generic PCI backend: names every accelerator-looking PCI function so that nothing goes
//! unseen, even when no vendor backend knows it.
//!
//! A function is reported when it has an accelerator class (display, processing accelerator,
//! co-processor), when its vendor only makes AI silicon (Tenstorrent, Groq, Graphcore...;
//! their bridges, NICs and storage aside), or when it is a known accelerator of a vendor that
//! makes other things too (Google TPUs beside gVNIC, AWS Neuron beside ENA/EFA, AMD's XDNA
//! NPU, which is a signal-processing controller). BMC and virtual display adapters (ASPEED,
//! Matrox, Cirrus, QEMU/Bochs, virtio, VMware, Hyper-V, VirtualBox) are display-class but
//! are no accelerators, and are skipped.
//!
//! The merge prefers vendor backends for equal ids, so this backend may safely report NVIDIA
//! or AMD GPUs too; it only wins where nobody else claimed a function. Vendor and device ids
//! and the product names below are from the PCI ID database (pci.ids).

use crate::detect::{Backend, Context, Findings, HostRoot, PciFunction, pci};
use crate::hardware::{Device, Family, Vendor, vendor_from_pci_id};

/// The `pci` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pci;

impl Backend for Pci {
    fn name(&self) -> &'static str {
        "pci"
    }

    fn detect(&self, ctx: &Context) -> Findings {
        let host = ctx.host();
        let devices = ctx
            .pci()
            .iter()
            .filter_map(|function| {
                let device_id = || function.device_id(host);
                let family = classify(function.vendor, function.class, device_id)?;
                Some(pci_device(host, function, family))
            })
            .collect();
        Findings {
            devices,
            ..Findings::default()
        }
    }
}

/// Vendors whose display-class functions are BMC framebuffers or emulated adapters.
const NON_ACCELERATOR_DISPLAY_VENDORS: &[u16] = &[
    0x1a03, // ASPEED (AST2x00 BMC VGA)
    0x102b, // Matrox (G200e BMC VGA)
    0x1013, // Cirrus Logic (emulated CL-GD5446)
    0x1234, // QEMU/Bochs standard VGA
    0x1af4, // Red Hat virtio (virtio-gpu)
    0x1b36, // Red Hat QEMU devices (QXL)
    0x15ad, // VMware SVGA
    0x1414, // Microsoft Hyper-V synthetic video
    0x80ee, // VirtualBox VGA
];

/// Vendors whose display-class (0x03xx) functions are compute GPUs. A display function from
/// anyone else (a cloud VM's emulated VGA such as EC2's `1d0f:1111`, a server's BMC
/// framebuffer) is a screen, not an accelerator.
const GPU_VENDORS: &[u16] = &[
    0x10de, // NVIDIA
    0x1002, // AMD (ATI)
    0x8086, // Intel
    0x106b, // Apple
    0x1ed5, // Moore Threads
    0x1ee0, // Biren
    0x9999, // MetaX
    0x1e3e, // Iluvatar CoreX
    0x1e36, // Enflame
];

/// Vendors that make AI accelerators only: any of their functions that is not a bridge,
/// NIC, storage, audio or serial-bus controller is an accelerator, whatever class it claims.
const AI_VENDORS: &[u16] = &[
    0x1e52, // Tenstorrent
    0x1de0, // Groq
    0x1d95, // Graphcore
    0x1e0d, // SambaNova Systems
    0x1da3, // Habana Labs (Gaudi)
    0x1e60, // Hailo
    0x1ed2, // FuriosaAI
    0x1eff, // Rebellions
    0x1e67, // Untether AI
    0x1f82, // d-Matrix
    0x1e38, // Blaize
    0x1e36, // Enflame
    0x1e3e, // Iluvatar CoreX
    0x1e30, // Sophgo
    0x1f1c, // Sophgo Technologies
    0x1f9d, // Axelera AI
    0x1ff4, // DEEPX
    0x20a1, // Etched
    0x1eca, // Lightmatter
    0xcabc, // Cambricon
];

/// An accelerator of a vendor that also makes non-accelerators, matched by device id.
struct KnownAccelerators {
    vendor: u16,
    devices: &'static [u16],
    family: Family,
    /// The class codes worth reading the device id for (`None`: any but plumbing). Intel and
    /// AMD have dozens of functions per host; only these classes can be their NPUs.
    classes: Option<&'static [u16]>,
}

const KNOWN_ACCELERATORS: &[KnownAccelerators] = &[
    // Google TPU v2/v3, v4, v5p, v5e, v6e, 7x.
    KnownAccelerators {
        vendor: 0x1ae0,
        devices: &[0x0027, 0x005e, 0x0062, 0x0063, 0x006f, 0x0076],
        family: Family::Tpu,
        classes: None,
    },
    // AWS Inferentia, Trainium, Inferentia2, Trainium2, Trainium3.
    KnownAccelerators {
        vendor: 0x1d0f,
        devices: &[
            0x7064, 0x7065, 0x7066, 0x7067, 0x7164, 0x7264, 0x7364, 0x7564, 0x7565,
        ],
        family: Family::Asic,
        classes: None,
    },
    // Qualcomm Cloud AI 080 and 100.
    KnownAccelerators {
        vendor: 0x17cb,
        devices: &[0xa080, 0xa100],
        family: Family::Asic,
        classes: None,
    },
    // AMD XDNA NPUs (Phoenix/Hawk Point; Strix/Krackan/Strix Halo): signal-processing class.
    KnownAccelerators {
        vendor: 0x1022,
        devices: &[0x1502, 0x17f0],
        family: Family::Npu,
        classes: Some(&[0x1180, 0x1200]),
    },
    // Intel NPUs (Meteor, Arrow, Lunar, Panther, Wildcat Lake).
    KnownAccelerators {
        vendor: 0x8086,
        devices: &[0x7d1d, 0xad1d, 0x643e, 0xb03e, 0xfd3e],
        family: Family::Npu,
        classes: Some(&[0x1200]),
    },
    // Baidu Kunlun (PF and VF).
    KnownAccelerators {
        vendor: 0x1d22,
        devices: &[0x3684, 0x3685],
        family: Family::Asic,
        classes: None,
    },
];

/// Product names for AI-vendor devices, so an unknown host still reads well.
const NAMES: &[(u16, u16, &str)] = &[
    (0x1e52, 0xfaca, "Tenstorrent Grayskull"),
    (0x1e52, 0x401e, "Tenstorrent Wormhole"),
    (0x1e52, 0xb140, "Tenstorrent Blackhole"),
    (0x1de0, 0x0000, "Groq TSP (GroqChip)"),
    (0x1d95, 0x0001, "Graphcore Colossus GC2"),
    (0x1d95, 0x0002, "Graphcore Colossus GC1"),
    (0x1da3, 0x1000, "Habana Gaudi"),
    (0x1da3, 0x1020, "Habana Gaudi2"),
    (0x1da3, 0x1060, "Habana Gaudi3"),
    (0x1e60, 0x2864, "Hailo-8"),
    (0x1e60, 0x45c4, "Hailo-10H"),
    (0x1ed2, 0x0000, "FuriosaAI Warboy"),
    (0x1ed2, 0x0001, "FuriosaAI RNGD"),
];

/// Board names from the subsystem id, where one chip ships on several boards.
const BOARDS: &[(u16, u16, u16, &str)] = &[
    (0x1e52, 0x401e, 0x0014, "n300"),
    (0x1e52, 0x401e, 0x0018, "n150"),
    (0x1e52, 0xb140, 0x0040, "p150a"),
    (0x1e52, 0xb140, 0x0041, "p150b"),
    (0x1e52, 0xb140, 0x0043, "p100a"),
    (0x1e52, 0xfaca, 0x0003, "e150"),
    (0x1e52, 0xfaca, 0x0007, "e75"),
    (0x1e52, 0xfaca, 0x000a, "e300"),
];

/// Decides whether a function is an accelerator and of which family. `device_id` is called
/// only when the answer depends on it, so most functions cost no extra read.
pub fn classify(
    vendor: u16,
    class: u32,
    device_id: impl FnOnce() -> Option<u16>,
) -> Option<Family> {
    if NON_ACCELERATOR_DISPLAY_VENDORS.contains(&vendor) {
        return None;
    }
    let function = PciFunction {
        address: String::new(),
        vendor,
        class,
    };
    let code = function.class_code();
    let base_class = code >> 8;
    let plumbing = pci::is_plumbing(code);
    if let Some(known) = KNOWN_ACCELERATORS.iter().find(|k| k.vendor == vendor) {
        let candidate = known.classes.map_or(!plumbing, |list| list.contains(&code));
        if candidate && device_id().is_some_and(|id| known.devices.contains(&id)) {
            return Some(known.family);
        }
    }
    let foreign_display = base_class == 0x03 && !GPU_VENDORS.contains(&vendor);
    if function.is_accelerator_class() && !foreign_display {
        return Some(family_from_class(base_class));
    }
    (AI_VENDORS.contains(&vendor) && !plumbing).then_some(Family::Asic)
}

fn family_from_class(base_class: u16) -> Family {
    if base_class == 0x03 {
        Family::Gpu
    } else {
        Family::Asic
    }
}

/// The model name: a known product (with its board), or `PCI vvvv:dddd`.
pub fn model_name(vendor: u16, device: Option<u16>, subsystem_device: Option<u16>) -> String {
    let Some(device) = device else {
        return format!("PCI {vendor:04x}");
    };
    let Some((.., name)) = NAMES.iter().find(|(v, d, _)| *v == vendor && *d == device) else {
        return format!("PCI {vendor:04x}:{device:04x}");
    };
    let board = subsystem_device.and_then(|sub| {
        BOARDS
            .iter()
            .find(|(v, d, s, _)| *v == vendor && *d == device && *s == sub)
    });
    match board {
        Some((.., board)) => format!("{name} {board}"),
        None => (*name).to_string(),
    }
}

fn pci_device(host: &HostRoot, function: &PciFunction, family: Family) -> Device {
    let dir = function.sysfs_dir();
    let device_id = function.device_id(host);
    let read_id = |name: &str| {
        host.read_u64(format!("{dir}/{name}"))
            .and_then(|id| u16::try_from(id).ok())
    };
    let subsystem = (read_id("subsystem_vendor"), read_id("subsystem_device"));
    let vendor = vendor_from_pci_id(function.vendor);
    let model = model_name(function.vendor, device_id, subsystem.1);
    let mut device = Device::new(function.address.clone(), vendor, family, model, "pci");
    let attributes = &mut device.attributes;
    if let Some(id) = device_id {
        attributes.insert("pci-id".into(), format!("{:04x}:{id:04x}", function.vendor));
    }
    if vendor == Vendor::Other {
        attributes.insert("pci-vendor".into(), format!("0x{:04x}", function.vendor));
    }
    attributes.insert("pci-class".into(), format!("0x{:06x}", function.class));
    if let (Some(sub_vendor), Some(sub_device)) = subsystem {
        attributes.insert(
            "pci-subsystem".into(),
            format!("{sub_vendor:04x}:{sub_device:04x}"),
        );
    }
    if let Some(driver) = pci::driver(host, &function.address) {
        attributes.insert("driver".into(), driver);
    }
    device
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::testing::detect_on;
    use proptest::prelude::*;

    #[test]
    fn pci_misc_fixture_reports_the_ai_cards_and_not_the_bmc() {
        let findings = detect_on(&Pci, "pci-misc");
        assert!(findings.warnings.is_empty());
        let ids: Vec<&str> = findings.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["0000:41:00.0", "0000:c1:00.0"]);
        let wormhole = &findings.devices[0];
        assert_eq!(wormhole.vendor, Vendor::Tenstorrent);
        assert_eq!(wormhole.family, Family::Asic);
        assert_eq!(wormhole.model, "Tenstorrent Wormhole n300");
        assert_eq!(
            wormhole.attributes.get("driver").map(String::as_str),
            Some("tenstorrent")
        );
        assert_eq!(
            wormhole.attributes.get("pci-subsystem").map(String::as_str),
            Some("1e52:0014")
        );
        let groq = &findings.devices[1];
        assert_eq!(groq.vendor, Vendor::Groq);
        assert_eq!(groq.model, "Groq TSP (GroqChip)");
        assert!(!groq.attributes.contains_key("driver"));
    }

    #[test]
    fn safety_net_for_gpus_and_npus_on_the_laptop() {
        let findings = detect_on(&Pci, "laptop-npu");
        let summary: Vec<(&str, Family, &str)> = findings
            .devices
            .iter()
            .map(|d| (d.id.as_str(), d.family, d.model.as_str()))
            .collect();
        assert_eq!(
            summary,
            [
                ("0000:00:02.0", Family::Gpu, "PCI 8086:7d55"),
                ("0000:00:0b.0", Family::Npu, "PCI 8086:7d1d"),
                ("0000:01:00.0", Family::Gpu, "PCI 10de:28e0"),
            ]
        );
    }

    #[test]
    fn vendor_specific_ids_on_cloud_hosts() {
        let tpu = detect_on(&Pci, "tpu-v5e-4");
        assert_eq!(tpu.devices.len(), 4, "gVNIC must not count");
        assert!(tpu.devices.iter().all(|d| d.family == Family::Tpu));
        let trn = detect_on(&Pci, "trn1-32xl");
        assert_eq!(trn.devices.len(), 16, "EFA and ENA must not count");
        assert_eq!(trn.devices[0].vendor, Vendor::Aws);
    }

    #[test]
    fn classification_rules() {
        let never = || -> Option<u16> { panic!("device id read for a function that needs none") };
        // ASPEED VGA, Huawei's BMC VGA is display class but Huawei is not an AI vendor.
        assert_eq!(classify(0x1a03, 0x030000, never), None);
        // EC2's emulated VGA adapter on an instance without accelerators.
        assert_eq!(classify(0x1d0f, 0x030000, || Some(0x1111)), None);
        assert_eq!(classify(0x19e5, 0x030000, never), None);
        assert_eq!(classify(0x10de, 0x030200, never), Some(Family::Gpu));
        assert_eq!(
            classify(0x10de, 0x068000, never),
            None,
            "NVSwitch is a bridge"
        );
        assert_eq!(classify(0x1e52, 0x120000, never), Some(Family::Asic));
        assert_eq!(classify(0x1de0, 0x0b4000, never), Some(Family::Asic));
        assert_eq!(classify(0x1de0, 0x058000, never), Some(Family::Asic));
        assert_eq!(
            classify(0x1d95, 0x060400, never),
            None,
            "a card's own bridge"
        );
        assert_eq!(classify(0x19e5, 0x120000, never), Some(Family::Asic));
        assert_eq!(classify(0x19e5, 0x020000, never), None);
        assert_eq!(
            classify(0x1022, 0x118000, || Some(0x1502)),
            Some(Family::Npu)
        );
        assert_eq!(classify(0x1022, 0x060000, || Some(0x1480)), None);
        assert_eq!(classify(0x1d0f, 0x020000, || Some(0xefa1)), None);
        assert_eq!(
            classify(0x1d0f, 0x088000, || Some(0x7364)),
            Some(Family::Asic)
        );
        assert_eq!(classify(0x1ae0, 0x020000, || Some(0x0042)), None);
        assert_eq!(
            classify(0x8086, 0x030000, || Some(0x7d55)),
            Some(Family::Gpu)
        );
        assert_eq!(
            classify(0x8086, 0x120000, || Some(0x643e)),
            Some(Family::Npu)
        );
        assert_eq!(
            classify(0x17cb, 0x120000, || Some(0xa100)),
            Some(Family::Asic)
        );
        assert_eq!(classify(0x17cb, 0x028000, || Some(0x1103)), None, "Wi-Fi");
        assert_eq!(
            model_name(0x1e52, Some(0xfaca), Some(0x0007)),
            "Tenstorrent Grayskull e75"
        );
        assert_eq!(
            model_name(0x1e52, Some(0xb140), Some(0x9999)),
            "Tenstorrent Blackhole"
        );
        assert_eq!(model_name(0x10de, Some(0x2330), None), "PCI 10de:2330");
    }

    proptest! {
        #[test]
        fn classify_never_panics(vendor in any::<u16>(), class in any::<u32>(), id in any::<Option<u16>>()) {
            let _ = classify(vendor, class, || id);
            let _ = model_name(vendor, id, id);
        }
    }
}
