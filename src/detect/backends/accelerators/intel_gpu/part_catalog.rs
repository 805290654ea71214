//! Intel GPUs by PCI device id: architecture family, native precisions, marketing name, and for
//! parts that ship in a single memory configuration, their memory.
//!
//! Sources (checked 2026-11-24):
//! - which ids belong to which platform: the Linux kernel's `include/drm/intel/pciids.h`
//!   (torvalds/linux commit 0755a4e3e809, which merged the former `xe_pciids.h` and
//!   `i915_pciids.h` lists): `INTEL_PVC_IDS`, `INTEL_DG2_IDS`, `INTEL_ATS_M_IDS`,
//!   `INTEL_BMG_IDS`, `INTEL_MTL_IDS`, `INTEL_ARL_*_IDS`, `INTEL_LNL_IDS`, `INTEL_PTL_IDS`.
//! - product names per id: pciutils/pciids `pci.ids` version 2026.08.22 (commit
//!   c1c12547d626), vendor `8086`, written the way `xpu-smi` and the driver print them.
//! - memory, XMX precisions and vector engines per Xe-core: Intel's product specification
//!   pages (ark.intel.com, "Memory Size" and "Xe-cores"/"Vector Engines") and the Xe-HPC,
//!   Xe-HPG, Xe2 and Xe3 architecture briefs.

use crate::hardware::{GIB, Precision};

use Precision::{Bf16, Fp16, Fp32, Int8, Tf32};

/// A GPU architecture family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Architecture {
    /// Name (`xe-hpc`).
    pub name: &'static str,
    /// Precisions the XMX (matrix) and vector engines compute in natively.
    pub precisions: &'static [Precision],
    /// Vector engines (EUs) per Xe-core, to turn the EU count tools report into cores: 8 on
    /// Xe-HPC, Xe2 and Xe3 (512-bit engines), 16 on Xe-HPG and Xe-LPG (256-bit engines): a
    /// Max 1550 has 128 Xe-cores and 1024 engines, an Arc A770 32 and 512, a B580 20 and 160.
    pub eus_per_xe_core: u32,
}

// Xe-HPC (Data Center GPU Max) XMX engines take TF32, BF16, FP16 and INT8; Xe-HPG (Arc A,
// Data Center GPU Flex, Arrow Lake-H's Xe-LPG+), Xe2 (Arc B, Lunar Lake) and Xe3 (Panther
// Lake) XMX take BF16, FP16 and INT8, without TF32. Meteor Lake's Xe-LPG has no XMX engines.
const MATRIX: &[Precision] = &[Fp32, Bf16, Fp16, Int8];
const XE_HPC: Architecture = Architecture {
    name: "xe-hpc",
    precisions: &[Fp32, Tf32, Bf16, Fp16, Int8],
    eus_per_xe_core: 8,
};
const XE_HPG: Architecture = Architecture {
    name: "xe-hpg",
    precisions: MATRIX,
    eus_per_xe_core: 16,
};
const XE2_HPG: Architecture = Architecture {
    name: "xe2-hpg",
    precisions: MATRIX,
    eus_per_xe_core: 8,
};
const XE_LPG: Architecture = Architecture {
    name: "xe-lpg",
    precisions: BASELINE_PRECISIONS,
    eus_per_xe_core: 16,
};
const XE_LPG_PLUS: Architecture = Architecture {
    name: "xe-lpg+",
    precisions: MATRIX,
    eus_per_xe_core: 16,
};
const XE2_LPG: Architecture = Architecture {
    name: "xe2-lpg",
    precisions: MATRIX,
    eus_per_xe_core: 8,
};
const XE3_LPG: Architecture = Architecture {
    name: "xe3-lpg",
    precisions: MATRIX,
    eus_per_xe_core: 8,
};

/// Precisions of a GPU whose architecture is not known: every i915/xe-era GPU computes FP16
/// natively, so that is the floor for parts not listed.
pub const BASELINE_PRECISIONS: &[Precision] = &[Fp32, Fp16];

/// The architecture of a device id, by the kernel's per-platform id lists.
pub fn architecture(device_id: u16) -> Option<Architecture> {
    match device_id {
        // PVC: Ponte Vecchio, Data Center GPU Max.
        0x0b69 | 0x0b6e | 0x0bd4..=0x0bdb | 0x0be0 | 0x0be1 | 0x0be5 => Some(XE_HPC),
        // DG2 (Alchemist: Arc A, Arc Pro A) and ATS-M (Data Center GPU Flex).
        0x5690..=0x5697 | 0x56a0..=0x56a6 | 0x56b0..=0x56b3 | 0x56ba..=0x56bf => Some(XE_HPG),
        0x56c0..=0x56c2 => Some(XE_HPG),
        // BMG: Battlemage (Arc B, Arc Pro B), G21 and G31.
        0xe202 | 0xe209 | 0xe20b..=0xe20d | 0xe210..=0xe212 | 0xe216 | 0xe220..=0xe223 => {
            Some(XE2_HPG)
        }
        // MTL and ARL-U/ARL-S: Meteor Lake's Xe-LPG; ARL-H adds XMX (Xe-LPG+).
        0x7d40 | 0x7d45 | 0x7d55 | 0x7d60 | 0x7dd5 | 0x7d41 | 0x7d67 | 0xb640 => Some(XE_LPG),
        0x7d51 | 0x7dd1 => Some(XE_LPG_PLUS),
        // LNL: Lunar Lake. PTL: Panther Lake.
        0x6420 | 0x64a0 | 0x64b0 => Some(XE2_LPG),
        0xb080..=0xb087 | 0xb08f | 0xb090 | 0xb0a0 | 0xb0b0 => Some(XE3_LPG),
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

/// Names from pci.ids; memory where every product sold under the id has the same amount (the
/// Arc A770 comes with 8 or 16 GB and pci.ids gives `0x56b1` to both Arc Pro A40 and A50, so
/// theirs is left open).
const PARTS: &[(u16, Part)] = &[
    // Ponte Vecchio.
    (0x0b69, part("Intel(R) Data Center GPU Max 1450", Some(128))),
    (0x0bd5, part("Intel(R) Data Center GPU Max 1550", Some(128))),
    (0x0bd6, part("Intel(R) Data Center GPU Max 1550", Some(128))),
    (0x0bd7, part("Intel(R) Data Center GPU Max 1350", Some(96))),
    (0x0bd8, part("Intel(R) Data Center GPU Max 1350", Some(96))),
    (0x0bd9, part("Intel(R) Data Center GPU Max 1100", Some(48))),
    (0x0bda, part("Intel(R) Data Center GPU Max 1100", Some(48))),
    (0x0bdb, part("Intel(R) Data Center GPU Max 1100", Some(48))),
    // Arctic Sound-M.
    (0x56c0, part("Intel(R) Data Center GPU Flex 170", Some(16))),
    (0x56c1, part("Intel(R) Data Center GPU Flex 140", Some(12))),
    // Alchemist.
    (0x56a0, part("Intel(R) Arc(TM) A770 Graphics", None)),
    (0x56a1, part("Intel(R) Arc(TM) A750 Graphics", Some(8))),
    (0x56a2, part("Intel(R) Arc(TM) A580 Graphics", Some(8))),
    (0x56a5, part("Intel(R) Arc(TM) A380 Graphics", Some(6))),
    (0x56a6, part("Intel(R) Arc(TM) A310 Graphics", Some(4))),
    (0x56b1, part("Intel(R) Arc(TM) Pro A40/A50 Graphics", None)),
    (0x56b3, part("Intel(R) Arc(TM) Pro A60 Graphics", Some(12))),
    // Battlemage.
    (0xe20b, part("Intel(R) Arc(TM) B580 Graphics", Some(12))),
    (0xe20c, part("Intel(R) Arc(TM) B570 Graphics", Some(10))),
    (0xe211, part("Intel(R) Arc(TM) Pro B60 Graphics", Some(24))),
    (0xe212, part("Intel(R) Arc(TM) Pro B50 Graphics", Some(16))),
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

    /// Every id of the kernel's lists (include/drm/intel/pciids.h at 0755a4e3e809) for the
    /// platforms the catalog covers, and the family each belongs to.
    #[test]
    fn kernel_id_lists_map_to_their_families() {
        let lists: &[(&str, &[u16])] = &[
            (
                "xe-hpc",
                &[
                    0x0b69, 0x0b6e, 0x0bd4, 0x0bd5, 0x0bd6, 0x0bd7, 0x0bd8, 0x0bd9, 0x0bda, 0x0bdb,
                    0x0be0, 0x0be1, 0x0be5,
                ],
            ),
            (
                "xe-hpg",
                &[
                    0x56a0, 0x56a1, 0x56a2, 0x56be, 0x56bf, 0x5690, 0x5691, 0x5692, 0x56a5, 0x56a6,
                    0x56b0, 0x56b1, 0x56ba, 0x56bb, 0x56bc, 0x56bd, 0x5693, 0x5694, 0x5695, 0x56a3,
                    0x56a4, 0x56b2, 0x56b3, 0x5696, 0x5697, 0x56c0, 0x56c2, 0x56c1,
                ],
            ),
            (
                "xe2-hpg",
                &[
                    0xe202, 0xe209, 0xe20b, 0xe20c, 0xe20d, 0xe210, 0xe211, 0xe212, 0xe216, 0xe220,
                    0xe221, 0xe222, 0xe223,
                ],
            ),
            (
                "xe-lpg",
                &[
                    0x7d40, 0x7d45, 0x7d55, 0x7d60, 0x7dd5, 0x7d41, 0x7d67, 0xb640,
                ],
            ),
            ("xe-lpg+", &[0x7d51, 0x7dd1]),
            ("xe2-lpg", &[0x6420, 0x64a0, 0x64b0]),
            (
                "xe3-lpg",
                &[
                    0xb080, 0xb081, 0xb082, 0xb083, 0xb084, 0xb085, 0xb086, 0xb087, 0xb08f, 0xb090,
                    0xb0a0, 0xb0b0,
                ],
            ),
        ];
        for (family, ids) in lists {
            for &id in *ids {
                assert_eq!(
                    architecture(id).map(|a| a.name),
                    Some(*family),
                    "0x{id:04x}"
                );
            }
        }
        // Ids between the lists' entries that the kernel does not list.
        for id in [0x56a7, 0x56b4, 0x56c3, 0xe203, 0xe213, 0x0bd0, 0x7d42] {
            assert_eq!(architecture(id), None, "0x{id:04x}");
        }
    }

    /// (device id, the product pci.ids 2026.08.22 names, memory from Intel's specification
    /// pages or `None` where the id covers several sizes).
    #[test]
    fn parts_match_pci_ids_and_intel_specifications() {
        let rows: &[(u16, &str, Option<u64>)] = &[
            (0x0bd5, "Max 1550", Some(128)),
            (0x0bd9, "Max 1100", Some(48)),
            (0x56c0, "Flex 170", Some(16)),
            (0x56c1, "Flex 140", Some(12)),
            (0x56a0, "A770", None),
            (0x56a5, "A380", Some(6)),
            (0xe20b, "B580", Some(12)),
            (0xe20c, "B570", Some(10)),
            (0xe211, "Pro B60", Some(24)),
        ];
        for &(id, product, memory_gib) in rows {
            let part = part_for(id).unwrap_or_else(|| panic!("0x{id:04x} missing"));
            assert!(part.name.contains(product), "0x{id:04x}: {}", part.name);
            assert_eq!(part.memory_bytes, memory_gib.map(|g| g * GIB), "0x{id:04x}");
            assert!(architecture(id).is_some(), "0x{id:04x} has no family");
        }
        assert_eq!(part_for(0x46a6), None);
        assert_eq!(fallback_name(Some(0x46a6)), "Intel(R) Graphics [0x46a6]");
    }

    #[test]
    fn xe_cores_per_family() {
        // Intel's specifications: Max 1550 128 Xe-cores and 1024 vector engines, Arc A770 32
        // and 512, Arc B580 20 and 160.
        let cores = |id: u16, eus: u32| architecture(id).map(|a| eus / a.eus_per_xe_core);
        assert_eq!(cores(0x0bd5, 1024), Some(128));
        assert_eq!(cores(0x56a0, 512), Some(32));
        assert_eq!(cores(0xe20b, 160), Some(20));
    }
}
