//! The serving engines' command-line arguments for a plan that fits: what to pass to
//! `vllm serve <model>` and to `python -m sglang.launch_server --model-path <model>` so the
//! engine runs the layout, context and memory share the planner chose.
//!
//! Flag names and values, checked against the engines' documentation:
//! - vLLM engine arguments (docs.vllm.ai, "Engine Arguments"; `vllm/engine/arg_utils.py`):
//!   `--tensor-parallel-size`, `--pipeline-parallel-size`, `--max-model-len`,
//!   `--gpu-memory-utilization`, `--max-num-seqs`, `--dtype`, `--quantization`. The KV-cache
//!   type `--kv-cache-dtype` takes `auto` (the model's type) or `fp8` among others
//!   (`vllm/config/cache.py`, `CacheDType`).
//! - vLLM expert and data parallelism (docs.vllm.ai, "Data Parallel Deployment" and "Expert
//!   Parallel Deployment"): `--data-parallel-size N` runs N attention ranks, each with
//!   `--tensor-parallel-size` devices; `--enable-expert-parallel` shards the experts over
//!   all `DP x TP` ranks, so the expert-parallel size is not a flag of its own.
//! - vLLM `--quantization fp8` quantizes a 16-bit checkpoint to FP8 when it loads, and
//!   `--quantization bitsandbytes` to 4-bit NF4 (docs.vllm.ai, "FP8 W8A8", "BitsAndBytes").
//! - SGLang server arguments (docs.sglang.io, "Server Arguments"): `--tp-size`, `--pp-size`,
//!   `--context-length`, `--mem-fraction-static`, `--max-running-requests`, `--dtype`,
//!   `--quantization fp8` (on a 16-bit checkpoint), `--kv-cache-dtype` (`auto`,
//!   `fp8_e4m3`, `fp8_e5m2`), `--enable-dp-attention` with `--dp-size`, and `--ep-size`.
//!   SGLang's `--tp-size` counts every rank of the replica; `--dp-size` splits the attention
//!   among them (SGLang cookbook, "parallelism configuration").
//!
//! Two engine settings are not the same quantity and are converted, not copied: vLLM's
//! `--gpu-memory-utilization` bounds everything the engine allocates, SGLang's
//! `--mem-fraction-static` bounds only weights plus the KV pool (activations and CUDA graphs
//! live in the rest). The SGLang value is therefore the plan's budget less its activations
//! and runtime overhead, as a share of the device's memory: the same weights and KV pool.
//!
//! Checkpoints already quantized (AWQ, GPTQ, FP8, NVFP4, MXFP4) carry their method in their
//! `config.json` and both engines read it; no flag is emitted for them, only a note that such
//! a checkpoint is needed when the plan's precision is below the model's own.

use std::sync::OnceLock;

use crate::hardware::Precision;

use self::choice::{EngineChoice, EngineKind, EngineVersion};
use super::memory::{Engine, scheduler_defaults};
use super::model::presets;
use super::products;
use super::report::{EngineSettings, Plan};
use crate::hardware::{Family, Vendor};

/// The settings for `plan` on today's vLLM with its defaults: `None` unless it is a serving
/// plan that fits.
pub fn settings(plan: &Plan) -> Option<EngineSettings> {
    settings_for(plan, &EngineChoice::default())
}

/// The settings for `plan` on the engine `choice` names, with its stated settings passed on:
/// `None` unless it is a serving plan that fits.
pub fn settings_for(plan: &Plan, choice: &EngineChoice) -> Option<EngineSettings> {
    if !plan.fits || plan.goal != "serve" {
        return None;
    }
    let tp = plan.tp?.max(1);
    let pp = plan.pp.unwrap_or(1).max(1);
    let context = plan.context?;
    let util = plan.gpu_memory_utilization?;
    let mut notes = Vec::new();
    let attention_dp = plan.attention_data_parallel.filter(|d| *d > 1);
    let expert_parallel = plan.expert_parallel.filter(|e| *e > 1);

    let mut vllm = Vec::new();
    let mut sglang = Vec::new();

    // Parallel layout. vLLM: DP attention ranks of TP/DP devices each; SGLang: TP over the
    // whole replica, DP splitting the attention.
    let vllm_tp = match attention_dp {
        Some(dp) if tp % dp == 0 => tp / dp,
        Some(dp) => {
            notes.push(format!(
                "data-parallel attention {dp} does not divide TP {tp}; the engines need it to"
            ));
            tp
        }
        None => tp,
    };
    push(&mut vllm, "--tensor-parallel-size", vllm_tp);
    push(&mut vllm, "--pipeline-parallel-size", pp);
    push(&mut sglang, "--tp-size", tp);
    push(&mut sglang, "--pp-size", pp);
    if let Some(dp) = attention_dp {
        push(&mut vllm, "--data-parallel-size", dp);
        sglang.push("--enable-dp-attention".to_string());
        push(&mut sglang, "--dp-size", dp);
    }
    if let Some(ep) = expert_parallel {
        vllm.push("--enable-expert-parallel".to_string());
        push(&mut sglang, "--ep-size", ep);
        let vllm_ep = vllm_tp.saturating_mul(attention_dp.unwrap_or(1));
        if ep != vllm_ep {
            notes.push(format!(
                "vLLM shards experts over all {vllm_ep} DP x TP ranks; the plan's expert-parallel size is {ep}"
            ));
        }
    }

    // Context and memory.
    push(&mut vllm, "--max-model-len", context);
    push(&mut sglang, "--context-length", context);
    vllm.push("--gpu-memory-utilization".to_string());
    vllm.push(fraction(util));
    if let Some(memory) = plan.per_device.filter(|m| m.capacity.0 > 0) {
        // A plan made for SGLang has its budget in SGLang's own terms already.
        let pool = if choice.kind == EngineKind::Sglang {
            memory.budget
        } else {
            memory
                .budget
                .saturating_sub(memory.activations)
                .saturating_sub(memory.overhead)
        };
        let share = (pool.as_f64() / memory.capacity.as_f64()).clamp(0.01, 1.0);
        sglang.push("--mem-fraction-static".to_string());
        sglang.push(fraction(share));
        // The engine runs at most its default number of sequences at once; raise it only
        // when the plan's concurrency per replica is above that default.
        let per_replica = plan
            .concurrency
            .unwrap_or(1)
            .div_ceil(u64::from(plan.replicas.unwrap_or(1).max(1)));
        let (_, default_sequences) =
            scheduler_defaults(memory.capacity, plan.device.as_deref().unwrap_or(""));
        match choice.max_num_seqs {
            Some(stated) => {
                push(&mut vllm, "--max-num-seqs", stated);
                push(&mut sglang, "--max-running-requests", stated);
                if per_replica > stated {
                    notes.push(format!(
                        "--max-num-seqs {stated} runs fewer sequences at once than the {per_replica} \
                         each replica holds; the rest wait"
                    ));
                }
            }
            None if per_replica > default_sequences => {
                push(&mut vllm, "--max-num-seqs", per_replica);
                push(&mut sglang, "--max-running-requests", per_replica);
            }
            None => {}
        }
    }
    if choice.kind == EngineKind::Sglang {
        notes.push(
            "planned with SGLang's accounting: the vLLM arguments keep its memory fraction, but \
             vLLM also counts activations and CUDA graphs in it"
                .to_string(),
        );
    }
    if let Some(tokens) = choice.max_num_batched_tokens {
        push(&mut vllm, "--max-num-batched-tokens", tokens);
        push(&mut sglang, "--chunked-prefill-size", tokens);
    }
    if choice.enforce_eager {
        vllm.push("--enforce-eager".to_string());
        sglang.push("--disable-cuda-graph".to_string());
    }

    if let Some(scaling) = plan.model.rope_scaling {
        rope_scaling(&scaling, choice, &mut vllm, &mut sglang);
    }

    // Cache and weight types.
    if plan.kv_dtype == Some("fp8") {
        vllm.extend(["--kv-cache-dtype".to_string(), "fp8".to_string()]);
        sglang.extend(["--kv-cache-dtype".to_string(), "fp8_e4m3".to_string()]);
    }
    if let Some(precision) = plan.precision {
        weights(
            precision,
            plan.model.native_precision,
            &mut vllm,
            &mut sglang,
            &mut notes,
        );
    }

    // vLLM 0.21 and later take the KV pool explicitly, so the start-up does not depend on
    // its own profile run agreeing with the plan's (`--kv-cache-memory-bytes`, vLLM
    // `vllm/config/cache.py` `CacheConfig.kv_cache_memory_bytes`, which replaces the
    // utilisation-derived pool when set).
    if choice.kind == EngineKind::Vllm
        && choice.memory_engine() == Engine::Vllm
        && let Some(memory) = plan.per_device
    {
        let pool = memory
            .budget
            .saturating_sub(memory.weights)
            .saturating_sub(memory.activations)
            .saturating_sub(memory.overhead);
        if pool.0 > 0 {
            push(&mut vllm, "--kv-cache-memory-bytes", pool.0);
        }
    }
    let facts = plan
        .device
        .as_deref()
        .map(|product| device_facts(product, plan.driver_version.as_deref()));
    let device_resource = facts.and_then(|device| {
        images::device_plugin_resource(device.vendor, device.family, device.product)
            .map(str::to_string)
    });
    let (image, image_refusal) = match facts {
        Some(device) => match images::image_for(choice, device) {
            Ok(picked) => {
                notes.extend(picked.notes);
                (Some(picked.image), None)
            }
            Err(reason) => (None, Some(reason)),
        },
        None => (None, Some("the plan names no device".to_string())),
    };

    Some(EngineSettings {
        engine: choice.kind.to_string(),
        image,
        image_refusal,
        device_resource,
        version: choice
            .version
            .map_or_else(|| "current".to_string(), |v| v.to_string()),
        model: hugging_face_id(&plan.model.name),
        vllm,
        sglang,
        notes,
    })
}

/// The first vLLM release without `--rope-scaling` (removed by vllm-project/vllm#28006 after a
/// year's deprecation; vLLM 0.13 rejects it, gpustack/gpustack#4236).
const ROPE_SCALING_FLAG_UNTIL: (u32, u32) = (0, 12);

/// The arguments that make the engines apply a RoPE scaling the request asked for: vLLM before
/// 0.12 `--rope-scaling JSON` (the form Qwen's model cards give), later `--hf-overrides
/// '{"rope_scaling": JSON}'` (vLLM docs, "Context Extension"; transformers keeps
/// `rope_scaling` as an alias of `rope_parameters`); SGLang `--json-model-override-args
/// '{"rope_scaling": JSON}'` (Qwen's model cards). Both also get the longer
/// `--max-model-len` / `--context-length` the plan already sets.
fn rope_scaling(
    scaling: &crate::plan::model::rope::RopeScaling,
    choice: &EngineChoice,
    vllm: &mut Vec<String>,
    sglang: &mut Vec<String>,
) {
    let json = scaling.json();
    let wrapped = serde_json::json!({ "rope_scaling": json }).to_string();
    let flag_era = match choice.version {
        None | Some(EngineVersion::Current) => false,
        Some(EngineVersion::V0 | EngineVersion::V1) => true,
        Some(EngineVersion::Release { major, minor, .. }) => {
            (major, minor) < ROPE_SCALING_FLAG_UNTIL
        }
    };
    if flag_era {
        push(vllm, "--rope-scaling", json.to_string());
    } else {
        push(vllm, "--hf-overrides", wrapped.clone());
    }
    push(sglang, "--json-model-override-args", wrapped);
}

/// The flags (or the checkpoint) for weights in `precision` when the model ships `native`.
fn weights(
    precision: Precision,
    native: Precision,
    vllm: &mut Vec<String>,
    sglang: &mut Vec<String>,
    notes: &mut Vec<String>,
) {
    if precision == native {
        return;
    }
    let both = |vllm: &mut Vec<String>, sglang: &mut Vec<String>, flag: &str, value: &str| {
        for args in [vllm, sglang] {
            args.push(flag.to_string());
            args.push(value.to_string());
        }
    };
    let sixteen = |p: Precision| matches!(p, Precision::Bf16 | Precision::Fp16);
    match precision {
        Precision::Bf16 => both(vllm, sglang, "--dtype", "bfloat16"),
        Precision::Fp16 => both(vllm, sglang, "--dtype", "float16"),
        Precision::Fp32 | Precision::Tf32 => both(vllm, sglang, "--dtype", "float32"),
        Precision::Fp8 if sixteen(native) || native == Precision::Fp32 => {
            both(vllm, sglang, "--quantization", "fp8");
        }
        Precision::Nf4 => {
            vllm.extend(["--quantization".to_string(), "bitsandbytes".to_string()]);
            notes.push(
                "nf4: vLLM quantizes to 4-bit as it loads (bitsandbytes); for SGLang use a 4-bit checkpoint"
                    .to_string(),
            );
        }
        other => notes.push(format!(
            "{other} weights: use a checkpoint quantized to {other} (the model ships {native}); \
             vLLM and SGLang read the method from its config.json"
        )),
    }
}

/// A preset's Hugging Face repository. The table writes variants as `Llama-3.1-8B(-Instruct)`
/// and adds remarks after a space; serving takes the instruction-tuned variant. The table is
/// read once: every serving plan asks.
fn hugging_face_id(name: &str) -> Option<String> {
    static IDS: OnceLock<Vec<(String, String)>> = OnceLock::new();
    let ids = IDS.get_or_init(|| {
        presets::list()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|preset| {
                let id: String = preset
                    .hf_id
                    .split_whitespace()
                    .next()?
                    .chars()
                    .filter(|c| !matches!(c, '(' | ')'))
                    .collect();
                id.contains('/').then_some((preset.key, id))
            })
            .collect()
    });
    let wanted = name.trim().to_ascii_lowercase();
    ids.iter()
        .find(|(key, _)| *key == wanted)
        .map(|(_, id)| id.clone())
}

/// Vendor and family of a product name: from the product table, else from the name.
fn device_facts<'a>(product: &'a str, driver_version: Option<&'a str>) -> images::DeviceFacts<'a> {
    let (vendor, family) = match products::lookup(product, None) {
        Some(known) => (known.vendor, known.family),
        None => {
            let lower = product.to_ascii_lowercase();
            if lower.contains("nvidia") || lower.contains("tesla") || lower.contains("geforce") {
                (Vendor::Nvidia, Family::Gpu)
            } else if lower.contains("amd")
                || lower.contains("instinct")
                || lower.contains("radeon")
            {
                (Vendor::Amd, Family::Gpu)
            } else if lower.contains("gaudi") {
                (Vendor::Intel, Family::Asic)
            } else if lower.contains("tpu") {
                (Vendor::Google, Family::Tpu)
            } else if lower.contains("trainium") || lower.contains("inferentia") {
                (Vendor::Aws, Family::Asic)
            } else {
                (Vendor::Other, Family::Gpu)
            }
        }
    };
    images::DeviceFacts {
        vendor,
        family,
        product,
        driver_version,
    }
}

fn push(args: &mut Vec<String>, flag: &str, value: impl ToString) {
    args.push(flag.to_string());
    args.push(value.to_string());
}

/// A fraction as people write the flag (`0.90`, `0.925`): rounded down to three decimals, so
/// the engine never gets more than the plan gave it, and trailing zeros past two dropped.
fn fraction(value: f64) -> String {
    let mut text = format!("{:.3}", (value * 1000.0 + 1e-6).floor() / 1000.0);
    if text.ends_with('0') {
        text.pop();
    }
    text
}

pub mod choice;
pub mod disaggregation;
pub mod images;
#[cfg(test)]
mod tests;
