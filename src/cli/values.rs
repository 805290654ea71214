//! The core's enums as command-line values. `plan`, `output` and `telemetry` stay free of
//! `clap`; each enum a flag takes gets its `clap::ValueEnum` here: the value's name (its
//! lowercase name everywhere else too) and the line `--help` prints for it.

use clap::ValueEnum;
use clap::builder::PossibleValue;

use crate::output::Format;
use crate::plan::kv::KvDtype;
use crate::plan::training::{Adamw, Kernels, Loss, Method, OptimizerStates};
use crate::telemetry::LogFormat;

/// Implements `ValueEnum` for a unit enum from `Variant => ("name", "help")` lines.
macro_rules! value_enum {
    ($type:ty { $($variant:path => ($name:literal, $help:literal)),+ $(,)? }) => {
        impl ValueEnum for $type {
            fn value_variants<'a>() -> &'a [Self] {
                &[$($variant),+]
            }

            fn to_possible_value(&self) -> Option<PossibleValue> {
                Some(match self {
                    $($variant => PossibleValue::new($name).help($help)),+
                })
            }
        }
    };
}

value_enum!(Format {
    Format::Table => ("table", "Aligned columns for people"),
    Format::Json => ("json", "Pretty-printed JSON"),
    Format::Yaml => ("yaml", "YAML"),
});

value_enum!(KvDtype {
    KvDtype::Auto => ("auto", "The model's 16-bit activation type (vLLM's `auto`)"),
    KvDtype::Bf16 => ("bf16", "bfloat16"),
    KvDtype::Fp16 => ("fp16", "float16"),
    KvDtype::Fp8 => ("fp8", "FP8 (E4M3), one byte per value"),
});

value_enum!(Method {
    Method::Full => ("full", "Every parameter trained, mixed-precision Adam"),
    Method::Lora => ("lora", "Low-rank adapters on a frozen 16-bit base"),
    Method::Qlora => ("qlora", "Low-rank adapters on a frozen NF4 base"),
    Method::Dpo => (
        "dpo",
        "Direct preference optimisation: full fine-tuning plus a frozen reference model"
    ),
});

value_enum!(OptimizerStates {
    OptimizerStates::Fp32 => (
        "fp32",
        "Mixed precision: FP32 master weights and Adam moments (16 bytes per parameter)"
    ),
    OptimizerStates::Bf16 => (
        "bf16",
        "Weights, gradients and Adam moments in BF16 (8 bytes per parameter)"
    ),
    OptimizerStates::EightBit => (
        "8bit",
        "8-bit Adam moments (bitsandbytes), FP32 master weights (10 bytes per parameter)"
    ),
});

value_enum!(Loss {
    Loss::Standard => (
        "standard",
        "transformers' cross-entropy on the whole logits tensor, upcast to FP32"
    ),
    Loss::Fused => (
        "fused",
        "A fused linear cross-entropy over chunks of tokens (Liger Kernel, use_liger_kernel=True)"
    ),
});

value_enum!(Adamw {
    Adamw::Fused => (
        "fused",
        "Each parameter updated in place (adamw_torch_fused, DeepSpeed's FusedAdam)"
    ),
    Adamw::Foreach => (
        "foreach",
        "torch.optim.AdamW's multi-tensor default (adamw_torch): a copy of the moments during the step"
    ),
});

value_enum!(Kernels {
    Kernels::Standard => (
        "standard",
        "transformers' own norms, rotary embedding and MLP activation"
    ),
    Kernels::Liger => (
        "liger",
        "Liger Kernel's RMSNorm, RoPE and SwiGLU/GeGLU (use_liger_kernel=True)"
    ),
});

value_enum!(LogFormat {
    LogFormat::Json => ("json", "One JSON object per line"),
    LogFormat::Text => ("text", "Human-readable text"),
});

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value's name is the one the rest of the program uses for it (serde's), so a
    /// flag value and the same value in JSON or a CRD never disagree.
    #[test]
    fn value_names_are_the_serde_names() {
        fn check<T: ValueEnum + serde::Serialize>() {
            for value in T::value_variants() {
                let name = value.to_possible_value().map(|v| v.get_name().to_string());
                let serde = serde_json::to_value(value).ok();
                assert_eq!(name.as_deref(), serde.as_ref().and_then(|v| v.as_str()));
            }
        }
        check::<KvDtype>();
        check::<Method>();
        check::<OptimizerStates>();
        check::<Loss>();
        check::<Adamw>();
        check::<Kernels>();
        for format in Format::value_variants() {
            let name = format.to_possible_value().map(|v| v.get_name().to_string());
            assert_eq!(name, Some(format!("{format:?}").to_lowercase()));
        }
    }
}
