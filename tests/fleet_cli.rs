//! `hwaccel fleet` as users run it on the fixture fleet (`fixtures/fleet/`): two 8x H100
//! NVSwitch nodes, one with an unhealthy GPU and one with a GPU missing, a mixed L4/A100 node,
//! and a placement holding four GPUs. Checks the three answers with real numbers, that
//! "more replicas" agrees with `hwaccel plan`, and that the JSON parses.

// Test helpers panic on setup failures by design; clippy only exempts `#[test]` bodies.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

use serde_json::{Value, json};

const INVENTORIES: &str = "fixtures/fleet/inventories";
const PLACEMENTS: &str = "fixtures/fleet/placements.yaml";

fn hwaccel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hwaccel"))
        .args(args)
        .output()
        .unwrap()
}

fn fleet(extra: &[&str]) -> Output {
    let mut args = vec![
        "fleet",
        "--inventory",
        INVENTORIES,
        "--placements",
        PLACEMENTS,
    ];
    args.extend(extra);
    hwaccel(&args)
}

fn fleet_json(extra: &[&str]) -> Value {
    let mut args = extra.to_vec();
    args.extend(["-o", "json"]);
    let out = fleet(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn h100(report: &Value) -> &Value {
    report["health"]["products"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["product"] == "NVIDIA H100 80GB HBM3")
        .expect("an H100 row")
}

#[test]
fn sick_or_missing_counts_the_unhealthy_the_missing_and_the_held() {
    let report = fleet_json(&["--model", "llama-3.1-8b", "--context", "8192"]);
    let h = h100(&report);
    // 8 + 7 present; one unhealthy; one missing on gpu-h100-1; 4 held by the placement.
    assert_eq!(h["devices"], 15);
    assert_eq!(h["healthy"], 14);
    assert_eq!(h["unhealthy"], 1);
    assert_eq!(h["missing"], 1);
    assert_eq!(h["reserved"], 4);
    assert_eq!(h["free"], 10);
    assert_eq!(
        report["placements"], 1,
        "the Pending placement holds nothing"
    );
    let nodes = report["health"]["nodes"].as_array().unwrap();
    let sick = &nodes[0];
    assert_eq!(sick["name"], "gpu-h100-0");
    let unhealthy = &sick["attention"][0];
    assert_eq!(unhealthy["name"], "gpu-0000-5d-00-0");
    assert_eq!(unhealthy["health"], "unhealthy");
    assert_eq!(unhealthy["use"]["kind"], "unusable");
    assert!(
        unhealthy["healthReasons"][0]
            .as_str()
            .unwrap()
            .contains("2 uncorrected ECC"),
        "{sick}"
    );
    assert_eq!(h["degraded"], 0);
    assert_eq!(nodes[1]["missing"], 1);
    assert_eq!(nodes[1]["expected"], 8);

    let table = String::from_utf8(fleet(&["--model", "llama-3.1-8b"]).stdout).unwrap();
    assert!(table.contains("Sick or missing"), "{table}");
    assert!(
        table.contains("gpu-h100-0: gpu-0000-5d-00-0 unhealthy"),
        "{table}"
    );
    assert!(
        table.contains("gpu-h100-1: 1 missing (expected 8, present 7)"),
        "{table}"
    );
}

/// What `hwaccel plan` says about `replicas` replicas on the same fleet, with the placement's
/// devices reserved.
fn plan_fits(model: &str, replicas: u32) -> bool {
    let replicas = replicas.to_string();
    let mut args = vec![
        "plan",
        "--model",
        model,
        "--context",
        "8192",
        "--replicas",
        &replicas,
        "--concurrency",
        &replicas,
        "--inventory",
        INVENTORIES,
        "-o",
        "json",
    ];
    // `hwaccel plan` names inventory devices by PCI bus id; the placement holds these four.
    for held in [
        "gpu-h100-1/0000:18:00.0",
        "gpu-h100-1/0000:2a:00.0",
        "gpu-h100-1/0000:3a:00.0",
        "gpu-h100-1/0000:5d:00.0",
    ] {
        args.extend(["--reserved", held]);
    }
    let out = hwaccel(&args);
    let code = out.status.code().unwrap();
    assert!(
        code == 0 || code == 2,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    code == 0
}

#[test]
fn what_fits_now_agrees_with_hwaccel_plan() {
    let report = fleet_json(&["--model", "llama-3.1-70b", "--context", "8192"]);
    let answer = &report["capacity"][0];
    let more = answer["moreReplicas"].as_u64().unwrap() as u32;
    assert!(more >= 1, "{answer}");
    assert!(plan_fits("llama-3.1-70b", more), "{more} should plan");
    assert!(
        !plan_fits("llama-3.1-70b", more + 1),
        "{} should not plan",
        more + 1
    );
    // The free L4s and the A100 cannot hold a 70B replica: stranded, by name.
    let stranded: Vec<&str> = answer["stranded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["product"].as_str().unwrap())
        .collect();
    assert!(stranded.contains(&"NVIDIA L4"), "{stranded:?}");
    // Every free device is either packed with replicas or stranded.
    let packed: u64 = answer["packing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["devices"].as_u64().unwrap())
        .sum();
    assert_eq!(
        answer["strandedDevices"].as_u64().unwrap() + packed,
        13,
        "{answer}"
    );
}

#[test]
fn a_model_that_does_not_fit_gets_nodes_to_add() {
    let report = fleet_json(&[
        "--model",
        "llama-3.1-405b",
        "--precision",
        "bf16",
        "--context",
        "8192",
    ]);
    let answer = &report["capacity"][0];
    assert_eq!(answer["moreReplicas"], 0);
    assert_eq!(answer["wanted"], 1);
    let add = &answer["add"];
    assert_eq!(add["shape"]["product"], "NVIDIA H100 80GB HBM3");
    // A node bought new has all 8 GPUs, though both templates lost one.
    assert_eq!(add["shape"]["devicesPerNode"], 8);
    let nodes = add["nodes"].as_u64().unwrap();
    assert!((1..=2).contains(&nodes), "{add}");
    assert_eq!(add["devices"].as_u64().unwrap(), nodes * 8);
    assert_eq!(add["plan"]["fits"], true);
    assert_eq!(add["plan"]["precision"], "bf16");
    let table = String::from_utf8(
        fleet(&[
            "--model",
            "llama-3.1-405b",
            "--precision",
            "bf16",
            "--context",
            "8192",
        ])
        .stdout,
    )
    .unwrap();
    assert!(
        table.contains(&format!(
            "add: {nodes} node(s) like gpu-h100-0 (8× NVIDIA H100 80GB HBM3)"
        )),
        "{table}"
    );
}

#[test]
fn every_preset_view_lists_what_fits_and_parses_as_json_and_yaml() {
    let report = fleet_json(&["--context", "8192"]);
    let answers = report["capacity"].as_array().unwrap();
    assert!(answers.len() > 10, "one answer per preset");
    let small = answers
        .iter()
        .find(|a| a["model"] == "llama-3.1-8b")
        .unwrap();
    // 10 free H100s hold one 8B replica each; the L4s and the A100 hold more.
    assert_eq!(small["moreReplicas"], 10);
    assert!(small["totalReplicas"].as_u64().unwrap() >= 10);
    assert!(report["strandedForEveryModel"].is_array());
    let yaml = fleet(&["-o", "yaml"]);
    assert!(yaml.status.success());
    let text = String::from_utf8(yaml.stdout).unwrap();
    let parsed: Value = serde_saphyr::from_str(&text).unwrap();
    assert!(parsed["health"]["total"]["devices"].as_u64().unwrap() == 18);
    let table = String::from_utf8(fleet(&["--context", "8192"]).stdout).unwrap();
    assert!(table.contains("What fits now"), "{table}");
    assert!(table.contains("llama-3.1-8b"), "{table}");
}

/// Issue 24: the "What fits now" table and `--model` ask the same question the same way
/// (same goal, same precision policy) and say what they assumed, so they give one answer.
#[test]
fn the_table_and_model_give_the_same_answer_and_state_their_assumptions() {
    let every = fleet_json(&["--context", "8192"]);
    for model in ["llama-3.1-70b", "deepseek-v3", "llama-3.1-8b"] {
        let from_table = every["capacity"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["model"] == model)
            .unwrap();
        let one = fleet_json(&["--model", model, "--context", "8192"]);
        let asked = &one["capacity"][0];
        for key in [
            "moreReplicas",
            "totalReplicas",
            "context",
            "precisionAsked",
            "concurrencyPerReplica",
        ] {
            assert_eq!(from_table[key], asked[key], "{model}: {key}");
        }
        assert_eq!(
            from_table["packing"][0]["precision"], asked["packing"][0]["precision"],
            "{model}"
        );
        assert_eq!(asked["context"], 8192);
        assert_eq!(asked["precisionAsked"], "auto");
    }
    let table = String::from_utf8(fleet(&["--context", "8192"]).stdout).unwrap();
    assert!(
        table.contains("assumed: context 8192 tokens, 1 request(s) per replica, precision auto"),
        "{table}"
    );
    assert!(table.contains("PRECISION"), "{table}");
    let one = String::from_utf8(
        fleet(&[
            "--model",
            "llama-3.1-70b",
            "--context",
            "8192",
            "--precision",
            "bf16",
        ])
        .stdout,
    )
    .unwrap();
    assert!(
        one.contains(
            "assumed: context 8192 tokens, 1 request(s) per replica, precision bf16 (asked)"
        ),
        "{one}"
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let out = hwaccel(&["fleet", "--inventory", "fixtures/fleet/nope.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nope.yaml"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let out = fleet(&["--model", "llama-3.1-7b"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("did you mean"));
    let out = fleet(&["--model", "llama-3.1-8b", "--train", "lora"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("serving"));
}

/// Issue 24: a degraded GPU is plannable (it counts free) and shown as degraded: the DEGRADED
/// column, and under "Sick or missing" with its reason.
#[test]
fn a_degraded_gpu_is_free_and_listed_as_degraded() {
    let dir = tempfile::tempdir().unwrap();
    let original = std::fs::read_to_string(format!("{INVENTORIES}/gpu-h100-0.yaml")).unwrap();
    // The first GPU (gpu-0000-18-00-0) turns degraded with one retired page.
    let degraded = original.replacen(
        "      health:\n        string: healthy\n",
        "      health:\n        string: degraded\n      retiredPages:\n        int: 1\n",
        1,
    );
    assert_ne!(degraded, original);
    let path = dir.path().join("gpu-h100-0.yaml");
    std::fs::write(&path, degraded).unwrap();
    let args = [
        "fleet",
        "--inventory",
        path.to_str().unwrap(),
        "--model",
        "llama-3.1-8b",
        "--context",
        "8192",
    ];
    let mut json_args = args.to_vec();
    json_args.extend(["-o", "json"]);
    let out = hwaccel(&json_args);
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let total = &report["health"]["total"];
    assert_eq!(
        (
            &total["devices"],
            &total["healthy"],
            &total["degraded"],
            &total["unhealthy"],
            &total["free"]
        ),
        (&json!(8), &json!(6), &json!(1), &json!(1), &json!(7)),
        "{total}"
    );
    let table = String::from_utf8(hwaccel(&args).stdout).unwrap();
    assert!(table.contains("DEGRADED"), "{table}");
    assert!(
        table.contains("gpu-h100-0: gpu-0000-18-00-0 degraded (1 retired page(s))"),
        "{table}"
    );
    assert!(!table.contains("none: no accelerator"), "{table}");
}

#[test]
fn gpus_no_driver_or_device_plugin_offers_are_named_under_sick_or_missing() {
    let dir = tempfile::tempdir().unwrap();
    let original = std::fs::read_to_string(format!("{INVENTORIES}/gpu-h100-0.yaml")).unwrap();
    // The agent read the Node's allocatable and found no device plugin resource.
    let unoffered = format!("{original}  devicePluginResources: {{}}\n");
    let path = dir.path().join("gpu-h100-0.yaml");
    std::fs::write(&path, unoffered).unwrap();
    let base = [
        "fleet",
        "--inventory",
        path.to_str().unwrap(),
        "--model",
        "llama-3.1-8b",
    ];
    let mut json_args = base.to_vec();
    json_args.extend(["-o", "json"]);
    let out = hwaccel(&json_args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = report["publication"].as_array().expect("publication rows");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["reason"], "NotAdvertised");
    assert_eq!(rows[0]["devices"], 8);
    let table = String::from_utf8_lossy(&hwaccel(&base).stdout).to_string();
    assert!(
        table.contains("DRA publication NotAdvertised: 8 NVIDIA GPUs detected; no DRA driver publishes them and no device plugin advertises them"),
        "{table}"
    );

    // The same inventory with the NVIDIA plugin's resource has nothing to say.
    let offered = format!("{original}  devicePluginResources:\n    nvidia.com/gpu: 8\n");
    std::fs::write(&path, offered).unwrap();
    let out = hwaccel(&json_args);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report.get("publication").is_none(), "{report}");
}
