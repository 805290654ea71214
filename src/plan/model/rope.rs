//! RoPE scaling: the context a config's `rope_scaling` extends the model to, and YaRN asked
//! for on a model whose config has none (`hwaccel plan --rope-scaling yarn:4`, a placement's
//! `spec.model.ropeScaling`).
//!
//! The engines derive the longest context from the config the same way (vLLM
//! `_get_and_verify_max_len`): `max_position_embeddings`, multiplied by `rope_scaling.factor`
//! for the scalings that stretch positions after training (`linear`, `dynamic`), and for YaRN
//! by `original_max_position_embeddings x factor` (the pre-training window, which YaRN
//! configs state). `llama3`, `longrope`/`su` and `default` leave it alone: their
//! `max_position_embeddings` already is the extended length. Transformers 5 configs name the
//! object `rope_parameters`; it is read the same way.
//!
//! Model cards document YaRN this way: Qwen3 ("natively supports context lengths of up to
//! 32,768 tokens... validated with YaRN" up to 131,072 with `factor: 4.0`,
//! `original_max_position_embeddings: 32768`), Qwen2.5 likewise.

use serde::Serialize;
use serde_json::Value;

use crate::plan::error::{PlanError, Result};

/// Most a factor may stretch the context; far beyond any published YaRN setting (DeepSeek-V3
/// uses 40), and it keeps `original x factor` inside the context bound.
pub const MAX_FACTOR: f64 = 1024.0;

/// A RoPE scaling that lengthens the context.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RopeScaling {
    /// `yarn`, `linear` or `dynamic` (as the config spells it).
    pub kind: RopeKind,
    /// `factor`.
    pub factor: f64,
    /// The window the model was trained on: `original_max_position_embeddings` for YaRN (or
    /// the config's maximum when it states none); the config's maximum for the others.
    pub original: u64,
}

/// The scalings that change the longest context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RopeKind {
    /// YaRN (arXiv:2309.00071).
    Yarn,
    /// Position interpolation.
    Linear,
    /// Dynamic NTK.
    Dynamic,
}

impl RopeKind {
    fn name(self) -> &'static str {
        match self {
            Self::Yarn => "yarn",
            Self::Linear => "linear",
            Self::Dynamic => "dynamic",
        }
    }
}

impl RopeScaling {
    /// The longest context with this scaling, capped at `limit` tokens.
    pub fn extended(&self, limit: u64) -> u64 {
        let extended = (self.original as f64 * self.factor).floor();
        if extended >= limit as f64 {
            limit
        } else {
            extended as u64
        }
    }

    /// The `rope_scaling` object as the engines take it (`{"rope_type":"yarn","factor":4.0,
    /// "original_max_position_embeddings":32768}`).
    pub fn json(&self) -> Value {
        let mut object = serde_json::Map::new();
        object.insert("rope_type".into(), self.kind.name().into());
        object.insert("factor".into(), self.factor.into());
        if self.kind == RopeKind::Yarn {
            object.insert(
                "original_max_position_embeddings".into(),
                self.original.into(),
            );
        }
        Value::Object(object)
    }

    /// `yarn x4.0 over 32768 tokens`.
    pub fn describe(&self) -> String {
        format!(
            "{} x{} over {} tokens",
            self.kind.name(),
            self.factor,
            self.original
        )
    }
}

/// A scaling a request asks for: `yarn:FACTOR[:ORIGINAL]`, ORIGINAL being the window the
/// model was trained on when the config's maximum is not it (Qwen3's configs say 40,960; its
/// model card's YaRN setting is over 32,768: `yarn:4:32768`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeRequest {
    /// The YaRN factor.
    pub factor: f64,
    /// `original_max_position_embeddings`, when stated.
    pub original: Option<u64>,
}

impl std::str::FromStr for RopeRequest {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let bad = || {
            format!(
                "rope scaling {text:?} is not yarn:FACTOR[:ORIGINAL] with a factor above 1 and \
                 at most {MAX_FACTOR} and an original context of 1 to 2^32 tokens (e.g. yarn:4, \
                 yarn:4:32768)"
            )
        };
        let mut parts = text.trim().split(':');
        let (Some(kind), Some(factor)) = (parts.next(), parts.next()) else {
            return Err(bad());
        };
        let original = match parts.next() {
            Some(original) => Some(
                original
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0 && *n <= super::bounds::MAX_CONTEXT)
                    .ok_or_else(bad)?,
            ),
            None => None,
        };
        if parts.next().is_some() || !kind.eq_ignore_ascii_case("yarn") || factor.len() > 16 {
            return Err(bad());
        }
        let factor: f64 = factor.trim().parse().map_err(|_| bad())?;
        if !(factor > 1.0 && factor <= MAX_FACTOR) {
            return Err(bad());
        }
        Ok(Self { factor, original })
    }
}

impl RopeRequest {
    /// YaRN over what `model_max` (the config's maximum, `None` when it states none) and
    /// the config's own scaling say the model was trained on.
    pub fn over(&self, model_max: Option<u64>, config: Option<RopeScaling>) -> Result<RopeScaling> {
        let original = match (self.original, config) {
            (Some(original), _) => original,
            (None, Some(scaling)) => scaling.original,
            (None, None) => model_max.ok_or_else(|| {
                PlanError::constraint(
                    "--rope-scaling needs the model's trained context: its config states no \
                     max_position_embeddings",
                )
            })?,
        };
        Ok(RopeScaling {
            kind: RopeKind::Yarn,
            factor: self.factor,
            original,
        })
    }
}

/// The context-lengthening scaling a config states (`rope_scaling` or `rope_parameters`),
/// given its `max_position_embeddings`; `None` when it states none or one that does not
/// change the context. A malformed object is an error naming the field.
pub fn from_config(
    origin: &str,
    object: Option<&Value>,
    max_position: Option<u64>,
) -> Result<Option<RopeScaling>> {
    let Some(object) = object.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let error = |reason: String| PlanError::config(origin, format!("rope_scaling: {reason}"));
    let Some(fields) = object.as_object() else {
        return Err(error(format!("expected an object, found {object}")));
    };
    let kind = fields
        .get("rope_type")
        .or_else(|| fields.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let kind = match kind.to_ascii_lowercase().as_str() {
        "yarn" => RopeKind::Yarn,
        "linear" => RopeKind::Linear,
        "dynamic" => RopeKind::Dynamic,
        // llama3, longrope, su, mrope, default: max_position_embeddings is already the
        // extended length (vLLM leaves it alone for these).
        _ => return Ok(None),
    };
    let factor = match fields.get("factor") {
        Some(value) => value
            .as_f64()
            .filter(|f| f.is_finite() && *f >= 1.0 && *f <= MAX_FACTOR)
            .ok_or_else(|| error(format!("factor {value} is not in 1..={MAX_FACTOR}")))?,
        None => return Err(error("a scaling without a factor".to_string())),
    };
    let original = match (kind, fields.get("original_max_position_embeddings")) {
        (RopeKind::Yarn, Some(value)) => Some(
            value
                .as_u64()
                .filter(|n| *n > 0 && *n <= super::bounds::MAX_CONTEXT)
                .ok_or_else(|| {
                    error(format!(
                        "original_max_position_embeddings {value} is not a context length"
                    ))
                })?,
        ),
        _ => max_position,
    };
    Ok(original.map(|original| RopeScaling {
        kind,
        factor,
        original,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn yarn_multiplies_the_original_window_and_llama3_changes_nothing() {
        // Qwen3's model card: factor 4 over the native 32,768 tokens is 131,072.
        let qwen =
            json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768});
        let scaling = from_config("c", Some(&qwen), Some(40_960))
            .unwrap()
            .unwrap();
        assert_eq!(scaling.extended(1 << 32), 131_072);
        // DeepSeek-V3: 40 x 4,096 = 163,840, its max_position_embeddings.
        let ds = json!({"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096});
        assert_eq!(
            from_config("c", Some(&ds), Some(163_840))
                .unwrap()
                .unwrap()
                .extended(1 << 32),
            163_840
        );
        // Llama 3.1's llama3 scaling: max_position_embeddings already says 131,072.
        let llama =
            json!({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192});
        assert_eq!(from_config("c", Some(&llama), Some(131_072)).unwrap(), None);
        // Linear: the config's maximum times the factor.
        let linear = json!({"type": "linear", "factor": 2.0});
        assert_eq!(
            from_config("c", Some(&linear), Some(4096))
                .unwrap()
                .unwrap()
                .extended(1 << 32),
            8192
        );
        assert_eq!(
            from_config("c", Some(&Value::Null), Some(4096)).unwrap(),
            None
        );
    }

    #[test]
    fn malformed_scalings_and_requests_are_clear_errors() {
        for bad in [
            json!("yarn"),
            json!({"rope_type": "yarn"}),
            json!({"rope_type": "yarn", "factor": "x"}),
            json!({"rope_type": "yarn", "factor": 1e9}),
            json!({"rope_type": "yarn", "factor": 2, "original_max_position_embeddings": -1}),
        ] {
            let err = from_config("config.json", Some(&bad), Some(4096)).unwrap_err();
            assert!(err.to_string().contains("rope_scaling: "), "{err}");
        }
        let request: RopeRequest = "yarn:4".parse().unwrap();
        assert_eq!(request.factor, 4.0);
        assert_eq!("YaRN:2.5".parse::<RopeRequest>().unwrap().factor, 2.5);
        let qwen3: RopeRequest = "yarn:4:32768".parse().unwrap();
        assert_eq!(
            qwen3.over(Some(40_960), None).unwrap().extended(1 << 32),
            131_072
        );
        for bad in [
            "yarn",
            "linear:2",
            "yarn:1",
            "yarn:0.5",
            "yarn:nan",
            "yarn:1e9",
            "",
            "yarn:4:0",
            "yarn:4:x",
            "yarn:4:32768:1",
        ] {
            let err = bad.parse::<RopeRequest>().unwrap_err();
            assert!(err.contains("yarn:FACTOR"), "{bad}: {err}");
        }
        let scaling = request.over(Some(32_768), None).unwrap();
        assert_eq!(scaling.extended(1 << 32), 131_072);
        assert_eq!(
            scaling.json(),
            json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
        );
        assert!(request.over(None, None).is_err());
    }
}
