//! What the AMD backend knows without asking the hardware: gfx targets and the GPU generations
//! they belong to, the precisions each generation computes in natively, and the marketing names
//! of common PCI device ids (the model name of last resort when no AMD tool is installed).

use crate::hardware::Precision;

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
}

/// Marketing names of common parts by PCI device id (pci.ids and AMD's Instinct docs, which list
/// `lspci -d 1002:74a1` for MI300X, `74a2` MI308X, `74a5` MI325X, `75a0` MI350X, `75a3` MI355X).
/// The gfx9 ids are pci.ids' Vega 10 and Vega 20 entries.
const KNOWN_PARTS: &[(u16, KnownPart)] = &[
    (0x6860, part("AMD Instinct MI25", "gfx900")),
    (0x6861, part("AMD Radeon Pro WX 9100", "gfx900")),
    (0x6863, part("AMD Radeon Vega Frontier Edition", "gfx900")),
    (0x687f, part("AMD Radeon RX Vega 56/64", "gfx900")),
    (0x66a0, part("AMD Instinct MI50/MI60", "gfx906")),
    (0x66a1, part("AMD Instinct MI50", "gfx906")),
    (0x66a3, part("AMD Radeon Pro Vega II", "gfx906")),
    (0x66af, part("AMD Radeon VII", "gfx906")),
    (0x738c, part("AMD Instinct MI100", "gfx908")),
    (0x7408, part("AMD Instinct MI250X", "gfx90a")),
    (0x740c, part("AMD Instinct MI250X/MI250", "gfx90a")),
    (0x740f, part("AMD Instinct MI210", "gfx90a")),
    (0x74a0, part("AMD Instinct MI300A", "gfx942")),
    (0x74a1, part("AMD Instinct MI300X", "gfx942")),
    (0x74a2, part("AMD Instinct MI308X", "gfx942")),
    (0x74a5, part("AMD Instinct MI325X", "gfx942")),
    (0x75a0, part("AMD Instinct MI350X", "gfx950")),
    (0x75a3, part("AMD Instinct MI355X", "gfx950")),
    (
        0x73bf,
        part("AMD Radeon RX 6800/6800 XT/6900 XT", "gfx1030"),
    ),
    (0x7448, part("AMD Radeon PRO W7900", "gfx1100")),
    (0x744c, part("AMD Radeon RX 7900 XT/7900 XTX", "gfx1100")),
    (0x747e, part("AMD Radeon RX 7700 XT/7800 XT", "gfx1101")),
    (0x7480, part("AMD Radeon RX 7600", "gfx1102")),
    (0x7550, part("AMD Radeon RX 9070/9070 XT", "gfx1201")),
];

const fn part(name: &'static str, gfx: &'static str) -> KnownPart {
    KnownPart { name, gfx }
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
        assert_eq!(known_part(0x6860).unwrap().name, "AMD Instinct MI25");
        assert_eq!(known_part(0x66a1).unwrap().gfx, "gfx906");
        assert_eq!(generation("gfx900").unwrap().name, "gcn5");
        assert_eq!(generation("gfx1012").unwrap().name, "rdna1");
        assert!(is_integrated("gfx90c"));
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
