//! Plan conformance: do the pods that run a placement run its plan? A workload edited after
//! it was planned keeps `Ready=True` while it wastes or overruns what was planned: TP 2 on
//! four held GPUs leaves two idle, a CUDA image on AMD devices never starts, a
//! `--max-model-len` above the plan's needs a KV cache the plan never gave it.
//!
//! For each pod (the driver, `placement/conformance.rs`, finds them: the pods its claims are
//! reserved for, and the pods labelled `hwaccel.io/placement=<name>` that `hwaccel plan --emit`
//! stamps) this compares:
//!
//! - **ranks against devices** (`IdleDevices`): tensor × pipeline × data-parallel ranks the
//!   engine's arguments start against the devices the pod holds (its claims' allocated
//!   devices, or its container's device-plugin resource); more devices than ranks leaves some
//!   idle, fewer ranks than devices cannot start (`ArgsDrift`);
//! - **the image's platform** (`WrongImage`): the pod's image against the plan's (a CUDA build
//!   on AMD GPUs, a ROCm build on NVIDIA ones), read from the image name as the image table
//!   (`plan::engine::images`) names them;
//! - **the node's driver** (`DriverTooOld`): the CUDA build the pod's image tag names (the
//!   image table's floors: CUDA 12 needs NVIDIA driver 525, CUDA 13 580) against the oldest
//!   driver its node's inventory reports;
//! - **the memory-shaping arguments** (`ArgsDrift`): `--max-model-len`, `--kv-cache-dtype`,
//!   `--quantization`, `--kv-cache-memory-bytes` (vLLM) and `--context-length`,
//!   `--kv-cache-dtype`, `--quantization` (SGLang) against the plan's; an argument the plan
//!   sets and the pod leaves out is drift (the engine's default is not what was planned).
//!
//! Pure; every text copied from a pod is cut.

use std::collections::BTreeMap;

use crate::api::placement::EngineStatus;
use crate::names::keys::PLACEMENT_LABEL;
use crate::names::truncate_at_char_boundary;
use crate::plan::engine::images::{cuda_driver_floor, driver_branch};

/// At most this many findings are kept (a Deployment of many drifted pods says the same
/// thing for each).
pub const MAX_FINDINGS: usize = 16;
/// Longest pod name, image or argument value quoted.
const MAX_QUOTED: usize = 128;

/// Why a pod does not run the plan, most urgent first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Drift {
    /// The pod holds devices its engine does not use.
    IdleDevices,
    /// The pod's image is built for another platform than the plan's devices.
    WrongImage,
    /// The pod's image needs a newer NVIDIA driver than its node runs.
    DriverTooOld,
    /// The engine's arguments differ from the plan's.
    ArgsDrift,
}

impl Drift {
    /// The condition's reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::IdleDevices => "IdleDevices",
            Self::WrongImage => "WrongImage",
            Self::DriverTooOld => "DriverTooOld",
            Self::ArgsDrift => "ArgsDrift",
        }
    }
}

/// One thing a pod does differently from the plan.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    /// Why.
    pub reason: Drift,
    /// The pod.
    pub pod: String,
    /// What differs, naming the pod.
    pub message: String,
    /// Devices the pod holds and does not use (`IdleDevices` only).
    pub idle: u32,
}

/// What the driver read of one pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodView {
    /// Its name.
    pub name: String,
    /// The engine container's image.
    pub image: Option<String>,
    /// The engine container's command and arguments, in order (a `sh -c` line split into
    /// words).
    pub argv: Vec<String>,
    /// Devices the pod holds: its claims' allocated devices, or its container's limit of the
    /// plan's device-plugin resource; `None` when neither says.
    pub held: Option<u32>,
    /// The oldest NVIDIA driver on the pod's node, as its inventory has it, when known.
    pub driver: Option<String>,
}

/// The verdict on a placement's pods.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Conformance {
    /// Pods judged.
    pub pods: usize,
    /// What differs, most urgent first, at most [`MAX_FINDINGS`].
    pub findings: Vec<Finding>,
    /// Findings left out past the bound.
    pub more: usize,
    /// The `hwaccel.io/placement` label value pods were looked for by (set by the driver).
    pub label: String,
}

impl Conformance {
    /// The condition's status: `None` (Unknown) without pods.
    pub fn status(&self) -> Option<bool> {
        (self.pods > 0).then_some(self.findings.is_empty())
    }

    /// The condition's reason.
    pub fn reason(&self) -> &'static str {
        match (self.pods, self.findings.first()) {
            (0, _) => "NoPods",
            (_, Some(finding)) => finding.reason.as_str(),
            (_, None) => "Conformant",
        }
    }

    /// The condition's message.
    pub fn message(&self) -> String {
        if self.pods == 0 {
            return format!(
                "no pod runs the placement yet: none holds its claims or carries \
                 {PLACEMENT_LABEL}={}",
                truncate_at_char_boundary(&self.label, 63)
            );
        }
        if self.findings.is_empty() {
            let plural = if self.pods == 1 { "" } else { "s" };
            return format!("{} pod{plural} run the plan", self.pods);
        }
        let mut parts: Vec<String> = self.findings.iter().map(|f| f.message.clone()).collect();
        if self.more > 0 {
            parts.push(format!("and {} more", self.more));
        }
        parts.join("; ")
    }

    /// Devices the pods hold and do not use.
    pub fn idle_devices(&self) -> u32 {
        self.findings
            .iter()
            .fold(0u32, |sum, f| sum.saturating_add(f.idle))
    }
}

/// Which engine a pod runs, by its command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Engine {
    Vllm,
    Sglang,
}

/// The arguments compared per engine: (flag, aliases).
const VLLM_MEMORY: &[&str] = &[
    "--max-model-len",
    "--kv-cache-dtype",
    "--quantization",
    "--kv-cache-memory-bytes",
];
const SGLANG_MEMORY: &[&str] = &["--context-length", "--kv-cache-dtype", "--quantization"];

/// Judges `pods` against the plan's engine arguments and image. `tp × pp` is the plan's; the
/// pods' own arguments say what they run.
pub fn judge(engine: &EngineStatus, pods: &[PodView]) -> Conformance {
    let mut findings = Vec::new();
    for pod in pods {
        judge_pod(engine, pod, &mut findings);
    }
    findings.sort();
    let more = findings.len().saturating_sub(MAX_FINDINGS);
    findings.truncate(MAX_FINDINGS);
    Conformance {
        pods: pods.len(),
        findings,
        more,
        label: String::new(),
    }
}

fn judge_pod(engine: &EngineStatus, pod: &PodView, findings: &mut Vec<Finding>) {
    let name = quoted(&pod.name);
    if let (Some(image), Some(planned)) = (&pod.image, &engine.image)
        && let (Some(running), Some(wanted)) = (platform(image), platform(planned))
        && running != wanted
    {
        findings.push(Finding {
            reason: Drift::WrongImage,
            pod: pod.name.clone(),
            message: format!(
                "pod {name} runs {} (a {running} build); the plan's devices need {wanted}: {}",
                quoted(image),
                quoted(planned)
            ),
            idle: 0,
        });
    }
    if let (Some(image), Some(driver)) = (&pod.image, &pod.driver)
        && let Some((cuda, floor)) = cuda_driver_floor(image)
        && driver_branch(driver).is_some_and(|branch| branch < floor)
    {
        findings.push(Finding {
            reason: Drift::DriverTooOld,
            pod: pod.name.clone(),
            message: format!(
                "pod {name} runs {} (CUDA {cuda}, which needs NVIDIA driver {floor} or newer) on a \
                 node with driver {}",
                quoted(image),
                quoted(driver)
            ),
            idle: 0,
        });
    }
    let Some(kind) = engine_of(&pod.argv) else {
        return;
    };
    let (planned_args, parallel, memory) = match kind {
        Engine::Vllm => (
            &engine.vllm,
            [
                "--tensor-parallel-size",
                "--pipeline-parallel-size",
                "--data-parallel-size",
            ],
            VLLM_MEMORY,
        ),
        Engine::Sglang => (
            &engine.sglang,
            ["--tp-size", "--pp-size", "--dp-size"],
            SGLANG_MEMORY,
        ),
    };
    let planned = flags(planned_args);
    let running = flags(&pod.argv);
    let ranks = |args: &BTreeMap<String, String>| {
        parallel.iter().fold(1u32, |product, flag| {
            let size = args
                .get(*flag)
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(1);
            product.saturating_mul(size.max(1))
        })
    };
    let running_ranks = ranks(&running);
    match pod.held {
        Some(held) if held > running_ranks => findings.push(Finding {
            reason: Drift::IdleDevices,
            pod: pod.name.clone(),
            message: format!(
                "pod {name} holds {held} devices and starts {running_ranks} rank{} ({}); {} idle",
                if running_ranks == 1 { "" } else { "s" },
                shown_parallel(&running, &parallel),
                held - running_ranks
            ),
            idle: held - running_ranks,
        }),
        Some(held) if held < running_ranks => findings.push(Finding {
            reason: Drift::ArgsDrift,
            pod: pod.name.clone(),
            message: format!(
                "pod {name} starts {running_ranks} ranks ({}) on {held} devices; it cannot start",
                shown_parallel(&running, &parallel)
            ),
            idle: 0,
        }),
        Some(_) => {}
        // Nothing says what it holds: the parallel sizes themselves are compared.
        None if running_ranks != ranks(&planned) => findings.push(Finding {
            reason: Drift::ArgsDrift,
            pod: pod.name.clone(),
            message: format!(
                "pod {name} starts {running_ranks} ranks ({}); the plan {}",
                shown_parallel(&running, &parallel),
                ranks(&planned)
            ),
            idle: 0,
        }),
        None => {}
    }
    for flag in memory {
        let (want, have) = (planned.get(*flag), running.get(*flag));
        if same_value(want, have) {
            continue;
        }
        let shown = |value: Option<&String>| {
            value.map_or_else(
                || "nothing (the engine's default)".to_string(),
                |v| quoted(v),
            )
        };
        findings.push(Finding {
            reason: Drift::ArgsDrift,
            pod: pod.name.clone(),
            message: format!(
                "pod {name} runs {flag} {}; the plan {}",
                shown(have),
                shown(want)
            ),
            idle: 0,
        });
    }
}

/// True when two argument values say the same (numbers by value).
fn same_value(a: Option<&String>, b: Option<&String>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => match (a.parse::<u64>(), b.parse::<u64>()) {
            (Ok(x), Ok(y)) => x == y,
            _ => a.eq_ignore_ascii_case(b),
        },
        _ => false,
    }
}

/// `TP 2 × PP 1 × DP 1` as the pod's arguments say it.
fn shown_parallel(args: &BTreeMap<String, String>, parallel: &[&str; 3]) -> String {
    let size = |flag: &str| {
        args.get(flag)
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(1)
    };
    format!(
        "TP {} × PP {} × DP {}",
        size(parallel[0]),
        size(parallel[1]),
        size(parallel[2])
    )
}

/// The engine a command line starts: vLLM (`vllm serve`, `vllm.entrypoints`) or SGLang
/// (`sglang.launch_server`).
fn engine_of(argv: &[String]) -> Option<Engine> {
    let mentions = |needle: &str| argv.iter().any(|word| word.contains(needle));
    if mentions("sglang") {
        Some(Engine::Sglang)
    } else if mentions("vllm") {
        Some(Engine::Vllm)
    } else {
        None
    }
}

/// Short flags the engines take for the long ones compared.
const ALIASES: &[(&str, &str)] = &[
    ("-tp", "--tensor-parallel-size"),
    ("-pp", "--pipeline-parallel-size"),
    ("-dp", "--data-parallel-size"),
    ("-q", "--quantization"),
    ("--tp", "--tp-size"),
    ("--pp", "--pp-size"),
    ("--dp", "--dp-size"),
];

/// `--flag value` and `--flag=value` pairs (the last one wins, as argparse does); a flag
/// without a value maps to `""`. Underscores in names read as dashes, as the engines allow.
fn flags(argv: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut words = argv.iter().peekable();
    while let Some(word) = words.next() {
        if !word.starts_with('-') || word == "-" || word == "--" {
            continue;
        }
        let (name, inline) = match word.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (word.as_str(), None),
        };
        let name = name.replace('_', "-");
        let name = ALIASES
            .iter()
            .find(|(short, _)| *short == name)
            .map_or(name.clone(), |(_, long)| (*long).to_string());
        let value = inline.unwrap_or_else(|| match words.peek() {
            Some(next) if !next.starts_with("--") && !is_short_flag(next) => {
                words.next().cloned().unwrap_or_default()
            }
            _ => String::new(),
        });
        out.insert(name, value);
    }
    out
}

fn is_short_flag(word: &str) -> bool {
    word.starts_with('-') && word.chars().nth(1).is_some_and(|c| c.is_ascii_alphabetic())
}

/// The software platform an image is built for, from its name as the image table and the
/// vendors name them; `None` when the name does not say.
pub fn platform(image: &str) -> Option<&'static str> {
    let name = image.to_ascii_lowercase();
    let rules: &[(&[&str], &str)] = &[
        (&["rocm"], "rocm"),
        (&["gaudi", "habana"], "gaudi"),
        (&["neuron"], "neuron"),
        (&["vllm-tpu", "/tpu"], "tpu"),
        (
            &["vllm-openai", "lmsysorg/sglang", "cuda", "nvcr.io/nvidia"],
            "cuda",
        ),
    ];
    rules
        .iter()
        .find(|(needles, _)| needles.iter().any(|n| name.contains(n)))
        .map(|(_, platform)| *platform)
}

fn quoted(text: &str) -> String {
    truncate_at_char_boundary(text, MAX_QUOTED).to_string()
}

/// Splits a `sh -c` line into words: whitespace-separated, single and double quotes kept
/// together and removed. Enough for the engine lines `--emit` and people write; not a shell.
pub fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut quote: Option<char> = None;
    let mut started = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => current.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                started = true;
            }
            (None, c) if c.is_whitespace() || c == ';' => {
                if started || !current.is_empty() {
                    words.push(std::mem::take(&mut current));
                }
                started = false;
            }
            (None, c) => current.push(c),
        }
    }
    if started || !current.is_empty() {
        words.push(current);
    }
    words
}

#[cfg(test)]
mod tests;
