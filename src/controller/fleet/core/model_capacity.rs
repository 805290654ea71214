//! Capacity in units of models, for the controller's gauges: for each model the controller
//! is told to count (`--capacity-model llama-3.1-70b@32768/bf16`), how many replicas of it
//! the free devices hold now and how many free devices none of them can use.
//!
//! The precision is part of the question: with `auto` (the default, as in `hwaccel fleet`)
//! the planner may answer "eight replicas in FP8" where BF16 holds two, which is the right
//! answer to "how many can I run" and the wrong one to "how many at the quality I serve".
//!
//! The answer is [`crate::fleet::capacity`]'s, the same one `hwaccel fleet` prints, so the gauge and
//! the command cannot disagree: replicas are packed one device class after the other on what
//! no placement holds, each replica serving one full-context request.
//!
//! A model is resolved once, when the controller starts: a typo in a preset key fails the
//! start-up with the planner's "did you mean" rather than a gauge that never appears.

use crate::controller::core::fleet_figures::ModelCount;
use crate::fleet::capacity::{self, Question};
use crate::plan::capability::PrecisionChoice;
use crate::plan::kv::KvDtype;
use crate::plan::request::{ModelInput, PlanInput, prepare};
use crate::plan::{Goal, Model, NodeSpec, PlanRequest, Reservations};

/// Most models counted: each costs a few dozen plans per pass.
pub const MAX_MODELS: usize = 16;
/// Longest context accepted in a specification (the planner's own bound is higher; a gauge
/// for a longer one would be for no model that exists).
const MAX_CONTEXT: u64 = 10_000_000;

/// A model to count, resolved.
#[derive(Debug, Clone)]
pub struct CountedModel {
    /// The preset key, as the gauge's `model` label.
    pub key: String,
    /// Tokens per request, as the gauge's `context` label.
    pub context: u64,
    /// The precision asked for, as the gauge's `precision` label (`auto`, `bf16`...).
    pub precision: String,
    model: Model,
    request: PlanRequest,
}

/// A `--capacity-model` value that cannot be counted.
#[derive(Debug, thiserror::Error)]
pub enum CapacitySpecError {
    /// Not `PRESET[@CONTEXT][/PRECISION]`.
    #[error("`{0}`: expected PRESET[@CONTEXT][/PRECISION] (llama-3.1-70b@32768/bf16)")]
    Malformed(String),
    /// The precision is not one the planner knows.
    #[error("`{spec}`: {reason}")]
    Precision {
        /// The specification.
        spec: String,
        /// Why.
        reason: String,
    },
    /// The context is not a number in range.
    #[error("`{spec}`: the context must be a whole number of tokens from 1 to {MAX_CONTEXT}")]
    Context {
        /// The specification.
        spec: String,
    },
    /// The planner refused the model (unknown preset, context beyond its maximum...).
    #[error("`{spec}`: {reason}")]
    Model {
        /// The specification.
        spec: String,
        /// The planner's message.
        reason: String,
    },
    /// More models than [`MAX_MODELS`].
    #[error("at most {MAX_MODELS} models can be counted; {0} were given")]
    TooMany(usize),
}

impl CountedModel {
    /// Resolves `PRESET[@CONTEXT][/PRECISION]`: by default the model's maximum context and
    /// `auto` precision.
    pub fn parse(spec: &str) -> Result<Self, CapacitySpecError> {
        let spec = spec.trim();
        let (rest, precision) = match spec.split_once('/') {
            Some((rest, precision)) => {
                let choice = precision.parse::<PrecisionChoice>().map_err(|err| {
                    CapacitySpecError::Precision {
                        spec: spec.to_string(),
                        reason: err.to_string(),
                    }
                })?;
                (rest, choice)
            }
            None => (spec, PrecisionChoice::Auto),
        };
        let (key, context) = match rest.split_once('@') {
            Some((key, context)) => {
                let context = context
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|c| (1..=MAX_CONTEXT).contains(c))
                    .ok_or_else(|| CapacitySpecError::Context {
                        spec: spec.to_string(),
                    })?;
                (key.trim(), Some(context))
            }
            None => (rest, None),
        };
        let valid_key = !key.is_empty()
            && key.len() <= 128
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
        if !valid_key {
            return Err(CapacitySpecError::Malformed(spec.to_string()));
        }
        let refused = |reason: String| CapacitySpecError::Model {
            spec: spec.to_string(),
            reason,
        };
        let prepared = prepare(PlanInput {
            model: ModelInput::Preset(key.to_string()),
            checkpoint_bytes: None,
            goal: Goal::Serve {
                context,
                concurrency: 1,
            },
            precision,
            kv_dtype: KvDtype::Auto,
            max_nodes: None,
            gpu_util: None,
            replicas: None,
            disaggregation: None,
            engine: crate::plan::engine::choice::EngineChoice::default(),
            rope_scaling: None,
            whole_devices: true,
        })
        .map_err(|err| refused(err.to_string()))?;
        let context = context
            .or(prepared.model.max_context)
            .ok_or_else(|| refused("the preset states no maximum context; give one".into()))?;
        if prepared.model.max_context.is_some_and(|max| context > max) {
            return Err(refused(format!(
                "{context} tokens is beyond the model's maximum context"
            )));
        }
        let mut request = prepared.request;
        request.goal = Goal::Serve {
            context: Some(context),
            concurrency: 1,
        };
        Ok(Self {
            key: key.to_string(),
            context,
            precision: precision_name(precision),
            model: prepared.model,
            request,
        })
    }

    /// Resolves every specification, refusing more than [`MAX_MODELS`] and duplicates.
    pub fn parse_all(specs: &[String]) -> Result<Vec<Self>, CapacitySpecError> {
        if specs.len() > MAX_MODELS {
            return Err(CapacitySpecError::TooMany(specs.len()));
        }
        let mut models: Vec<Self> = Vec::with_capacity(specs.len());
        for spec in specs {
            let model = Self::parse(spec)?;
            // The same series twice would only cost a second computation of one answer.
            if !models.iter().any(|m| {
                m.key == model.key && m.context == model.context && m.precision == model.precision
            }) {
                models.push(model);
            }
        }
        Ok(models)
    }
}

/// The label value of a precision choice: its serde name (`auto`, `bf16`, `fp4`...).
fn precision_name(choice: PrecisionChoice) -> String {
    serde_json::to_value(choice)
        .ok()
        .and_then(|value| value.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{choice:?}").to_ascii_lowercase())
}

/// Counts each model on `nodes` with `reserved` held. A model the planner cannot answer for
/// is left out with its error, so one bad answer never hides the others.
pub fn count(
    models: &[CountedModel],
    nodes: &[NodeSpec],
    reserved: &Reservations,
) -> (Vec<ModelCount>, Vec<String>) {
    let mut counts = Vec::with_capacity(models.len());
    let mut errors = Vec::new();
    for counted in models {
        let question = Question {
            model: &counted.model,
            request: &counted.request,
            wanted: None,
            shapes: &[],
        };
        match capacity::capacity(&question, nodes, reserved) {
            Ok(answer) => counts.push(ModelCount {
                model: counted.key.clone(),
                context: counted.context,
                precision: counted.precision.clone(),
                replicas: answer.total_replicas,
                stranded_devices: answer.stranded_devices,
            }),
            Err(err) => errors.push(format!(
                "{}@{}/{}: {err}",
                counted.key, counted.context, counted.precision
            )),
        }
    }
    (counts, errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::shorthand::parse_hardware;

    fn counted(spec: &str) -> CountedModel {
        CountedModel::parse(spec).unwrap_or_else(|err| panic!("{spec}: {err}"))
    }

    #[test]
    fn a_preset_at_a_context_counts_like_hwaccel_plan_places() {
        let nodes = parse_hardware("1x8xH100-80GB+nvswitch").unwrap();
        let (counts, errors) = count(
            &[counted("llama-3.1-8b@8192")],
            &nodes,
            &Reservations::none(),
        );
        assert!(errors.is_empty(), "{errors:?}");
        // An 8B model in BF16 holds an 8k request on one H100: one replica per device.
        assert_eq!(
            counts,
            [ModelCount {
                model: "llama-3.1-8b".into(),
                context: 8192,
                precision: "auto".into(),
                replicas: 8,
                stranded_devices: 0,
            }]
        );
    }

    #[test]
    fn held_devices_are_not_counted_and_leftovers_are_stranded() {
        let nodes = parse_hardware("1x8xH100-80GB+nvswitch").unwrap();
        let mut reserved = Reservations::none();
        for device in nodes[0].devices.iter().take(3) {
            reserved.insert(nodes[0].name.clone(), device.id.clone());
        }
        let model = counted("llama-3.1-70b@8192/bf16");
        let (free, _) = count(std::slice::from_ref(&model), &nodes, &Reservations::none());
        let (left, _) = count(&[model], &nodes, &reserved);
        // 70B in BF16 with 8k requests takes four H100s per replica (TP 2 leaves no KV room
        // once NVLink's communication buffers are paid): two on a free node, one on the five
        // left, and the fifth stranded.
        assert_eq!((free[0].replicas, free[0].stranded_devices), (2, 0));
        assert_eq!((left[0].replicas, left[0].stranded_devices), (1, 1));
        assert_eq!(free[0].precision, "bf16");
        // With the precision left to the planner, a smaller format packs one per device.
        let (auto, _) = count(
            &[counted("llama-3.1-70b@8192")],
            &nodes,
            &Reservations::none(),
        );
        assert!(auto[0].replicas > free[0].replicas, "{auto:?}");
    }

    #[test]
    fn the_default_context_is_the_models_maximum() {
        let model = counted("llama-3.1-8b");
        assert_eq!(model.context, 131_072);
    }

    #[test]
    fn bad_specifications_are_refused_with_the_reason() {
        for (spec, says) in [
            ("", "expected PRESET"),
            ("llama 3", "expected PRESET"),
            ("llama-3.1-8b@", "whole number"),
            ("llama-3.1-8b@0", "whole number"),
            ("llama-3.1-8b@lots", "whole number"),
            ("llama-3.1-8b@99999999999", "whole number"),
            ("llama-3.1-8b@1000000", "beyond the model's maximum"),
            ("lama-3.1-8b", "lama-3.1-8b"),
            ("../../etc/passwd", "unknown precision"),
            ("..", "unknown model preset"),
            ("a;b", "expected PRESET"),
            ("llama-3.1-8b@8192/fp9", "fp9"),
            ("llama-3.1-8b/", "precision"),
        ] {
            let err = CountedModel::parse(spec).expect_err(spec).to_string();
            assert!(err.contains(says), "{spec}: {err}");
        }
        let many: Vec<String> = (0..=MAX_MODELS).map(|_| "llama-3.1-8b".into()).collect();
        assert!(matches!(
            CountedModel::parse_all(&many),
            Err(CapacitySpecError::TooMany(_))
        ));
        let twice =
            CountedModel::parse_all(&["llama-3.1-8b@8192".into(), "llama-3.1-8b@8192".into()]);
        assert_eq!(twice.map(|m| m.len()).ok(), Some(1));
    }

    #[test]
    fn an_empty_fleet_counts_nothing_and_is_no_error() {
        let (counts, errors) = count(&[counted("llama-3.1-8b@8192")], &[], &Reservations::none());
        assert_eq!(counts[0].replicas, 0);
        assert!(errors.is_empty(), "{errors:?}");
    }
}
