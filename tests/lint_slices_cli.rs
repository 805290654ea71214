//! `hwaccel lint-slices` as users run it: the vendor-shaped fixtures in `fixtures/dra/` pass
//! with only the anomalies their PROVENANCE says were put there on purpose, and each crafted
//! slice in `fixtures/dra-lint/` is reported with its class and exit code.

// Test helpers panic on setup failures by design; clippy only exempts `#[test]` bodies.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

/// Runs `hwaccel lint-slices -o json FILES…`: the exit code and the report.
fn lint(files: &[String], extra: &[&str]) -> (i32, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_hwaccel"))
        .arg("lint-slices")
        .args(files)
        .args(extra)
        .args(["-o", "json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: {stdout} {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap(), report)
}

/// (class, slice, device) of every finding of `severity`.
fn rows(report: &Value, severity: &str) -> BTreeSet<(String, String, String)> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["severity"] == severity)
        .map(|f| {
            (
                f["class"].as_str().unwrap().to_string(),
                f["slice"].as_str().unwrap().to_string(),
                f["device"].as_str().unwrap_or("-").to_string(),
            )
        })
        .collect()
}

fn fixtures(dir: &str) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "json"))
        .map(|p| p.display().to_string())
        .collect();
    files.sort();
    files
}

#[test]
fn the_vendor_fixtures_have_no_errors_and_only_their_deliberate_anomalies() {
    let files = fixtures("fixtures/dra");
    assert!(files.len() >= 8, "{files:?}");
    let (code, report) = lint(&files, &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["errors"], 0, "{report:#}");
    // PROVENANCE.md: "one GPU's VRAM unreadable (`memory: 0`)" in amd-mi300x-2026.yaml and
    // "unreadable memory (`0Mi`, the unprivileged case)" in intel-max1550-4x.yaml.
    let expected: BTreeSet<(String, String, String)> = [
        ("Sentinel", "mi300x-2026-gpu.amd.com-d3v1c", "gpu-2-129"),
        (
            "Sentinel",
            "max1550-4x-gpu.intel.com-q8w3e",
            "0000-9a-00-0-0x0bd5",
        ),
    ]
    .into_iter()
    .map(|(c, s, d)| (c.to_string(), s.to_string(), d.to_string()))
    .collect();
    assert_eq!(rows(&report, "warning"), expected, "{report:#}");
    assert_eq!(report["warnings"], 2);
    // The Intel fixture keeps the driver's deprecated names: information, not a failure.
    assert!(
        rows(&report, "info")
            .iter()
            .any(|(class, slice, _)| class == "Deprecated" && slice.starts_with("max1550")),
        "{report:#}"
    );
    // --strict makes the two warnings fail the run.
    assert_eq!(lint(&files, &["--strict"]).0, 2);
}

#[test]
fn a_slice_the_apiserver_refuses_fails_with_the_field_named() {
    let (code, report) = lint(
        &["fixtures/dra-lint/refused-driver-version.yaml".into()],
        &[],
    );
    assert_eq!(code, 2, "{report:#}");
    let refused = &report["findings"][0];
    assert_eq!(refused["class"], "Refused");
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("driverVersion") && message.contains("6.10.5.60205"),
        "{message}"
    );
}

#[test]
fn an_empty_slice_fails() {
    let (code, report) = lint(&["fixtures/dra-lint/empty-slice.yaml".into()], &[]);
    assert_eq!(code, 2, "{report:#}");
    assert_eq!(
        rows(&report, "error"),
        BTreeSet::from([(
            "EmptySlice".to_string(),
            "h100-8x-nvswitch-gpu.nvidia.com-empty".to_string(),
            "-".to_string()
        )])
    );
}

#[test]
fn attribute_anomalies_are_warnings_and_names_information() {
    let (code, report) = lint(&["fixtures/dra-lint/attribute-anomalies.yaml".into()], &[]);
    assert_eq!(code, 0, "{report:#}");
    let classes = |severity| -> BTreeSet<String> {
        rows(&report, severity)
            .into_iter()
            .map(|(c, _, _)| c)
            .collect()
    };
    assert_eq!(
        classes("warning"),
        BTreeSet::from(["Sentinel".to_string(), "MissingFact".to_string()])
    );
    assert_eq!(report["warnings"], 3, "{report:#}");
    assert_eq!(
        classes("info"),
        BTreeSet::from(["Deprecated".to_string(), "DriverScoped".to_string()])
    );
}

#[test]
fn an_unreadable_file_exits_1() {
    let out = Command::new(env!("CARGO_BIN_EXE_hwaccel"))
        .args(["lint-slices", "fixtures/dra-lint/no-such-file.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-file.yaml"));
}
