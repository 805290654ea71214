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

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

mod imports;

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

/// The lines under `dir` (comments cut) that `hit` finds naming something, each as
/// `file:line: names `what`: line`.
fn lines_naming(dir: &str, hit: impl Fn(&str) -> Option<String>) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut found = Vec::new();
    for file in rust_files(&root) {
        let text = fs::read_to_string(&file).unwrap_or_default();
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if let Some(what) = hit(code) {
                let shown = file
                    .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                    .unwrap_or(&file);
                found.push(format!(
                    "{}:{}: names `{what}`: {}",
                    shown.display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    found
}

/// The lines under `dir` that name one of `crates` or one of the crate's `modules`.
fn violations(dir: &str, crates: &[&str], modules: &[&str]) -> Vec<String> {
    lines_naming(dir, |code| {
        let crate_hit = crates.iter().find(|c| names_root(code, c));
        let module_hit = modules.iter().find(|m| {
            code.contains(&format!("crate::{m}::"))
                || code.contains(&format!("crate::{m};"))
                || code.contains(&format!("hwaccel::{m}::"))
        });
        crate_hit.or(module_hit).map(|hit| hit.to_string())
    })
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

/// One line of code: its file, its number, the code before any comment, and whether it is
/// part of an attribute (`#[...]`, over as many lines as its brackets take).
struct CodeLine {
    file: String,
    number: usize,
    code: String,
    in_attribute: bool,
}

/// The non-comment lines of the Rust files under `dir` that are not test code: files named
/// `tests.rs` or `*_tests.rs` are skipped, and a file's lines stop at its inline
/// `#[cfg(test)] mod tests {` (inline test modules close the file, by this codebase's
/// convention).
fn production_lines(dir: &str) -> Vec<CodeLine> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut lines = Vec::new();
    for file in rust_files(&root) {
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let shown = file
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap_or(&file)
            .display()
            .to_string();
        let text = fs::read_to_string(&file).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        // Open brackets of the attribute being read, 0 outside one.
        let mut attribute_depth: i64 = 0;
        for (number, line) in all.iter().enumerate() {
            let next = all.get(number + 1).map_or("", |l| l.trim());
            // An inline test module (`mod tests {`), not a declaration of a test file
            // (`mod reconcile_tests;`), which other modules follow.
            if line.trim() == "#[cfg(test)]" && next.contains("mod ") && next.ends_with('{') {
                break;
            }
            let code = line.split("//").next().unwrap_or_default();
            let starts_attribute = attribute_depth == 0 && code.trim_start().starts_with("#[");
            let in_attribute = starts_attribute || attribute_depth > 0;
            if in_attribute {
                attribute_depth += code.matches('[').count() as i64;
                attribute_depth -= code.matches(']').count() as i64;
                attribute_depth = attribute_depth.max(0);
            }
            if !code.trim().is_empty() {
                lines.push(CodeLine {
                    file: shown.clone(),
                    number: number + 1,
                    code: code.to_string(),
                    in_attribute,
                });
            }
        }
    }
    lines
}

/// True when `code` names the module path `path` itself (not one that only starts with it,
/// like `controller::fleet_loop` for `controller::fleet`).
fn names_module(code: &str, path: &str) -> bool {
    code.match_indices(path).any(|(at, _)| {
        !code[at + path.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// The lines under `dir` (tests included: a test that reaches into another loop ties the two
/// as much as code does) that name one of `paths`.
fn naming(dir: &str, paths: &[&str]) -> Vec<String> {
    lines_naming(dir, |code| {
        paths
            .iter()
            .find(|path| names_module(code, path))
            .map(|path| path.to_string())
    })
}

#[test]
fn the_controller_loops_do_not_import_each_other() {
    // The fleet loop's figures reach the taint pass through `controller/fleet_loop.rs`, and
    // Node Events through `controller/node_events.rs`; a test across loops sits above them.
    let mut found = naming(
        "src/controller/placement",
        &["controller::fleet", "controller::taints"],
    );
    found.extend(naming(
        "src/controller/fleet",
        &["controller::taints", "controller::placement"],
    ));
    found.extend(naming(
        "src/controller/taints",
        &["controller::fleet", "controller::placement"],
    ));
    assert!(
        found.is_empty(),
        "a controller loop imports another:\n{}",
        found.join("\n")
    );
}

/// The controller's shared files, which name no loop: what every loop builds on. Only
/// `mod.rs` and `fleet_loop.rs` (which run the loops) and the tests across loops name them.
const SHARED_CONTROLLER_FILES: &[&str] = &[
    "src/controller/cache.rs",
    "src/controller/context.rs",
    "src/controller/core",
    "src/controller/crds.rs",
    "src/controller/dra_watch.rs",
    "src/controller/events.rs",
    "src/controller/inventory_changes.rs",
    "src/controller/leader.rs",
    "src/controller/metrics",
    "src/controller/metrics.rs",
    "src/controller/node_changes.rs",
    "src/controller/node_events.rs",
    "src/controller/passes.rs",
];

#[test]
fn the_controllers_shared_files_name_no_loop() {
    let mut found = Vec::new();
    for file in SHARED_CONTROLLER_FILES {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        assert!(
            path.exists(),
            "{file} is gone: update SHARED_CONTROLLER_FILES"
        );
        found.extend(naming(
            file,
            &[
                "controller::placement",
                "controller::fleet",
                "controller::taints",
                "super::placement",
                "super::fleet",
                "super::taints",
            ],
        ));
    }
    assert!(
        found.is_empty(),
        "a shared controller file reads a loop:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_planners_answer_and_its_layer_stay_below_the_search_and_the_fleet_view() {
    // `plan/report.rs` is the answer as data: the search builds it, never the reverse. The
    // planner sits below the fleet view (`src/fleet`), which calls it; the device-state rule
    // both read lives in `hardware/`.
    let mut found = naming("src/plan/report.rs", &["plan::search", "super::search"]);
    found.extend(naming("src/plan", &["crate::fleet"]));
    assert!(
        found.is_empty(),
        "the planner imports upward:\n{}",
        found.join("\n")
    );
}

#[test]
fn wire_names_are_written_only_in_the_registry() {
    // Every `hwaccel.io` name the operator writes or matches comes from `names::keys`; a
    // literal elsewhere is a key that can drift from the admission policies and the docs.
    // Attributes are exempt (a derive's `group = "..."` must be a literal; a test in `api`
    // checks it against the registry).
    let found: Vec<String> = production_lines("src")
        .into_iter()
        .filter(|line| {
            !line.file.starts_with("src/names/")
                && !line.file.starts_with("src/testing/")
                && !line.file.starts_with("src/fuzz_tests/")
                && !line.in_attribute
                && line.code.contains("hwaccel.io")
        })
        .map(|line| format!("{}:{}: {}", line.file, line.number, line.code.trim()))
        .collect();
    assert!(
        found.is_empty(),
        "hwaccel.io names outside src/names/keys.rs:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_chart_admission_policies_name_only_registered_keys() {
    let policy = fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/charts/hwaccel-operator/templates/admission-policy.yaml"
    ))
    .expect("the admission policies");
    let mut names = Vec::new();
    for (at, _) in policy.match_indices("hwaccel.io") {
        let start = policy[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-'))
            .map_or(0, |i| i + 1);
        let end = policy[at..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || "./-_".contains(c)))
            .map_or(policy.len(), |i| at + i);
        names.push(policy[start..end].trim_end_matches('.').to_string());
    }
    assert!(names.len() > 20, "the policies name our keys: {names:?}");
    let unregistered: Vec<&String> = names
        .iter()
        .filter(|name| !hwaccel::names::keys::is_registered(name))
        .collect();
    assert!(
        unregistered.is_empty(),
        "the admission policies name keys the registry does not list: {unregistered:?}"
    );
}

#[test]
fn the_module_checker_tells_a_module_from_one_that_starts_like_it() {
    assert!(names_module(
        "use crate::controller::fleet::pass;",
        "controller::fleet"
    ));
    assert!(names_module(
        "use crate::controller::fleet;",
        "controller::fleet"
    ));
    assert!(!names_module(
        "use crate::controller::fleet_loop::run;",
        "controller::fleet"
    ));
}

#[test]
fn the_api_names_nothing_of_the_planner() {
    // The CRD types keep their own enums (`api::placement::PrecisionChoice`, ...): a planner
    // change must not change the CRD. Where the API meets the planner is above both:
    // `dra::inventory_node` and `controller::placement::core::plan_input`.
    let found = naming("src/api", &["crate::plan", "hwaccel::plan"]);
    assert!(
        found.is_empty(),
        "the API names the planner:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_import_circle_spans_more_than_two_files_and_none_is_inside_the_controller() {
    let graph = imports::Graph::of_src();
    assert!(
        graph.edges.len() > 200,
        "the import reader found only {} files",
        graph.edges.len()
    );
    let arrows: usize = graph.edges.values().map(|targets| targets.len()).sum();
    assert!(arrows > 600, "the import reader found only {arrows} arrows");
    let bad: Vec<String> = graph
        .circles()
        .into_iter()
        .filter(|circle| {
            circle.len() > 2
                || circle
                    .iter()
                    .any(|file| file.starts_with("src/controller/"))
        })
        .map(|circle| circle.into_iter().collect::<Vec<_>>().join(" <-> "))
        .collect();
    assert!(
        bad.is_empty(),
        "import circles (of more than two files, or inside the controller):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_import_reader_sees_use_trees_reexports_and_known_circles() {
    assert_eq!(
        imports::expand("crate::plan::{engine::{self, EngineSettings}, report::Plan as P}"),
        [
            "crate::plan::engine",
            "crate::plan::engine::EngineSettings",
            "crate::plan::report::Plan",
        ]
    );
    let graph = imports::Graph::of_src();
    let imports_of = |file: &str| graph.edges.get(file).cloned().unwrap_or_default();
    // A path through a re-export reaches the file that defines the item: `crate::plan::Plan`
    // is `plan/report.rs`, which the plan's entry point re-exports.
    assert!(imports_of("src/cli/plan.rs").contains("src/plan/report.rs"));
    // `use super::...` in a child reaches its parent.
    assert!(imports_of("src/dra/counters.rs").contains("src/dra/pools.rs"));
    // Circles are found: a three-file circle and a two-file one, beside a file outside both.
    let edges = [
        ("a", &["b"][..]),
        ("b", &["c"][..]),
        ("c", &["a", "d"][..]),
        ("d", &[][..]),
        ("e", &["f"][..]),
        ("f", &["e"][..]),
    ]
    .into_iter()
    .map(|(file, to)| {
        (
            file.to_string(),
            to.iter()
                .map(|t| t.to_string())
                .collect::<BTreeSet<String>>(),
        )
    })
    .collect();
    let mut circles = imports::Graph { edges }.circles();
    circles.sort();
    assert_eq!(
        circles,
        [
            BTreeSet::from(["a", "b", "c"].map(String::from)),
            BTreeSet::from(["e", "f"].map(String::from)),
        ]
    );
}

/// The top-level modules, lowest first: a module may name only modules in earlier rows (and
/// its own). A row holds modules that name none of each other. `DESIGN.md` and
/// docs/architecture.md draw the same order.
const LAYERS: &[&[&str]] = &[
    &["hardware", "names", "output", "duration", "backoff"],
    &["detect"],
    &["labels"],
    &["plan"],
    &["fleet"],
    &["api"],
    &["dra"],
    &["health", "kube_client", "signals", "telemetry"],
    &["server", "shutdown"],
    &["agent"],
    &["controller"],
    &["cleanup"],
    &["cli"],
    &["main"],
];

#[test]
fn no_module_imports_one_above_it() {
    let layer_of = |module: &str| LAYERS.iter().position(|row| row.contains(&module));
    let mut found = Vec::new();
    let mut unknown = BTreeSet::new();
    for line in production_lines("src") {
        let module = line
            .file
            .trim_start_matches("src/")
            .split(['/', '.'])
            .next()
            .unwrap_or_default()
            .to_string();
        if matches!(module.as_str(), "lib" | "testing" | "fuzz_tests") {
            continue;
        }
        let Some(own) = layer_of(&module) else {
            unknown.insert(module);
            continue;
        };
        for (at, _) in line.code.match_indices("crate::") {
            let named: String = line.code[at + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if named == module || named.is_empty() {
                continue;
            }
            match layer_of(&named) {
                Some(layer) if layer < own => {}
                Some(_) => found.push(format!(
                    "{}:{}: {module} names {named}: {}",
                    line.file,
                    line.number,
                    line.code.trim()
                )),
                None => {
                    unknown.insert(named);
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "modules missing from LAYERS: {unknown:?}"
    );
    assert!(
        found.is_empty(),
        "a module imports one beside or above it:\n{}",
        found.join("\n")
    );
}
