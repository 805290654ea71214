//! Finding a `helm` binary and rendering the chart with it, for the chart tests.
//!
//! helm is not a Rust dependency: the test cluster's build (`tests/cluster/build.sh --full`)
//! builds a pinned helm v4 into its cache, and `make check-manifests` builds it when missing.
//! Lookup order: `$HELM`, `$TESTCLUSTER_BIN/helm`, the newest
//! `${TESTCLUSTER_CACHE:-~/.cache/hwaccel-testcluster}/*/helm`, then `helm` on `PATH`.
#![allow(dead_code)] // each test crate uses a different subset

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The chart, relative to the repository root.
pub const CHART: &str = "charts/hwaccel-operator";

/// Where the chart lives in this checkout.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(CHART)
}

/// The helm binary to use, or `None` (the caller skips with a notice).
pub fn find_helm() -> Option<PathBuf> {
    let from_env = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
    if let Some(helm) = from_env("HELM") {
        return Some(PathBuf::from(helm));
    }
    if let Some(bin) = from_env("TESTCLUSTER_BIN") {
        let helm = PathBuf::from(bin).join("helm");
        if helm.is_file() {
            return Some(helm);
        }
    }
    let cache = from_env("TESTCLUSTER_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            from_env("HOME").map(|home| PathBuf::from(home).join(".cache/hwaccel-testcluster"))
        });
    if let Some(helm) = cache.and_then(|dir| newest_helm_in(&dir)) {
        return Some(helm);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("helm"))
        .find(|helm| helm.is_file())
}

/// The most recently built `<cache>/<hash>/helm`.
fn newest_helm_in(cache: &Path) -> Option<PathBuf> {
    std::fs::read_dir(cache)
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("helm"))
        .filter_map(|helm| {
            let modified = helm.metadata().ok()?.modified().ok()?;
            Some((modified, helm))
        })
        .max()
        .map(|(_, helm)| helm)
}

/// Prints why a test does nothing; used when no helm binary exists.
pub fn skip_notice(test: &str) {
    eprintln!(
        "NOTICE: {test} skipped: no helm binary (set HELM, or build the test cluster's with \
         `tests/cluster/build.sh --full`)"
    );
}

/// `helm template <release> <chart> --namespace <ns> <extra...>`: the rendered YAML, or
/// helm's error output.
pub fn template(
    helm: &Path,
    chart: &Path,
    release: &str,
    namespace: &str,
    extra: &[&str],
) -> Result<String, String> {
    let output = Command::new(helm)
        .arg("template")
        .arg(release)
        .arg(chart)
        .args(["--namespace", namespace])
        .args(extra)
        .output()
        .map_err(|err| format!("cannot run {}: {err}", helm.display()))?;
    if output.status.success() {
        String::from_utf8(output.stdout).map_err(|err| format!("helm printed non-UTF-8: {err}"))
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// Every non-empty YAML document of a multi-document stream, as JSON values; panics (this is
/// test support) when the stream does not parse.
pub fn documents(yaml: &str) -> Vec<Value> {
    let docs: Vec<Value> = match serde_saphyr::from_multiple(yaml) {
        Ok(docs) => docs,
        Err(err) => panic!("rendered YAML does not parse: {err}\n{yaml}"),
    };
    docs.into_iter().filter(|doc| !doc.is_null()).collect()
}

/// The documents of one kind.
pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|doc| doc["kind"] == kind).collect()
}

/// `metadata.name` of a document ("" when absent).
pub fn name_of(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}
