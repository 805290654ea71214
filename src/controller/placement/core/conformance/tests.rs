//! Conformance on command lines shaped as `hwaccel plan --emit` writes them (`vllm serve
//! <model> <status.engine.vllm...>`, SGLang's `python3 -m sglang.launch_server`) and as people
//! edit them.

use super::*;

/// What the planner writes for a 70B model on two H100s (TP 2), vLLM 0.21.
fn engine() -> EngineStatus {
    EngineStatus {
        engine: Some("vllm".into()),
        image: Some("docker.io/vllm/vllm-openai:v0.21.0".into()),
        model: Some("meta-llama/Llama-3.1-70B-Instruct".into()),
        vllm: [
            "--tensor-parallel-size",
            "2",
            "--pipeline-parallel-size",
            "1",
            "--max-model-len",
            "8192",
            "--gpu-memory-utilization",
            "0.92",
            "--kv-cache-memory-bytes",
            "21474836480",
        ]
        .map(String::from)
        .to_vec(),
        sglang: [
            "--tp-size",
            "2",
            "--pp-size",
            "1",
            "--context-length",
            "8192",
        ]
        .map(String::from)
        .to_vec(),
        ..EngineStatus::default()
    }
}

/// The pod `--emit` renders for [`engine`], holding `held` devices.
fn emitted(name: &str, held: u32) -> PodView {
    let engine = engine();
    let mut argv = vec!["vllm".to_string(), "serve".to_string()];
    argv.extend(engine.model.clone());
    argv.extend(engine.vllm.clone());
    PodView {
        name: name.into(),
        image: engine.image.clone(),
        argv,
        held: Some(held),
        driver: Some("580.95.05".into()),
    }
}

fn reasons(verdict: &Conformance) -> Vec<Drift> {
    verdict.findings.iter().map(|f| f.reason).collect()
}

#[test]
fn the_emitted_pods_run_the_plan() {
    let verdict = judge(&engine(), &[emitted("web-0", 2), emitted("web-1", 2)]);
    assert_eq!(verdict.status(), Some(true), "{verdict:?}");
    assert_eq!(verdict.reason(), "Conformant");
    assert_eq!(verdict.message(), "2 pods run the plan");
}

#[test]
fn fewer_tensor_parallel_ranks_than_held_devices_leave_devices_idle_naming_the_pod() {
    let mut pod = emitted("web-7d9f-abcde", 4);
    let tp = pod
        .argv
        .iter()
        .position(|a| a == "--tensor-parallel-size")
        .unwrap();
    pod.argv[tp + 1] = "2".into();
    let verdict = judge(&engine(), &[pod]);
    assert_eq!(verdict.status(), Some(false));
    assert_eq!(verdict.reason(), "IdleDevices");
    assert_eq!(verdict.idle_devices(), 2);
    assert_eq!(
        verdict.message(),
        "pod web-7d9f-abcde holds 4 devices and starts 2 ranks (TP 2 × PP 1 × DP 1); 2 idle"
    );
}

#[test]
fn more_ranks_than_devices_cannot_start() {
    let mut pod = emitted("web-0", 2);
    pod.argv.extend(["-tp".to_string(), "4".to_string()]);
    let verdict = judge(&engine(), &[pod]);
    assert_eq!(reasons(&verdict), [Drift::ArgsDrift]);
    assert!(
        verdict.message().contains("starts 4 ranks"),
        "{}",
        verdict.message()
    );
}

#[test]
fn another_vendors_image_is_the_wrong_image() {
    let mut pod = emitted("web-0", 2);
    pod.image = Some("docker.io/vllm/vllm-openai-rocm:v0.21.0".into());
    let verdict = judge(&engine(), &[pod]);
    assert_eq!(reasons(&verdict), [Drift::WrongImage]);
    assert!(
        verdict
            .message()
            .contains("(a rocm build); the plan's devices need cuda"),
        "{}",
        verdict.message()
    );
    // A private mirror whose name says nothing is not judged.
    let mut mirrored = emitted("web-0", 2);
    mirrored.image = Some("registry.example.com/ml/serving:3".into());
    assert_eq!(judge(&engine(), &[mirrored]).status(), Some(true));
}

#[test]
fn a_longer_context_or_a_dropped_memory_argument_is_drift() {
    let mut longer = emitted("web-0", 2);
    let len = longer
        .argv
        .iter()
        .position(|a| a == "--max-model-len")
        .unwrap();
    longer.argv[len + 1] = "32768".into();
    let verdict = judge(&engine(), &[longer]);
    assert_eq!(reasons(&verdict), [Drift::ArgsDrift]);
    assert_eq!(
        verdict.message(),
        "pod web-0 runs --max-model-len 32768; the plan 8192"
    );

    let mut dropped = emitted("web-0", 2);
    let at = dropped
        .argv
        .iter()
        .position(|a| a == "--kv-cache-memory-bytes")
        .unwrap();
    dropped.argv.drain(at..at + 2);
    let message = judge(&engine(), &[dropped]).message();
    assert!(
        message.contains("--kv-cache-memory-bytes nothing (the engine's default)"),
        "{message}"
    );

    // `--flag=value`, underscores and a changed utilisation (not compared) are fine.
    let mut spelled = emitted("web-0", 2);
    let len = spelled
        .argv
        .iter()
        .position(|a| a == "--max-model-len")
        .unwrap();
    spelled.argv.drain(len..len + 2);
    spelled.argv.push("--max_model_len=8192".into());
    spelled
        .argv
        .extend(["--gpu-memory-utilization".into(), "0.8".into()]);
    assert_eq!(judge(&engine(), &[spelled]).status(), Some(true));
}

#[test]
fn a_shell_line_and_sglang_are_read_too() {
    let engine = engine();
    let line = format!(
        "bash /vllm-workspace/examples/online_serving/multi-node-serving.sh leader --ray_cluster_size=2; vllm serve {} {} --distributed-executor-backend ray",
        engine.model.clone().unwrap(),
        engine.vllm.join(" ")
    );
    let mut argv = vec!["sh".to_string(), "-c".to_string()];
    argv.extend(shell_words(&line));
    let pod = PodView {
        name: "lws-0".into(),
        image: engine.image.clone(),
        argv,
        held: Some(2),
        driver: None,
    };
    assert_eq!(judge(&engine, &[pod]).status(), Some(true));

    let sglang = PodView {
        name: "sg-0".into(),
        image: Some("docker.io/lmsysorg/sglang:v0.5.20".into()),
        argv: [
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "meta-llama/Llama-3.1-70B-Instruct",
            "--tp-size",
            "2",
            "--pp-size",
            "1",
            "--context-length",
            "8192",
            "--host",
            "0.0.0.0",
        ]
        .map(String::from)
        .to_vec(),
        held: Some(2),
        driver: None,
    };
    assert_eq!(
        judge(&engine, std::slice::from_ref(&sglang)).status(),
        Some(true)
    );
    let mut one = sglang;
    one.argv[6] = "1".into();
    assert_eq!(judge(&engine, &[one]).reason(), "IdleDevices");
}

#[test]
fn without_pods_the_verdict_is_unknown_and_says_where_it_looked() {
    let mut verdict = judge(&engine(), &[]);
    verdict.label = "web".into();
    assert_eq!(verdict.status(), None);
    assert_eq!(verdict.reason(), "NoPods");
    assert!(verdict.message().contains("hwaccel.io/placement=web"));
}

#[test]
fn many_drifted_pods_keep_the_findings_bounded() {
    let pods: Vec<PodView> = (0..40)
        .map(|i| {
            let mut pod = emitted(&format!("web-{i}"), 8);
            pod.name = "x".repeat(300);
            pod
        })
        .collect();
    let verdict = judge(&engine(), &pods);
    assert_eq!(verdict.findings.len(), MAX_FINDINGS);
    assert_eq!(verdict.more, 40 - MAX_FINDINGS);
    assert!(
        verdict.message().len() < 16 * 300,
        "{}",
        verdict.message().len()
    );
}

#[test]
fn shell_words_keep_quoted_text_together() {
    assert_eq!(
        shell_words("vllm serve 'a model' --x \"1 2\";next"),
        ["vllm", "serve", "a model", "--x", "1 2", "next"]
    );
}

#[test]
fn an_image_whose_cuda_the_nodes_driver_cannot_run_is_driver_too_old() {
    let mut old = emitted("web-0", 2);
    old.driver = Some("550.90.07".into());
    let verdict = judge(&engine(), std::slice::from_ref(&old));
    assert_eq!(reasons(&verdict), [Drift::DriverTooOld]);
    assert_eq!(
        verdict.message(),
        "pod web-0 runs docker.io/vllm/vllm-openai:v0.21.0 (CUDA 13, which needs NVIDIA driver \
         580 or newer) on a node with driver 550.90.07"
    );
    // The CUDA 12 build runs there; an unknown driver or tag is not judged.
    let mut cuda12 = old.clone();
    cuda12.image = Some("docker.io/vllm/vllm-openai:v0.20.0".into());
    let mut planned = engine();
    planned.image = cuda12.image.clone();
    assert_eq!(judge(&planned, &[cuda12]).status(), Some(true));
    let mut unknown = old;
    unknown.driver = Some("unknown".into());
    assert_eq!(judge(&engine(), &[unknown]).status(), Some(true));
}
