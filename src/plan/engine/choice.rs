//! The serving engine a plan is for, as the user states it (`hwaccel plan --engine ...`, a
//! ModelPlacement's `spec.engine`), and the settings of it that change memory: the engine and
//! its version (which start-up accounting applies, [`Engine`]), eager mode (no CUDA graphs),
//! the scheduler budget (`max_num_seqs`, `max_num_batched_tokens`) and SGLang's
//! `mem_fraction_static`.
//!
//! Versions map onto the accounting eras `memory.rs` models: vLLM before 0.8 is the V0 engine,
//! 0.8 up to 0.20 is V1 with CUDA graphs outside the budget, 0.21 and later profile the graphs
//! inside it. A generation may be named instead of a version (`v0`, `v1`, `current`). Without
//! an engine the plan assumes today's vLLM and says so ([`EngineChoice::assumption`]).
//!
//! Bounds (every value is checked by [`EngineChoice::validate`], and the CRD carries the same
//! limits): `max_num_seqs` 1 to [`MAX_NUM_SEQS`], `max_num_batched_tokens` 1 to
//! [`MAX_BATCHED_TOKENS`] and at least `max_num_seqs` (vLLM's scheduler refuses fewer tokens
//! than sequences, `vllm/config/scheduler.py`), `mem_fraction_static` in (0, 1] and only for
//! SGLang.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::plan::error::{PlanError, Result};
use crate::plan::memory::Engine;

/// Most sequences a replica may be asked to run at once.
pub const MAX_NUM_SEQS: u64 = 65_536;
/// Most tokens one scheduler step may be asked to batch (4,194,304).
pub const MAX_BATCHED_TOKENS: u64 = 1 << 22;
/// The first vLLM release of the V1 engine by default.
const V1_FROM: (u32, u32) = (0, 8);
/// The first vLLM release that profiles CUDA graphs inside the budget.
const GRAPHS_IN_BUDGET_FROM: (u32, u32) = (0, 21);

/// The serving engines the planner can render and account for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// vLLM (`vllm serve`).
    #[default]
    Vllm,
    /// SGLang (`python -m sglang.launch_server`).
    Sglang,
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
        })
    }
}

impl FromStr for EngineKind {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "vllm" => Ok(Self::Vllm),
            "sglang" => Ok(Self::Sglang),
            other => Err(format!("unknown engine {other:?}: use vllm or sglang")),
        }
    }
}

/// An engine version: a release (`0.10.2`) or a vLLM generation (`v0`, `v1`, `current`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum EngineVersion {
    /// A release, major.minor.patch (the patch level names an image tag; it does not change
    /// the accounting).
    Release {
        /// Major version.
        major: u32,
        /// Minor version.
        minor: u32,
        /// Patch level (its leading digits; 0 when not given).
        patch: u32,
    },
    /// vLLM's V0 engine (0.7 and earlier).
    V0,
    /// vLLM's V1 engine before CUDA graphs were profiled (0.8 to 0.20).
    V1,
    /// The newest accounting the planner models.
    Current,
}

impl fmt::Display for EngineVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Release {
                major,
                minor,
                patch,
            } => write!(f, "{major}.{minor}.{patch}"),
            Self::V0 => f.write_str("v0"),
            Self::V1 => f.write_str("v1"),
            Self::Current => f.write_str("current"),
        }
    }
}

impl FromStr for EngineVersion {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let bad = || {
            format!(
                "engine version {text:?} is neither a release (0.10, 0.11.2) nor a generation \
                 (v0, v1, current)"
            )
        };
        let trimmed = text.trim().to_ascii_lowercase();
        match trimmed.as_str() {
            "v0" => return Ok(Self::V0),
            "v1" => return Ok(Self::V1),
            "current" | "latest" => return Ok(Self::Current),
            _ => {}
        }
        let release = trimmed.strip_prefix('v').unwrap_or(&trimmed);
        if release.len() > 32 {
            return Err(bad());
        }
        let mut parts = release.split('.');
        let number = |part: Option<&str>| -> std::result::Result<u32, String> {
            let part = part.ok_or_else(bad)?;
            if part.is_empty() || part.len() > 4 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            part.parse().map_err(|_| bad())
        };
        let major = number(parts.next())?;
        let minor = number(parts.next())?;
        // An optional patch level: digits, maybe followed by a suffix like `post1` or `rc2`.
        let patch = match parts.next() {
            None => 0,
            Some(text) => {
                if text.is_empty()
                    || text.len() > 12
                    || !text.bytes().all(|b| b.is_ascii_alphanumeric())
                {
                    return Err(bad());
                }
                let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
                if digits.is_empty() || digits.len() > 4 {
                    return Err(bad());
                }
                digits.parse().map_err(|_| bad())?
            }
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Self::Release {
            major,
            minor,
            patch,
        })
    }
}

/// The engine and the settings of it that shape memory and the emitted arguments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct EngineChoice {
    /// The engine.
    pub kind: EngineKind,
    /// Its version; `None`: the newest the planner models.
    pub version: Option<EngineVersion>,
    /// Whether the engine (or its version) was stated rather than assumed.
    pub stated: bool,
    /// `--enforce-eager` (vLLM) / `--disable-cuda-graph` (SGLang): no CUDA graphs.
    pub enforce_eager: bool,
    /// `--max-num-seqs` (vLLM) / `--max-running-requests` (SGLang); `None`: the default.
    pub max_num_seqs: Option<u64>,
    /// `--max-num-batched-tokens` (vLLM) / `--chunked-prefill-size` (SGLang); `None`: the
    /// engine's default for the device.
    pub max_num_batched_tokens: Option<u64>,
    /// SGLang's `--mem-fraction-static`; `None`: `--gpu-util`, else SGLang's own default.
    pub mem_fraction_static: Option<f64>,
}

impl EngineChoice {
    /// The accounting era `memory.rs` applies.
    pub fn memory_engine(&self) -> Engine {
        match (self.kind, self.version) {
            (EngineKind::Sglang, _) => Engine::Sglang,
            (EngineKind::Vllm, None | Some(EngineVersion::Current)) => Engine::Vllm,
            (EngineKind::Vllm, Some(EngineVersion::V0)) => Engine::VllmV0,
            (EngineKind::Vllm, Some(EngineVersion::V1)) => Engine::VllmV1,
            (EngineKind::Vllm, Some(EngineVersion::Release { major, minor, .. })) => {
                let release = (major, minor);
                if release < V1_FROM {
                    Engine::VllmV0
                } else if release < GRAPHS_IN_BUDGET_FROM {
                    Engine::VllmV1
                } else {
                    Engine::Vllm
                }
            }
        }
    }

    /// Checks every bound; the error names the flag (or field) at fault.
    pub fn validate(&self) -> Result<()> {
        if let Some(seqs) = self.max_num_seqs
            && !(1..=MAX_NUM_SEQS).contains(&seqs)
        {
            return Err(PlanError::constraint(format!(
                "--max-num-seqs {seqs} must be between 1 and {MAX_NUM_SEQS}"
            )));
        }
        if let Some(tokens) = self.max_num_batched_tokens {
            if !(1..=MAX_BATCHED_TOKENS).contains(&tokens) {
                return Err(PlanError::constraint(format!(
                    "--max-num-batched-tokens {tokens} must be between 1 and {MAX_BATCHED_TOKENS}"
                )));
            }
            if let Some(seqs) = self.max_num_seqs
                && tokens < seqs
            {
                return Err(PlanError::constraint(format!(
                    "--max-num-batched-tokens {tokens} must be at least --max-num-seqs {seqs} \
                     (the engine schedules one token per sequence at least)"
                )));
            }
        }
        if let Some(fraction) = self.mem_fraction_static {
            if self.kind != EngineKind::Sglang {
                return Err(PlanError::constraint(
                    "--mem-fraction-static is SGLang's setting: add --engine sglang (vLLM's is \
                     --gpu-util)",
                ));
            }
            if !(fraction > 0.0 && fraction <= 1.0) {
                return Err(PlanError::constraint(format!(
                    "--mem-fraction-static {fraction} must be in (0, 1]"
                )));
            }
        }
        if self.kind == EngineKind::Sglang
            && matches!(self.version, Some(EngineVersion::V0 | EngineVersion::V1))
        {
            return Err(PlanError::constraint(
                "--engine-version v0 and v1 are vLLM generations; give SGLang a release (0.5) \
                 or current",
            ));
        }
        Ok(())
    }

    /// The engine as people name it: `vLLM 0.10 (V1 accounting)`, `SGLang current`.
    pub fn describe(&self) -> String {
        let era = match self.memory_engine() {
            Engine::VllmV0 => {
                " (V0 engine: whole prompts profiled, CUDA graphs outside the budget)"
            }
            Engine::VllmV1 => " (V1 engine: CUDA graphs outside the budget)",
            Engine::Vllm => " (0.21 or later: CUDA graphs profiled inside the budget)",
            Engine::Sglang => "",
        };
        format!("{}{era}", self.describe_short())
    }

    /// The engine and version alone: `vLLM 0.21.0`, `SGLang current`.
    pub fn describe_short(&self) -> String {
        let name = match self.kind {
            EngineKind::Vllm => "vLLM",
            EngineKind::Sglang => "SGLang",
        };
        let version = self
            .version
            .map_or_else(|| "current".to_string(), |v| v.to_string());
        format!("{name} {version}")
    }

    /// The plan's line about the engine: what was assumed when nothing was stated.
    pub fn assumption(&self) -> String {
        let eager = if self.enforce_eager {
            ", eager (no CUDA graphs)"
        } else {
            ""
        };
        if self.stated {
            format!("engine: {}{eager}, as asked", self.describe())
        } else {
            format!(
                "engine: assumed {}{eager}; name another with --engine and --engine-version",
                self.describe()
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_map_onto_the_accounting_eras() {
        let vllm = |version: &str| EngineChoice {
            version: Some(version.parse().unwrap()),
            ..EngineChoice::default()
        };
        assert_eq!(vllm("0.7.3").memory_engine(), Engine::VllmV0);
        assert_eq!(vllm("0.8").memory_engine(), Engine::VllmV1);
        assert_eq!(vllm("v0.10.1post1").memory_engine(), Engine::VllmV1);
        assert_eq!(vllm("0.21.0").memory_engine(), Engine::Vllm);
        assert_eq!(vllm("1.0").memory_engine(), Engine::Vllm);
        assert_eq!(vllm("v1").memory_engine(), Engine::VllmV1);
        assert_eq!(vllm("current").memory_engine(), Engine::Vllm);
        assert_eq!(EngineChoice::default().memory_engine(), Engine::Vllm);
        let sglang = EngineChoice {
            kind: EngineKind::Sglang,
            ..EngineChoice::default()
        };
        assert_eq!(sglang.memory_engine(), Engine::Sglang);
    }

    #[test]
    fn bad_versions_and_engines_are_clear_errors() {
        for bad in [
            "",
            "0",
            "x.y",
            "0.10.1.2",
            "0.-1",
            "99999.1",
            "0.1.~",
            "latestest",
            "0.1.rc1",
        ] {
            let err = bad.parse::<EngineVersion>().unwrap_err();
            assert!(err.contains("neither a release"), "{bad}: {err}");
        }
        assert!(
            "tgi"
                .parse::<EngineKind>()
                .unwrap_err()
                .contains("vllm or sglang")
        );
        assert_eq!("SGLang".parse::<EngineKind>(), Ok(EngineKind::Sglang));
    }

    #[test]
    fn bounds_are_checked_with_the_flag_named() {
        let ok = EngineChoice::default();
        assert!(ok.validate().is_ok());
        let check = |choice: EngineChoice, expected: &str| {
            let err = choice.validate().unwrap_err().to_string();
            assert!(err.contains(expected), "{err}");
        };
        check(
            EngineChoice {
                max_num_seqs: Some(0),
                ..ok
            },
            "--max-num-seqs 0 must be between 1 and 65536",
        );
        check(
            EngineChoice {
                max_num_batched_tokens: Some(MAX_BATCHED_TOKENS + 1),
                ..ok
            },
            "--max-num-batched-tokens 4194305",
        );
        check(
            EngineChoice {
                max_num_seqs: Some(512),
                max_num_batched_tokens: Some(256),
                ..ok
            },
            "at least --max-num-seqs 512",
        );
        check(
            EngineChoice {
                mem_fraction_static: Some(0.8),
                ..ok
            },
            "add --engine sglang",
        );
        let sglang = EngineChoice {
            kind: EngineKind::Sglang,
            ..ok
        };
        for bad in [0.0, -0.1, 1.5, f64::NAN] {
            check(
                EngineChoice {
                    mem_fraction_static: Some(bad),
                    ..sglang
                },
                "must be in (0, 1]",
            );
        }
        check(
            EngineChoice {
                version: Some(EngineVersion::V0),
                ..sglang
            },
            "vLLM generations",
        );
    }

    #[test]
    fn the_assumption_is_said() {
        let assumed = EngineChoice::default().assumption();
        assert!(
            assumed.starts_with("engine: assumed vLLM current"),
            "{assumed}"
        );
        let stated = EngineChoice {
            kind: EngineKind::Sglang,
            version: Some("0.5".parse().unwrap()),
            stated: true,
            ..EngineChoice::default()
        };
        assert_eq!(stated.assumption(), "engine: SGLang 0.5.0, as asked");
    }
}
