//! What the AMD backend knows without asking the hardware: gfx targets and the GPU generations
//! they belong to, the precisions each generation computes in natively, and the marketing names,
//! gfx targets and (where one id is one memory size) memory of PCI device ids: the model of last
//! resort when no AMD tool is installed and the driver's sysfs files say nothing.
//!
//! Sources (checked 2026-11-24):
//! - gfx targets, which are APUs, and example products per target: LLVM's
//!   `llvm/docs/AMDGPUUsage.rst` processor table (llvm/llvm-project commit 001388cf6923), and
//!   for gfx11/gfx12 products the later additions in llvm/llvm-project PRs #155577 and #170469.
//! - device ids and product names: pciutils/pciids `pci.ids` version 2026.08.22 (commit
//!   c1c12547d626), vendor `1002`; code names there (Vega 10, Navi 31, Aqua Vanjaram) tie an id
//!   to its gfx target.
//! - memory and gfx target per product: the "GPU hardware specifications" tables of the ROCm
//!   documentation (`docs/reference/gpu-arch-specs.rst`, ROCm/legacy-rocm-build commit
//!   089d7513c55f; rocm.docs.amd.com `reference/gpu-specs`).
//!
//! The kernel's `amdgpu_drv.c` id list only maps ids to chip families, and newer parts (MI300,
//! RDNA 3 on) are not listed there at all but matched by class and probed by IP discovery, so it
//! names no product and is not used here.

use crate::hardware::{GIB, Precision};

/// A GPU generation, as identified by its gfx target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation {
    /// Generation name (`cdna3`, `rdna3`).
    pub name: &'static str,
    /// Precisions the matrix/dot units compute in natively.
    pub precisions: &'static [Precision],
}

use Precision::{Bf16, Fp8, Fp16, Fp32, Int8, Mxfp4};

// Precision sets, from AMD's ISA guides and product briefs:
// - CDNA 1/2 (MI100, MI200): MFMA in FP32, BF16, FP16 and INT8; no FP8 before CDNA 3.
// - CDNA 3 (MI300 series): adds FP8 (E4M3/E5M2) MFMA. It also has an XF32 mode, which ROCm
//   frameworks do not use as TF32 and which CDNA 4 dropped, so it is not listed.
// - CDNA 4 (MI350 series): adds the OCP microscaling formats, MXFP4 among them.
// - RDNA 3/3.5: WMMA in FP16, BF16 and INT8. RDNA 4 adds FP8 WMMA.
// - RDNA 2 and GCN 5: packed FP16 only.
const CDNA12: &[Precision] = &[Fp32, Bf16, Fp16, Int8];
const CDNA3: &[Precision] = &[Fp32, Bf16, Fp16, Fp8, Int8];
const CDNA4: &[Precision] = &[Fp32, Bf16, Fp16, Fp8, Int8, Mxfp4];
const RDNA3: &[Precision] = &[Fp32, Bf16, Fp16, Int8];
const RDNA4: &[Precision] = &[Fp32, Bf16, Fp16, Fp8, Int8];
const PACKED_FP16: &[Precision] = &[Fp32, Fp16];

/// The generation of a gfx target (`gfx942` is CDNA 3).
pub fn generation(gfx: &str) -> Option<Generation> {
    let (name, precisions) = match gfx {
        // GCN 5 (Vega): Vega 10 (MI25, RX Vega), Raven/Picasso and Renoir APUs, Vega 12,
        // Vega 20 (MI50/MI60, Radeon VII).
        "gfx900" | "gfx902" | "gfx904" | "gfx906" | "gfx909" | "gfx90c" => ("gcn5", PACKED_FP16),
        "gfx908" => ("cdna", CDNA12),
        "gfx90a" => ("cdna2", CDNA12),
        "gfx940" | "gfx941" | "gfx942" => ("cdna3", CDNA3),
        "gfx950" => ("cdna4", CDNA4),
        // RDNA 1 (Navi 10/12/14) and the Cyan Skillfish APU.
        "gfx1010" | "gfx1011" | "gfx1012" | "gfx1013" => ("rdna1", PACKED_FP16),
        "gfx1030" | "gfx1031" | "gfx1032" | "gfx1033" | "gfx1034" | "gfx1035" | "gfx1036" => {
            ("rdna2", PACKED_FP16)
        }
        "gfx1100" | "gfx1101" | "gfx1102" | "gfx1103" => ("rdna3", RDNA3),
        "gfx1150" | "gfx1151" | "gfx1152" | "gfx1153" => ("rdna3.5", RDNA3),
        "gfx1200" | "gfx1201" => ("rdna4", RDNA4),
        _ => return None,
    };
    Some(Generation { name, precisions })
}

/// True for gfx targets that only ship as the integrated GPU of an APU, whose "VRAM" is a
/// firmware carve-out of system memory rather than memory of its own.
pub fn is_integrated(gfx: &str) -> bool {
    matches!(
        gfx,
        "gfx902"
            | "gfx909"
            | "gfx90c"
            | "gfx1013"
            | "gfx1033"
            | "gfx1035"
            | "gfx1036"
            | "gfx1103"
            | "gfx1150"
            | "gfx1151"
            | "gfx1152"
            | "gfx1153"
    )
}

/// The gfx target name for KFD's `gfx_target_version` (`90402` is `gfx942`, `90010` is
/// `gfx90a`): major * 10000 + minor * 100 + stepping, with minor and stepping printed in hex.
pub fn gfx_name(target_version: u64) -> Option<String> {
    let major = target_version / 10_000;
    let minor = (target_version / 100) % 100;
    let stepping = target_version % 100;
    if major == 0 || minor > 0xf || stepping > 0xf {
        return None;
    }
    Some(format!("gfx{major}{minor:x}{stepping:x}"))
}

/// The gfx target from a tool's `GFX Version` text. ROCm 6's `rocm-smi` prints the KFD
/// version's three parts in decimal (`gfx9010` for `gfx90a`, `gfx9012` for `gfx90c`); newer
/// tools print the target itself (`gfx90a`). All-digit text is read as major (one digit for
/// gfx9 and older, two from gfx10), minor (one digit) and a decimal stepping.
pub fn normalize_gfx(text: &str) -> Option<String> {
    let lower = text.trim().to_ascii_lowercase();
    let digits = lower.strip_prefix("gfx")?;
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    if !digits.chars().all(|c| c.is_ascii_digit()) {
        return Some(lower);
    }
    let major_len = if digits.starts_with('1') { 2 } else { 1 };
    let (major, rest) = digits.split_at_checked(major_len)?;
    let (minor, stepping) = rest.split_at_checked(1)?;
    let version = major.parse::<u64>().ok()? * 10_000
        + minor.parse::<u64>().ok()? * 100
        + stepping.parse::<u64>().ok()?;
    gfx_name(version)
}

/// A PCI device id whose product is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownPart {
    /// The marketing name.
    pub name: &'static str,
    /// Its gfx target.
    pub gfx: &'static str,
    /// Memory, when every product sold under this id has the same amount.
    pub memory_bytes: Option<u64>,
}

/// Parts by PCI device id. Names follow pci.ids (with the `AMD` prefix the tools print); where
/// pci.ids lists several products under one id, so does the name, and memory is given only
/// when ROCm's specification tables give all of them the same amount (`0x740c` is MI250X or
/// MI250, both 128 GiB; `0x744c` is RX 7900 XT, XTX or GRE, 20, 24 or 16 GiB, so none).
const KNOWN_PARTS: &[(u16, KnownPart)] = &[
    // GCN 5 (Vega 10, gfx900).
    (
        0x6860,
        part("AMD Instinct MI25/MI25x2/V340/V320", "gfx900", None),
    ),
    (0x6861, part("AMD Radeon PRO WX 9100", "gfx900", None)),
    (
        0x6863,
        part("AMD Radeon Vega Frontier Edition", "gfx900", None),
    ),
    (0x687f, part("AMD Radeon RX Vega 56/64", "gfx900", None)),
    // GCN 5.1 (Vega 20, gfx906).
    (
        0x66a0,
        part("AMD Radeon Pro/Radeon Instinct (Vega 20)", "gfx906", None),
    ),
    (
        0x66a1,
        part("AMD Radeon Pro VII/Radeon Instinct MI50", "gfx906", None),
    ),
    (0x66a3, part("AMD Radeon Pro Vega II", "gfx906", None)),
    (0x66af, part("AMD Radeon VII", "gfx906", Some(16))),
    // CDNA (Arcturus, gfx908) and CDNA 2 (Aldebaran, gfx90a).
    (0x738c, part("AMD Instinct MI100", "gfx908", Some(32))),
    (0x738e, part("AMD Instinct MI100", "gfx908", Some(32))),
    (0x7408, part("AMD Instinct MI250X", "gfx90a", Some(128))),
    (
        0x740c,
        part("AMD Instinct MI250X/MI250", "gfx90a", Some(128)),
    ),
    (0x740f, part("AMD Instinct MI210", "gfx90a", Some(64))),
    // CDNA 3 (Aqua Vanjaram, gfx942) and CDNA 4 (gfx950). MI308X is missing from ROCm's
    // tables, so its memory is left open.
    (0x74a0, part("AMD Instinct MI300A", "gfx942", Some(128))),
    (0x74a1, part("AMD Instinct MI300X", "gfx942", Some(192))),
    (0x74a2, part("AMD Instinct MI308X", "gfx942", None)),
    (0x74a5, part("AMD Instinct MI325X", "gfx942", Some(256))),
    (0x75a0, part("AMD Instinct MI350X", "gfx950", Some(288))),
    (0x75a3, part("AMD Instinct MI355X", "gfx950", Some(288))),
    // RDNA 1 (Navi 10, gfx1010).
    (0x7310, part("AMD Radeon Pro W5700X", "gfx1010", None)),
    (0x7312, part("AMD Radeon Pro W5700", "gfx1010", None)),
    (
        0x731f,
        part(
            "AMD Radeon RX 5600 OEM/5600 XT / 5700/5700 XT",
            "gfx1010",
            None,
        ),
    ),
    // RDNA 2 (Navi 21, gfx1030).
    (0x73a1, part("AMD Radeon Pro V620", "gfx1030", Some(32))),
    (0x73a2, part("AMD Radeon Pro W6900X", "gfx1030", None)),
    (0x73a3, part("AMD Radeon PRO W6800", "gfx1030", Some(32))),
    (0x73a5, part("AMD Radeon RX 6950 XT", "gfx1030", Some(16))),
    (0x73af, part("AMD Radeon RX 6900 XT", "gfx1030", Some(16))),
    (
        0x73bf,
        part("AMD Radeon RX 6800/6800 XT / 6900 XT", "gfx1030", Some(16)),
    ),
    // RDNA 3 (Navi 31 gfx1100, Navi 32 gfx1101, Navi 33 gfx1102).
    (0x7448, part("AMD Radeon Pro W7900", "gfx1100", Some(48))),
    (
        0x7449,
        part("AMD Radeon Pro W7800 48GB", "gfx1100", Some(48)),
    ),
    (
        0x744a,
        part("AMD Radeon Pro W7900 Dual Slot", "gfx1100", Some(48)),
    ),
    (
        0x744c,
        part(
            "AMD Radeon RX 7900 XT/7900 XTX/7900 GRE/7900M",
            "gfx1100",
            None,
        ),
    ),
    (0x745e, part("AMD Radeon Pro W7800", "gfx1100", Some(32))),
    (0x7460, part("AMD Radeon PRO V710", "gfx1101", Some(28))),
    (0x7461, part("AMD Radeon PRO V710", "gfx1101", Some(28))),
    (0x7470, part("AMD Radeon PRO W7700", "gfx1101", Some(16))),
    (
        0x747e,
        part("AMD Radeon RX 7700 XT / 7800 XT", "gfx1101", None),
    ),
    (
        0x7480,
        part(
            "AMD Radeon RX 7600/7600 XT/7600M XT/7600S/7700S / PRO W7600",
            "gfx1102",
            None,
        ),
    ),
    // RDNA 3.5 APUs: Strix Point (gfx1150) and Strix Halo (gfx1151).
    (0x150e, part("AMD Radeon 880M / 890M", "gfx1150", None)),
    (
        0x1586,
        part(
            "AMD Radeon Graphics / Radeon 8050S Graphics / Radeon 8060S Graphics",
            "gfx1151",
            None,
        ),
    ),
    // RDNA 4 (Navi 48 gfx1201, Navi 44 gfx1200).
    (
        0x7550,
        part("AMD Radeon RX 9070/9070 XT/9070 GRE", "gfx1201", Some(16)),
    ),
    (0x7551, part("AMD Radeon AI PRO R9700", "gfx1201", Some(32))),
    (
        0x7590,
        part("AMD Radeon RX 9050 / 9060 XT", "gfx1200", None),
    ),
];

const fn part(name: &'static str, gfx: &'static str, memory_gib: Option<u64>) -> KnownPart {
    KnownPart {
        name,
        gfx,
        memory_bytes: match memory_gib {
            Some(gib) => Some(gib * GIB),
            None => None,
        },
    }
}

/// The known part for a PCI device id.
pub fn known_part(device_id: u16) -> Option<KnownPart> {
    KNOWN_PARTS
        .iter()
        .find(|(id, _)| *id == device_id)
        .map(|(_, part)| *part)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gfx_names_from_kfd_target_versions() {
        assert_eq!(gfx_name(90402).as_deref(), Some("gfx942"));
        assert_eq!(gfx_name(90010).as_deref(), Some("gfx90a"));
        assert_eq!(gfx_name(90500).as_deref(), Some("gfx950"));
        assert_eq!(gfx_name(110000).as_deref(), Some("gfx1100"));
        assert_eq!(gfx_name(120001).as_deref(), Some("gfx1201"));
        assert_eq!(gfx_name(0), None);
        assert_eq!(gfx_name(91700), None);
    }

    #[test]
    fn rocm_6_decimal_gfx_versions_are_read_as_targets() {
        // `rocm-smi --showproductname --json` on an MI250X (ROCm/rocm_smi_lib#159).
        assert_eq!(normalize_gfx("gfx9010").as_deref(), Some("gfx90a"));
        assert_eq!(normalize_gfx("gfx9012").as_deref(), Some("gfx90c"));
        assert_eq!(normalize_gfx("gfx942").as_deref(), Some("gfx942"));
        assert_eq!(normalize_gfx("gfx906").as_deref(), Some("gfx906"));
        assert_eq!(normalize_gfx("gfx1100").as_deref(), Some("gfx1100"));
        assert_eq!(normalize_gfx("gfx1010").as_deref(), Some("gfx1010"));
        assert_eq!(normalize_gfx("GFX90A").as_deref(), Some("gfx90a"));
        assert_eq!(normalize_gfx("gfx9016"), None, "stepping above 15");
        assert_eq!(normalize_gfx("N/A"), None);
        assert_eq!(normalize_gfx("gfx"), None);
    }

    #[test]
    fn gfx9_parts_have_names_and_generations() {
        // pci.ids: "6860  Vega 10 [Instinct MI25/MI25x2/V340/V320]", "66a1  Vega 20 [Radeon Pro
        // VII/Radeon Instinct MI50]"; LLVM: gfx900 is Vega 10 and MI25, gfx906 MI50/MI60.
        let mi25 = known_part(0x6860).unwrap();
        assert!(mi25.name.contains("MI25"));
        assert_eq!(mi25.gfx, "gfx900");
        assert!(known_part(0x66a1).unwrap().name.contains("MI50"));
        assert_eq!(known_part(0x66a1).unwrap().gfx, "gfx906");
        assert_eq!(generation("gfx900").unwrap().name, "gcn5");
        assert_eq!(generation("gfx1012").unwrap().name, "rdna1");
        assert!(is_integrated("gfx90c"));
    }

    /// One row per family the catalog covers: (device id, words of the pci.ids 2026.08.22
    /// name, gfx target ROCm's tables or LLVM's processor table give the product, memory in
    /// GiB from ROCm's tables, or `None` where the id covers products of different sizes).
    const SOURCE_ROWS: &[(u16, &str, &str, Option<u64>)] = &[
        (0x66af, "Radeon VII", "gfx906", Some(16)),
        (0x738c, "MI100", "gfx908", Some(32)),
        (0x740f, "MI210", "gfx90a", Some(64)),
        (0x7408, "MI250X", "gfx90a", Some(128)),
        (0x740c, "MI250", "gfx90a", Some(128)),
        (0x74a0, "MI300A", "gfx942", Some(128)),
        (0x74a1, "MI300X", "gfx942", Some(192)),
        (0x74a5, "MI325X", "gfx942", Some(256)),
        (0x75a0, "MI350X", "gfx950", Some(288)),
        (0x75a3, "MI355X", "gfx950", Some(288)),
        (0x731f, "5700 XT", "gfx1010", None),
        (0x73a3, "W6800", "gfx1030", Some(32)),
        (0x73af, "RX 6900 XT", "gfx1030", Some(16)),
        (0x7448, "W7900", "gfx1100", Some(48)),
        (0x744c, "7900 XTX", "gfx1100", None),
        (0x7470, "W7700", "gfx1101", Some(16)),
        (0x150e, "890M", "gfx1150", None),
        (0x1586, "8060S", "gfx1151", None),
        (0x7550, "9070 XT", "gfx1201", Some(16)),
        (0x7551, "R9700", "gfx1201", Some(32)),
        (0x7590, "9060 XT", "gfx1200", None),
    ];

    #[test]
    fn device_ids_match_pci_ids_and_rocm_specifications() {
        for &(id, words, gfx, memory_gib) in SOURCE_ROWS {
            let part = known_part(id).unwrap_or_else(|| panic!("0x{id:04x} missing"));
            assert!(part.name.contains(words), "0x{id:04x}: {}", part.name);
            assert_eq!(part.gfx, gfx, "0x{id:04x}");
            assert_eq!(part.memory_bytes, memory_gib.map(|g| g * GIB), "0x{id:04x}");
        }
    }

    #[test]
    fn every_catalogued_part_has_a_known_generation() {
        let mut ids: Vec<u16> = KNOWN_PARTS.iter().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), KNOWN_PARTS.len(), "duplicate device id");
        for (id, part) in KNOWN_PARTS {
            assert!(generation(part.gfx).is_some(), "0x{id:04x}: {}", part.gfx);
            assert!(part.name.starts_with("AMD "), "0x{id:04x}");
        }
        // LLVM lists gfx1150 and gfx1151 (Strix) as APUs: their memory is the host's.
        assert!(is_integrated(known_part(0x1586).unwrap().gfx));
    }

    #[test]
    fn generations_carry_their_precisions() {
        let mi300 = generation("gfx942").unwrap();
        assert_eq!(mi300.name, "cdna3");
        assert!(mi300.precisions.contains(&Fp8));
        assert!(!mi300.precisions.contains(&Mxfp4));
        assert!(generation("gfx950").unwrap().precisions.contains(&Mxfp4));
        assert!(!generation("gfx90a").unwrap().precisions.contains(&Fp8));
        assert_eq!(generation("gfx9999"), None);
    }

    #[test]
    fn device_ids_name_parts() {
        assert_eq!(known_part(0x74a1).unwrap().name, "AMD Instinct MI300X");
        assert_eq!(known_part(0x75a3).unwrap().gfx, "gfx950");
        assert_eq!(known_part(0x1234), None);
        assert!(is_integrated("gfx1151"));
        assert!(!is_integrated("gfx942"));
    }
}
