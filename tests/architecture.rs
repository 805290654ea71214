//! The layering rules of `DESIGN.md`, checked on the source: the pure core (`hardware`,
//! `detect`, `plan`, `labels`, `names`, `fleet`) names no Kubernetes, async-runtime or command-line crate and
//! none of the crate's Kubernetes-facing modules, and the controller's pure cores (the shared
//! `controller/core` and each loop's own: `controller/placement/core`,
//! `controller/fleet/core`, `controller/taints/core.rs`) name no client, runtime or
//! command-line crate.
//!
//! `make check` also compiles the library without its default features, which leaves the
//! Kubernetes crates out altogether; this test says *which line* broke the rule, and covers
//! the controller's cores, which that build cannot (they sit inside a Kubernetes-facing
//! module).

use std::fs;
use std::path::{Path, PathBuf};

/// Crates the pure core must not name.
const CLUSTER_CRATES: &[&str] = &["kube", "k8s_openapi", "tokio", "clap"];
/// The crate's own modules that talk to Kubernetes or parse command lines.
const CLUSTER_MODULES: &[&str] = &[
    "api",
    "agent",
    "cleanup",
    "cli",
    "controller",
    "health",
    "kube_client",
    "server",
    "shutdown",
    "signals",
    "telemetry",
];

/// The controller's pure cores: the one every loop shares and each loop's own, beside its
/// driver. A loop whose core is one file names that file.
const CONTROLLER_CORES: &[&str] = &[
    "src/controller/core",
    "src/controller/placement/core",
    "src/controller/fleet/core",
    "src/controller/taints/core.rs",
];

/// The Rust files at `dir`: the file itself when it is one, else every file beneath it.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    if dir.is_file() {
        return vec![dir.to_path_buf()];
    }
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// True when `code` (one line, comments stripped) names `root` as a path root: `root::`,
/// `use root` or `root as`.
fn names_root(code: &str, root: &str) -> bool {
    let bytes = code.as_bytes();
    code.match_indices(root).any(|(at, _)| {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let boundary_before =
            before.is_none_or(|b| !(b.is_ascii_alphanumeric() || b == b'_' || b == b':'));
        let rest = &code[at + root.len()..];
        boundary_before
            && (rest.starts_with("::")
                || (code[..at].trim_end().ends_with("use") && !rest.starts_with('_')))
    })
}

/// The lines under `dir` that name one of `crates` or one of the crate's `modules`.
fn violations(dir: &str, crates: &[&str], modules: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut found = Vec::new();
    for file in rust_files(&root) {
        let text = fs::read_to_string(&file).unwrap_or_default();
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            let crate_hit = crates.iter().find(|c| names_root(code, c));
            let module_hit = modules.iter().find(|m| {
                code.contains(&format!("crate::{m}::"))
                    || code.contains(&format!("crate::{m};"))
                    || code.contains(&format!("hwaccel::{m}::"))
            });
            if let Some(hit) = crate_hit.or(module_hit) {
                let shown = file
                    .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                    .unwrap_or(&file);
                found.push(format!(
                    "{}:{}: names `{hit}`: {}",
                    shown.display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    found
}

#[test]
fn the_pure_core_names_no_kubernetes_runtime_or_cli_code() {
    let mut found = Vec::new();
    for dir in [
        "src/hardware",
        "src/detect",
        "src/plan",
        "src/labels",
        "src/names",
        "src/fleet",
    ] {
        found.extend(violations(dir, CLUSTER_CRATES, CLUSTER_MODULES));
    }
    assert!(
        found.is_empty(),
        "the pure core must stay pure:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_controller_cores_name_no_client_runtime_or_cli() {
    let mut found = Vec::new();
    for dir in CONTROLLER_CORES {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        // A core that moved without this list following would be checked by nobody.
        assert!(path.exists(), "{dir} is gone: update CONTROLLER_CORES");
        found.extend(violations(
            dir,
            &["kube", "tokio", "clap", "futures"],
            &["agent", "cli", "kube_client", "server"],
        ));
    }
    assert!(
        found.is_empty(),
        "the controller's cores must stay pure:\n{}",
        found.join("\n")
    );
}

#[test]
fn every_controller_loop_core_is_checked() {
    // A new loop folder with a core that nobody added to the list would go unchecked.
    let controller = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/controller");
    for entry in fs::read_dir(&controller).expect("src/controller").flatten() {
        let path = entry.path();
        for core in [path.join("core"), path.join("core.rs")] {
            if path.is_dir() && core.exists() {
                let shown = core
                    .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                    .unwrap_or(&core)
                    .to_string_lossy()
                    .trim_start_matches('/')
                    .to_string();
                assert!(
                    CONTROLLER_CORES.contains(&shown.as_str()),
                    "{shown} is a loop's pure core that CONTROLLER_CORES does not list"
                );
            }
        }
    }
}

#[test]
fn the_checker_sees_each_kind_of_reference() {
    assert!(names_root("use kube::Client;", "kube"));
    assert!(names_root("    let t = tokio::time::sleep(d);", "tokio"));
    assert!(names_root("#[derive(clap::ValueEnum)]", "clap"));
    assert!(names_root("use clap;", "clap"));
    assert!(!names_root("use crate::kube_client::build;", "kube"));
    assert!(!names_root("let kube = 1;", "kube"));
    assert!(!names_root("fn is_kube(x: u8) {}", "kube"));
    assert!(!names_root("use crate::plan::tokio_like::X;", "tokio"));
}
