//! Accelerator products the planner knows by name: memory as the vendor tool reports it,
//! precisions, memory bandwidth and the usual scale-up link. Used by the `--hardware`
//! shorthand and to fill in what a detection report leaves out (bandwidth, precisions).
//!
//! Bandwidth and memory figures are the vendors' datasheet values: NVIDIA H100 (SXM 3.35 TB/s,
//! PCIe 2.0 TB/s, NVL 3.9 TB/s), H200 (4.8 TB/s), H20 (4.0 TB/s), A100 (40 GB 1.555 TB/s,
//! 80 GB SXM 2.039 TB/s, 80 GB PCIe 1.935 TB/s), L4 (300 GB/s), L40S (864 GB/s), A10
//! (600 GB/s), RTX A6000 (768 GB/s), A40 (696 GB/s), T4 (320 GB/s), V100 (900 GB/s), GeForce RTX 4090 (1,008 GB/s), B200
//! (8 TB/s) datasheets; H800 (SXM5: 80 GB HBM3, 3.35 TB/s, the H100 SXM's compute, NVLink
//! 400 GB/s; PCIe: 2.0 TB/s) datasheet; GB200 from the GB200 NVL72 spec sheet divided by its 72
//! GPUs (13.4 TB HBM3e = 186 GB and 576 TB/s = 8 TB/s per GPU; FP4 1,440 PFLOPS with
//! sparsity = 10 PFLOPS dense per GPU, FP8 5, FP16/BF16 2.5, TF32 1.25 dense; NVLink 5 at
//! 1.8 TB/s per GPU), its `nvidia-smi` size 189,471 MiB as GB200 trays print it; AMD
//! Instinct MI300X (5.3 TB/s), MI325X (6 TB/s), MI355X (8 TB/s) data sheets; Intel Gaudi 2
//! (2.45 TB/s) and Gaudi 3 (3.7 TB/s) product briefs; Google Cloud TPU v5e (819 GB/s), v5p (2,765 GB/s), v6e (1,640 GB/s) system-architecture pages; AWS Trainium2
//! (2.9 TB/s per chip). Memory in MiB is what `nvidia-smi` / `amd-smi` print where they differ
//! from the marketing figure (an "80 GB" H100 shows 81,559 MiB).
//! Precisions follow the architecture (Hopper: FP8; Ada: FP8; Ampere: no FP8; Blackwell and
//! MI355X: FP4), as the detection backends fill them.

use crate::hardware::{Family, InterconnectKind, MIB, Precision, Vendor};

use super::units::Bytes;

use Precision::{Bf16, Fp8, Fp16, Fp32, Int4, Int8, Mxfp4, Nvfp4, Tf32};

const HOPPER: &[Precision] = &[Fp32, Tf32, Bf16, Fp16, Fp8, Int8, Int4];
const ADA: &[Precision] = &[Fp32, Tf32, Bf16, Fp16, Fp8, Int8, Int4];
const AMPERE: &[Precision] = &[Fp32, Tf32, Bf16, Fp16, Int8, Int4];
const TURING: &[Precision] = &[Fp32, Fp16, Int8, Int4];
const VOLTA: &[Precision] = &[Fp32, Fp16];
const BLACKWELL: &[Precision] = &[Fp32, Tf32, Bf16, Fp16, Fp8, Int8, Int4, Nvfp4, Mxfp4];
const CDNA3: &[Precision] = &[Fp32, Bf16, Fp16, Fp8, Int8];
const CDNA4: &[Precision] = &[Fp32, Bf16, Fp16, Fp8, Int8, Mxfp4];
const GAUDI: &[Precision] = &[Fp32, Bf16, Fp16, Fp8, Int8];
const TPU: &[Precision] = &[Fp32, Bf16, Int8];
const TRAINIUM2: &[Precision] = &[Fp32, Bf16, Fp16, Fp8];

/// What an unknown product is assumed to compute in: the formats every current accelerator
/// has, and the integer formats weight-only kernels use.
pub const CONSERVATIVE_PRECISIONS: &[Precision] = &[Fp32, Fp16, Bf16, Int8, Int4];

/// One product.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Product {
    /// Display name.
    pub name: &'static str,
    /// Lowercase fragments that must all occur in a device name for it to be this product.
    pub patterns: &'static [&'static str],
    /// The maker.
    pub vendor: Vendor,
    /// The kind of device.
    pub family: Family,
    /// Memory in MiB as reported by the vendor tool.
    pub memory_mib: u64,
    /// The marketing size in GB, used to tell variants apart (`A100-40GB`).
    pub nominal_gb: u64,
    /// Native precisions.
    pub precisions: &'static [Precision],
    /// Peak memory bandwidth in TB/s.
    pub bandwidth_tbps: f64,
    /// The scale-up link its usual servers have (`None`: PCIe only).
    pub link: Option<InterconnectKind>,
}

/// A GPU entry; `memory` is (MiB as reported, nominal GB).
const fn gpu(
    name: &'static str,
    patterns: &'static [&'static str],
    vendor: Vendor,
    (memory_mib, nominal_gb): (u64, u64),
    precisions: &'static [Precision],
    bandwidth_tbps: f64,
    link: Option<InterconnectKind>,
) -> Product {
    Product {
        name,
        patterns,
        vendor,
        family: Family::Gpu,
        memory_mib,
        nominal_gb,
        precisions,
        bandwidth_tbps,
        link,
    }
}

const NV: Vendor = Vendor::Nvidia;
const NVSWITCH: Option<InterconnectKind> = Some(InterconnectKind::Nvswitch);
const NVLINK: Option<InterconnectKind> = Some(InterconnectKind::Nvlink);
const PCIE: Option<InterconnectKind> = None;

/// The table. More specific patterns come first: the first product whose patterns all match
/// (and, when a memory size is known, whose size matches) wins.
pub const PRODUCTS: &[Product] = &[
    gpu(
        "NVIDIA H100 NVL",
        &["h100", "nvl"],
        NV,
        (95_830, 94),
        HOPPER,
        3.9,
        NVLINK,
    ),
    gpu(
        "NVIDIA H100 PCIe",
        &["h100", "pcie"],
        NV,
        (81_559, 80),
        HOPPER,
        2.0,
        PCIE,
    ),
    gpu(
        "NVIDIA H100 80GB HBM3",
        &["h100"],
        NV,
        (81_559, 80),
        HOPPER,
        3.35,
        NVSWITCH,
    ),
    // The H100's export variant for China: the same die and memory, NVLink cut to 400 GB/s
    // (the H100 SXM has 900 GB/s). The table keeps no link bandwidth, only the link kind.
    gpu(
        "NVIDIA H800 PCIe",
        &["h800", "pcie"],
        NV,
        (81_559, 80),
        HOPPER,
        2.0,
        PCIE,
    ),
    gpu(
        "NVIDIA H800",
        &["h800"],
        NV,
        (81_559, 80),
        HOPPER,
        3.35,
        NVSWITCH,
    ),
    gpu(
        "NVIDIA H200",
        &["h200"],
        NV,
        (143_771, 141),
        HOPPER,
        4.8,
        NVSWITCH,
    ),
    gpu(
        "NVIDIA H20",
        &["h20"],
        NV,
        (97_871, 96),
        HOPPER,
        4.0,
        NVSWITCH,
    ),
    gpu(
        "NVIDIA A100 80GB PCIe",
        &["a100", "pcie"],
        NV,
        (81_920, 80),
        AMPERE,
        1.935,
        PCIE,
    ),
    gpu(
        "NVIDIA A100-SXM4-80GB",
        &["a100"],
        NV,
        (81_920, 80),
        AMPERE,
        2.039,
        NVSWITCH,
    ),
    gpu(
        "NVIDIA A100-SXM4-40GB",
        &["a100"],
        NV,
        (40_960, 40),
        AMPERE,
        1.555,
        NVSWITCH,
    ),
    gpu("NVIDIA L40S", &["l40s"], NV, (46_068, 48), ADA, 0.864, PCIE),
    gpu("NVIDIA L4", &["l4"], NV, (23_034, 24), ADA, 0.3, PCIE),
    gpu(
        "NVIDIA A10G",
        &["a10g"],
        NV,
        (23_028, 24),
        AMPERE,
        0.6,
        PCIE,
    ),
    gpu("NVIDIA A10", &["a10"], NV, (23_028, 24), AMPERE, 0.6, PCIE),
    gpu(
        "NVIDIA RTX A6000",
        &["a6000"],
        NV,
        (49_140, 48),
        AMPERE,
        0.768,
        PCIE,
    ),
    gpu(
        "NVIDIA A40",
        &["a40"],
        NV,
        (46_068, 48),
        AMPERE,
        0.696,
        PCIE,
    ),
    gpu("NVIDIA T4", &["t4"], NV, (15_360, 16), TURING, 0.32, PCIE),
    gpu(
        "NVIDIA V100",
        &["v100"],
        NV,
        (32_768, 32),
        VOLTA,
        0.9,
        NVLINK,
    ),
    gpu(
        "NVIDIA GeForce RTX 4090",
        &["4090"],
        NV,
        (24_564, 24),
        ADA,
        1.008,
        PCIE,
    ),
    // The Blackwell GPU of a GB200 superchip (GB200 NVL72 / NVL4): the B200's die at
    // 1,200 W with 186 GB of HBM3e. Before the B200 so that "NVIDIA GB200" is this row: the
    // B200's pattern also occurs in the name.
    gpu(
        "NVIDIA GB200",
        &["gb200"],
        NV,
        (189_471, 186),
        BLACKWELL,
        8.0,
        NVSWITCH,
    ),
    gpu(
        "NVIDIA B200",
        &["b200"],
        NV,
        (183_359, 180),
        BLACKWELL,
        8.0,
        NVSWITCH,
    ),
    gpu(
        "AMD Instinct MI300X",
        &["mi300x"],
        Vendor::Amd,
        (196_608, 192),
        CDNA3,
        5.3,
        Some(InterconnectKind::Xgmi),
    ),
    gpu(
        "AMD Instinct MI325X",
        &["mi325x"],
        Vendor::Amd,
        (262_144, 256),
        CDNA3,
        6.0,
        Some(InterconnectKind::Xgmi),
    ),
    gpu(
        "AMD Instinct MI355X",
        &["mi355x"],
        Vendor::Amd,
        (294_912, 288),
        CDNA4,
        8.0,
        Some(InterconnectKind::Xgmi),
    ),
    Product {
        name: "Intel Gaudi 2",
        patterns: &["gaudi2"],
        vendor: Vendor::Intel,
        family: Family::Asic,
        memory_mib: 98_304,
        nominal_gb: 96,
        precisions: GAUDI,
        bandwidth_tbps: 2.45,
        link: Some(InterconnectKind::Gaudilink),
    },
    Product {
        name: "Intel Gaudi 2",
        patterns: &["hl 225"],
        vendor: Vendor::Intel,
        family: Family::Asic,
        memory_mib: 98_304,
        nominal_gb: 96,
        precisions: GAUDI,
        bandwidth_tbps: 2.45,
        link: Some(InterconnectKind::Gaudilink),
    },
    Product {
        name: "Intel Gaudi 3",
        patterns: &["gaudi3"],
        vendor: Vendor::Intel,
        family: Family::Asic,
        memory_mib: 131_072,
        nominal_gb: 128,
        precisions: GAUDI,
        bandwidth_tbps: 3.7,
        link: Some(InterconnectKind::Gaudilink),
    },
    Product {
        name: "Google TPU v5e",
        patterns: &["v5e"],
        vendor: Vendor::Google,
        family: Family::Tpu,
        memory_mib: 16_384,
        nominal_gb: 16,
        precisions: TPU,
        bandwidth_tbps: 0.819,
        link: Some(InterconnectKind::Ici),
    },
    Product {
        name: "Google TPU v5e",
        patterns: &["v5 lite"],
        vendor: Vendor::Google,
        family: Family::Tpu,
        memory_mib: 16_384,
        nominal_gb: 16,
        precisions: TPU,
        bandwidth_tbps: 0.819,
        link: Some(InterconnectKind::Ici),
    },
    Product {
        name: "Google TPU v5p",
        patterns: &["v5p"],
        vendor: Vendor::Google,
        family: Family::Tpu,
        memory_mib: 97_280,
        nominal_gb: 95,
        precisions: TPU,
        bandwidth_tbps: 2.765,
        link: Some(InterconnectKind::Ici),
    },
    Product {
        name: "Google TPU v6e",
        patterns: &["v6e"],
        vendor: Vendor::Google,
        family: Family::Tpu,
        memory_mib: 32_768,
        nominal_gb: 32,
        precisions: TPU,
        bandwidth_tbps: 1.64,
        link: Some(InterconnectKind::Ici),
    },
    Product {
        name: "AWS Trainium2",
        patterns: &["trainium2"],
        vendor: Vendor::Aws,
        family: Family::Asic,
        memory_mib: 98_304,
        nominal_gb: 96,
        precisions: TRAINIUM2,
        bandwidth_tbps: 2.9,
        link: Some(InterconnectKind::Neuronlink),
    },
];

/// Lowercase, with every run of non-alphanumerics turned into one space, so
/// `A100-SXM4-40GB`, `a100 sxm4 40gb` and `A100_SXM4_40GB` compare equal.
fn normalise(text: &str) -> String {
    let spaced: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                ' '
            }
        })
        .collect();
    spaced.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The product a device name denotes. With `memory_gb`, a variant of that size is preferred
/// (within 10 %), so `A100` with 40 GB is the 40 GB part.
pub fn lookup(name: &str, memory_gb: Option<f64>) -> Option<&'static Product> {
    let key = normalise(name);
    let candidates: Vec<&Product> = PRODUCTS
        .iter()
        .filter(|p| patterns_match(p.patterns, &key))
        .collect();
    let sized = memory_gb.and_then(|gb| {
        candidates
            .iter()
            .find(|p| (p.nominal_gb as f64 - gb).abs() <= p.nominal_gb as f64 * 0.1)
            .copied()
    });
    sized.or_else(|| candidates.first().copied())
}

/// [`lookup`] with a device's memory as the tools report it: in bytes, compared in GiB (the
/// table's nominal "80 GB" of an H100 is what vendor tools show as 79.6 GiB). Every device the
/// planner describes, detected or published, is looked up through this one unit.
pub fn lookup_sized(name: &str, memory: Option<Bytes>) -> Option<&'static Product> {
    lookup(name, memory.map(Bytes::as_gib))
}

/// The table's matching rule on a display name: every pattern occurs in the normalised name
/// and none is the prefix of a longer model number. Other encodings of the table (the DRA
/// DeviceClasses' CEL) are tested against this.
pub fn name_matches(patterns: &[&str], name: &str) -> bool {
    patterns_match(patterns, &normalise(name))
}

fn patterns_match(patterns: &[&str], key: &str) -> bool {
    patterns.iter().all(|pattern| contains_model(key, pattern))
}

/// True when `pattern` occurs in `key` and is not the prefix of a longer model number: "a10"
/// must not match "a100", "l4" not "l40s", "h20" not "h200".
fn contains_model(key: &str, pattern: &str) -> bool {
    key.match_indices(pattern).any(|(at, _)| {
        !key[at + pattern.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

impl Product {
    /// Memory in bytes.
    pub fn memory(&self) -> Bytes {
        Bytes(self.memory_mib * MIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detected_names_map_to_products() {
        let name = |n: &str, gb: Option<f64>| lookup(n, gb).map(|p| p.name);
        assert_eq!(
            name("NVIDIA H100 80GB HBM3", Some(79.6)),
            Some("NVIDIA H100 80GB HBM3")
        );
        assert_eq!(name("NVIDIA H100 PCIe", None), Some("NVIDIA H100 PCIe"));
        assert_eq!(
            name("NVIDIA A100-SXM4-40GB", Some(40.0)),
            Some("NVIDIA A100-SXM4-40GB")
        );
        assert_eq!(name("A100", Some(80.0)), Some("NVIDIA A100-SXM4-80GB"));
        assert_eq!(name("NVIDIA L4", None), Some("NVIDIA L4"));
        assert_eq!(name("NVIDIA L40S", None), Some("NVIDIA L40S"));
        assert_eq!(name("NVIDIA A10G", None), Some("NVIDIA A10G"));
        assert_eq!(name("h20", None), Some("NVIDIA H20"));
        assert_eq!(name("H200", None), Some("NVIDIA H200"));
        assert_eq!(name("NVIDIA H800", Some(79.6)), Some("NVIDIA H800"));
        assert_eq!(name("NVIDIA H800 PCIe", None), Some("NVIDIA H800 PCIe"));
        assert_eq!(name("H800", None), Some("NVIDIA H800"));
        // The GB200's name contains the B200's pattern: the GB200 row wins, with or without
        // a memory size, and the B200 stays the B200.
        assert_eq!(name("NVIDIA GB200", Some(185.0)), Some("NVIDIA GB200"));
        assert_eq!(name("GB200", None), Some("NVIDIA GB200"));
        assert_eq!(name("NVIDIA B200", Some(179.0)), Some("NVIDIA B200"));

        assert_eq!(
            name("AMD Instinct MI300X", None),
            Some("AMD Instinct MI300X")
        );
        assert_eq!(name("TPU-v5e", None), Some("Google TPU v5e"));
        assert_eq!(name("tpu-v5-lite-podslice", None), Some("Google TPU v5e"));
        assert_eq!(name("HL-225", None), Some("Intel Gaudi 2"));
        assert_eq!(name("NVIDIA A10", None), Some("NVIDIA A10"));

        assert_eq!(name("Frobnicator 9000", None), None);
    }

    #[test]
    fn table_is_sane() {
        for p in PRODUCTS {
            assert!(
                p.memory_mib > 0 && p.bandwidth_tbps > 0.0 && !p.precisions.is_empty(),
                "{}",
                p.name
            );
            let gib = p.memory_mib as f64 / 1024.0;
            assert!((gib / p.nominal_gb as f64 - 1.0).abs() < 0.1, "{}", p.name);
        }
    }
}
