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
        "gfx906" => ("gcn5", PACKED_FP16),
        "gfx908" => ("cdna", CDNA12),
        "gfx90a" => ("cdna2", CDNA12),
        "gfx940" | "gfx941" | "gfx942" => ("cdna3", CDNA3),
        "gfx950" => ("cdna4", CDNA4),
        "gfx1030" | "gfx1031" | "gfx1032" | "gfx1033" | "gfx1034" | "gfx1035" | "gfx1036" => {
            ("rdna2", PACKED_FP16)
        }
        "gfx1100" | "gfx1101" | "gfx1102" | "gfx1103" => ("rdna3", RDNA3),
        "gfx1150" | "gfx1151" | "gfx1152" => ("rdna3.5", RDNA3),
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
        "gfx90c"
            | "gfx1033"
            | "gfx1035"
            | "gfx1036"
            | "gfx1103"
            | "gfx1150"
            | "gfx1151"
            | "gfx1152"
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
const KNOWN_PARTS: &[(u16, KnownPart)] = &[
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
