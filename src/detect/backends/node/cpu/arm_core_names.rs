//! Names for arm64 cores, which `/proc/cpuinfo` identifies only by the MIDR fields
//! `CPU implementer` and `CPU part` (`0x41`/`0xd4f` is ARM Neoverse-V2).

/// Names of arm64 implementers (`CPU implementer`), as `lscpu` prints them.
pub(super) fn implementer_name(implementer: u32) -> Option<&'static str> {
    Some(match implementer {
        0x41 => "ARM",
        0x42 => "Broadcom",
        0x43 => "Cavium",
        0x46 => "Fujitsu",
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
/// is V1, Graviton4 and NVIDIA Grace are V2, Azure Cobalt 100 is N2.
pub(super) fn part_name(implementer: u32, part: u32) -> Option<&'static str> {
    Some(match (implementer, part) {
        // Small boards (Raspberry Pi, Allwinner) that run the agent on edge nodes.
        (0x41, 0xc07) => "Cortex-A7",
        (0x41, 0xd03) => "Cortex-A53",
        (0x41, 0xd08) => "Cortex-A72",
        (0x41, 0xd0b) => "Cortex-A76",
        (0x41, 0xd0c) => "Neoverse-N1",
        (0x41, 0xd40) => "Neoverse-V1",
        (0x41, 0xd49) => "Neoverse-N2",
        (0x41, 0xd4f) => "Neoverse-V2",
        (0x41, 0xd84) => "Neoverse-V3",
        (0x41, 0xd8e) => "Neoverse-N3",
        (0x43, 0x0af) => "ThunderX2-99xx",
        (0x46, 0x001) => "A64FX",
        (0x48, 0xd01) => "Kunpeng-920",
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
