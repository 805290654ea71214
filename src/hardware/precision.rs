//! Numeric precisions an accelerator can compute in, and what each costs per stored value.
//!
//! The bits per parameter are *effective* storage costs: block-scaled formats carry their
//! scales, so MXFP4 is 4 bits plus one 8-bit scale per 32 values (4.25 bits), and QLoRA's NF4
//! with double quantisation is 4.127 bits (arXiv:2305.14314 §3).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A numeric format for weights, activations or the KV cache.
///
/// The declaration order is from the widest to the narrowest format, so sorting a set of
/// precisions lists the most accurate first.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// IEEE 754 single precision.
    Fp32,
    /// TensorFloat-32: FP32 range with a 10-bit mantissa, a compute mode on NVIDIA Ampere+.
    Tf32,
    /// bfloat16: FP32's exponent range in 16 bits.
    Bf16,
    /// IEEE 754 half precision.
    Fp16,
    /// 8-bit float (E4M3/E5M2), with per-tensor or per-block scales.
    Fp8,
    /// 8-bit integer (GPTQ/W8A8 and similar).
    Int8,
    /// NVIDIA's 4-bit float: E2M1 values with an FP8 scale per 16 values.
    Nvfp4,
    /// OCP microscaling 4-bit float: E2M1 values with an E8M0 scale per 32 values.
    Mxfp4,
    /// 4-bit integer with group scales (AWQ/GPTQ, group size 128).
    Int4,
    /// QLoRA's 4-bit NormalFloat with double-quantised block constants.
    Nf4,
}

impl Precision {
    /// Every precision, widest first.
    pub const ALL: [Self; 10] = [
        Self::Fp32,
        Self::Tf32,
        Self::Bf16,
        Self::Fp16,
        Self::Fp8,
        Self::Int8,
        Self::Nvfp4,
        Self::Mxfp4,
        Self::Int4,
        Self::Nf4,
    ];

    /// Effective storage bits per value, scales included.
    pub fn bits_per_param(self) -> f64 {
        match self {
            Self::Fp32 | Self::Tf32 => 32.0,
            Self::Bf16 | Self::Fp16 => 16.0,
            // Per-block scales (128x128 in DeepSeek's FP8) add well under 0.01 bit.
            Self::Fp8 | Self::Int8 => 8.0,
            Self::Mxfp4 => 4.0 + 8.0 / 32.0,
            Self::Nvfp4 => 4.0 + 8.0 / 16.0,
            // One 16-bit scale and one 16-bit zero point per group of 128.
            Self::Int4 => 4.0 + 32.0 / 128.0,
            Self::Nf4 => 4.0 + 8.0 / 64.0 + 32.0 / (64.0 * 256.0),
        }
    }

    /// Effective bytes per value (`bits_per_param / 8`).
    pub fn bytes_per_param(self) -> f64 {
        self.bits_per_param() / 8.0
    }

    /// The lowercase name used in labels, CLI flags and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fp32 => "fp32",
            Self::Tf32 => "tf32",
            Self::Bf16 => "bf16",
            Self::Fp16 => "fp16",
            Self::Fp8 => "fp8",
            Self::Int8 => "int8",
            Self::Mxfp4 => "mxfp4",
            Self::Nvfp4 => "nvfp4",
            Self::Int4 => "int4",
            Self::Nf4 => "nf4",
        }
    }

    /// True for the 4-bit float formats that need hardware support (MXFP4, NVFP4).
    pub fn is_fp4(self) -> bool {
        matches!(self, Self::Mxfp4 | Self::Nvfp4)
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error for a precision name that is not one of [`Precision::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown precision {0:?} (expected one of fp32, tf32, bf16, fp16, fp8, int8, mxfp4, nvfp4, fp4, int4, nf4)"
)]
pub struct UnknownPrecision(pub String);

impl FromStr for Precision {
    type Err = UnknownPrecision;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        Ok(match lower.as_str() {
            "fp32" | "float32" | "f32" => Self::Fp32,
            "tf32" => Self::Tf32,
            "bf16" | "bfloat16" => Self::Bf16,
            "fp16" | "float16" | "f16" | "half" => Self::Fp16,
            "fp8" | "float8" | "e4m3" | "fp8_e4m3" | "e5m2" | "fp8_e5m2" => Self::Fp8,
            "int8" | "i8" | "w8a8" => Self::Int8,
            // "fp4" alone means the open microscaling format; NVFP4 is named explicitly.
            "mxfp4" | "fp4" => Self::Mxfp4,
            "nvfp4" => Self::Nvfp4,
            "int4" | "i4" | "awq" | "gptq" => Self::Int4,
            "nf4" => Self::Nf4,
            _ => return Err(UnknownPrecision(s.to_string())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in Precision::ALL {
            assert_eq!(p.as_str().parse::<Precision>(), Ok(p));
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{p}\""));
        }
    }

    #[test]
    fn narrower_formats_never_cost_more_bits() {
        // The declaration order is widest first; bits must not increase along it.
        let widths: Vec<f64> = Precision::ALL.iter().map(|p| p.bits_per_param()).collect();
        for pair in widths.windows(2) {
            assert!(pair[1] <= pair[0], "{widths:?}");
        }
    }

    #[test]
    fn qlora_nf4_matches_the_paper() {
        assert!((Precision::Nf4.bits_per_param() - 4.127).abs() < 0.001);
        assert!("NF5".parse::<Precision>().is_err());
    }
}
