//! Intel GPUs by PCI device id: architecture family, native precisions, marketing name, and for
//! data-center parts that ship in a single memory configuration, their memory.

use crate::hardware::{GIB, Precision};

use Precision::{Bf16, Fp16, Fp32, Int8, Tf32};

/// A GPU architecture family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Architecture {
    /// Name (`xe-hpc`).
    pub name: &'static str,
    /// Precisions the XMX (matrix) and vector engines compute in natively.
    pub precisions: &'static [Precision],
}

// From Intel's product briefs: Xe-HPC (Data Center GPU Max) XMX engines take TF32, BF16, FP16
// and INT8; Xe-HPG (Arc A, Data Center GPU Flex) and Xe2-HPG (Arc B) XMX take BF16, FP16 and
// INT8, without TF32. Every i915/xe-era GPU computes FP16 natively, so that is the floor for
// parts not listed (integrated graphics).
const XE_HPC: Architecture = Architecture {
    name: "xe-hpc",
    precisions: &[Fp32, Tf32, Bf16, Fp16, Int8],
};
const XE_HPG: Architecture = Architecture {
    name: "xe-hpg",
    precisions: &[Fp32, Bf16, Fp16, Int8],
};
const XE2_HPG: Architecture = Architecture {
    name: "xe2-hpg",
    precisions: &[Fp32, Bf16, Fp16, Int8],
};

/// Precisions of a GPU whose architecture is not known.
pub const BASELINE_PRECISIONS: &[Precision] = &[Fp32, Fp16];

/// Vector engines (EUs) per Xe-core on Xe-HPC, Xe-HPG and Xe2.
pub const EUS_PER_XE_CORE: u32 = 8;

/// The architecture of a device id, by the ranges Intel assigned to each family.
pub fn architecture(device_id: u16) -> Option<Architecture> {
    match device_id {
        // Ponte Vecchio.
        0x0b69 | 0x0bd0..=0x0bdb => Some(XE_HPC),
        // Alchemist (Arc A, Arc Pro A: 0x5690-0x56bf) and Arctic Sound-M (Flex: 0x56c0-0x56c2).
        0x5690..=0x56c2 => Some(XE_HPG),
        // Battlemage (Arc B, Arc Pro B).
        0xe202..=0xe212 => Some(XE2_HPG),
        _ => None,
    }
}

/// A named part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// The name `xpu-smi` and the driver give it.
    pub name: &'static str,
    /// Memory, for parts sold in one memory configuration only.
    pub memory_bytes: Option<u64>,
}

const fn part(name: &'static str, memory_gib: Option<u64>) -> Part {
    Part {
        name,
        memory_bytes: match memory_gib {
            Some(gib) => Some(gib * GIB),
            None => None,
        },
    }
}

/// Names from pci.ids and Intel's product pages; Arc A770 comes with 8 or 16 GB, so its memory
/// is left open.
const PARTS: &[(u16, Part)] = &[
    (0x0b69, part("Intel(R) Data Center GPU Max 1450", None)),
    (0x0bd5, part("Intel(R) Data Center GPU Max 1550", Some(128))),
    (0x0bd6, part("Intel(R) Data Center GPU Max 1550", Some(128))),
    (0x0bd7, part("Intel(R) Data Center GPU Max 1350", None)),
    (0x0bd9, part("Intel(R) Data Center GPU Max 1100", Some(48))),
    (0x0bda, part("Intel(R) Data Center GPU Max 1100", Some(48))),
    (0x0bdb, part("Intel(R) Data Center GPU Max 1100", Some(48))),
    (0x56c0, part("Intel(R) Data Center GPU Flex 170", Some(16))),
    (0x56c1, part("Intel(R) Data Center GPU Flex 140", None)),
    (0x56a0, part("Intel(R) Arc(TM) A770 Graphics", None)),
    (0x56a1, part("Intel(R) Arc(TM) A750 Graphics", None)),
    (0x56a5, part("Intel(R) Arc(TM) A380 Graphics", None)),
    (0x56a6, part("Intel(R) Arc(TM) A310 Graphics", None)),
    (0xe20b, part("Intel(R) Arc(TM) B580 Graphics", None)),
    (0xe20c, part("Intel(R) Arc(TM) B570 Graphics", None)),
    (0xe211, part("Intel(R) Arc(TM) Pro B60 Graphics", None)),
];

/// The named part for a device id.
pub fn part_for(device_id: u16) -> Option<Part> {
    PARTS
        .iter()
        .find(|(id, _)| *id == device_id)
        .map(|(_, part)| *part)
}

/// The name of a part nobody listed, the way `xpu-smi` names one (`Intel(R) Graphics [0x46a6]`).
pub fn fallback_name(device_id: Option<u16>) -> String {
    match device_id {
        Some(id) => format!("Intel(R) Graphics [0x{id:04x}]"),
        None => "Intel(R) Graphics".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_by_device_id() {
        assert_eq!(architecture(0x0bd5).unwrap().name, "xe-hpc");
        assert!(architecture(0x0bd5).unwrap().precisions.contains(&Tf32));
        assert_eq!(architecture(0x56c0).unwrap().name, "xe-hpg");
        assert!(!architecture(0x56a0).unwrap().precisions.contains(&Tf32));
        assert_eq!(architecture(0xe20b).unwrap().name, "xe2-hpg");
        assert_eq!(architecture(0x46a6), None);
    }

    #[test]
    fn parts_and_fallbacks() {
        assert_eq!(part_for(0x0bd5).unwrap().memory_bytes, Some(128 * GIB));
        assert_eq!(part_for(0x56a0).unwrap().memory_bytes, None);
        assert_eq!(part_for(0x46a6), None);
        assert_eq!(fallback_name(Some(0x46a6)), "Intel(R) Graphics [0x46a6]");
    }
}
