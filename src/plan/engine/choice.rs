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
use crate::plan::kv::WindowCaching;
use crate::plan::memory::Engine;

/// Most sequences a replica may be asked to run at once.
pub const MAX_NUM_SEQS: u64 = 65_536;
/// Most tokens one scheduler step may be asked to batch (4,194,304).
pub const MAX_BATCHED_TOKENS: u64 = 1 << 22;
/// The first vLLM release of the V1 engine by default.
const V1_FROM: (u32, u32) = (0, 8);
/// The first vLLM release that profiles CUDA graphs inside the budget.
const GRAPHS_IN_BUDGET_FROM: (u32, u32) = (0, 21);
/// A release as (major, minor, patch).
type Release = (u32, u32, u32);
/// The first vLLM release with the hybrid KV cache manager for sliding-window layers of mixed
/// models (release notes: "Initial full support for Hybrid Memory Allocator (#17996)").
const HYBRID_SLIDING_FROM: Release = (0, 9, 1);
/// Chunked local attention in the hybrid manager (#19351, 0.9.2) until #21761 (0.10.1) turned
/// it off by default; on again by 0.19.0, whose start-up logs print
/// `VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE: True` (llm-d-incubation/llm-d-planner
/// @d3121e0, `accuracy/results/v0.19.0/logs/meta-llama-llama-4-scout--h100-80gb--tp4pp1dp1--8192.log`).
/// The release of #29627, which turned it back on, is not pinned: 0.10.1 to 0.18 are taken
/// as off, which errs toward the larger cache.
const HYBRID_CHUNKED: [(Release, Release); 2] =
    [((0, 9, 2), (0, 10, 1)), ((0, 19, 0), (u32::MAX, 0, 0))];

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

/// An engine version: a release (`0.10.2`, `0.10.1.1`, `0.6.6.post1`) or a vLLM generation
/// (`v0`, `v1`, `current`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum EngineVersion {
    /// A release as the engine prints it (`vllm --version`, `sglang.__version__`): up to four
    /// numbers, a `.postN` (or `postN`) post-release, and a `+local` build tag
    /// (`0.4.1+cu121`), which names a wheel's CUDA build and is dropped. Only major.minor
    /// change the accounting; the rest names the image tag.
    Release {
        /// Major version.
        major: u32,
        /// Minor version.
        minor: u32,
        /// Patch level (its leading digits; 0 when not given).
        patch: u32,
        /// A fourth number (`0.10.1.1`), when given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        build: Option<u32>,
        /// A post-release number (`0.6.6.post1`), when given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        post: Option<u32>,
    },
    /// vLLM's V0 engine (0.7 and earlier).
    V0,
    /// vLLM's V1 engine before CUDA graphs were profiled (0.8 to 0.20).
    V1,
    /// The newest accounting the planner models.
    Current,
}

impl EngineVersion {
    /// The release `major.minor.patch`.
    pub fn release(major: u32, minor: u32, patch: u32) -> Self {
        Self::Release {
            major,
            minor,
            patch,
            build: None,
            post: None,
        }
    }
}

impl fmt::Display for EngineVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Release {
                major,
                minor,
                patch,
                build,
                post,
            } => {
                write!(f, "{major}.{minor}.{patch}")?;
                if let Some(build) = build {
                    write!(f, ".{build}")?;
                }
                if let Some(post) = post {
                    write!(f, ".post{post}")?;
                }
                Ok(())
            }
            Self::V0 => f.write_str("v0"),
            Self::V1 => f.write_str("v1"),
            Self::Current => f.write_str("current"),
        }
    }
}

/// A version number part: 1 to 4 ASCII digits.
fn version_number(part: &str) -> Option<u32> {
    (!part.is_empty() && part.len() <= 4 && part.bytes().all(|b| b.is_ascii_digit()))
        .then(|| part.parse().ok())
        .flatten()
}

/// A pre- or post-release suffix PEP 440 allows after a number (`post1`, `rc2`, `dev0`, `a1`,
/// `b3`): the post-release number when it is one, `Some(None)` for the others (they do not
/// change the accounting), `None` when the text is no such suffix.
fn release_suffix(text: &str) -> Option<Option<u32>> {
    for (label, post) in [
        ("post", true),
        ("rc", false),
        ("dev", false),
        ("a", false),
        ("b", false),
    ] {
        if let Some(number) = text.strip_prefix(label) {
            let number = if number.is_empty() && label == "dev" {
                0
            } else {
                version_number(number)?
            };
            return Some(post.then_some(number));
        }
    }
    None
}

impl FromStr for EngineVersion {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let bad = || {
            format!(
                "engine version {text:?} is neither a release (0.10, 0.11.2, 0.10.1.1, \
                 0.6.6.post1, 0.4.1+cu121) nor a generation (v0, v1, current)"
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
        if release.len() > 40 {
            return Err(bad());
        }
        // A local build tag (`+cu121`, `+rocm6.2`) names how a wheel was built, not a release.
        let release = match release.split_once('+') {
            Some((public, local))
                if !local.is_empty()
                    && local
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'.') =>
            {
                public
            }
            Some(_) => return Err(bad()),
            None => release,
        };
        let mut numbers = Vec::with_capacity(4);
        let mut post = None;
        let mut suffixed = false;
        for (index, part) in release.split('.').enumerate() {
            if suffixed {
                return Err(bad());
            }
            // A part of its own after the patch level: `.post1`, `.rc1`.
            if index >= 3
                && let Some(suffix) = release_suffix(part)
            {
                post = suffix;
                suffixed = true;
                continue;
            }
            let digits = part.bytes().take_while(u8::is_ascii_digit).count();
            let number = version_number(&part[..digits]).ok_or_else(bad)?;
            if digits < part.len() {
                // Digits then a suffix (`1post1`, `0rc2`), after the minor version only.
                if index < 2 {
                    return Err(bad());
                }
                post = release_suffix(&part[digits..]).ok_or_else(bad)?;
                suffixed = true;
            }
            numbers.push(number);
            if numbers.len() > 4 {
                return Err(bad());
            }
        }
        match numbers[..] {
            [major, minor, ..] => Ok(Self::Release {
                major,
                minor,
                patch: numbers.get(2).copied().unwrap_or(0),
                build: numbers.get(3).copied(),
                post,
            }),
            _ => Err(bad()),
        }
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

    /// Which windowed layers the engine caches for their window ([`WindowCaching`]): vLLM's
    /// hybrid KV cache manager arrived in 0.9.1 for sliding windows; earlier engines (and the
    /// V1 generation named without a release, which spans both) cache a mixed model's windowed
    /// layers in full.
    pub fn window_caching(&self) -> WindowCaching {
        let release = match (self.kind, self.version) {
            (EngineKind::Sglang, _) | (EngineKind::Vllm, None | Some(EngineVersion::Current)) => {
                return WindowCaching::All;
            }
            (EngineKind::Vllm, Some(EngineVersion::V0 | EngineVersion::V1)) => {
                return WindowCaching::UniformOnly;
            }
            (
                EngineKind::Vllm,
                Some(EngineVersion::Release {
                    major,
                    minor,
                    patch,
                    ..
                }),
            ) => (major, minor, patch),
        };
        if release < HYBRID_SLIDING_FROM {
            WindowCaching::UniformOnly
        } else if HYBRID_CHUNKED
            .iter()
            .any(|(from, until)| (*from..*until).contains(&release))
        {
            WindowCaching::All
        } else {
            WindowCaching::SlidingOnly
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

    /// Issue 38: the versions engines print (`vllm --version`, pip's wheel names) parse, keep
    /// what names an image tag, and map onto the right accounting era.
    #[test]
    fn versions_as_engines_print_them_parse() {
        for (text, shown, engine) in [
            ("0.10.1.1", "0.10.1.1", Engine::VllmV1),
            ("0.6.6.post1", "0.6.6.post1", Engine::VllmV0),
            ("0.5.13.post1", "0.5.13.post1", Engine::VllmV0),
            ("0.4.1+cu121", "0.4.1", Engine::VllmV0),
            ("v0.9.2rc1", "0.9.2", Engine::VllmV1),
            ("0.10.1post1", "0.10.1.post1", Engine::VllmV1),
            ("0.22.0+rocm6.4", "0.22.0", Engine::Vllm),
            ("0.11", "0.11.0", Engine::VllmV1),
        ] {
            let version: EngineVersion = text.parse().unwrap_or_else(|err| panic!("{err}"));
            assert_eq!(version.to_string(), shown, "{text}");
            let choice = EngineChoice {
                version: Some(version),
                ..EngineChoice::default()
            };
            assert_eq!(choice.memory_engine(), engine, "{text}");
        }
        assert_eq!(
            "0.10.1.1".parse::<EngineVersion>(),
            Ok(EngineVersion::Release {
                major: 0,
                minor: 10,
                patch: 1,
                build: Some(1),
                post: None
            })
        );
    }

    #[test]
    fn window_caching_follows_the_release() {
        let vllm = |version: &str| {
            EngineChoice {
                version: Some(version.parse().unwrap()),
                ..EngineChoice::default()
            }
            .window_caching()
        };
        assert_eq!(vllm("0.6.6.post1"), WindowCaching::UniformOnly);
        assert_eq!(vllm("0.9.0"), WindowCaching::UniformOnly);
        assert_eq!(vllm("0.9.1"), WindowCaching::SlidingOnly);
        assert_eq!(vllm("0.9.2"), WindowCaching::All);
        assert_eq!(vllm("0.10.0"), WindowCaching::All);
        assert_eq!(vllm("0.10.1.1"), WindowCaching::SlidingOnly);
        assert_eq!(vllm("0.18.1"), WindowCaching::SlidingOnly);
        assert_eq!(vllm("0.19.0"), WindowCaching::All);
        assert_eq!(vllm("v1"), WindowCaching::UniformOnly);
        assert_eq!(EngineChoice::default().window_caching(), WindowCaching::All);
    }

    #[test]
    fn bad_versions_and_engines_are_clear_errors() {
        for bad in [
            "",
            "0",
            "x.y",
            "0.10.1.2.3",
            "0.-1",
            "99999.1",
            "0.1.~",
            "latestest",
            "0.1.rc1",
            "0.4.1+",
            "0.4.1+cu 121",
            "0.6.6.post",
            "0.6.6.post1.2",
            "0post1.1",
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
