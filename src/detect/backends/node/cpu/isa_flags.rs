//! The ISA extensions that matter for running models on the CPU, filtered from the first
//! processor's `flags` (x86) or `Features` (arm64) line of `/proc/cpuinfo`.

/// ISA extensions that matter for running models on the CPU, by their `/proc/cpuinfo` names.
/// x86: AVX2/AVX-512 vector paths, VNNI int8 dot products, BF16/FP16 vector math and the AMX
/// tile engine. arm64: SVE/SVE2 vectors, BF16, int8 matrix multiply and dot product.
pub const AI_FLAGS: &[&str] = &[
    "amx_bf16",
    "amx_fp16",
    "amx_int8",
    "amx_tile",
    "asimddp",
    "avx2",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "avx512f",
    "avx_vnni",
    "bf16",
    "i8mm",
    "sve",
    "sve2",
];

/// The AI-relevant subset of a flags line, sorted and without duplicates.
pub fn ai_flags(flags: &str) -> Vec<String> {
    let mut found: Vec<String> = flags
        .split_ascii_whitespace()
        .filter(|flag| AI_FLAGS.contains(flag))
        .map(str::to_string)
        .collect();
    found.sort();
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_only_ai_flags_sorted_once() {
        assert_eq!(
            ai_flags("fpu lm sve avx2 avx2 amx_tile"),
            ["amx_tile", "avx2", "sve"]
        );
        assert!(ai_flags("").is_empty());
    }
}
