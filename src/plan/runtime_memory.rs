//! The memory an engine can allocate on a device: what the vendor tool reports as the total,
//! less what the driver and firmware keep for themselves.
//!
//! `nvidia-smi` and NVML report `memory.total`, and that is what detection records; the CUDA
//! runtime (`cudaMemGetInfo`, `torch.cuda.mem_get_info`), which vLLM and SGLang size their
//! budgets from, reports `memory.total - memory.reserved`. Planning on the larger figure gives
//! every device a few hundred MiB the engine never sees: the error the issue that added this
//! module measured on small KV pools. Measured on lent machines with
//! `scripts/capture-gpu-host.sh` (`fixtures/real/*/cuda/memory.json`, driver 580.159.04):
//!
//! | product | nvidia-smi total | reserved | CUDA total |
//! |---|---|---|---|
//! | NVIDIA H100 80GB HBM3 | 81,559 MiB | 480 MiB | 81,079 MiB |
//! | NVIDIA H200 | 143,771 MiB | 616 MiB | 143,155 MiB |
//!
//! Other NVIDIA products lose [`NVIDIA_DEFAULT_RESERVED`]: public logs put the L4 at 455 MiB
//! (23,034 MiB reported, "22.05 GiB" in CUDA's terms) and the A100 40GB at 512 MiB (40,960
//! MiB reported, 39.50 GiB logged by vLLM, vllm-project/vllm#12330); docs/planner.md lists
//! them.
//!
//! ROCm (HIP's `hipMemGetInfo`, which `torch.cuda.mem_get_info` calls there) reports the VRAM
//! the amdgpu driver exposes, the same figure `rocm-smi`, `amd-smi` and sysfs
//! `mem_info_vram_total` give, so a detected AMD device keeps its reported total. The products'
//! nominal sizes (the `--hardware` shorthand's) are a little more:
//!
//! | product | nominal | runtime total | source |
//! |---|---|---|---|
//! | AMD Instinct MI300X | 196,608 MiB | 196,592 MiB (191.98 GiB) | vLLM 0.6.4 ROCm `total_gpu_memory=191.98GiB` (AUGMXNT/MI300-testing, `inference-vllm-vs-vllm-rocm.ipynb`); `rocm-smi` 206,141,652,992 B (`fixtures/hosts/mi300x-8x`) |
//! | AMD Instinct MI250 / MI250X (per GCD) | 65,536 MiB | 65,520 MiB (63.984375 GiB) | `torch.cuda.mem_get_info` total on an MI250 (jaglinux/pytorch-notes, `memory_stats.py`); the MI250X has the same 64 GiB per GCD |
//!
//! Other vendors' runtimes, and AMD products not listed (MI325X, MI355X), keep the reported total.

use crate::hardware::{MIB, Vendor};

use super::units::Bytes;

/// Reserved memory measured per product, by the name the vendor tool prints (exact match,
/// ignoring ASCII case) and the total it reports, in MiB: the reservation grows with the
/// memory size, so a variant of another size falls back to the default.
const MEASURED_NVIDIA: &[(&str, u64, u64)] = &[
    ("NVIDIA H100 80GB HBM3", 81_559, 480),
    ("NVIDIA H200", 143_771, 616),
];

/// The most ROCm lets an engine allocate on each measured AMD product, by the name `amd-smi`
/// prints (exact match, ignoring ASCII case), in MiB: a reported total above it (a nominal size)
/// is cut to it, a detected one (already the driver's figure) is kept.
const MEASURED_AMD: &[(&str, u64)] = &[
    ("AMD Instinct MI300X", 196_592),
    ("AMD Instinct MI250", 65_520),
    ("AMD Instinct MI250X", 65_520),
];

/// What an NVIDIA device of an unmeasured product is assumed to keep back: the A100 40GB's
/// logged 512 MiB, between the L4's 455 and the H200's 616.
pub const NVIDIA_DEFAULT_RESERVED: Bytes = Bytes(512 * MIB);

/// The memory the runtime of `vendor`'s `product` lets an engine allocate, of `reported`.
pub fn runtime_memory(vendor: Vendor, product: &str, reported: Bytes) -> Bytes {
    match vendor {
        Vendor::Nvidia => nvidia_runtime_memory(product, reported),
        Vendor::Amd => MEASURED_AMD
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(product))
            .map_or(reported, |(_, total_mib)| {
                reported.min(Bytes(total_mib * MIB))
            }),
        _ => reported,
    }
}

/// CUDA's total: `nvidia-smi`'s less what the driver reserved.
fn nvidia_runtime_memory(product: &str, reported: Bytes) -> Bytes {
    let measured = MEASURED_NVIDIA
        .iter()
        .find(|(name, total_mib, _)| {
            name.eq_ignore_ascii_case(product) && reported == Bytes(total_mib * MIB)
        })
        .map(|(_, _, reserved_mib)| Bytes(reserved_mib * MIB));
    reported.saturating_sub(measured.unwrap_or(NVIDIA_DEFAULT_RESERVED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_products_lose_what_the_driver_reserved() {
        // The CUDA totals logged on the lent machines (fixtures/real/*/cuda/memory.json).
        let h100 = runtime_memory(Vendor::Nvidia, "NVIDIA H100 80GB HBM3", Bytes(81_559 * MIB));
        assert_eq!(h100, Bytes(85_017_493_504));
        let h200 = runtime_memory(Vendor::Nvidia, "NVIDIA H200", Bytes(143_771 * MIB));
        assert_eq!(h200.0 / MIB, 150_109_880_320 / MIB);
    }

    #[test]
    fn rocm_sees_what_the_driver_reports_not_the_nominal_size() {
        // Detected MI300X: rocm-smi's 206,141,652,992 B, what vLLM logged as 191.98 GiB.
        let detected = Bytes(206_141_652_992);
        assert_eq!(
            runtime_memory(Vendor::Amd, "AMD Instinct MI300X", detected),
            detected
        );
        // The shorthand's nominal 192 GiB is cut to it.
        assert_eq!(
            runtime_memory(Vendor::Amd, "amd instinct mi300x", Bytes::gib(192)),
            detected
        );
        assert_eq!(
            runtime_memory(Vendor::Amd, "AMD Instinct MI250X", Bytes::gib(64)),
            Bytes(65_520 * MIB)
        );
        // A partition (CPX/NPS4: a quarter of the memory) is below the cap and kept.
        let quarter = Bytes(49_148 * MIB);
        assert_eq!(
            runtime_memory(Vendor::Amd, "AMD Instinct MI300X", quarter),
            quarter
        );
    }

    #[test]
    fn others_lose_the_default_or_nothing() {
        let l4 = Bytes(23_034 * MIB);
        assert_eq!(
            runtime_memory(Vendor::Nvidia, "NVIDIA L4", l4),
            Bytes((23_034 - 512) * MIB)
        );
        // A measured name with another size is another variant: the default applies.
        assert_eq!(
            runtime_memory(Vendor::Nvidia, "NVIDIA H200", Bytes(144_000 * MIB)),
            Bytes((144_000 - 512) * MIB)
        );
        assert_eq!(
            runtime_memory(Vendor::Amd, "AMD Instinct MI325X", Bytes(262_144 * MIB)),
            Bytes(262_144 * MIB),
            "unmeasured AMD products keep the reported total"
        );
        assert_eq!(
            runtime_memory(Vendor::Intel, "Intel Gaudi 2", Bytes(98_304 * MIB)),
            Bytes(98_304 * MIB)
        );
        assert_eq!(
            runtime_memory(Vendor::Nvidia, "tiny", Bytes(MIB)),
            Bytes::ZERO
        );
    }
}
