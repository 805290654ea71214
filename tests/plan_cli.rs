//! `hwaccel plan` as users run it: the exit-code contract (0 fits, 2 does not fit, 1 bad input),
//! the JSON fields tools rely on, and clear errors instead of panics.

// Test helpers panic on setup failures by design; clippy only exempts `#[test]` bodies.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use hwaccel::hardware::{Family, InterconnectKind, MIB, Vendor};
use hwaccel::testing::report::{ReportBuilder, accelerator};
use serde_json::Value;

fn hwaccel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hwaccel"))
        .arg("plan")
        .args(args)
        .output()
        .unwrap()
}

fn json(args: &[&str]) -> (i32, Value) {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let out = hwaccel(&all);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: {stdout} / {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap(), value)
}

/// Asserts exit code 1, a message naming `expected`, and no panic.
fn bad_input(args: &[&str], expected: &str) {
    let out = hwaccel(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(
        stderr.contains(expected),
        "{args:?}: {stderr:?} lacks {expected:?}"
    );
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "{args:?} printed a plan");
}

#[test]
fn a_plan_that_fits_exits_0_with_the_contract_fields() {
    let (code, plan) = json(&[
        "--model",
        "llama-3.1-70b",
        "--hardware",
        "1x8xH100-80GB+nvswitch",
        "--precision",
        "bf16",
        "--serve",
        "--context",
        "32768",
        "--concurrency",
        "4",
    ]);
    assert_eq!(code, 0);
    assert_eq!(plan["fits"], true);
    assert_eq!(plan["precision"], "bf16");
    for field in [
        "tp",
        "pp",
        "replicas",
        "devices",
        "nodes",
        "max_concurrency",
    ] {
        assert!(
            plan[field].as_u64().is_some_and(|v| v >= 1),
            "{field}: {}",
            plan[field]
        );
    }
    for field in [
        "weights",
        "kv_cache",
        "activations",
        "overhead",
        "total",
        "capacity",
    ] {
        assert!(
            plan["per_device"][field].as_u64().is_some(),
            "per_device.{field}"
        );
    }
    let per_device = &plan["per_device"];
    assert!(per_device["total"].as_u64() <= per_device["capacity"].as_u64());
    let assignments = plan["assignments"].as_array().unwrap();
    assert!(!assignments.is_empty());
    for a in assignments {
        assert!(
            a["node"].is_string() && a["devices"].is_array() && a["stage"].is_u64(),
            "{a}"
        );
    }
    assert!(plan["max_concurrency"].as_u64().unwrap() >= 4);
    assert!(plan["reasons"].as_array().is_some_and(|r| !r.is_empty()));
    assert!(plan["suggestions"].is_array());
    assert_eq!(plan["throughput"]["kind"], "estimate");
}

#[test]
fn asked_for_replicas_are_placed_each_holding_its_share() {
    let args = |replicas: &'static str| {
        let mut args = vec![
            "--model",
            "llama-3.1-8b",
            "--hardware",
            "2x8xH100-80GB+nvswitch",
            "--precision",
            "bf16",
            "--context",
            "8192",
            "--concurrency",
            "8",
        ];
        if !replicas.is_empty() {
            args.extend(["--replicas", replicas]);
        }
        args
    };
    // Unasked, one replica holds all 8 requests.
    let (code, plan) = json(&args(""));
    assert_eq!(code, 0);
    assert_eq!(plan["replicas"], 1);
    // Asked for 10: ten copies, more than one node holds, each holding its share.
    let (code, plan) = json(&args("10"));
    assert_eq!(code, 0, "{plan}");
    assert_eq!(plan["replicas"], 10);
    let devices = plan["devices"].as_u64().unwrap();
    assert_eq!(
        devices,
        10 * plan["tp"].as_u64().unwrap() * plan["pp"].as_u64().unwrap()
    );
    let nodes: std::collections::BTreeSet<&str> = plan["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["node"].as_str())
        .collect();
    assert_eq!(nodes.len(), 2, "{plan}");
    assert!(plan["max_concurrency"].as_u64().unwrap() >= 8);
    // More replicas than the fleet has devices does not fit, and says so.
    let (code, plan) = json(&args("17"));
    assert_eq!(code, 2, "{plan}");
    assert_eq!(plan["fits"], false);
    bad_input(&args("0"), "--replicas");
}

#[test]
fn one_asked_replica_holding_everything_needs_a_wider_layout() {
    let args = |replicas: Option<&'static str>| {
        let mut args = vec![
            "--model",
            "llama-3.1-70b",
            "--hardware",
            "1x8xH100-80GB+nvswitch",
            "--precision",
            "bf16",
            "--context",
            "8192",
            "--concurrency",
            "64",
        ];
        args.extend(replicas.map(|r| ["--replicas", r]).into_iter().flatten());
        args
    };
    let (_, free) = json(&args(None));
    assert_eq!(
        (free["tp"].as_u64(), free["replicas"].as_u64()),
        (Some(4), Some(2))
    );
    let (code, one) = json(&args(Some("1")));
    assert_eq!(code, 0, "{one}");
    assert_eq!(
        (one["tp"].as_u64(), one["replicas"].as_u64()),
        (Some(8), Some(1))
    );
    assert!(one["max_concurrency"].as_u64().unwrap() >= 64);
    let (code, four) = json(&args(Some("4")));
    assert_eq!(code, 2, "four TP-4 replicas need 16 devices: {four}");
}

#[test]
fn a_plan_that_does_not_fit_exits_2_and_says_what_would() {
    let (code, plan) = json(&[
        "--model",
        "llama-3.1-405b",
        "--hardware",
        "1x8xH100",
        "--precision",
        "bf16",
    ]);
    assert_eq!(code, 2);
    assert_eq!(plan["fits"], false);
    assert!(plan["tp"].is_null() && plan["devices"].is_null());
    assert!(
        plan["per_device"]["total"].as_u64() > plan["per_device"]["budget"].as_u64(),
        "nearest miss shown"
    );
    let suggestions: Vec<&str> = plan["suggestions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        suggestions.iter().any(|s| s.starts_with("--precision fp8")),
        "{suggestions:?}"
    );
    assert!(
        suggestions.iter().any(|s| s.contains("more node(s) like")),
        "{suggestions:?}"
    );
}

/// `make demo`'s DeepSeek-V3 placement (BF16, 131,072 tokens, 64 at once, one node) on the
/// demo's 8 x MI300X and 8 x H100 nodes: the MI300X node holds one such request, so the
/// refusal names the concurrency (not the KV room of one request), the H100 node the weights,
/// and no suggestion is a one-token edit of the context.
#[test]
fn the_demo_refusal_names_the_binding_constraint() {
    let (code, plan) = json(&[
        "--model",
        "deepseek-v3",
        "--hardware",
        "1x8xMI300X,1x8xH100-80GB+nvswitch",
        "--precision",
        "bf16",
        "--context",
        "131072",
        "--concurrency",
        "64",
        "--max-nodes",
        "1",
    ]);
    assert_eq!(code, 2);
    let lines = |key: &str| -> Vec<String> {
        plan[key]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    let reasons = lines("reasons");
    let mi300x = reasons
        .iter()
        .find(|r| r.starts_with("AMD Instinct MI300X"))
        .unwrap();
    assert!(
        mi300x.contains(
            "the concurrency does not fit: 1 concurrent 131072-token request(s) fit, 64 asked"
        ),
        "{mi300x}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("NVIDIA H100") && r.contains("the weights do not fit")),
        "{reasons:?}"
    );
    assert!(
        !reasons.iter().any(|r| r.contains("is left for KV")),
        "{reasons:?}"
    );
    let changes = plan["suggested_changes"].as_array().unwrap();
    let context = changes
        .iter()
        .find(|c| c["change"] == "context")
        .and_then(|c| c["context"].as_u64())
        .expect("a shorter context");
    assert!(
        context.is_multiple_of(1024) && context <= 131_072 - 1024,
        "{context}"
    );
    assert!(
        changes
            .iter()
            .any(|c| c["change"] == "concurrency" && c["concurrency"] == 1),
        "{changes:?}"
    );
    let suggestions = lines("suggestions");
    assert!(
        suggestions
            .iter()
            .any(|s| s.starts_with(&format!("--context {context}: "))),
        "{suggestions:?}"
    );
}

#[test]
fn table_output_explains_the_memory() {
    let out = hwaccel(&[
        "--model",
        "llama-3.1-8b",
        "--hardware",
        "1xL4",
        "--context",
        "8192",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    for expected in [
        "FITS",
        "PER DEVICE",
        "weights",
        "kv cache",
        "budget",
        "why:",
        "KV cache:",
    ] {
        assert!(text.contains(expected), "{expected}: {text}");
    }
}

#[test]
fn bare_parameter_counts_and_training_goals_work() {
    let (code, plan) = json(&[
        "--params",
        "70B",
        "--hardware",
        "8xH100",
        "--context",
        "8192",
    ]);
    assert_eq!(code, 0);
    assert!(
        plan["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.as_str().unwrap().contains("assumed"))
    );

    let (code, plan) = json(&[
        "--model",
        "llama-3.1-8b",
        "--hardware",
        "1xL4",
        "--train",
        "qlora",
        "--seq-len",
        "1024",
    ]);
    assert_eq!(code, 0, "{plan}");
    assert_eq!(plan["precision"], "nf4");
    assert!(plan["training"]["trainable_params"].as_u64().unwrap() > 0);
    // Nothing has checked QLoRA's memory against a trace or a GPU; the plan says so.
    assert!(
        plan["reasons"]
            .to_string()
            .contains("qlora: planned as TRL prepares a 4-bit model"),
        "{}",
        plan["reasons"]
    );
}

fn write_report(dir: &Path, name: &str, gpus: usize, yaml: bool) {
    let h100 = accelerator(
        Vendor::Nvidia,
        Family::Gpu,
        "NVIDIA H100 80GB HBM3",
        81_559 * MIB,
    );
    let report = ReportBuilder::new()
        .first_bus(1)
        .accelerators(gpus, &h100)
        .fabric(InterconnectKind::Nvswitch, Some(18))
        .build();
    let (text, ext) = if yaml {
        (hwaccel::output::to_yaml(&report).unwrap(), "yaml")
    } else {
        (hwaccel::output::to_json(&report).unwrap(), "json")
    };
    std::fs::write(dir.join(format!("{name}.{ext}")), text).unwrap();
}

#[test]
fn detection_reports_are_inventories() {
    let dir = tempfile::tempdir().unwrap();
    write_report(dir.path(), "node-a", 8, false);
    write_report(dir.path(), "node-b", 8, true);
    let inventory = dir.path().to_str().unwrap();
    let (code, plan) = json(&[
        "--model",
        "llama-3.1-405b",
        "--inventory",
        inventory,
        "--precision",
        "bf16",
        "--context",
        "8192",
    ]);
    assert_eq!(code, 0, "{plan}");
    assert_eq!(
        (
            plan["tp"].as_u64(),
            plan["pp"].as_u64(),
            plan["nodes"].as_u64()
        ),
        (Some(8), Some(2), Some(2))
    );
    let nodes: Vec<&str> = plan["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["node"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["node-a", "node-b"]);
    assert_eq!(plan["assignments"][0]["devices"][0], "0000:01:00.0");

    // With one device of node-b reserved, TP 8 x PP 2 no longer fits the 15 free devices; the
    // planner falls back to TP 4 x PP 3 and leaves the reserved device alone.
    let reserved = [
        "--model",
        "llama-3.1-405b",
        "--inventory",
        inventory,
        "--precision",
        "bf16",
        "--context",
        "8192",
        "--reserved",
        "node-b/0000:03:00.0",
    ];
    let (code, plan) = json(&reserved);
    assert_eq!(code, 0, "{plan}");
    assert_eq!(
        (plan["tp"].as_u64(), plan["pp"].as_u64()),
        (Some(4), Some(3))
    );
    for a in plan["assignments"].as_array().unwrap() {
        assert!(
            !(a["node"] == "node-b"
                && a["devices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|d| d == "0000:03:00.0"))
        );
    }
}

#[test]
fn bad_models_are_exit_1() {
    bad_input(
        &["--model", "nope-1b", "--hardware", "8xH100"],
        "unknown model",
    );
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("config.json");
    std::fs::write(&broken, "{\"num_hidden_layers\": 32,").unwrap();
    bad_input(
        &["--model", broken.to_str().unwrap(), "--hardware", "8xH100"],
        "not valid JSON",
    );
    let incomplete = dir.path().join("incomplete.json");
    std::fs::write(
        &incomplete,
        r#"{"hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000}"#,
    )
    .unwrap();
    bad_input(
        &[
            "--model",
            incomplete.to_str().unwrap(),
            "--hardware",
            "8xH100",
        ],
        "missing num_hidden_layers",
    );
    bad_input(
        &["--params", "seventy", "--hardware", "8xH100"],
        "invalid parameter count",
    );
    bad_input(
        &[
            "--model",
            "llama-3.1-8b",
            "--params",
            "8B",
            "--hardware",
            "8xH100",
        ],
        "cannot be used with",
    );
}

#[test]
fn zero_devices_are_exit_1() {
    bad_input(
        &["--model", "llama-3.1-8b", "--hardware", "0x8xH100"],
        "zero devices",
    );
    let dir = tempfile::tempdir().unwrap();
    write_report(dir.path(), "empty", 0, false);
    bad_input(
        &[
            "--model",
            "llama-3.1-8b",
            "--inventory",
            dir.path().to_str().unwrap(),
        ],
        "no usable accelerators",
    );
    bad_input(
        &[
            "--model",
            "llama-3.1-8b",
            "--inventory",
            "/nonexistent/inventory.json",
        ],
        "cannot read",
    );
    bad_input(
        &["--model", "llama-3.1-8b", "--hardware", "8xWarpCore"],
        "give its memory",
    );
}

#[test]
fn impossible_constraints_are_exit_1() {
    let base = ["--model", "llama-3.1-8b", "--hardware", "1xH100"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().chain(extra).copied().collect()
    };
    bad_input(&with(&["--gpu-util", "1.5"]), "--gpu-util");
    bad_input(&with(&["--gpu-util", "0"]), "--gpu-util");
    bad_input(&with(&["--context", "0"]), "--context");
    bad_input(
        &with(&["--context", "1000000"]),
        "exceeds llama-3.1-8b's maximum",
    );
    bad_input(&with(&["--concurrency", "0"]), "--concurrency");
    bad_input(&with(&["--max-nodes", "0"]), "--max-nodes");
    bad_input(&with(&["--precision", "fp5"]), "unknown precision");
    bad_input(&with(&["--reserved", "no-slash"]), "NODE/DEVICE");
    bad_input(&with(&["--checkpoint-bytes", "lots"]), "--checkpoint-bytes");
    bad_input(&with(&["--concurrency", "many"]), "invalid value");
    bad_input(
        &with(&["--train", "qlora", "--precision", "fp8"]),
        "NF4 base",
    );
    bad_input(
        &with(&["--train", "full", "--precision", "int4"]),
        "mixed precision",
    );
    bad_input(
        &with(&["--train", "lora", "--lora-targets", "lm_head"]),
        "unknown module",
    );
}

#[test]
fn presets_can_be_listed() {
    let out = hwaccel(&["--list-models"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("llama-3.1-70b")
            && text.contains("deepseek-v3")
            && text.contains("mlc-ai/mlc-llm")
            && text.contains("huggingface.co/deepseek-ai/DeepSeek-V3 config.json")
    );
}

/// Issue 23 item 1: the engine settings are inputs. They change the memory the plan counts,
/// reach the engine arguments, and an unstated engine is named as assumed.
#[test]
fn engine_settings_feed_the_memory_model_and_the_arguments() {
    let base = [
        "--model",
        "llama-3.1-8b",
        "--hardware",
        "1x1xH100-80GB",
        "--context",
        "8192",
    ];
    let with = |extra: &[&str]| -> (i32, Value) {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        json(&args)
    };
    let (code, assumed) = with(&[]);
    assert_eq!(code, 0, "{assumed}");
    let reasons = assumed["reasons"].to_string();
    assert!(
        reasons.contains("engine: assumed vLLM current"),
        "{reasons}"
    );
    assert_eq!(assumed["engine"]["engine"], "vllm");
    assert_eq!(assumed["engine"]["version"], "current");

    // Eager mode frees the 1 GiB of CUDA graphs current vLLM counts; a smaller scheduler
    // budget shrinks the profile run: more KV tokens, and the flags are passed on.
    let (code, eager) = with(&[
        "--enforce-eager",
        "--max-num-seqs",
        "64",
        "--max-num-batched-tokens",
        "2048",
    ]);
    assert_eq!(code, 0, "{eager}");
    assert!(
        eager["kv_tokens"].as_u64() > assumed["kv_tokens"].as_u64(),
        "{} vs {}",
        eager["kv_tokens"],
        assumed["kv_tokens"]
    );
    assert!(
        eager["per_device"]["overhead"].as_u64().unwrap() + (1 << 30)
            <= assumed["per_device"]["overhead"].as_u64().unwrap()
    );
    let vllm = eager["engine"]["vllm"].to_string();
    for flag in [
        r#""--enforce-eager""#,
        r#""--max-num-seqs","64""#,
        r#""--max-num-batched-tokens","2048""#,
    ] {
        assert!(vllm.contains(flag), "{flag} in {vllm}");
    }
    let sglang = eager["engine"]["sglang"].to_string();
    for flag in [
        r#""--disable-cuda-graph""#,
        r#""--max-running-requests","64""#,
        r#""--chunked-prefill-size","2048""#,
    ] {
        assert!(sglang.contains(flag), "{flag} in {sglang}");
    }

    // vLLM 0.10 (V1) keeps CUDA graphs outside the budget: as eager on current vLLM.
    let (_, v1) = with(&["--engine", "vllm", "--engine-version", "0.10.1"]);
    assert_eq!(
        v1["per_device"]["overhead"],
        with(&["--enforce-eager"]).1["per_device"]["overhead"]
    );
    assert!(
        v1["reasons"]
            .to_string()
            .contains("engine: vLLM 0.10.1 (V1 engine")
    );

    // SGLang: its own accounting and fraction, stated or its default.
    let (code, sglang) = with(&["--engine", "sglang", "--mem-fraction-static", "0.8"]);
    assert_eq!(code, 0, "{sglang}");
    assert_eq!(sglang["engine"]["engine"], "sglang");
    assert_eq!(sglang["per_device"]["activations"], 0);
    assert_eq!(sglang["gpu_memory_utilization"], 0.8);
    assert!(
        sglang["engine"]["sglang"]
            .to_string()
            .contains(r#""--mem-fraction-static","0.80""#),
        "{}",
        sglang["engine"]
    );
    let (_, default) = with(&["--engine", "sglang"]);
    assert!(
        default["reasons"]
            .to_string()
            .contains("SGLang's default for this device and layout"),
        "{}",
        default["reasons"]
    );
}

/// Issue 23 item 5: every engine input has bounds and a clear error.
#[test]
fn bad_engine_settings_are_exit_1_naming_the_flag() {
    let base = ["--model", "llama-3.1-8b", "--hardware", "1xH100"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().chain(extra).copied().collect()
    };
    bad_input(
        &with(&["--engine", "tgi"]),
        r#"--engine: unknown engine "tgi""#,
    );
    bad_input(&with(&["--engine-version", "one"]), "--engine-version");
    bad_input(
        &with(&["--max-num-seqs", "0"]),
        "--max-num-seqs 0 must be between 1 and 65536",
    );
    bad_input(&with(&["--max-num-seqs", "70000"]), "--max-num-seqs 70000");
    bad_input(
        &with(&["--max-num-batched-tokens", "5000000"]),
        "--max-num-batched-tokens 5000000",
    );
    bad_input(
        &with(&["--max-num-seqs", "256", "--max-num-batched-tokens", "128"]),
        "at least --max-num-seqs 256",
    );
    bad_input(
        &with(&["--mem-fraction-static", "0.8"]),
        "add --engine sglang",
    );
    bad_input(
        &with(&["--engine", "sglang", "--mem-fraction-static", "1.2"]),
        "must be in (0, 1]",
    );
    bad_input(
        &with(&[
            "--engine",
            "sglang",
            "--mem-fraction-static",
            "0.8",
            "--gpu-util",
            "0.9",
        ]),
        "not both",
    );
    bad_input(
        &with(&["--engine", "sglang", "--engine-version", "v0"]),
        "vLLM generations",
    );
}

/// Issue 23: a preset plans its own maximum context and says so; gpt-oss-20b is MXFP4.
#[test]
fn presets_plan_their_own_maximum_context_and_native_format() {
    let (code, plan) = json(&["--model", "deepseek-v3", "--hardware", "2x8xH200"]);
    assert!(code == 0 || code == 2, "{plan}");
    assert_eq!(plan["context"], 163_840, "{plan}");
    let reasons = plan["reasons"].to_string();
    assert!(
        reasons.contains("context: 163840 tokens, deepseek-v3's maximum"),
        "{reasons}"
    );
    let (code, plan) = json(&["--model", "gpt-oss-20b", "--hardware", "1x1xH100-80GB"]);
    assert_eq!(code, 0, "{plan}");
    assert_eq!(plan["precision"], "mxfp4", "{plan}");
    let (code, plan) = json(&[
        "--model",
        "gpt-oss-20b",
        "--hardware",
        "1x1xH100-80GB",
        "--precision",
        "fp4",
    ]);
    assert_eq!(code, 0, "{plan}");
    assert_eq!(plan["precision"], "mxfp4", "{plan}");
}

/// Runs `hwaccel plan` but kills it (and fails) after `limit`, so a read that blocks fails the
/// test instead of hanging it.
fn hwaccel_within(args: &[&str], limit: std::time::Duration) -> (Output, std::time::Duration) {
    let started = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hwaccel"))
        .arg("plan")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("hwaccel plan {args:?} still ran after {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let elapsed = started.elapsed();
    (child.wait_with_output().unwrap(), elapsed)
}

#[test]
fn special_and_oversized_inventory_files_are_refused_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("node.json");
    let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    // A FIFO named as --inventory (or as --model) used to block the read for ever.
    for args in [
        [
            "--model",
            "llama-3.1-8b",
            "--inventory",
            fifo.to_str().unwrap(),
        ],
        ["--model", fifo.to_str().unwrap(), "--hardware", "1xH100"],
    ] {
        let (out, elapsed) = hwaccel_within(&args, std::time::Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("is a FIFO, not a regular file"),
            "{args:?}: {stderr}"
        );
        assert!(
            elapsed < std::time::Duration::from_secs(5),
            "{args:?}: took {elapsed:?}"
        );
    }

    // One byte over the cap (sparse: no disk used) is refused, not read whole.
    let big = dir.path().join("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(hwaccel::plan::load::MAX_FILE_BYTES + 1)
        .unwrap();
    bad_input(
        &[
            "--model",
            "llama-3.1-8b",
            "--inventory",
            big.to_str().unwrap(),
        ],
        "larger than 16 MiB",
    );

    // A FIFO inside an inventory directory is skipped like any non-file entry.
    let inventories = tempfile::tempdir().unwrap();
    write_report(inventories.path(), "n1", 1, false);
    let status = Command::new("mkfifo")
        .arg(inventories.path().join("n2.json"))
        .status()
        .unwrap();
    assert!(status.success());
    let (out, _) = hwaccel_within(
        &[
            "--model",
            "llama-3.1-8b",
            "--inventory",
            inventories.path().to_str().unwrap(),
            "-o",
            "json",
        ],
        std::time::Duration::from_secs(30),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `draDevices` of a plan as (node, device, driver/pool/device) triples.
fn dra_devices(plan: &Value) -> Vec<(String, String, String)> {
    plan["draDevices"]
        .as_array()
        .unwrap_or_else(|| panic!("no draDevices: {plan}"))
        .iter()
        .map(|d| {
            let dra = &d["dra"];
            (
                d["node"].as_str().unwrap().to_string(),
                d["device"].as_str().unwrap().to_string(),
                format!(
                    "{}/{}/{}",
                    dra["driver"].as_str().unwrap(),
                    dra["pool"].as_str().unwrap(),
                    dra["device"].as_str().unwrap()
                ),
            )
        })
        .collect()
}

#[test]
fn resource_slices_alone_plan_on_the_published_gpus_and_name_their_dra_devices() {
    let slices = "fixtures/dra/nvidia-h100-8x.yaml";
    let (code, plan) = json(&[
        "--model",
        "llama-3.1-8b",
        "--precision",
        "bf16",
        "--resource-slices",
        slices,
        "--replicas",
        "8",
    ]);
    assert_eq!(code, 0, "{plan}");
    let chosen = dra_devices(&plan);
    assert_eq!(chosen.len(), 8, "{chosen:?}");
    assert!(
        chosen
            .iter()
            .all(|(node, _, dra)| node == "h100-8x-nvswitch"
                && dra.starts_with("gpu.nvidia.com/h100-8x-nvswitch/gpu-"))
    );
    assert!(
        !chosen.iter().any(|(_, _, dra)| dra.contains("mig")),
        "{chosen:?}"
    );
    // The MIG device is no ninth GPU.
    let (code, _) = json(&[
        "--model",
        "llama-3.1-8b",
        "--precision",
        "bf16",
        "--resource-slices",
        slices,
        "--replicas",
        "9",
    ]);
    assert_eq!(code, 2);
}

#[test]
fn an_inventory_and_slices_of_the_same_node_count_each_gpu_once() {
    let args = |replicas: &'static str| {
        [
            "--model",
            "llama-3.1-8b",
            "--precision",
            "bf16",
            "--inventory",
            "fixtures/golden/h100-8x-nvswitch.inventory.yaml",
            "--resource-slices",
            "fixtures/dra/nvidia-h100-8x.yaml",
            "--replicas",
            replicas,
        ]
    };
    let (code, plan) = json(&args("8"));
    assert_eq!(code, 0, "{plan}");
    let chosen = dra_devices(&plan);
    assert_eq!(chosen.len(), 8);
    // Devices keep the inventory's names and gain the driver's.
    assert!(
        chosen.contains(&(
            "h100-8x-nvswitch".to_string(),
            "gpu-0000-18-00-0".to_string(),
            "gpu.nvidia.com/h100-8x-nvswitch/gpu-0".to_string()
        )),
        "{chosen:?}"
    );
    let (code, _) = json(&args("9"));
    assert_eq!(code, 2, "eight GPUs, not sixteen");
}

#[test]
fn multi_document_yaml_and_single_json_slices_are_read() {
    let (code, plan) = json(&[
        "--model",
        "llama-3.1-8b",
        "--precision",
        "bf16",
        "--resource-slices",
        "fixtures/dra/amd-mi300x-8x.yaml",
        "--replicas",
        "8",
    ]);
    assert_eq!(code, 0, "{plan}");
    assert!(
        dra_devices(&plan)
            .iter()
            .all(|(_, _, dra)| dra.starts_with("gpu.amd.com/mi300x-8x/gpu-"))
    );
    // One Gaudi is reported unhealthy: seven usable.
    let gaudi = |replicas| {
        json(&[
            "--model",
            "llama-3.1-8b",
            "--precision",
            "bf16",
            "--resource-slices",
            "fixtures/dra/intel-gaudi2-8x.json",
            "--replicas",
            replicas,
        ])
    };
    let (code, plan) = gaudi("7");
    assert_eq!(code, 0, "{plan}");
    assert_eq!(dra_devices(&plan).len(), 7);
    assert_eq!(gaudi("8").0, 2);
}

#[test]
fn a_file_of_other_objects_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pods.yaml");
    std::fs::write(&path, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n").unwrap();
    bad_input(
        &[
            "--model",
            "llama-3.1-8b",
            "--resource-slices",
            path.to_str().unwrap(),
        ],
        "expected ResourceSlices",
    );
    // A table names the DRA devices too.
    let out = hwaccel(&[
        "--model",
        "llama-3.1-8b",
        "--precision",
        "bf16",
        "--resource-slices",
        "fixtures/dra/nvidia-h100-8x.yaml",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("DRA DEVICE") && stdout.contains("gpu.nvidia.com/h100-8x-nvswitch/gpu-"),
        "{stdout}"
    );
}

#[test]
fn json_plans_carry_the_engine_arguments_and_tables_a_run_line() {
    let (code, plan) = json(&[
        "--model",
        "llama-3.1-8b",
        "--hardware",
        "1x2xH100",
        "--context",
        "8192",
    ]);
    assert_eq!(code, 0, "{plan}");
    let vllm: Vec<&str> = plan["engine"]["vllm"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let tp = plan["tp"].as_u64().unwrap().to_string();
    assert!(
        vllm.windows(2)
            .any(|w| w == ["--tensor-parallel-size", tp.as_str()]),
        "{vllm:?}"
    );
    assert!(
        vllm.windows(2).any(|w| w == ["--max-model-len", "8192"]),
        "{vllm:?}"
    );
    assert!(
        plan["engine"]["sglang"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    );
    let out = hwaccel(&["--model", "llama-3.1-8b", "--hardware", "1x2xH100"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains(
            "run with: vllm serve meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size"
        ),
        "{table}"
    );
}

#[test]
fn emit_renders_a_deployment_on_the_planned_nodes() {
    let out = hwaccel(&[
        "--model",
        "llama-3.1-8b",
        "--hardware",
        "2x4xH100",
        "--context",
        "8192",
        "--concurrency",
        "200",
        "--emit",
        "deployment",
        "--image",
        "example.com/vllm:test",
        "--namespace",
        "ml",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "kind: Deployment",
        "namespace: ml",
        "image: example.com/vllm:test",
        "nvidia.com/gpu",
        "kubernetes.io/hostname",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--max-model-len",
    ] {
        assert!(stdout.contains(expected), "{expected} missing:\n{stdout}");
    }
    // JSON with -o json.
    let out = hwaccel(&[
        "--model",
        "llama-3.1-8b",
        "--hardware",
        "1x1xH100",
        "--emit",
        "deployment",
        "-o",
        "json",
    ]);
    let value: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(value["kind"], "Deployment");
    assert_eq!(
        value["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        "1"
    );
}

/// Issue 23 item 4: the workload runs on the devices it names. An MI300X plan gets vLLM's ROCm
/// image, a Gaudi plan the Gaudi image, an SGLang plan SGLang's server, and a device the
/// engine version does not support is refused with the reason.
#[test]
fn emit_picks_the_image_for_the_devices_or_refuses_with_the_reason() {
    let emit = |extra: &[&str]| -> (Option<i32>, Value, String) {
        let mut args = vec!["--model", "llama-3.1-8b", "--context", "8192"];
        args.extend(extra);
        args.extend(["--emit", "deployment", "-o", "json"]);
        let out = hwaccel(&args);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.code(), value, stderr)
    };
    let container = |value: &Value| value["spec"]["template"]["spec"]["containers"][0].clone();

    let (code, mi300x, stderr) = emit(&["--hardware", "1x1xMI300X"]);
    assert_eq!(code, Some(0), "{stderr}");
    let c = container(&mi300x);
    assert_eq!(c["image"], "docker.io/vllm/vllm-openai-rocm:latest", "{c}");
    assert_eq!(c["resources"]["limits"]["amd.com/gpu"], "1", "{c}");
    // Current vLLM gets the plan's KV pool explicitly.
    assert!(
        c["args"].to_string().contains("--kv-cache-memory-bytes"),
        "{c}"
    );

    let (code, gaudi, stderr) = emit(&["--hardware", "1x8xGaudi3"]);
    assert_eq!(code, Some(0), "{stderr}");
    let c = container(&gaudi);
    assert!(
        c["image"]
            .as_str()
            .is_some_and(|i| i.starts_with("vault.habana.ai/gaudi-docker/")),
        "{c}"
    );

    let (code, pinned, stderr) = emit(&["--hardware", "1x1xH100", "--engine-version", "0.10.2"]);
    assert_eq!(code, Some(0), "{stderr}");
    let c = container(&pinned);
    assert_eq!(c["image"], "docker.io/vllm/vllm-openai:v0.10.2", "{c}");
    assert!(
        !c["args"].to_string().contains("--kv-cache-memory-bytes"),
        "{c}"
    );

    let (code, sglang, stderr) = emit(&["--hardware", "1x1xH100", "--engine", "sglang"]);
    assert_eq!(code, Some(0), "{stderr}");
    let c = container(&sglang);
    assert_eq!(c["image"], "docker.io/lmsysorg/sglang:latest", "{c}");
    assert_eq!(
        c["command"],
        serde_json::json!(["python3", "-m", "sglang.launch_server"])
    );
    let args = c["args"].to_string();
    assert!(
        args.contains(r#""--model-path","meta-llama/Llama-3.1-8B-Instruct""#)
            && args.contains("--mem-fraction-static")
            && args.contains(r#""--port","8000""#),
        "{args}"
    );

    // Compute capability 7.0 on current vLLM (7.5 or higher since 0.21): refused, exit 1.
    let (code, value, stderr) = emit(&["--hardware", "1x8xV100"]);
    assert_eq!(code, Some(1), "{value}");
    assert!(
        stderr.contains("needs compute capability 7.5 or higher and NVIDIA V100 has 7.0"),
        "{stderr}"
    );
    // An explicit image is the user's choice.
    let (code, _, stderr) = emit(&["--hardware", "1x8xV100", "--image", "example.com/v:1"]);
    assert_eq!(code, Some(0), "{stderr}");
    // No SGLang image for AMD: refused with the reason.
    let (code, _, stderr) = emit(&["--hardware", "1x1xMI300X", "--engine", "sglang"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("no SGLang image"), "{stderr}");
}

#[test]
fn emit_refuses_what_a_workload_cannot_express() {
    // Does not fit: nothing on stdout, the reasons on stderr, exit 2.
    let out = hwaccel(&[
        "--model",
        "llama-3.1-405b",
        "--hardware",
        "1x1xL4",
        "--emit",
        "deployment",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("does not fit") && stderr.contains("  - "),
        "{stderr}"
    );
    // A replica across nodes is not a Deployment.
    bad_input(
        &[
            "--model",
            "llama-3.1-405b",
            "--precision",
            "bf16",
            "--hardware",
            "2x8xH100+ib",
            "--emit",
            "deployment",
        ],
        "--emit lws",
    );
    let out = hwaccel(&[
        "--model",
        "llama-3.1-405b",
        "--precision",
        "bf16",
        "--hardware",
        "2x8xH100+ib",
        "--emit",
        "lws",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("kind: LeaderWorkerSet") && stdout.contains("size: 2"),
        "{stdout}"
    );
    // A config file's model has no known repository: --served-model names it.
    bad_input(
        &[
            "--params",
            "8B",
            "--hardware",
            "1x1xH100",
            "--emit",
            "deployment",
        ],
        "--served-model",
    );
    // Placement files: missing, not a placement, and not with planning flags.
    bad_input(
        &[
            "--emit",
            "deployment",
            "--placement",
            "/nonexistent/mp.yaml",
        ],
        "/nonexistent/mp.yaml",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pod.yaml");
    std::fs::write(&path, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n").unwrap();
    bad_input(
        &["--emit", "lws", "--placement", path.to_str().unwrap()],
        "ModelPlacement",
    );
    let out = hwaccel(&[
        "--emit",
        "lws",
        "--placement",
        path.to_str().unwrap(),
        "--model",
        "llama-3.1-8b",
    ]);
    assert_ne!(out.status.code(), Some(0));
    // Emit flags without --emit are a usage error.
    let out = hwaccel(&[
        "--model",
        "llama-3.1-8b",
        "--hardware",
        "1x1xH100",
        "--image",
        "x",
    ]);
    assert_ne!(out.status.code(), Some(0));
}

#[test]
fn disaggregated_plans_show_both_pools_in_the_table_and_the_json() {
    let args = [
        "--model",
        "llama-3.1-70b",
        "--hardware",
        "1x4xH100+nvswitch,1x4xL40S",
        "--precision",
        "bf16",
        "--context",
        "8192",
        "--concurrency",
        "32",
        "--disaggregated",
    ];
    let (code, plan) = json(&args);
    assert_eq!(code, 0, "{plan}");
    // The top level is the decode pool, `prefill` the prefill pool.
    assert!(plan["device"].as_str().unwrap().contains("H100"), "{plan}");
    assert_eq!(plan["prefill"]["device"], "NVIDIA L40S");
    assert_eq!(plan["prefill"]["precision"], plan["precision"]);
    assert_eq!(plan["prefill"]["kv_dtype"], plan["kv_dtype"]);
    assert_eq!(plan["prefill"]["replicas"], 1);
    assert!(plan["prefill"]["kv_tokens"].as_u64().unwrap() >= 8192);
    assert!(plan["prefill"]["per_device"]["total"].as_u64().is_some());
    let nodes = |pool: &Value| -> Vec<String> {
        pool["assignments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["node"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(nodes(&plan).iter().all(|n| n.starts_with("h100")));
    assert!(
        nodes(&plan["prefill"])
            .iter()
            .all(|n| n.starts_with("l40s"))
    );
    let sglang = |pool: &Value| pool["engine"]["sglang"].to_string();
    assert!(
        sglang(&plan).contains(r#""--disaggregation-mode","decode""#),
        "{plan}"
    );
    assert!(sglang(&plan["prefill"]).contains(r#""--disaggregation-mode","prefill""#));

    let out = hwaccel(&args);
    assert_eq!(out.status.code(), Some(0));
    let table = String::from_utf8_lossy(&out.stdout);
    let decode_at = table.find("== decode pool ==").expect("a decode section");
    let prefill_at = table.find("== prefill pool ==").expect("a prefill section");
    assert!(decode_at < prefill_at, "{table}");
    assert!(table[prefill_at..].contains("x NVIDIA L40S"), "{table}");
    assert_eq!(table.matches("PER DEVICE").count(), 2, "{table}");
    assert!(table.contains("--kv-transfer-config '{"), "{table}");

    // A fleet too small for the prefill pool exits 2 and names it.
    let (code, refused) = json(&[
        "--model",
        "llama-3.1-8b",
        "--hardware",
        "1x1xH100",
        "--context",
        "8192",
        "--disaggregated",
    ]);
    assert_eq!(code, 2);
    assert!(
        refused["reasons"]
            .to_string()
            .contains("prefill pool: no free devices left")
    );
    assert!(refused.get("prefill").is_none());
    // --prefill-replicas needs --disaggregated.
    let out = hwaccel(&[
        "--model",
        "llama-3.1-8b",
        "--hardware",
        "1x2xH100",
        "--prefill-replicas",
        "2",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--disaggregated"));
}

/// The 8x H100 inventory of the fleet fixtures: one GPU unhealthy, seven plannable.
const H100_INVENTORY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/fixtures/fleet/inventories/gpu-h100-0.yaml"
);

/// `hwaccel plan` of `replicas` one-request replicas of Llama 3.1 8B on the H100 inventory,
/// with `reserved` (`NODE/DEVICE`) held when given.
fn replicas_on_h100(replicas: u32, reserved: Option<&str>) -> (i32, Value) {
    let replicas = replicas.to_string();
    let mut args = vec![
        "--model",
        "llama-3.1-8b",
        "--inventory",
        H100_INVENTORY,
        "--context",
        "8192",
        "--replicas",
        &replicas,
        "--concurrency",
        &replicas,
    ];
    if let Some(reserved) = reserved {
        args.extend(["--reserved", reserved]);
    }
    json(&args)
}

/// Issue 24: `--reserved` takes every name an inventory or `hwaccel fleet` prints for a
/// device (its inventory name, its PCI address in either width, its UUID in any case) and
/// reserves the same device by each; a name that matches nothing is exit 1 listing the node's
/// devices, never a reservation that quietly does nothing.
#[test]
fn reserved_devices_are_named_by_inventory_name_pci_address_or_uuid() {
    let names = [
        "gpu-0000-18-00-0",
        "0000:18:00.0",
        "18:00.0",
        "GPU-5c2a1e0f-0000-0000-0000-000000000000",
        "gpu-5c2a1e0f-0000-0000-0000-000000000000",
    ];
    let mut placed = Vec::new();
    for name in names {
        let reserved = format!("gpu-h100-0/{name}");
        // Seven replicas need every plannable GPU: with one reserved they do not fit.
        let (code, plan) = replicas_on_h100(7, Some(&reserved));
        assert_eq!(code, 2, "{name}: the reservation took no effect: {plan}");
        let (code, plan) = replicas_on_h100(6, Some(&reserved));
        assert_eq!(code, 0, "{name}: {plan}");
        let devices: std::collections::BTreeSet<String> = plan["assignments"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|a| a["devices"].as_array().unwrap().iter())
            .map(|d| d.as_str().unwrap().to_string())
            .collect();
        assert!(!devices.contains("0000:18:00.0"), "{name}: {devices:?}");
        placed.push(devices);
    }
    assert!(placed.windows(2).all(|w| w[0] == w[1]), "{placed:?}");
    // Without the reservation, the seven fit: the exit 2 above was the reservation's doing.
    let (code, _) = replicas_on_h100(7, None);
    assert_eq!(code, 0);

    let with = |reserved: &'static str| {
        [
            "--model",
            "llama-3.1-8b",
            "--inventory",
            H100_INVENTORY,
            "--reserved",
            reserved,
        ]
    };
    bad_input(
        &with("gpu-h100-0/gpu-0000-99-00-0"),
        "its devices: 0000:18:00.0 (gpu-0000-18-00-0, GPU-5c2a1e0f-0000-0000-0000-000000000000)",
    );
    bad_input(&with("gpu-h100-9/0000:18:00.0"), "its nodes: gpu-h100-0");
}

/// Issue 38: `--optimizer-states` sets the optimizer's bytes per parameter and the plan says
/// which it assumed; BF16 states keep 8 bytes per parameter where mixed precision keeps 16.
#[test]
fn optimizer_states_are_stated_and_change_the_plan() {
    let plan = |states: Option<&str>| {
        let mut args = vec![
            "--model",
            "llama-3.2-1b",
            "--hardware",
            "1x1xH100",
            "--train",
            "full",
        ];
        if let Some(states) = states {
            args.extend(["--optimizer-states", states]);
        }
        let (code, plan) = json(&args);
        assert_eq!(code, 0, "{plan}");
        plan
    };
    let states = |plan: &Value| {
        let t = &plan["training"];
        ["weights", "gradients", "optimizer"]
            .iter()
            .map(|k| t[k].as_u64().unwrap())
            .sum::<u64>() as f64
    };
    let default = plan(None);
    let bf16 = plan(Some("bf16"));
    let eight = plan(Some("8bit"));
    assert_eq!(default["training"]["optimizer_states"], "fp32");
    assert_eq!(bf16["training"]["optimizer_states"], "bf16");
    assert!(
        default["reasons"]
            .to_string()
            .contains("optimizer states fp32")
    );
    assert!(
        bf16["reasons"]
            .to_string()
            .contains("optimizer states bf16")
    );
    assert!((states(&bf16) / states(&default) - 0.5).abs() < 1e-3);
    assert!((states(&eight) / states(&default) - 10.0 / 16.0).abs() < 1e-3);
    bad_input(
        &[
            "--model",
            "llama-3.2-1b",
            "--hardware",
            "1x1xH100",
            "--train",
            "full",
            "--optimizer-states",
            "fp8",
        ],
        "--optimizer-states",
    );
}

/// Issue 38: `--loss fused` (a fused linear cross-entropy, Liger Kernel's) plans without the
/// whole logits; the plan says which loss it assumed, and a plan refused at a long sequence
/// with the standard loss names the flag and what it would save.
#[test]
fn a_fused_loss_is_stated_and_fits_what_the_standard_loss_cannot() {
    let args = |loss: &'static str| {
        vec![
            "--model",
            "llama-3.1-8b",
            "--hardware",
            "1x1xH100",
            "--train",
            "lora",
            "--seq-len",
            "32768",
            "--loss",
            loss,
        ]
    };
    let (code, standard) = json(&args("standard"));
    assert_eq!(code, 2, "{standard}");
    assert_eq!(standard["fits"], false, "{standard}");
    assert!(standard["reasons"].to_string().contains("loss standard"));
    assert!(
        standard["suggestions"].to_string().contains("--loss fused"),
        "{}",
        standard["suggestions"]
    );
    let (code, fused) = json(&args("fused"));
    assert_eq!(code, 0, "{fused}");
    assert_eq!(fused["fits"], true, "{fused}");
    assert_eq!(fused["training"]["loss"], "fused");
    assert!(fused["reasons"].to_string().contains("loss fused"));
    assert!(!fused["suggestions"].to_string().contains("--loss fused"));
    let mut chunky = args("standard");
    *chunky.last_mut().unwrap() = "chunky";
    bad_input(&chunky, "--loss");
}

/// Issue 38: `--adamw foreach` counts PyTorch's multi-tensor AdamW's copy of the moments: a
/// BF16 full fine-tune of Llama 3.1 8B that one H100 holds with a fused AdamW needs two
/// (ZeRO-1 shards the moments and the copy), and the plan says where the step peaks.
#[test]
fn adamw_foreach_is_stated_and_needs_room_for_the_step() {
    let args = |adamw: &'static str| {
        vec![
            "--model",
            "llama-3.1-8b",
            "--hardware",
            "1x8xH100",
            "--train",
            "full",
            "--optimizer-states",
            "bf16",
            "--adamw",
            adamw,
        ]
    };
    let devices = |plan: &serde_json::Value| plan["devices"].as_u64().unwrap_or(0);
    let (code, fused) = json(&args("fused"));
    assert_eq!(code, 0, "{fused}");
    assert_eq!(fused["training"]["adamw"], "fused");
    assert_eq!(devices(&fused), 1, "{fused}");
    assert!(fused["reasons"].to_string().contains("adamw fused"));
    let (code, foreach) = json(&args("foreach"));
    assert_eq!(code, 0, "{foreach}");
    assert_eq!(foreach["training"]["adamw"], "foreach");
    assert_eq!(devices(&foreach), 2, "{foreach}");
    let reasons = foreach["reasons"].to_string();
    assert!(reasons.contains("adamw foreach"), "{reasons}");
    assert!(reasons.contains("peaks in the optimizer step"), "{reasons}");
    let mut adam = args("fused");
    *adam.last_mut().unwrap() = "adam";
    bad_input(&adam, "--adamw");
}

/// Issue 38: `--kernels liger` counts Liger Kernel's layer kernels: its RMSNorm returns its
/// input's dtype, so a QLoRA base keeps a 16-bit residual stream and half-size checkpoints
/// (traced): Llama 3.1 70B QLoRA at 10,240 tokens fits one H100 with them and needs two with
/// transformers' own. A model type Liger has no kernels for is planned as transformers' and
/// the reasons say so.
#[test]
fn liger_kernels_are_stated_and_keep_less() {
    let args = |model: &str, kernels: &str| -> Vec<String> {
        [
            "--model",
            model,
            "--hardware",
            "1x8xH100",
            "--train",
            "qlora",
            "--seq-len",
            "10240",
            "--kernels",
            kernels,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, plan) = json(&args);
        assert_eq!(code, 0, "{plan}");
        plan
    };
    let devices = |plan: &serde_json::Value| plan["devices"].as_u64().unwrap_or(0);
    let standard = run(args("llama-3.1-70b", "standard"));
    assert_eq!(standard["training"]["kernels"], "standard");
    assert_eq!(devices(&standard), 2, "{standard}");
    assert!(
        standard["reasons"]
            .to_string()
            .contains("kernels standard:")
    );
    let liger = run(args("llama-3.1-70b", "liger"));
    assert_eq!(liger["training"]["kernels"], "liger");
    assert_eq!(devices(&liger), 1, "{liger}");
    assert!(
        liger["reasons"]
            .to_string()
            .contains("kernels liger: Liger Kernel's RMSNorm")
    );
    // The same shapes under a model type Liger Kernel does not patch: transformers' layers.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    let llama: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string("fixtures/models/llama-65b/config.json").unwrap(),
    )
    .unwrap();
    let mut other = llama.clone();
    other["model_type"] = "starcoder2".into();
    std::fs::write(&config, other.to_string()).unwrap();
    let path = config.to_str().unwrap();
    let unpatched = run(args(path, "liger"));
    let reasons = unpatched["reasons"].to_string();
    assert!(
        reasons.contains("no layer kernels for starcoder2"),
        "{reasons}"
    );
    assert_eq!(
        unpatched["per_device"]["total"],
        run(args(path, "standard"))["per_device"]["total"]
    );
    let mut triton = args("llama-3.1-70b", "liger");
    *triton.last_mut().unwrap() = "triton".to_string();
    bad_input(
        &triton.iter().map(String::as_str).collect::<Vec<_>>(),
        "--kernels",
    );
}

/// Issue 38: QLoRA of an MoE counts its routed experts as transformers 5 loads them in 4 bits:
/// unquantized, FP32 after PEFT's preparation. fms-acceleration's Mixtral 8x7B QLoRA recipe
/// (r16 on q, k, v, o, 4096 x 4), which fit one A100 in 40 GiB on transformers 4.48, is
/// refused there and the reasons say why; a dense model's QLoRA says nothing of experts.
#[test]
fn qlora_of_an_moe_counts_its_experts_unquantized() {
    let args = |model: &'static str| {
        vec![
            "--model",
            model,
            "--hardware",
            "1x1xA100-80GB",
            "--train",
            "qlora",
            "--lora-targets",
            "q,k,v,o",
            "--seq-len",
            "4096",
            "--micro-batch",
            "4",
        ]
    };
    let (code, mixtral) = json(&args("mixtral-8x7b"));
    assert_eq!(code, 2, "{mixtral}");
    assert_eq!(mixtral["fits"], false);
    let reasons = mixtral["reasons"].to_string();
    assert!(
        reasons.contains("45.1B routed-expert parameters stay unquantized"),
        "{reasons}"
    );
    assert!(reasons.contains("experts_implementation"), "{reasons}");
    let (code, dense) = json(&args("mistral-7b-v0.1"));
    assert_eq!(code, 0, "{dense}");
    assert!(!dense["reasons"].to_string().contains("routed-expert"));
}

/// Issue 38: YaRN asked for on a preset lengthens its context and the emitted arguments apply
/// it: Qwen3-8B at 131,072 tokens (its model card: factor 4 over 32,768) is refused without
/// it and planned with it; today's vLLM takes `--hf-overrides`, vLLM before 0.12
/// `--rope-scaling`, SGLang `--json-model-override-args`.
#[test]
fn rope_scaling_lengthens_the_context_and_reaches_the_engine() {
    let base = [
        "--model",
        "qwen3-8b",
        "--hardware",
        "1x1xH100",
        "--context",
        "131072",
    ];
    let out = hwaccel(&base);
    assert_eq!(
        out.status.code(),
        Some(1),
        "beyond 40,960 tokens without scaling"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("exceeds qwen3-8b's maximum"));
    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--rope-scaling", "yarn:4:32768"])
        .collect();
    let (code, plan) = json(&args);
    assert_eq!(code, 0, "{plan}");
    let vllm = plan["engine"]["vllm"].to_string();
    let sglang = plan["engine"]["sglang"].to_string();
    assert!(
        vllm.contains("--hf-overrides") && vllm.contains("original_max_position_embeddings"),
        "{vllm}"
    );
    assert!(vllm.contains("131072"), "{vllm}");
    assert!(
        sglang.contains("--json-model-override-args") && sglang.contains("yarn"),
        "{sglang}"
    );
    let old: Vec<&str> = args
        .iter()
        .copied()
        .chain(["--engine-version", "0.10.1.1"])
        .collect();
    let (code, plan) = json(&old);
    assert_eq!(code, 0, "{plan}");
    let vllm = plan["engine"]["vllm"].to_string();
    assert!(
        vllm.contains("--rope-scaling") && !vllm.contains("--hf-overrides"),
        "{vllm}"
    );
    assert_eq!(plan["engine"]["version"], "0.10.1.1");
    bad_input(
        &[&base[..], &["--rope-scaling", "linear:2"]].concat(),
        "--rope-scaling",
    );
}

/// Issue 39: GPUs a driver publishes shareable by memory (`fixtures/dra/nvidia-h100-shareable.yaml`,
/// 80Gi in 8Gi steps) give a small model a share sized to it, rounded to the policy, with the
/// engine's budget sized to the share; the same model planned from an inventory alone (no
/// driver says the GPUs are shareable) takes a whole device as before, and so does a model
/// that needs more than one device.
#[test]
fn shareable_slices_give_a_small_model_a_share_and_an_inventory_alone_a_whole_device() {
    let small = |source: &str, path: &str, extra: &[&str]| {
        let mut args = vec![
            "--model",
            "llama-3.1-8b",
            "--precision",
            "bf16",
            "--context",
            "8192",
            "--concurrency",
            "4",
            source,
            path,
        ];
        args.extend_from_slice(extra);
        json(&args)
    };
    let shareable = "fixtures/dra/nvidia-h100-shareable.yaml";
    let (code, plan) = small("--resource-slices", shareable, &[]);
    assert_eq!(code, 0, "{plan}");
    let fraction = &plan["fraction"];
    assert_eq!(fraction["kind"], "share", "{plan}");
    assert_eq!(fraction["device_bytes"], 80u64 << 30);
    let share = fraction["bytes"].as_u64().unwrap();
    let total = plan["per_device"]["total"].as_u64().unwrap();
    assert_eq!(share % (8 << 30), 0, "a multiple of the policy's 8Gi step");
    assert!(share >= total + (512 << 20) && share < total + (512 << 20) + (8 << 30));
    let util = plan["gpu_memory_utilization"].as_f64().unwrap();
    assert!(util < 0.5, "{util}");
    let vllm = plan["engine"]["vllm"].as_array().unwrap();
    assert!(
        vllm.windows(2)
            .any(|w| w[0] == "--gpu-memory-utilization" && w[1] == format!("{util:.3}").as_str()),
        "{vllm:?}"
    );
    assert!(plan["max_concurrency"].as_u64().unwrap() >= 4);
    let out = hwaccel(&["--model", "llama-3.1-8b", "--resource-slices", shareable]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("FRACTION share: "), "{table}");

    // Whole devices when asked, for a model that spans devices, and from an inventory alone.
    let (code, plan) = small("--resource-slices", shareable, &["--whole-devices"]);
    assert_eq!(code, 0, "{plan}");
    assert_eq!(plan["fraction"]["kind"], "device", "{plan}");
    assert_eq!(plan["fraction"]["bytes"], 80u64 << 30);
    let (code, plan) = json(&[
        "--model",
        "llama-3.1-70b",
        "--precision",
        "bf16",
        "--context",
        "8192",
        "--resource-slices",
        shareable,
    ]);
    assert_eq!(code, 0, "{plan}");
    assert_eq!(plan["fraction"]["kind"], "device", "{plan}");
    let (code, plan) = small(
        "--inventory",
        "fixtures/golden/h100-8x-nvswitch.inventory.yaml",
        &[],
    );
    assert_eq!(code, 0, "{plan}");
    assert!(plan.get("fraction").is_none(), "{plan}");
    assert!(plan["gpu_memory_utilization"].as_f64().unwrap() > 0.85);
}

/// Issue 39: on a node whose driver publishes MIG partitions (dynamic MIG,
/// `fixtures/dra/nvidia-h100-dynamic-mig.yaml`) a small model takes the smallest profile that
/// holds it, named by its DRA device.
#[test]
fn a_small_model_takes_the_smallest_mig_profile_that_holds_it() {
    let (code, plan) = json(&[
        "--model",
        "llama-3.1-8b",
        "--precision",
        "bf16",
        "--context",
        "8192",
        "--concurrency",
        "4",
        "--resource-slices",
        "fixtures/dra/nvidia-h100-dynamic-mig.yaml",
    ]);
    assert_eq!(code, 0, "{plan}");
    assert_eq!(plan["fraction"]["kind"], "partition", "{plan}");
    assert_eq!(plan["fraction"]["profile"], "3g.40gb");
    let chosen = dra_devices(&plan);
    assert_eq!(chosen.len(), 1);
    assert!(chosen[0].2.contains("-mig-3g40gb-"), "{chosen:?}");
}

/// Issue 39: AMD's partitions. The 2026 layout's node (`fixtures/dra/amd-mi300x-2026.yaml`)
/// has one GPU partitioned on the node (DPX, two 98,296 MiB partitions, no whole entry) beside
/// whole MI300X: a small model takes a partition of it, named by its DRA device; a model no
/// partition holds, and a request for whole devices, take a whole GPU.
#[test]
fn a_small_model_takes_a_partition_of_a_gpu_partitioned_on_its_node() {
    let run = |model: &str, extra: &[&str]| {
        let mut args = vec![
            "--model",
            model,
            "--precision",
            "bf16",
            "--context",
            "8192",
            "--concurrency",
            "4",
            "--resource-slices",
            "fixtures/dra/amd-mi300x-2026.yaml",
        ];
        args.extend_from_slice(extra);
        let (code, plan) = json(&args);
        assert_eq!(code, 0, "{plan}");
        plan
    };
    let plan = run("llama-3.1-8b", &[]);
    assert_eq!(plan["fraction"]["kind"], "partition", "{plan}");
    assert_eq!(plan["fraction"]["profile"], "dpx_nps2");
    assert_eq!(plan["fraction"]["bytes"], 98_296u64 << 20);
    assert_eq!(plan["fraction"]["device_bytes"], 196_592u64 << 20);
    let chosen = dra_devices(&plan);
    assert_eq!(chosen.len(), 1);
    assert!(
        ["gpu-3-130", "gpu-9-136"].contains(&chosen[0].2.rsplit('/').next().unwrap()),
        "{chosen:?}"
    );
    for plan in [
        run("llama-3.1-70b", &[]),
        run("llama-3.1-8b", &["--whole-devices"]),
    ] {
        assert!(plan.get("fraction").is_none(), "{plan}");
        let chosen = dra_devices(&plan);
        assert!(
            chosen.iter().all(
                |(_, _, device)| device.ends_with("gpu-1-128") || device.ends_with("gpu-4-131")
            ),
            "{chosen:?}"
        );
    }
}

/// Issue 39: `--emit` of a plan on a fraction asks for the fraction, not a whole GPU. A share
/// comes with a ResourceClaimTemplate requesting the share's memory of the DRA driver (a
/// device plugin only hands out whole devices), which each pod names; a MIG partition asks
/// NVIDIA's device plugin for the profile's own resource (`mixed` MIG strategy); with
/// `--whole-devices` it is `nvidia.com/gpu` again; an AMD partition, which no device plugin
/// resource names, comes with a ResourceClaimTemplate asking `gpu.amd.com` for its profile.
#[test]
fn emit_of_a_fraction_asks_for_the_fraction() {
    let emit = |slices: &str, extra: &[&str]| -> Value {
        let mut args = vec![
            "--model",
            "llama-3.1-8b",
            "--precision",
            "bf16",
            "--context",
            "8192",
            "--concurrency",
            "4",
            "--resource-slices",
            slices,
            "--emit",
            "deployment",
            "--namespace",
            "ml",
            "-o",
            "json",
        ];
        args.extend_from_slice(extra);
        let out = hwaccel(&args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let (_, plan) = json(&[
        "--model",
        "llama-3.1-8b",
        "--precision",
        "bf16",
        "--context",
        "8192",
        "--concurrency",
        "4",
        "--resource-slices",
        "fixtures/dra/nvidia-h100-shareable.yaml",
    ]);
    let share = plan["fraction"]["bytes"].as_u64().unwrap();

    let list = emit("fixtures/dra/nvidia-h100-shareable.yaml", &[]);
    assert_eq!(list["kind"], "List", "{list}");
    let template = &list["items"][0];
    assert_eq!(template["kind"], "ResourceClaimTemplate", "{list}");
    assert_eq!(template["metadata"]["namespace"], "ml");
    let subrequest = &template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0];
    assert_eq!(subrequest["count"], 1, "{template}");
    let asked = subrequest["capacity"]["requests"]["memory"]
        .as_str()
        .unwrap();
    assert_eq!(
        asked,
        hwaccel::api::quantity::bytes(share).0,
        "the plan's share: {template}"
    );
    let deployment = &list["items"][1];
    assert_eq!(deployment["kind"], "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["resourceClaims"][0]["resourceClaimTemplateName"],
        template["metadata"]["name"]
    );
    let container = &pod["containers"][0];
    assert_eq!(
        container["resources"]["claims"][0]["name"],
        pod["resourceClaims"][0]["name"]
    );
    assert!(container["resources"]["limits"].is_null(), "{container}");
    assert!(pod["affinity"]["nodeAffinity"].is_object(), "{pod}");

    let mig = emit("fixtures/dra/nvidia-h100-dynamic-mig.yaml", &[]);
    assert_eq!(mig["kind"], "Deployment", "{mig}");
    let limits = &mig["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"];
    assert_eq!(limits["nvidia.com/mig-3g.40gb"], "1", "{limits}");
    let whole = emit(
        "fixtures/dra/nvidia-h100-dynamic-mig.yaml",
        &["--whole-devices"],
    );
    let limits = &whole["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"];
    assert_eq!(limits["nvidia.com/gpu"], "1", "{limits}");

    // An AMD partition: no device plugin resource names one, so the pod's claim asks the DRA
    // driver's class for the profile.
    let amd = emit("fixtures/dra/amd-mi300x-2026.yaml", &[]);
    assert_eq!(amd["kind"], "List", "{amd}");
    let template = &amd["items"][0];
    assert_eq!(template["kind"], "ResourceClaimTemplate", "{amd}");
    assert!(
        template["metadata"]["name"]
            .as_str()
            .unwrap()
            .ends_with("-partition"),
        "{template}"
    );
    let subrequest = &template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0];
    assert_eq!(subrequest["deviceClassName"], "gpu.amd.com", "{template}");
    let cel = subrequest["selectors"][0]["cel"]["expression"]
        .as_str()
        .unwrap();
    assert!(cel.contains("partitionProfile == 'dpx_nps2'"), "{cel}");
    let pod = &amd["items"][1]["spec"]["template"]["spec"];
    assert_eq!(pod["resourceClaims"][0]["name"], "accelerator-partition");
    assert_eq!(
        pod["resourceClaims"][0]["resourceClaimTemplateName"],
        template["metadata"]["name"]
    );
}

/// A plan that shards a frozen base with ZeRO-3 says what it added for the sharding and that
/// only published FSDP runs checked it; a plan on one device does not.
#[test]
fn a_zero3_plan_states_what_sharding_adds() {
    let plan = |model: &str| {
        let (code, plan) = json(&[
            "--model",
            model,
            "--hardware",
            "1x8xH100",
            "--train",
            "lora",
            "--seq-len",
            "4096",
        ]);
        assert_eq!(code, 0, "{plan}");
        plan
    };
    let sharded = plan("llama-3.1-70b");
    assert_eq!(sharded["training"]["zero_stage"], 3, "{sharded}");
    assert!(sharded["devices"].as_u64().unwrap_or(0) > 1, "{sharded}");
    let reasons = sharded["reasons"].to_string();
    assert!(
        reasons.contains("zero-3: each layer gathered as stored")
            && reasons.contains("3.5 bytes per hidden unit")
            && reasons.contains("50 % of the checkpointed"),
        "{reasons}"
    );
    let one = plan("llama-3.1-8b");
    assert_eq!(one["devices"], 1, "{one}");
    assert!(!one["reasons"].to_string().contains("zero-3:"), "{one}");
}
