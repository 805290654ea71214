//! A ModelPlacement spec as the planner's input ([`PlanInput`]). The spec's shapes that exist
//! for the CRD's sake (one optional field per model source, a goal with optional `serve` and
//! `train`, the KV-cache type as a precision) become the planner's types here, in one place;
//! model resolution and defaults are the planner's own ([`crate::plan::request::prepare`]).

use crate::api::placement::{
    EngineName, EngineSpec, Goal, ModelPlacementSpec, ModelSource, PrecisionChoice,
};
use crate::plan::Bytes;
use crate::plan::engine::choice::{EngineChoice, EngineKind, EngineVersion};
use crate::plan::kv::KvDtype;
use crate::plan::request::{ModelInput, PlanInput};
use crate::plan::search::{Disaggregation, Goal as PlannerGoal};
use crate::plan::training::{LoraTarget, TrainingTarget};

/// Where an inline `config.json` comes from, in messages.
const INLINE_CONFIG_ORIGIN: &str = "spec.model.huggingFaceConfig";

impl ModelPlacementSpec {
    /// The planner's input for this spec; the error names the part of the spec at fault.
    pub fn plan_input(&self) -> Result<PlanInput, String> {
        let model = self.model.model_input()?;
        let goal = self.goal.planner_goal()?;
        let constraints = self.constraints.clone().unwrap_or_default();
        Ok(PlanInput {
            model,
            checkpoint_bytes: self.model.checkpoint_bytes.map(Bytes),
            goal,
            precision: constraints.precision.unwrap_or_default(),
            kv_dtype: kv_dtype(constraints.kv_cache_precision.unwrap_or_default())?,
            max_nodes: constraints.max_nodes,
            gpu_util: constraints
                .memory_utilization_percent
                .map(|percent| f64::from(percent) / 100.0),
            replicas: self.replicas,
            disaggregation: self
                .goal
                .serve
                .as_ref()
                .filter(|serve| serve.disaggregated)
                .map(|serve| Disaggregation {
                    prefill_replicas: serve.prefill_replicas.unwrap_or(1),
                }),
            engine: self
                .engine
                .as_ref()
                .map(EngineSpec::choice)
                .transpose()?
                .unwrap_or_default(),
            rope_scaling: self
                .model
                .rope_scaling
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(|err: String| format!("model.ropeScaling: {err}"))?,
        })
    }
}

impl EngineSpec {
    /// The planner's engine choice; bounds beyond the schema's are the planner's to check.
    fn choice(&self) -> Result<EngineChoice, String> {
        let kind = match self.name.unwrap_or_default() {
            EngineName::Vllm => EngineKind::Vllm,
            EngineName::Sglang => EngineKind::Sglang,
        };
        let version = match &self.version {
            Some(text) => Some(
                text.parse::<EngineVersion>()
                    .map_err(|err| format!("engine.version: {err}"))?,
            ),
            None => None,
        };
        Ok(EngineChoice {
            kind,
            version,
            stated: self.name.is_some() || self.version.is_some(),
            enforce_eager: self.enforce_eager,
            max_num_seqs: self.max_num_seqs.map(u64::from),
            max_num_batched_tokens: self.max_num_batched_tokens.map(u64::from),
            mem_fraction_static: self
                .mem_fraction_static_percent
                .map(|percent| f64::from(percent) / 100.0),
        })
    }
}

impl ModelSource {
    /// The one model source set.
    fn model_input(&self) -> Result<ModelInput, String> {
        match (&self.preset, &self.parameters, &self.hugging_face_config) {
            (Some(key), None, None) => Ok(ModelInput::Preset(key.clone())),
            (None, Some(count), None) => Ok(ModelInput::ParamCount(count.clone())),
            (None, None, Some(config)) => Ok(ModelInput::Inline {
                origin: INLINE_CONFIG_ORIGIN.to_string(),
                json: config.text().to_string(),
            }),
            _ => {
                Err("model: set exactly one of preset, parameters or huggingFaceConfig".to_string())
            }
        }
    }
}

impl Goal {
    /// The planner's goal. Training always checkpoints gradients and adapts every linear
    /// module: the spec offers no choice there.
    fn planner_goal(&self) -> Result<PlannerGoal, String> {
        match (&self.serve, &self.train) {
            (Some(serve), None) => Ok(PlannerGoal::Serve {
                context: Some(u64::from(serve.context)),
                concurrency: u64::from(serve.concurrency),
            }),
            (None, Some(train)) => Ok(PlannerGoal::Train(TrainingTarget {
                method: train.method,
                seq_len: u64::from(train.seq_len),
                micro_batch: u64::from(train.micro_batch),
                gradient_checkpointing: true,
                lora_rank: u64::from(train.lora_rank),
                lora_targets: LoraTarget::ALL.to_vec(),
                optimizer_states: train.optimizer_states.unwrap_or_default(),
            })),
            _ => Err("goal: set exactly one of serve or train".to_string()),
        }
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
        let input = spec().plan_input().unwrap();
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
        let engine = sglang.plan_input().unwrap().engine;
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
        let err = bad.plan_input().unwrap_err();
        assert!(err.starts_with("engine.version: "), "{err}");
    }

    #[test]
    fn a_serving_spec_becomes_the_planner_input() {
        let input = spec().plan_input().unwrap();
        assert_eq!(input.model, ModelInput::Preset("llama-3.1-8b".into()));
        assert_eq!(
            input.goal,
            PlannerGoal::Serve {
                context: Some(4096),
                concurrency: 3
            }
        );
        assert_eq!(input.precision, PrecisionChoice::Fp8);
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
            }),
        };
        let PlannerGoal::Train(target) = spec.plan_input().unwrap().goal else {
            panic!("a training goal");
        };
        assert_eq!(target.method, TrainMethod::Qlora);
        assert!(target.gradient_checkpointing);
        assert_eq!(target.lora_targets, LoraTarget::ALL.to_vec());
        assert_eq!(target.optimizer_states, OptimizerStates::Fp32);
        // Issue 38: `optimizerStates` reaches the planner as the CRD spells it.
        let json = r#"{"method": "full", "seqLen": 2048, "optimizerStates": "bf16"}"#;
        spec.goal.train = Some(serde_json::from_str(json).unwrap());
        let PlannerGoal::Train(target) = spec.plan_input().unwrap().goal else {
            panic!("a training goal");
        };
        assert_eq!(target.optimizer_states, OptimizerStates::Bf16);
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
        });
        assert!(two_goals.plan_input().unwrap_err().starts_with("goal:"));
        let mut int8_cache = spec();
        int8_cache.constraints = Some(Constraints {
            kv_cache_precision: Some(PrecisionChoice::Int8),
            ..Constraints::default()
        });
        assert_eq!(
            int8_cache.plan_input().unwrap_err(),
            "constraints.kvCachePrecision Int8 is not a KV-cache type (auto, bf16, fp16, fp8)"
        );
        let mut no_model = spec();
        no_model.model.preset = None;
        assert!(no_model.plan_input().unwrap_err().starts_with("model:"));
    }
}
