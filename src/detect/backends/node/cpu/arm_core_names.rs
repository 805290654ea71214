//! Names for arm64 cores, which `/proc/cpuinfo` identifies only by the MIDR fields
//! `CPU implementer` and `CPU part` (`0x41`/`0xd4f` is ARM Neoverse-V2).
//!
//! Source: util-linux `sys-utils/lscpu-arm.c` (util-linux/util-linux commit 39465c780eed,
//! v2.43-devel, 2026-08-20), whose implementer and part tables are what `lscpu` prints; the
//! names here are spelt as there. Which cloud and AI parts use which core (the comments on
//! [`part_name`]) is from the vendors' own documentation: AWS's Graviton getting-started guide,
//! NVIDIA's Grace and DGX Spark (GB10) data sheets, Ampere's and Microsoft's product pages.

/// Names of arm64 implementers (`CPU implementer`), as `lscpu` prints them.
pub(super) fn implementer_name(implementer: u32) -> Option<&'static str> {
    Some(match implementer {
        0x41 => "ARM",
        0x42 => "Broadcom",
        0x43 => "Cavium",
        0x46 => "FUJITSU",
        0x48 => "HiSilicon",
        0x4e => "NVIDIA",
        0x50 => "APM",
        0x51 => "Qualcomm",
        0x61 => "Apple",
        0x6d => "Microsoft",
        0xc0 => "Ampere",
        _ => return None,
    })
}

/// Names of the arm64 cores found in servers and AI machines, by (implementer, part). Neoverse
/// cores are what the cloud parts are built on: Graviton2 and Ampere Altra are N1, Graviton3
/// is V1, Graviton4 and NVIDIA Grace are V2, Azure Cobalt 100 is N2; NVIDIA's GB10 (DGX Spark)
/// pairs Cortex-X925 with Cortex-A725, Jetson Orin runs Cortex-A78AE, AmpereOne is Ampere-1
/// and Ampere-1a, and NVIDIA's Vera CPU is Olympus.
pub(super) fn part_name(implementer: u32, part: u32) -> Option<&'static str> {
    Some(match (implementer, part) {
        // Small boards (Raspberry Pi, Allwinner, Jetson) that run the agent on edge nodes.
        (0x41, 0xc07) => "Cortex-A7",
        (0x41, 0xd03) => "Cortex-A53",
        (0x41, 0xd05) => "Cortex-A55",
        (0x41, 0xd07) => "Cortex-A57",
        (0x41, 0xd08) => "Cortex-A72",
        (0x41, 0xd0b) => "Cortex-A76",
        (0x41, 0xd42) => "Cortex-A78AE",
        (0x41, 0xd85) => "Cortex-X925",
        (0x41, 0xd87) => "Cortex-A725",
        // Neoverse.
        (0x41, 0xd0c) => "Neoverse-N1",
        (0x41, 0xd40) => "Neoverse-V1",
        (0x41, 0xd49) => "Neoverse-N2",
        (0x41, 0xd4f) => "Neoverse-V2",
        (0x41, 0xd83) => "Neoverse-V3AE",
        (0x41, 0xd84) => "Neoverse-V3",
        (0x41, 0xd8e) => "Neoverse-N3",
        (0x43, 0x0af) => "ThunderX2-99xx",
        (0x46, 0x001) => "A64FX",
        (0x46, 0x003) => "MONAKA",
        (0x48, 0xd01 | 0xd02 | 0xd03 | 0xd22) => "Kunpeng-920",
        (0x48, 0xd06) => "Kunpeng-950",
        (0x4e, 0x000) => "Denver",
        (0x4e, 0x003) => "Denver-2",
        (0x4e, 0x004) => "Carmel",
        (0x4e, 0x010) => "Olympus",
        (0x51, 0x001) => "Oryon",
        (0x61, 0x022) => "Icestorm-M1",
        (0x61, 0x023) => "Firestorm-M1",
        (0x61, 0x024) => "Icestorm-M1-Pro",
        (0x61, 0x025) => "Firestorm-M1-Pro",
        (0x61, 0x028) => "Icestorm-M1-Max",
        (0x61, 0x029) => "Firestorm-M1-Max",
        (0x61, 0x032) => "Blizzard-M2",
        (0x61, 0x033) => "Avalanche-M2",
        (0x61, 0x034) => "Blizzard-M2-Pro",
        (0x61, 0x035) => "Avalanche-M2-Pro",
        (0x61, 0x038) => "Blizzard-M2-Max",
        (0x61, 0x039) => "Avalanche-M2-Max",
        (0x6d, 0xd49) => "Azure-Cobalt-100",
        (0xc0, 0xac3) => "Ampere-1",
        (0xc0, 0xac4) => "Ampere-1a",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of lscpu-arm.c at util-linux 39465c780eed: (implementer, part, implementer name,
    /// part name).
    const LSCPU_ROWS: &[(u32, u32, &str, &str)] = &[
        (0x41, 0xd0c, "ARM", "Neoverse-N1"),
        (0x41, 0xd40, "ARM", "Neoverse-V1"),
        (0x41, 0xd49, "ARM", "Neoverse-N2"),
        (0x41, 0xd4f, "ARM", "Neoverse-V2"),
        (0x41, 0xd84, "ARM", "Neoverse-V3"),
        (0x41, 0xd8e, "ARM", "Neoverse-N3"),
        (0x41, 0xd85, "ARM", "Cortex-X925"),
        (0x41, 0xd87, "ARM", "Cortex-A725"),
        (0x41, 0xd42, "ARM", "Cortex-A78AE"),
        (0x46, 0x001, "FUJITSU", "A64FX"),
        (0x48, 0xd01, "HiSilicon", "Kunpeng-920"),
        (0x4e, 0x004, "NVIDIA", "Carmel"),
        (0x4e, 0x010, "NVIDIA", "Olympus"),
        (0x51, 0x001, "Qualcomm", "Oryon"),
        (0x61, 0x033, "Apple", "Avalanche-M2"),
        (0x6d, 0xd49, "Microsoft", "Azure-Cobalt-100"),
        (0xc0, 0xac3, "Ampere", "Ampere-1"),
        (0xc0, 0xac4, "Ampere", "Ampere-1a"),
    ];

    #[test]
    fn names_match_lscpu() {
        for &(implementer, part, vendor, name) in LSCPU_ROWS {
            assert_eq!(
                implementer_name(implementer),
                Some(vendor),
                "0x{implementer:02x}"
            );
            assert_eq!(
                part_name(implementer, part),
                Some(name),
                "0x{implementer:02x}/0x{part:03x}"
            );
        }
    }

    #[test]
    fn a_part_number_belongs_to_its_implementer() {
        // 0xd49 is Neoverse-N2 from ARM but Azure Cobalt 100 from Microsoft; 0xd40 from
        // HiSilicon is not in our table (lscpu calls it Cortex-A76).
        assert_ne!(part_name(0x41, 0xd49), part_name(0x6d, 0xd49));
        assert_eq!(part_name(0x48, 0xd40), None);
        assert_eq!(implementer_name(0x99), None);
    }
}
