//! One way into the planner. `hwaccel plan`'s flags and a ModelPlacement's spec both describe
//! a planning question as a [`PlanInput`]; [`prepare`] turns it into the [`Model`] and the
//! [`PlanRequest`] the search works on. Model resolution (presets with "did you mean" hints,
//! parameter counts, `config.json` files and inline configs), the memory-utilisation default
//! for serving or training, and the rule that training picks its own replicas all live here,
//! so the command line and the controller cannot drift apart.

use super::capability::PrecisionChoice;
use super::engine::choice::{EngineChoice, EngineKind};
use super::error::{PlanError, Result};
use super::kv::KvDtype;
use super::load::load_model;
use super::memory::DEFAULT_GPU_UTIL;
use super::model::config::{MAX_CONTEXT, parse_config};
use super::model::rope::RopeRequest;
use super::model::{Model, parse_param_count, presets};
use super::search::{Disaggregation, Goal, PlanRequest};
use super::training::DEFAULT_TRAINING_GPU_UTIL;
use super::units::Bytes;

/// Where the model's description comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelInput {
    /// A built-in preset key; an unknown key is an error that names similar ones.
    Preset(String),
    /// A preset key, else a `config.json` file or a directory holding one (`--model`).
    PresetOrFile(String),
    /// A bare parameter count (`70B`, `8e9`); a Llama-like shape is assumed.
    ParamCount(String),
    /// A `config.json` given inline as JSON text; `origin` names it in messages.
    Inline {
        /// Where the text came from (`spec.model.huggingFaceConfig`).
        origin: String,
        /// The JSON text.
        json: String,
    },
}

/// A planning question, whoever asks it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanInput {
    /// The model.
    pub model: ModelInput,
    /// Exact checkpoint size, replacing the weight bytes computed from the architecture.
    pub checkpoint_bytes: Option<Bytes>,
    /// Serving or training, and their shape.
    pub goal: Goal,
    /// Weight precision.
    pub precision: PrecisionChoice,
    /// KV-cache type (serving).
    pub kv_dtype: KvDtype,
    /// Most nodes the plan may use.
    pub max_nodes: Option<u32>,
    /// Fraction of device memory to use; `None` takes the goal's default.
    pub gpu_util: Option<f64>,
    /// Serving replicas asked for; training ignores them (with a note).
    pub replicas: Option<u32>,
    /// Serving: plan separate prefill and decode pools.
    pub disaggregation: Option<Disaggregation>,
    /// Serving: the engine and its settings (default: today's vLLM, said in the plan).
    pub engine: EngineChoice,
    /// Serving: YaRN asked for on top of the model's config (`--rope-scaling yarn:4`).
    pub rope_scaling: Option<RopeRequest>,
    /// Plan whole devices even where a driver publishes them shareable.
    pub whole_devices: bool,
}

/// A question the planner can answer.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The resolved model.
    pub model: Model,
    /// Goal, precision and limits.
    pub request: PlanRequest,
    /// Parts of the input that were not applied, in the command line's terms.
    pub notes: Vec<String>,
}

/// Resolves the model and fills in the defaults.
pub fn prepare(input: PlanInput) -> Result<Prepared> {
    let mut model = resolve_model(&input.model)?.with_checkpoint_bytes(input.checkpoint_bytes);
    let training = matches!(input.goal, Goal::Train(_));
    if let Some(request) = input.rope_scaling {
        apply_rope_request(&mut model, request)?;
    }
    let default_util = if training {
        DEFAULT_TRAINING_GPU_UTIL
    } else {
        DEFAULT_GPU_UTIL
    };
    let mut notes = Vec::new();
    if training && input.replicas.is_some() {
        notes.push(
            "--replicas applies to serving; training picks its data-parallel degree".to_string(),
        );
    }
    // SGLang's budget is its `mem_fraction_static`: stated, else `--gpu-util`, else SGLang's
    // own default for each device (computed per device class by the memory model).
    let mut engine = input.engine;
    let mut gpu_util = input.gpu_util;
    if engine.kind == EngineKind::Sglang && !training {
        if engine.mem_fraction_static.is_some() && gpu_util.is_some() {
            return Err(PlanError::constraint(
                "give --mem-fraction-static or --gpu-util, not both: they are the same budget",
            ));
        }
        engine.mem_fraction_static = engine.mem_fraction_static.or(gpu_util);
        gpu_util = engine.mem_fraction_static;
    }
    let request = PlanRequest {
        goal: input.goal,
        precision: input.precision,
        kv_dtype: input.kv_dtype,
        max_nodes: input.max_nodes,
        gpu_util: gpu_util.unwrap_or(default_util),
        replicas: input.replicas.filter(|_| !training),
        disaggregation: input.disaggregation.filter(|_| !training),
        engine,
        whole_devices: input.whole_devices,
    };
    Ok(Prepared {
        model,
        request,
        notes,
    })
}

/// Lengthens the model's context by the YaRN factor asked for, over the window it was trained
/// on, and records the scaling so the engines are told to apply it.
fn apply_rope_request(model: &mut Model, request: RopeRequest) -> Result<()> {
    let scaling = request.over(model.max_context, model.rope_scaling)?;
    let extended = scaling.extended(MAX_CONTEXT);
    model.notes.push(format!(
        "context: RoPE scaling {} asked for: the longest context is {extended} tokens (the \
         engine is told to apply it; the model card should validate the factor)",
        scaling.describe()
    ));
    model.max_context = Some(extended);
    model.rope_requested = Some(scaling);
    Ok(())
}

fn resolve_model(input: &ModelInput) -> Result<Model> {
    match input {
        ModelInput::Preset(key) => presets::find(key)?.ok_or_else(|| PlanError::UnknownPreset {
            name: key.clone(),
            hint: presets::hint(key, "; `hwaccel plan --list-models` lists the presets"),
        }),
        ModelInput::PresetOrFile(spec) => load_model(spec),
        ModelInput::ParamCount(count) => Ok(Model::from_param_count(
            count.trim(),
            parse_param_count(count)?,
        )),
        ModelInput::Inline { origin, json } => {
            let config: serde_json::Value =
                serde_json::from_str(json).map_err(|err| PlanError::UnreadableConfig {
                    origin: origin.clone(),
                    reason: err.to_string(),
                })?;
            let parsed = parse_config(origin, &config)?;
            let name = config
                .get("_name_or_path")
                .and_then(serde_json::Value::as_str)
                .filter(|n| !n.is_empty())
                .unwrap_or("inline config");
            Ok(Model::from_config(name, origin.as_str(), parsed))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::training::{LoraTarget, Method, TrainingTarget};

    fn serve(model: ModelInput) -> PlanInput {
        PlanInput {
            model,
            checkpoint_bytes: None,
            goal: Goal::Serve {
                context: Some(8192),
                concurrency: 1,
            },
            precision: PrecisionChoice::Auto,
            kv_dtype: KvDtype::Auto,
            max_nodes: None,
            gpu_util: None,
            replicas: Some(2),
            disaggregation: None,
            engine: EngineChoice::default(),
            rope_scaling: None,
            whole_devices: false,
        }
    }

    #[test]
    fn serving_keeps_replicas_and_takes_the_serving_default() {
        let prepared = prepare(serve(ModelInput::Preset("llama-3.1-8b".into()))).unwrap();
        assert_eq!(prepared.model.name, "llama-3.1-8b");
        assert_eq!(prepared.request.replicas, Some(2));
        assert!((prepared.request.gpu_util - DEFAULT_GPU_UTIL).abs() < f64::EPSILON);
        assert!(prepared.notes.is_empty());
    }

    #[test]
    fn training_drops_replicas_with_a_note_and_takes_the_training_default() {
        let mut input = serve(ModelInput::ParamCount("8B".into()));
        input.goal = Goal::Train(TrainingTarget {
            method: Method::Lora,
            seq_len: 2048,
            micro_batch: 1,
            gradient_checkpointing: true,
            lora_rank: 16,
            lora_targets: LoraTarget::ALL.to_vec(),
            optimizer_states: crate::plan::training::OptimizerStates::Fp32,
            loss: Default::default(),
            adamw: Default::default(),
            kernels: Default::default(),
        });
        input.checkpoint_bytes = Some(Bytes(16_000_000_000));
        let prepared = prepare(input).unwrap();
        assert_eq!(prepared.request.replicas, None);
        assert!((prepared.request.gpu_util - DEFAULT_TRAINING_GPU_UTIL).abs() < f64::EPSILON);
        assert!(prepared.notes[0].starts_with("--replicas applies to serving"));
        assert_eq!(prepared.model.checkpoint_bytes, Some(Bytes(16_000_000_000)));
    }

    /// Issue 38: `--rope-scaling yarn:4` lengthens Qwen3-8B's context over its trained window
    /// and is recorded for the engines; without it the config's maximum holds.
    #[test]
    fn yarn_asked_for_lengthens_the_context() {
        let plain = prepare(serve(ModelInput::Preset("qwen3-8b".into()))).unwrap();
        assert_eq!(plain.model.max_context, Some(40_960));
        assert_eq!(plain.model.rope_requested, None);
        let mut input = serve(ModelInput::Preset("qwen3-8b".into()));
        // Qwen3's card: factor 4 over the 32,768 tokens it was trained on (its config's
        // 40,960 adds room for the output), 131,072 in all.
        input.rope_scaling = Some("yarn:4:32768".parse().unwrap());
        let yarn = prepare(input).unwrap();
        assert_eq!(yarn.model.max_context, Some(131_072));
        assert!(yarn.model.rope_requested.is_some());
        assert!(
            yarn.model.notes.iter().any(|n| n.contains("yarn x4")),
            "{:?}",
            yarn.model.notes
        );
    }

    #[test]
    fn unknown_presets_suggest_similar_keys() {
        let err = prepare(serve(ModelInput::Preset("llama-3.1-7b".into())))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("unknown model preset"), "{err}");
        assert!(
            err.contains("did you mean") && err.contains("llama-3.1-8b"),
            "{err}"
        );
        let err = prepare(serve(ModelInput::Preset("zzz".into())))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--list-models"), "{err}");
    }

    #[test]
    fn inline_configs_are_named_and_bad_json_is_a_clear_error() {
        let json = r#"{"_name_or_path": "tiny", "hidden_size": 1024, "num_hidden_layers": 2,
            "num_attention_heads": 8, "intermediate_size": 4096, "vocab_size": 32000}"#;
        let origin = "spec.model.huggingFaceConfig".to_string();
        let inline = |json: &str| ModelInput::Inline {
            origin: origin.clone(),
            json: json.to_string(),
        };
        let prepared = prepare(serve(inline(json))).unwrap();
        assert_eq!(prepared.model.name, "tiny");
        let err = prepare(serve(inline("{"))).unwrap_err().to_string();
        assert!(
            err.starts_with("spec.model.huggingFaceConfig: cannot be read as JSON"),
            "{err}"
        );
    }
}
