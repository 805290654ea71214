//! Engine arguments from real plans: every flag follows the plan's numbers, and plans that do
//! not fit, or train, get none.

use super::*;
use crate::plan::inventory::Reservations;
use crate::plan::kv::KvDtype;
use crate::plan::search::{Goal, PlanRequest, plan};
use crate::plan::shorthand::parse_hardware;
use crate::plan::training::{LoraTarget, Method, TrainingTarget};

fn serve(preset: &str, hardware: &str, context: u64, concurrency: u64) -> Plan {
    serve_with(
        preset,
        hardware,
        PlanRequest::serve(Some(context), concurrency),
    )
}

fn serve_with(preset: &str, hardware: &str, request: PlanRequest) -> Plan {
    let model = presets::find(preset).unwrap().unwrap();
    let nodes = parse_hardware(hardware).unwrap();
    plan(&model, &nodes, &Reservations::none(), &request).unwrap()
}

/// The value after `flag`, if the flag is there.
fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).map(String::as_str)
}

fn has(args: &[String], flag: &str) -> bool {
    args.iter().any(|a| a == flag)
}

#[test]
fn a_dense_plan_gives_both_engines_its_layout_context_and_memory_share() {
    let plan = serve("llama-3.1-70b", "1x8xH100", 32768, 8);
    assert!(plan.fits, "{}", plan.to_table());
    let engine = plan
        .engine
        .clone()
        .expect("a fitting serving plan has settings");
    let (tp, pp) = (plan.tp.unwrap(), plan.pp.unwrap());
    assert_eq!(
        engine.model.as_deref(),
        Some("meta-llama/Llama-3.1-70B-Instruct")
    );
    assert_eq!(
        value(&engine.vllm, "--tensor-parallel-size"),
        Some(tp.to_string().as_str())
    );
    assert_eq!(
        value(&engine.vllm, "--pipeline-parallel-size"),
        Some(pp.to_string().as_str())
    );
    assert_eq!(value(&engine.vllm, "--max-model-len"), Some("32768"));
    assert_eq!(
        value(&engine.vllm, "--gpu-memory-utilization"),
        Some("0.90")
    );
    assert_eq!(
        value(&engine.sglang, "--tp-size"),
        Some(tp.to_string().as_str())
    );
    assert_eq!(value(&engine.sglang, "--context-length"), Some("32768"));
    // SGLang's static share is weights plus the KV pool: below vLLM's whole budget, above
    // the weights alone.
    let memory = plan.per_device.unwrap();
    let share: f64 = value(&engine.sglang, "--mem-fraction-static")
        .unwrap()
        .parse()
        .unwrap();
    assert!(share < 0.90, "{share}");
    assert!(
        share > memory.weights.as_f64() / memory.capacity.as_f64(),
        "{share}"
    );
    // The checkpoint's own precision needs no flag; 16-bit KV is the engines' default.
    for args in [&engine.vllm, &engine.sglang] {
        assert!(!has(args, "--quantization"), "{args:?}");
        assert!(!has(args, "--kv-cache-dtype"), "{args:?}");
        assert!(!has(args, "--enable-expert-parallel") && !has(args, "--enable-dp-attention"));
    }
    let line = engine.vllm_command(&plan.model.name);
    assert!(
        line.starts_with("vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size"),
        "{line}"
    );
    assert!(
        plan.to_table().contains(&format!("run with: {line}")),
        "{}",
        plan.to_table()
    );
}

#[test]
fn fp8_weights_and_cache_on_a_16_bit_checkpoint_are_flags_of_both_engines() {
    let mut request = PlanRequest::serve(Some(8192), 1);
    request.precision = "fp8".parse().unwrap();
    request.kv_dtype = KvDtype::Fp8;
    request.gpu_util = 0.85;
    let plan = serve_with("llama-3.1-8b", "1x1xH100", request);
    assert!(plan.fits, "{}", plan.to_table());
    let engine = plan.engine.unwrap();
    assert_eq!(value(&engine.vllm, "--quantization"), Some("fp8"));
    assert_eq!(value(&engine.sglang, "--quantization"), Some("fp8"));
    assert_eq!(value(&engine.vllm, "--kv-cache-dtype"), Some("fp8"));
    assert_eq!(value(&engine.sglang, "--kv-cache-dtype"), Some("fp8_e4m3"));
    assert_eq!(
        value(&engine.vllm, "--gpu-memory-utilization"),
        Some("0.85")
    );
}

#[test]
fn int4_needs_a_quantized_checkpoint_not_a_flag() {
    let mut request = PlanRequest::serve(Some(8192), 1);
    request.precision = "int4".parse().unwrap();
    let plan = serve_with("llama-3.1-70b", "1x1xH100", request);
    assert!(plan.fits, "{}", plan.to_table());
    let engine = plan.engine.unwrap();
    assert!(!has(&engine.vllm, "--quantization"), "{:?}", engine.vllm);
    assert!(
        engine.notes.iter().any(|n| n.contains("int4")),
        "{:?}",
        engine.notes
    );
}

#[test]
fn a_concurrency_above_the_engine_default_raises_its_sequence_limit() {
    // One H100 holds about 2,000 requests of 1,024 tokens of a 1B model: one replica runs
    // 1,500 at once, above vLLM's default of 1,024 sequences on an 80 GB device.
    let plan = serve("llama-3.2-1b", "1x8xH100", 1024, 1500);
    assert!(plan.fits, "{}", plan.to_table());
    assert_eq!(plan.replicas, Some(1), "{}", plan.to_table());
    let engine = plan.engine.unwrap();
    assert_eq!(value(&engine.vllm, "--max-num-seqs"), Some("1500"));
    assert_eq!(
        value(&engine.sglang, "--max-running-requests"),
        Some("1500")
    );
    // A small concurrency leaves the engine's default alone.
    let small = serve("llama-3.2-1b", "1x1xH100", 1024, 4).engine.unwrap();
    assert!(!has(&small.vllm, "--max-num-seqs"));
    assert!(!has(&small.sglang, "--max-running-requests"));
}

#[test]
fn preset_names_become_repositories_the_engines_can_download() {
    assert_eq!(
        hugging_face_id("llama-3.1-8b").as_deref(),
        Some("meta-llama/Llama-3.1-8B-Instruct")
    );
    assert_eq!(
        hugging_face_id("qwen2-7b").as_deref(),
        Some("Qwen/Qwen2-7B-Instruct")
    );
    assert_eq!(
        hugging_face_id("deepseek-v3").as_deref(),
        Some("deepseek-ai/DeepSeek-V3")
    );
    assert_eq!(hugging_face_id("70B"), None);
}

#[test]
fn expert_and_attention_data_parallel_map_to_each_engines_own_flags() {
    let mut plan = serve("qwen3-30b-a3b", "1x8xH100", 8192, 1);
    assert!(plan.fits, "{}", plan.to_table());
    // The layout as the expert-parallel search would report it: 8 ranks, DP attention 8.
    plan.tp = Some(8);
    plan.pp = Some(1);
    plan.expert_parallel = Some(8);
    plan.attention_data_parallel = Some(8);
    // A driver new enough for every image, so that no note is about the driver.
    plan.driver_version = Some("580.159.04".into());
    let engine = settings(&plan).unwrap();
    assert_eq!(value(&engine.vllm, "--tensor-parallel-size"), Some("1"));
    assert_eq!(value(&engine.vllm, "--data-parallel-size"), Some("8"));
    assert!(has(&engine.vllm, "--enable-expert-parallel"));
    assert_eq!(value(&engine.sglang, "--tp-size"), Some("8"));
    assert_eq!(value(&engine.sglang, "--dp-size"), Some("8"));
    assert!(has(&engine.sglang, "--enable-dp-attention"));
    assert_eq!(value(&engine.sglang, "--ep-size"), Some("8"));
    assert!(engine.notes.is_empty(), "{:?}", engine.notes);

    // Expert parallel alone: vLLM's EP is its TP group.
    plan.attention_data_parallel = None;
    let engine = settings(&plan).unwrap();
    assert_eq!(value(&engine.vllm, "--tensor-parallel-size"), Some("8"));
    assert!(!has(&engine.vllm, "--data-parallel-size"));
    assert!(has(&engine.vllm, "--enable-expert-parallel"));
    assert!(!has(&engine.sglang, "--enable-dp-attention"));

    // An EP size vLLM cannot express is said, not hidden.
    plan.expert_parallel = Some(4);
    let engine = settings(&plan).unwrap();
    assert!(
        engine
            .notes
            .iter()
            .any(|n| n.contains("expert-parallel size is 4")),
        "{:?}",
        engine.notes
    );

    // Neither: no MoE flags at all.
    plan.expert_parallel = None;
    let engine = settings(&plan).unwrap();
    assert!(!has(&engine.vllm, "--enable-expert-parallel") && !has(&engine.sglang, "--ep-size"));
}

#[test]
fn refusals_and_training_plans_have_no_engine_settings() {
    let refused = serve("llama-3.1-405b", "1x1xL4", 8192, 1);
    assert!(!refused.fits);
    assert!(refused.engine.is_none());
    assert!(!refused.to_table().contains("run with:"));

    let mut request = PlanRequest::serve(None, 1);
    request.goal = Goal::Train(TrainingTarget {
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
    let trained = serve_with("llama-3.2-1b", "1x1xH100", request);
    assert!(trained.fits);
    assert!(trained.engine.is_none());
}

#[test]
fn fractions_never_round_up() {
    assert_eq!(fraction(0.9), "0.90");
    assert_eq!(fraction(0.925), "0.925");
    assert_eq!(fraction(0.8999), "0.899");
    assert_eq!(fraction(1.0), "1.00");
}
