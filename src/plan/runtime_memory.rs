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
//! them. Other vendors' runtimes are not measured yet, so their devices keep the reported total.

use crate::hardware::{MIB, Vendor};

use super::units::Bytes;

/// Reserved memory measured per product, by the name the vendor tool prints (exact match,
/// ignoring ASCII case) and the total it reports, in MiB: the reservation grows with the
/// memory size, so a variant of another size falls back to the default.
const MEASURED_NVIDIA: &[(&str, u64, u64)] = &[
    ("NVIDIA H100 80GB HBM3", 81_559, 480),
    ("NVIDIA H200", 143_771, 616),
];

/// What an NVIDIA device of an unmeasured product is assumed to keep back: the A100 40GB's
/// logged 512 MiB, between the L4's 455 and the H200's 616.
pub const NVIDIA_DEFAULT_RESERVED: Bytes = Bytes(512 * MIB);

/// The memory the runtime of `vendor`'s `product` lets an engine allocate, of `reported`.
pub fn runtime_memory(vendor: Vendor, product: &str, reported: Bytes) -> Bytes {
    if vendor != Vendor::Nvidia {
        return reported;
    }
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
        let mi300x = Bytes(196_592 * MIB);
        assert_eq!(
            runtime_memory(Vendor::Amd, "AMD Instinct MI300X", mi300x),
            mi300x
        );
        assert_eq!(
            runtime_memory(Vendor::Nvidia, "tiny", Bytes(MIB)),
            Bytes::ZERO
        );
    }
}
