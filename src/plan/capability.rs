//! Which weight precisions a model may be served in on a device, and how.
//!
//! Memory is not the only gate. A device computes natively in the precisions it lists; some
//! narrower weight formats still run on GPUs that cannot compute in them, through weight-only
//! kernels that widen the weights on the fly (vLLM's Marlin kernels: FP8 weights on Ampere —
//! "vLLM runs the official FP8 quantized model natively on 8xA100 or 8xH100",
//! `vllm-project.github.io` `_posts/2024-07-23-llama31.md`; gpt-oss's MXFP4 experts on A100
//! and H100, `vllm-project/recipes` `OpenAI/GPT-OSS.md`). Quantising *to* NVFP4 or MXFP4
//! needs hardware FP4 (Blackwell, MI355X). Some models must not run in FP16 at all
//! (`_FLOAT16_NOT_SUPPORTED_MODELS`, `vllm/config/model.py`: Gemma 2 and 3, GLM-4, PLaMo 2).

use serde::{Deserialize, Serialize};

use crate::hardware::{Family, Precision, Vendor};

use super::inventory::DeviceSpec;
use super::model::Model;

/// How a precision would run on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Execution {
    /// The device computes in it.
    Native,
    /// Weights are stored narrow and widened by weight-only kernels.
    WeightOnly,
}

// One type for `hwaccel plan --precision` and a ModelPlacement's `constraints.precision`: the
// choices a ModelPlacement may name are (de)serialised by their lowercase names and make up the
// CRD's enum; the command line also accepts every other precision by name (`FromStr`), which
// the CRD does not offer. The doc line below is the CRD field's description: keep it as is.
/// Weight precision choice.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum PrecisionChoice {
    /// Let the planner choose: the highest precision that fits.
    #[default]
    Auto,
    /// bfloat16.
    Bf16,
    /// float16.
    Fp16,
    /// 8-bit float.
    Fp8,
    /// 8-bit integer.
    Int8,
    /// 4-bit integer (AWQ/GPTQ).
    Int4,
    /// 4-bit NormalFloat (QLoRA).
    Nf4,
    /// 4-bit float (MXFP4/NVFP4).
    Fp4,
    /// Exactly FP32 (command line only).
    #[serde(skip)]
    Fp32,
    /// Exactly TF32 (command line only; refused: it is a compute mode).
    #[serde(skip)]
    Tf32,
    /// Exactly NVFP4 (command line only).
    #[serde(skip)]
    Nvfp4,
    /// Exactly MXFP4 (command line only).
    #[serde(skip)]
    Mxfp4,
}

impl PrecisionChoice {
    /// The one precision asked for; `None` for `auto` and for `fp4` (either 4-bit float).
    pub fn exact(self) -> Option<Precision> {
        Some(match self {
            Self::Auto | Self::Fp4 => return None,
            Self::Bf16 => Precision::Bf16,
            Self::Fp16 => Precision::Fp16,
            Self::Fp8 => Precision::Fp8,
            Self::Int8 => Precision::Int8,
            Self::Int4 => Precision::Int4,
            Self::Nf4 => Precision::Nf4,
            Self::Fp32 => Precision::Fp32,
            Self::Tf32 => Precision::Tf32,
            Self::Nvfp4 => Precision::Nvfp4,
            Self::Mxfp4 => Precision::Mxfp4,
        })
    }
}

impl From<Precision> for PrecisionChoice {
    fn from(precision: Precision) -> Self {
        match precision {
            Precision::Fp32 => Self::Fp32,
            Precision::Tf32 => Self::Tf32,
            Precision::Bf16 => Self::Bf16,
            Precision::Fp16 => Self::Fp16,
            Precision::Fp8 => Self::Fp8,
            Precision::Int8 => Self::Int8,
            Precision::Nvfp4 => Self::Nvfp4,
            Precision::Mxfp4 => Self::Mxfp4,
            Precision::Int4 => Self::Int4,
            Precision::Nf4 => Self::Nf4,
        }
    }
}

impl std::str::FromStr for PrecisionChoice {
    type Err = crate::hardware::UnknownPrecision;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "fp4" => Ok(Self::Fp4),
            other => other.parse::<Precision>().map(Self::from),
        }
    }
}

/// The serving ladder in order of preference: the model's 16-bit type, then FP8, INT8, the
/// FP4 formats and INT4 (`planner-formulas.md` §4); a checkpoint that ships in another format
/// is tried as shipped too. FP32 comes last, as the only way to run a model that must not see
/// FP16 on a device without BF16; NF4 only when asked for by name.
pub fn serving_candidates(choice: PrecisionChoice, model: &Model) -> Vec<Precision> {
    match choice {
        PrecisionChoice::Fp4 => vec![Precision::Nvfp4, Precision::Mxfp4],
        PrecisionChoice::Auto => {
            let mut ladder = vec![
                Precision::Bf16,
                Precision::Fp16,
                Precision::Fp8,
                Precision::Int8,
                Precision::Nvfp4,
                Precision::Mxfp4,
                Precision::Int4,
            ];
            if !ladder.contains(&model.native.precision)
                && model.native.precision != Precision::Fp32
            {
                ladder.push(model.native.precision);
                ladder.sort();
            }
            // A checkpoint that ships quantised (gpt-oss's MXFP4, DeepSeek-V3's FP8) has no
            // official wider copy: `auto` plans it as shipped or narrower, never wider
            // (issue 23). Asking for a wider precision by name still works.
            if !matches!(model.native.precision, Precision::Bf16 | Precision::Fp16) {
                ladder.retain(|&p| p >= model.native.precision);
            }
            if model.fp16_unsafe {
                ladder.push(Precision::Fp32);
            }
            ladder
        }
        exact => exact.exact().into_iter().collect(),
    }
}

/// Whether `device` can serve `model` with weights in `precision`; the error says why not.
pub fn serving_support(
    model: &Model,
    device: &DeviceSpec,
    precision: Precision,
) -> Result<Execution, String> {
    let lists = |p: Precision| device.precisions.contains(&p);
    let name = &device.product;
    let weight_only_gpu = is_modern_gpu(device);
    // Without BF16 the activations run in FP16, which these models cannot take whatever the
    // weights are stored in; only FP32 is left.
    if model.fp16_unsafe && !lists(Precision::Bf16) && precision != Precision::Fp32 {
        return Err(format!(
            "{} ({}) needs bf16 or fp32 activations and {name} has no bf16",
            model.name, model.arch.model_type
        ));
    }
    match precision {
        Precision::Tf32 => Err("tf32 is a compute mode, not a storage format".to_string()),
        Precision::Fp16 if model.fp16_unsafe => Err(format!(
            "{} ({}) is numerically unstable in fp16; vLLM refuses it",
            model.name, model.arch.model_type
        )),
        Precision::Fp32 | Precision::Bf16 | Precision::Fp16 if lists(precision) => {
            Ok(Execution::Native)
        }
        Precision::Fp32 | Precision::Bf16 | Precision::Fp16 => {
            Err(format!("{name} does not compute in {precision}"))
        }
        Precision::Fp8 | Precision::Int8 | Precision::Int4 if lists(precision) => {
            Ok(Execution::Native)
        }
        Precision::Fp8 if weight_only_gpu && device.vendor == Vendor::Nvidia => {
            Ok(Execution::WeightOnly)
        }
        Precision::Int8 | Precision::Int4 if weight_only_gpu => Ok(Execution::WeightOnly),
        Precision::Fp8 | Precision::Int8 | Precision::Int4 => Err(format!(
            "{name} has no {precision} compute and no weight-only kernels for it"
        )),
        Precision::Nvfp4 | Precision::Mxfp4 if lists(precision) => Ok(Execution::Native),
        Precision::Mxfp4 if model.native.precision == Precision::Mxfp4 && weight_only_gpu => {
            Ok(Execution::WeightOnly)
        }
        Precision::Nvfp4 | Precision::Mxfp4 => Err(format!(
            "{name} has no {precision} support (FP4 needs Blackwell-class hardware)"
        )),
        Precision::Nf4 if device.family == Family::Gpu => Ok(Execution::WeightOnly),
        Precision::Nf4 => Err(format!("{name} has no bitsandbytes NF4 kernels")),
    }
}

/// Ampere-or-newer NVIDIA and CDNA-class AMD GPUs, the ones weight-only kernels target:
/// recognised by BF16 support, which arrived with the same generations.
fn is_modern_gpu(device: &DeviceSpec) -> bool {
    device.family == Family::Gpu
        && matches!(device.vendor, Vendor::Nvidia | Vendor::Amd)
        && device.precisions.contains(&Precision::Bf16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::inventory::DeviceSpec;
    use crate::plan::model::presets;
    use crate::plan::products;

    fn device(product: &str) -> DeviceSpec {
        DeviceSpec::of_product(
            products::lookup(product, None).unwrap(),
            "d0".to_string(),
            None,
        )
    }

    /// Issue 23: `auto` never plans a quantised checkpoint wider than it ships.
    #[test]
    fn auto_keeps_quantised_checkpoints_at_or_below_their_format() {
        let gpt_oss = presets::find("gpt-oss-20b").unwrap().unwrap();
        let ladder = serving_candidates(PrecisionChoice::Auto, &gpt_oss);
        assert_eq!(ladder, vec![Precision::Mxfp4, Precision::Int4]);
        let deepseek = presets::find("deepseek-v3").unwrap().unwrap();
        let ladder = serving_candidates(PrecisionChoice::Auto, &deepseek);
        assert_eq!(ladder.first(), Some(&Precision::Fp8));
        let llama = presets::find("llama-3.1-8b").unwrap().unwrap();
        let ladder = serving_candidates(PrecisionChoice::Auto, &llama);
        assert_eq!(ladder.first(), Some(&Precision::Bf16));
        assert_eq!(
            serving_candidates(PrecisionChoice::Bf16, &gpt_oss),
            vec![Precision::Bf16]
        );
    }

    #[test]
    fn ampere_runs_fp8_weight_only_and_hopper_natively() {
        let model = presets::find("llama-3.1-405b").unwrap().unwrap();
        assert_eq!(
            serving_support(&model, &device("A100-80GB"), Precision::Fp8),
            Ok(Execution::WeightOnly)
        );
        assert_eq!(
            serving_support(&model, &device("H100"), Precision::Fp8),
            Ok(Execution::Native)
        );
        assert!(serving_support(&model, &device("TPU-v5e"), Precision::Fp8).is_err());
    }

    #[test]
    fn fp4_needs_hardware_unless_it_is_the_checkpoint_format() {
        let llama = presets::find("llama-3.1-70b").unwrap().unwrap();
        let gpt_oss = presets::find("gpt-oss-120b").unwrap().unwrap();
        assert!(serving_support(&llama, &device("H100"), Precision::Nvfp4).is_err());
        assert!(serving_support(&llama, &device("H100"), Precision::Mxfp4).is_err());
        assert_eq!(
            serving_support(&llama, &device("B200"), Precision::Nvfp4),
            Ok(Execution::Native)
        );
        assert_eq!(
            serving_support(&gpt_oss, &device("H100"), Precision::Mxfp4),
            Ok(Execution::WeightOnly)
        );
    }

    #[test]
    fn gemma2_never_runs_in_fp16() {
        let gemma = presets::find("gemma-2-27b").unwrap().unwrap();
        let err = serving_support(&gemma, &device("H100"), Precision::Fp16).unwrap_err();
        assert!(err.contains("fp16"), "{err}");
        assert!(serving_support(&gemma, &device("H100"), Precision::Bf16).is_ok());
        // T4 has no BF16, so on a T4 Gemma 2 runs in FP32 or not at all.
        assert!(serving_support(&gemma, &device("T4"), Precision::Bf16).is_err());
        assert!(serving_support(&gemma, &device("T4"), Precision::Int8).is_err());
        assert!(serving_support(&gemma, &device("T4"), Precision::Fp32).is_ok());
    }

    #[test]
    fn choices_parse() {
        assert_eq!("auto".parse(), Ok(PrecisionChoice::Auto));
        assert_eq!("FP4".parse(), Ok(PrecisionChoice::Fp4));
        assert_eq!("nf4".parse(), Ok(PrecisionChoice::Nf4));
        assert_eq!("mxfp4".parse(), Ok(PrecisionChoice::Mxfp4));
        assert_eq!(PrecisionChoice::Mxfp4.exact(), Some(Precision::Mxfp4));
        assert!("fp5".parse::<PrecisionChoice>().is_err());
    }
}
