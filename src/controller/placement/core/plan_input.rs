//! A ModelPlacement spec as the planner's input ([`PlanInput`]). The spec's shapes that exist
//! for the CRD's sake (one optional field per model source, a goal with optional `serve` and
//! `train`, the KV-cache type as a precision, the API's own enums) become the planner's types
//! here, in one place; model resolution and defaults are the planner's own
//! ([`crate::plan::request::prepare`]). The API names nothing of the planner: this file is
//! where the two meet.

use crate::api::placement::{
    AllocationMode, EngineName, EngineSpec, Goal, ModelPlacementSpec, ModelSource, OptimizerStates,
    PrecisionChoice, TrainAdamw, TrainKernels, TrainLoss, TrainMethod,
};
use crate::plan::Bytes;
use crate::plan::capability::PrecisionChoice as PlannerPrecision;
use crate::plan::engine::choice::{EngineChoice, EngineKind, EngineVersion};
use crate::plan::kv::KvDtype;
use crate::plan::request::{ModelInput, PlanInput};
use crate::plan::search::{Disaggregation, Goal as PlannerGoal};
use crate::plan::training::{
    Adamw as PlannerAdamw, Kernels as PlannerKernels, LoraTarget, Loss as PlannerLoss, Method,
    OptimizerStates as PlannerStates, TrainingTarget,
};

/// Where an inline `config.json` comes from, in messages.
const INLINE_CONFIG_ORIGIN: &str = "spec.model.huggingFaceConfig";

/// The planner's input for `spec`; the error names the part of the spec at fault.
pub fn plan_input(spec: &ModelPlacementSpec) -> Result<PlanInput, String> {
    let model = model_input(&spec.model)?;
    let goal = planner_goal(&spec.goal)?;
    let constraints = spec.constraints.clone().unwrap_or_default();
    Ok(PlanInput {
        model,
        checkpoint_bytes: spec.model.checkpoint_bytes.map(Bytes),
        goal,
        precision: precision(constraints.precision.unwrap_or_default()),
        kv_dtype: kv_dtype(constraints.kv_cache_precision.unwrap_or_default())?,
        max_nodes: constraints.max_nodes,
        gpu_util: constraints
            .memory_utilization_percent
            .map(|percent| f64::from(percent) / 100.0),
        replicas: spec.replicas,
        disaggregation: spec
            .goal
            .serve
            .as_ref()
            .filter(|serve| serve.disaggregated)
            .map(|serve| Disaggregation {
                prefill_replicas: serve.prefill_replicas.unwrap_or(1),
            }),
        engine: spec
            .engine
            .as_ref()
            .map(engine_choice)
            .transpose()?
            .unwrap_or_default(),
        rope_scaling: spec
            .model
            .rope_scaling
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(|err: String| format!("model.ropeScaling: {err}"))?,
        // Only claims can hold a share (a template's, which the scheduler places, or the
        // controller's own, which the ledger counts); node labels hold whole devices.
        whole_devices: !matches!(
            spec.allocation,
            Some(AllocationMode::Claims | AllocationMode::ClaimTemplate)
        ) || spec
            .constraints
            .as_ref()
            .and_then(|c| c.whole_devices)
            .unwrap_or(false),
    })
}

/// The planner's engine choice; bounds beyond the schema's are the planner's to check.
fn engine_choice(engine: &EngineSpec) -> Result<EngineChoice, String> {
    let kind = match engine.name.unwrap_or_default() {
        EngineName::Vllm => EngineKind::Vllm,
        EngineName::Sglang => EngineKind::Sglang,
    };
    let version = match &engine.version {
        Some(text) => Some(
            text.parse::<EngineVersion>()
                .map_err(|err| format!("engine.version: {err}"))?,
        ),
        None => None,
    };
    Ok(EngineChoice {
        kind,
        version,
        stated: engine.name.is_some() || engine.version.is_some(),
        enforce_eager: engine.enforce_eager,
        max_num_seqs: engine.max_num_seqs.map(u64::from),
        max_num_batched_tokens: engine.max_num_batched_tokens.map(u64::from),
        mem_fraction_static: engine
            .mem_fraction_static_percent
            .map(|percent| f64::from(percent) / 100.0),
    })
}

/// The one model source set.
fn model_input(source: &ModelSource) -> Result<ModelInput, String> {
    match (
        &source.preset,
        &source.parameters,
        &source.hugging_face_config,
    ) {
        (Some(key), None, None) => Ok(ModelInput::Preset(key.clone())),
        (None, Some(count), None) => Ok(ModelInput::ParamCount(count.clone())),
        (None, None, Some(config)) => Ok(ModelInput::Inline {
            origin: INLINE_CONFIG_ORIGIN.to_string(),
            json: config.text().to_string(),
        }),
        _ => Err("model: set exactly one of preset, parameters or huggingFaceConfig".to_string()),
    }
}

/// The planner's goal. Training always checkpoints gradients and adapts every linear module:
/// the spec offers no choice there.
fn planner_goal(goal: &Goal) -> Result<PlannerGoal, String> {
    match (&goal.serve, &goal.train) {
        (Some(serve), None) => Ok(PlannerGoal::Serve {
            context: Some(u64::from(serve.context)),
            concurrency: u64::from(serve.concurrency),
        }),
        (None, Some(train)) => Ok(PlannerGoal::Train(TrainingTarget {
            method: train_method(train.method),
            seq_len: u64::from(train.seq_len),
            micro_batch: u64::from(train.micro_batch),
            gradient_checkpointing: true,
            lora_rank: u64::from(train.lora_rank),
            lora_targets: LoraTarget::ALL.to_vec(),
            optimizer_states: optimizer_states(train.optimizer_states.unwrap_or_default()),
            loss: loss(train.loss.unwrap_or_default()),
            adamw: adamw(train.adamw.unwrap_or_default()),
            kernels: kernels(train.kernels.unwrap_or_default()),
        })),
        _ => Err("goal: set exactly one of serve or train".to_string()),
    }
}

/// The KV-cache type `constraints.kvCachePrecision` names.
fn kv_dtype(choice: PrecisionChoice) -> Result<KvDtype, String> {
    match choice {
        PrecisionChoice::Auto => Ok(KvDtype::Auto),
        PrecisionChoice::Bf16 => Ok(KvDtype::Bf16),
        PrecisionChoice::Fp16 => Ok(KvDtype::Fp16),
        PrecisionChoice::Fp8 => Ok(KvDtype::Fp8),
        other => Err(format!(
            "constraints.kvCachePrecision {other:?} is not a KV-cache type (auto, bf16, fp16, fp8)"
        )),
    }
}

/// The planner's precision choice for the API's.
pub fn precision(choice: PrecisionChoice) -> PlannerPrecision {
    match choice {
        PrecisionChoice::Auto => PlannerPrecision::Auto,
        PrecisionChoice::Bf16 => PlannerPrecision::Bf16,
        PrecisionChoice::Fp16 => PlannerPrecision::Fp16,
        PrecisionChoice::Fp8 => PlannerPrecision::Fp8,
        PrecisionChoice::Int8 => PlannerPrecision::Int8,
        PrecisionChoice::Int4 => PlannerPrecision::Int4,
        PrecisionChoice::Nf4 => PlannerPrecision::Nf4,
        PrecisionChoice::Fp4 => PlannerPrecision::Fp4,
    }
}

/// The planner's fine-tuning method for the API's.
pub fn train_method(method: TrainMethod) -> Method {
    match method {
        TrainMethod::Full => Method::Full,
        TrainMethod::Lora => Method::Lora,
        TrainMethod::Qlora => Method::Qlora,
        TrainMethod::Dpo => Method::Dpo,
    }
}

/// The planner's AdamW implementation for the API's.
pub fn adamw(adamw: TrainAdamw) -> PlannerAdamw {
    match adamw {
        TrainAdamw::Fused => PlannerAdamw::Fused,
        TrainAdamw::Foreach => PlannerAdamw::Foreach,
    }
}

/// The planner's layer kernels for the API's.
pub fn kernels(kernels: TrainKernels) -> PlannerKernels {
    match kernels {
        TrainKernels::Standard => PlannerKernels::Standard,
        TrainKernels::Liger => PlannerKernels::Liger,
    }
}

/// The planner's training loss for the API's.
pub fn loss(loss: TrainLoss) -> PlannerLoss {
    match loss {
        TrainLoss::Standard => PlannerLoss::Standard,
        TrainLoss::Fused => PlannerLoss::Fused,
    }
}

/// The planner's optimizer-state precision for the API's.
pub fn optimizer_states(states: OptimizerStates) -> PlannerStates {
    match states {
        OptimizerStates::Fp32 => PlannerStates::Fp32,
        OptimizerStates::Bf16 => PlannerStates::Bf16,
        OptimizerStates::EightBit => PlannerStates::EightBit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::placement::{Constraints, OptimizerStates, ServeGoal, TrainGoal, TrainMethod};

    fn spec() -> ModelPlacementSpec {
        ModelPlacementSpec {
            model: ModelSource {
                preset: Some("llama-3.1-8b".into()),
                ..ModelSource::default()
            },
            goal: Goal {
                serve: Some(ServeGoal {
                    disaggregated: false,
                    prefill_replicas: None,
                    context: 4096,
                    concurrency: 3,
                }),
                train: None,
            },
            constraints: Some(Constraints {
                precision: Some(PrecisionChoice::Fp8),
                memory_utilization_percent: Some(80),
                ..Constraints::default()
            }),
            replicas: Some(2),
            allocation: None,
            engine: None,
        }
    }

    /// Issue 23: the spec's engine fields become the planner's engine choice; a spec without
    /// them leaves the engine to be assumed (and said).
    #[test]
    fn engine_fields_become_the_engine_choice() {
        let input = plan_input(&spec()).unwrap();
        assert_eq!(input.engine, EngineChoice::default());
        let mut sglang = spec();
        sglang.engine = Some(EngineSpec {
            name: Some(EngineName::Sglang),
            version: Some("0.5.2".into()),
            enforce_eager: true,
            max_num_seqs: Some(64),
            max_num_batched_tokens: Some(4096),
            mem_fraction_static_percent: Some(85),
        });
        let engine = plan_input(&sglang).unwrap().engine;
        assert_eq!(engine.kind, EngineKind::Sglang);
        assert_eq!(engine.version, Some(EngineVersion::release(0, 5, 2)));
        assert!(engine.stated && engine.enforce_eager);
        assert_eq!(engine.max_num_seqs, Some(64));
        assert_eq!(engine.max_num_batched_tokens, Some(4096));
        assert_eq!(engine.mem_fraction_static, Some(0.85));
        let mut bad = spec();
        bad.engine = Some(EngineSpec {
            version: Some("x".into()),
            ..EngineSpec::default()
        });
        let err = plan_input(&bad).unwrap_err();
        assert!(err.starts_with("engine.version: "), "{err}");
    }

    #[test]
    fn a_serving_spec_becomes_the_planner_input() {
        let input = plan_input(&spec()).unwrap();
        assert_eq!(input.model, ModelInput::Preset("llama-3.1-8b".into()));
        assert_eq!(
            input.goal,
            PlannerGoal::Serve {
                context: Some(4096),
                concurrency: 3
            }
        );
        assert_eq!(input.precision, PlannerPrecision::Fp8);
        assert_eq!(input.gpu_util, Some(0.8));
        assert_eq!(input.replicas, Some(2));
    }

    #[test]
    fn training_takes_every_linear_module_and_checkpoints() {
        let mut spec = spec();
        spec.goal = Goal {
            serve: None,
            train: Some(TrainGoal {
                method: TrainMethod::Qlora,
                seq_len: 1024,
                micro_batch: 2,
                lora_rank: 8,
                optimizer_states: None,
                loss: None,
                adamw: None,
                kernels: None,
            }),
        };
        let PlannerGoal::Train(target) = plan_input(&spec).unwrap().goal else {
            panic!("a training goal");
        };
        assert_eq!(target.method, Method::Qlora);
        assert!(target.gradient_checkpointing);
        assert_eq!(target.lora_targets, LoraTarget::ALL.to_vec());
        assert_eq!(target.optimizer_states, PlannerStates::Fp32);
        // Issue 38: `optimizerStates`, `loss` and `adamw` reach the planner as the CRD spells them.
        let decoded = |json: &str| {
            let mut spec = spec.clone();
            spec.goal.train = Some(serde_json::from_str(json).unwrap());
            match plan_input(&spec).unwrap().goal {
                PlannerGoal::Train(target) => target,
                other => panic!("a training goal, not {other:?}"),
            }
        };
        let target = decoded(r#"{"method": "full", "seqLen": 2048, "optimizerStates": "bf16"}"#);
        assert_eq!(target.optimizer_states, PlannerStates::Bf16);
        assert_eq!(target.loss, PlannerLoss::Standard);
        let target = decoded(r#"{"method": "lora", "seqLen": 32768, "loss": "fused"}"#);
        assert_eq!(target.loss, PlannerLoss::Fused);
        // An unknown loss is a decoding error, not the default.
        let unknown = r#"{"method": "lora", "loss": "chunky"}"#;
        assert!(serde_json::from_str::<TrainGoal>(unknown).is_err());
        for each in [TrainLoss::Standard, TrainLoss::Fused] {
            assert_eq!(
                serde_json::to_value(each).unwrap(),
                serde_json::to_value(loss(each)).unwrap()
            );
        }
        // `adamw` likewise: fused unless the spec says foreach; an unknown one is refused.
        assert_eq!(target.adamw, PlannerAdamw::Fused);
        let target = decoded(r#"{"method": "full", "adamw": "foreach"}"#);
        assert_eq!(target.adamw, PlannerAdamw::Foreach);
        let unknown = r#"{"method": "full", "adamw": "adam"}"#;
        assert!(serde_json::from_str::<TrainGoal>(unknown).is_err());
        for each in [TrainAdamw::Fused, TrainAdamw::Foreach] {
            assert_eq!(
                serde_json::to_value(each).unwrap(),
                serde_json::to_value(adamw(each)).unwrap()
            );
        }
        // `kernels` likewise: transformers' own unless the spec says liger.
        assert_eq!(target.kernels, PlannerKernels::Standard);
        let target = decoded(r#"{"method": "qlora", "kernels": "liger"}"#);
        assert_eq!(target.kernels, PlannerKernels::Liger);
        let unknown = r#"{"method": "qlora", "kernels": "triton"}"#;
        assert!(serde_json::from_str::<TrainGoal>(unknown).is_err());
        for each in [TrainKernels::Standard, TrainKernels::Liger] {
            assert_eq!(
                serde_json::to_value(each).unwrap(),
                serde_json::to_value(kernels(each)).unwrap()
            );
        }
    }

    #[test]
    fn malformed_specs_name_the_field() {
        let mut two_goals = spec();
        two_goals.goal.train = Some(TrainGoal {
            method: TrainMethod::Full,
            seq_len: 1,
            micro_batch: 1,
            lora_rank: 1,
            optimizer_states: None,
            loss: None,
            adamw: None,
            kernels: None,
        });
        assert!(plan_input(&two_goals).unwrap_err().starts_with("goal:"));
        let mut int8_cache = spec();
        int8_cache.constraints = Some(Constraints {
            kv_cache_precision: Some(PrecisionChoice::Int8),
            ..Constraints::default()
        });
        assert_eq!(
            plan_input(&int8_cache).unwrap_err(),
            "constraints.kvCachePrecision Int8 is not a KV-cache type (auto, bf16, fp16, fp8)"
        );
        let mut no_model = spec();
        no_model.model.preset = None;
        assert!(plan_input(&no_model).unwrap_err().starts_with("model:"));
    }

    /// The API's enums and the planner's share wire names: each API variant, written as the
    /// CRD writes it, reads back as the planner's variant it converts to. A variant renamed on
    /// one side only fails here.
    #[test]
    fn the_apis_enums_convert_to_the_planners_variant_of_the_same_name() {
        fn same<
            A: serde::Serialize,
            P: serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
        >(
            api: A,
            converted: P,
        ) {
            let wire = serde_json::to_value(&api).unwrap();
            let read: P = serde_json::from_value(wire.clone()).unwrap();
            assert_eq!(read, converted, "{wire}");
        }
        for choice in [
            PrecisionChoice::Auto,
            PrecisionChoice::Bf16,
            PrecisionChoice::Fp16,
            PrecisionChoice::Fp8,
            PrecisionChoice::Int8,
            PrecisionChoice::Int4,
            PrecisionChoice::Nf4,
            PrecisionChoice::Fp4,
        ] {
            same(choice, precision(choice));
        }
        for method in [
            TrainMethod::Full,
            TrainMethod::Lora,
            TrainMethod::Qlora,
            TrainMethod::Dpo,
        ] {
            same(method, train_method(method));
        }
        for states in [
            OptimizerStates::Fp32,
            OptimizerStates::Bf16,
            OptimizerStates::EightBit,
        ] {
            same(states, optimizer_states(states));
        }
    }
}
