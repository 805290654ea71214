//! What a run cost the test control plane: the apiserver's requests by caller and verb (from
//! its audit log, which `up.sh` writes for every verb when started with `TC_AUDIT_READS=1`),
//! the CPU time of its processes, and etcd's database size. The scale harness reads these so
//! a slow run says whether the controller or the test bed spent the time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

/// A position in the apiserver's audit log: requests are counted from here on.
#[derive(Debug, Clone)]
pub struct AuditCursor {
    path: PathBuf,
    offset: u64,
}

impl AuditCursor {
    /// The end of the log under the cluster's work dir, as it is now.
    pub fn now(work: &Path) -> Result<Self> {
        let path = work.join("logs/audit.log");
        let offset = std::fs::metadata(&path)
            .with_context(|| format!("{} (is the cluster up?)", path.display()))?
            .len();
        Ok(Self { path, offset })
    }

    /// The requests logged since the cursor. Fails when the log was rotated in between (it
    /// shrank), rather than count half a run.
    pub fn requests_since(&self) -> Result<Requests> {
        let bytes = std::fs::read(&self.path)
            .with_context(|| format!("reading {}", self.path.display()))?;
        let start = usize::try_from(self.offset).context("offset")?;
        anyhow::ensure!(
            bytes.len() >= start,
            "{} was rotated during the run (raise --audit-log-maxsize)",
            self.path.display()
        );
        Ok(Requests::parse(&String::from_utf8_lossy(&bytes[start..])))
    }
}

/// Requests by `(caller, verb)`.
#[derive(Debug, Default)]
pub struct Requests {
    /// Count and latencies (seconds, request received to response complete).
    pub by_caller_verb: BTreeMap<(String, String), Vec<f64>>,
    /// Count by `(caller, verb, resource)`; the resource names its subresource
    /// (`modelplacements/status`), so a run can say which writes it made.
    pub by_caller_resource: BTreeMap<(String, String, String), usize>,
    /// Audit lines that did not parse (a line cut by the reader racing the writer).
    pub unreadable: usize,
}

impl Requests {
    /// Counts the audit events of `log` (JSON lines): one per request at `ResponseComplete`,
    /// and a watch once, at `ResponseStarted` (it completes only when it ends).
    pub fn parse(log: &str) -> Self {
        let mut requests = Self::default();
        for line in log.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                requests.unreadable += 1;
                continue;
            };
            let verb = event["verb"].as_str().unwrap_or("?");
            let stage = event["stage"].as_str().unwrap_or("");
            let counted = match verb {
                "watch" => stage == "ResponseStarted",
                _ => stage == "ResponseComplete",
            };
            if !counted {
                continue;
            }
            let caller = caller(event["userAgent"].as_str().unwrap_or(""));
            let seconds = latency(&event).unwrap_or(0.0);
            *requests
                .by_caller_resource
                .entry((caller.clone(), verb.to_string(), resource(&event)))
                .or_default() += 1;
            requests
                .by_caller_verb
                .entry((caller, verb.to_string()))
                .or_default()
                .push(seconds);
        }
        requests
    }

    /// The number of requests `caller` made, all verbs.
    pub fn count(&self, caller: &str) -> usize {
        self.by_caller_verb
            .iter()
            .filter(|((who, _), _)| who == caller)
            .map(|(_, latencies)| latencies.len())
            .sum()
    }

    /// One line per verb and resource of `caller`'s requests, with its count.
    pub fn resource_table(&self, caller: &str) -> String {
        let mut out = String::new();
        for ((who, verb, resource), count) in &self.by_caller_resource {
            if who == caller {
                let _ = writeln!(out, "  {verb:<8} {resource:<36} {count:>7}");
            }
        }
        out
    }

    /// One line per caller and verb: count, p50 and p99 latency (watches: time to the first
    /// byte of the response).
    pub fn table(&self) -> String {
        let mut out = String::new();
        for ((caller, verb), latencies) in &self.by_caller_verb {
            let mut sorted = latencies.clone();
            sorted.sort_by(f64::total_cmp);
            let _ = writeln!(
                out,
                "  {caller:<28} {verb:<8} {:>7} requests, p50 {:>7.1} ms, p99 {:>7.1} ms",
                sorted.len(),
                quantile(&sorted, 0.5) * 1000.0,
                quantile(&sorted, 0.99) * 1000.0
            );
        }
        if self.unreadable > 0 {
            let _ = writeln!(out, "  ({} audit lines unreadable)", self.unreadable);
        }
        out
    }
}

/// The request's resource, with its subresource when it has one (`nodes`,
/// `modelplacements/status`); `?` for a request without one (`/version`).
fn resource(event: &Value) -> String {
    let object = &event["objectRef"];
    match (object["resource"].as_str(), object["subresource"].as_str()) {
        (Some(resource), Some(sub)) => format!("{resource}/{sub}"),
        (Some(resource), None) => resource.to_string(),
        _ => "?".to_string(),
    }
}

/// Who called, from the User-Agent: its product token (`hwaccel-controller`,
/// `kube-controller-manager`); the test harness's kube-rs client sends none.
fn caller(user_agent: &str) -> String {
    match user_agent.split(['/', ' ']).next() {
        Some(product) if !product.is_empty() => product.to_string(),
        _ => "(no User-Agent: the harness)".to_string(),
    }
}

fn latency(event: &Value) -> Option<f64> {
    let received: Timestamp = event["requestReceivedTimestamp"].as_str()?.parse().ok()?;
    let done: Timestamp = event["stageTimestamp"].as_str()?.parse().ok()?;
    Some(done.duration_since(received).as_secs_f64())
}

/// The `q`-quantile of sorted values (nearest rank); 0 for none.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// CPU seconds (user + system) process `pid` has used so far.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: count fields after it.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let per_second = clock_ticks_per_second()?;
    Some(ticks as f64 / per_second)
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; 100 on every Linux we run on).
fn clock_ticks_per_second() -> Option<f64> {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()?;
    let ticks: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    (ticks > 0.0).then_some(ticks)
}

/// The pid of a control-plane process `up.sh` started (`kube-apiserver`, `etcd`...).
pub fn component_pid(work: &Path, name: &str) -> Option<u32> {
    std::fs::read_to_string(work.join(format!("run/{name}.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// etcd's database size in bytes (`etcd_mvcc_db_total_size_in_bytes`), from its /metrics.
pub fn etcd_db_bytes(metrics: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("etcd_mvcc_db_total_size_in_bytes "))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_once_by_caller_and_verb() {
        let log = r#"{"stage":"ResponseComplete","verb":"list","userAgent":"hwaccel-controller/0.1.0","requestReceivedTimestamp":"2026-11-27T01:00:00.000000Z","stageTimestamp":"2026-11-27T01:00:00.020000Z"}
{"stage":"ResponseStarted","verb":"watch","userAgent":"hwaccel-controller/0.1.0","requestReceivedTimestamp":"2026-11-27T01:00:00.000000Z","stageTimestamp":"2026-11-27T01:00:00.001000Z"}
{"stage":"ResponseComplete","verb":"watch","userAgent":"hwaccel-controller/0.1.0","requestReceivedTimestamp":"2026-11-27T01:00:00.000000Z","stageTimestamp":"2026-11-27T01:05:00.000000Z"}
{"stage":"ResponseComplete","verb":"patch","userAgent":"hwaccel-controller/0.1.0","objectRef":{"resource":"modelplacements","subresource":"status"},"requestReceivedTimestamp":"2026-11-27T01:00:00.000000Z","stageTimestamp":"2026-11-27T01:00:00.003000Z"}
{"stage":"ResponseComplete","verb":"create","userAgent":"","requestReceivedTimestamp":"2026-11-27T01:00:00.000000Z","stageTimestamp":"2026-11-27T01:00:00.004000Z"}
{"stage":"ResponseComplete","verb":"get","userAgent":"kube-controller-manager/v1.37.2 (linux/amd64) kubernetes/0000000","requestReceivedTimestamp":"2026-11-27T01:00:00.000000Z","stageTimestamp":"2026-11-27T01:00:00.001000Z"}
{"stage":"Resp"#;
        let requests = Requests::parse(log);
        assert_eq!(requests.count("hwaccel-controller"), 3);
        let resources = requests.resource_table("hwaccel-controller");
        let rows: Vec<Vec<&str>> = resources
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows,
            [
                vec!["list", "?", "1"],
                vec!["patch", "modelplacements/status", "1"],
                vec!["watch", "?", "1"]
            ],
            "{resources}"
        );
        assert_eq!(requests.count("kube-controller-manager"), 1);
        assert_eq!(requests.count("(no User-Agent: the harness)"), 1);
        assert_eq!(requests.unreadable, 1);
        let list = &requests.by_caller_verb[&("hwaccel-controller".into(), "list".into())];
        assert!((list[0] - 0.020).abs() < 1e-9, "{list:?}");
        assert!(requests.table().contains("watch"), "{}", requests.table());
    }

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&sorted, 0.5), 50.0);
        assert_eq!(quantile(&sorted, 0.99), 99.0);
        assert_eq!(quantile(&[], 0.99), 0.0);
    }

    #[test]
    fn this_process_has_used_some_cpu_and_etcd_size_is_read() {
        assert!(cpu_seconds(std::process::id()).is_some());
        let metrics = "# HELP x\netcd_mvcc_db_total_size_in_bytes 1.2e+07\n";
        assert_eq!(etcd_db_bytes(metrics), Some(1.2e7));
    }
}
