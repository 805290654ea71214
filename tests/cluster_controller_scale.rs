//! Scale run of the controller: kwok fake Nodes with synthetic inventories (a mixed fleet of
//! 8 x H100 NVSwitch, 8 x A100 80GB, 8 x MI300X, 1-4 x L4 and CPU-only nodes) and hundreds
//! of ModelPlacements, against the `hwaccel controller` binary as its own process so its
//! peak RSS can be read. Prints the figures `docs/benchmarks.md` records.
//!
//! `scripts/scale.sh` (or `make scale`) runs it with `SCALE_RUN=1` (`SCALE_NODES`, default
//! 1000; `SCALE_PLACEMENTS`, default 300; `SCALE_TIMEOUT_S`, default 300); without
//! `SCALE_RUN` it returns at once, so `make cluster-test` does not pay for it.
//!
//! It measures the operator, not the test bed: the Nodes are plain objects (no kubelet, no
//! kwok: nothing heartbeats, so an idle node costs the apiserver nothing; the controller reads
//! Nodes' labels and never their readiness), and besides the controller's own figures the run
//! prints the apiserver's requests by caller and verb (its audit log, every verb:
//! `TC_AUDIT_READS=1`), the CPU seconds of the controller, the apiserver and etcd over the run,
//! and etcd's database size. A run that misses its deadline prints the same figures before it
//! fails, so the report says where the time went.

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use futures::{StreamExt, TryStreamExt};
use hwaccel::api::placement::{ModelPlacementSpec, PrecisionChoice};
use hwaccel::api::{AcceleratorInventory, ModelPlacement};
use hwaccel::hardware::Report;
use hwaccel::hardware::{Family, GIB, InterconnectKind, Vendor};
use hwaccel::testing::report::{ReportBuilder, accelerator, host_cpu};
use hwaccel::testing::{InventoryBuilder, PlacementBuilder};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use support::apiserver_load::{AuditCursor, Requests, component_pid, cpu_seconds, etcd_db_bytes};
use support::process::{ChildGuard, free_port, peak_rss_kib};
use support::{TEST_LABEL, TestCluster, install_crds};

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The synthetic detection report of node number `i` (10 % steps: 3 H100, 2 A100, 1 MI300X,
/// 3 L4, 1 CPU-only).
fn report(i: usize) -> Report {
    let (count, vendor, model, memory, fabric) = match i % 10 {
        0..=2 => (
            8,
            Vendor::Nvidia,
            "NVIDIA H100 80GB HBM3",
            80 * GIB,
            Some(InterconnectKind::Nvswitch),
        ),
        3 | 4 => (
            8,
            Vendor::Nvidia,
            "NVIDIA A100-SXM4-80GB",
            80 * GIB,
            Some(InterconnectKind::Nvswitch),
        ),
        5 => (
            8,
            Vendor::Amd,
            "AMD Instinct MI300X",
            192 * GIB,
            Some(InterconnectKind::Xgmi),
        ),
        6..=8 => (1 + i % 4, Vendor::Nvidia, "NVIDIA L4", 24 * GIB, None),
        _ => (0, Vendor::Nvidia, "", 0, None),
    };
    let mut cpu = host_cpu(Vendor::Intel, "Intel Xeon");
    cpu.memory_bytes = Some(512 * GIB);
    let mut node = ReportBuilder::new()
        .accelerators(count, &accelerator(vendor, Family::Gpu, model, memory))
        .device(cpu);
    if let Some(kind) = fabric {
        node = node.fabric(kind, None);
    }
    node.build()
}

/// A mix of models that all fit the fleet.
fn spec(i: usize) -> ModelPlacementSpec {
    let (preset, precision, concurrency) = match i % 6 {
        0 => ("llama-3.1-8b", PrecisionChoice::Bf16, 4),
        1 => ("llama-3.1-70b", PrecisionChoice::Bf16, 16),
        2 => ("qwen3-32b", PrecisionChoice::Auto, 8),
        3 => ("mixtral-8x7b", PrecisionChoice::Auto, 8),
        4 => ("gpt-oss-20b", PrecisionChoice::Auto, 4),
        _ => ("llama-3.1-70b", PrecisionChoice::Fp8, 32),
    };
    PlacementBuilder::serve(preset)
        .precision(precision)
        .concurrency(concurrency)
        .spec()
}

async fn create_fleet(cluster: &TestCluster, count: usize) -> Result<()> {
    let client = cluster.client();
    let prefix = cluster.prefix().to_string();
    futures::stream::iter(0..count)
        .map(|i| {
            let client = client.clone();
            let prefix = prefix.clone();
            async move {
                let name = format!("{prefix}-n{i:05}");
                let labels = BTreeMap::from([(TEST_LABEL.to_string(), prefix.clone())]);
                // No kwok annotation: nothing heartbeats for these Nodes (see the module docs).
                let node = Node {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        labels: Some(labels),
                        ..ObjectMeta::default()
                    },
                    ..Node::default()
                };
                Api::<Node>::all(client.clone())
                    .create(&PostParams::default(), &node)
                    .await?;
                let inventory = InventoryBuilder::from_report(report(i))
                    .node(&name)
                    .label(TEST_LABEL, &prefix)
                    .build();
                Api::<AcceleratorInventory>::all(client)
                    .patch(
                        &name,
                        &PatchParams::apply("hwaccel-agent").force(),
                        &Patch::Apply(&inventory),
                    )
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// How many observations of a Prometheus histogram fell at or below the bucket bound `le`,
/// and how many there were in all.
fn count_at_most(text: &str, name: &str, le: f64) -> Option<(u64, u64)> {
    let buckets = histogram_buckets(text, name);
    let total = buckets.last()?.1;
    let within = buckets.iter().find(|(bound, _)| *bound == le)?.1;
    Some((within, total))
}

/// The cumulative `(le, count)` buckets of a Prometheus histogram, in bound order. `name` may
/// carry one label besides `le`: `metric{object="status"}`.
/// The value of an unlabelled counter or gauge in a Prometheus exposition.
fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

fn histogram_buckets(text: &str, name: &str) -> Vec<(f64, u64)> {
    let (name, label) = match name.split_once('{') {
        Some((name, label)) => (name, Some(label.trim_end_matches('}'))),
        None => (name, None),
    };
    let mut buckets: Vec<(f64, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{name}_bucket{{")))
        .filter_map(|rest| {
            let (labels, count) = rest.split_once("} ")?;
            let mut le = None;
            let mut matched = label.is_none();
            for pair in labels.split(',') {
                match pair.strip_prefix("le=") {
                    Some(bound) => le = Some(bound.trim_matches('"')),
                    None => matched |= Some(pair) == label,
                }
            }
            let le = match le? {
                "+Inf" => f64::INFINITY,
                bound => bound.parse().ok()?,
            };
            matched.then_some(())?;
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// The p-quantile of a Prometheus histogram, as the upper bound of the bucket it falls in.
fn quantile_from_metrics(text: &str, name: &str, q: f64) -> Option<(f64, u64)> {
    let buckets = histogram_buckets(text, name);
    let total = buckets.last()?.1;
    let wanted = (q * total as f64).ceil() as u64;
    buckets
        .iter()
        .find(|(_, c)| *c >= wanted)
        .map(|(le, _)| (*le, total))
}

#[tokio::test]
#[ignore = "scale run: scripts/scale.sh"]
async fn scale_run() -> Result<()> {
    // `make cluster-test` runs every ignored test; the scale run only runs when asked for.
    if !support::scale_run("run the scale test") {
        return Ok(());
    }
    let nodes = env_number("SCALE_NODES", 1000);
    let placements = env_number("SCALE_PLACEMENTS", 300);
    // Unset: the controller's own default.
    let workers = std::env::var("SCALE_WORKERS").ok();
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let started = Instant::now();
    create_fleet(&cluster, nodes).await?;
    println!(
        "scale: {nodes} nodes and inventories created in {:?}",
        started.elapsed()
    );

    let timeout = Duration::from_secs(env_number("SCALE_TIMEOUT_S", 300) as u64);
    let work = cluster.env().work.clone();
    let audit = AuditCursor::now(&work)?;
    let test_bed = TestBed::now(&work);

    let port = free_port()?;
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_hwaccel"));
    let mut command = Command::new(binary);
    command.args([
        "controller",
        "--namespace",
        cluster.namespace(),
        "--selector",
        &format!("{TEST_LABEL}={}", cluster.prefix()),
        "--leader-election-namespace",
        cluster.namespace(),
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
        "--health-addr",
        "127.0.0.1:0",
        "--identity",
        "scale",
        "--log-format",
        "json",
    ]);
    if let Some(workers) = &workers {
        command.arg(format!("--placement-workers={workers}"));
    }
    let child = command
        .env("KUBECONFIG", &cluster.env().kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let controller = ChildGuard(child);
    let controller_pid = controller.0.id();
    // `SCALE_PERF_OUT=FILE`: a CPU profile of the controller for the whole run, for a flame
    // graph (docs/benchmarks.md says how it is made).
    let profiler = match std::env::var_os("SCALE_PERF_OUT") {
        Some(out) => Some(Profiler::attach(controller_pid, &out)?),
        None => None,
    };
    let metrics_url = format!("http://127.0.0.1:{port}/metrics");
    // The clock starts once the controller says it can reconcile (its caches listed every
    // inventory and Node, its ledger rebuilt): a placement created earlier would wait for that
    // and blur the figures. Its start-up is reported on its own.
    let spawned = Instant::now();
    let startup = wait_for_startup(&metrics_url, timeout).await?;
    println!(
        "scale: controller start-up {:?} after spawn (taking the lead included); from the lead: {}",
        spawned.elapsed(),
        startup
            .iter()
            .map(|(phase, seconds)| format!("{phase} {:.2} s", seconds))
            .collect::<Vec<_>>()
            .join(", ")
    );

    // The first fleet pass writes every new inventory's status once (freeDevices and the
    // DRAPublished condition): a cost per node, paid once, not per placement. The requests
    // per placement are counted from when those writes are done.
    let settled = wait_for_inventory_writes(&metrics_url, nodes, timeout).await;
    println!(
        "scale: the first fleet pass wrote {settled} inventory statuses ({nodes} nodes) in {:?} after start-up",
        spawned.elapsed()
    );
    let placements_audit = AuditCursor::now(&work)?;
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    // The apiserver's own CPU while the placements are created and planned (the figure above
    // also holds the start-up's lists and the first fleet pass), and with
    // `SCALE_APISERVER_PROFILE=FILE` its Go CPU profile over the first
    // `SCALE_APISERVER_PROFILE_S` seconds (30) of the same span: what a reconcile's writes
    // wait for. The control plane must serve /debug/pprof (`TC_APISERVER_PROFILING=1`); the
    // binary is stripped, so perf could not name its functions, and pprof can.
    let apiserver_pid = component_pid(&work, "kube-apiserver");
    let apiserver_cpu = apiserver_pid.and_then(cpu_seconds);
    let apiserver_profile = std::env::var_os("SCALE_APISERVER_PROFILE").map(|out| {
        let seconds = env_number("SCALE_APISERVER_PROFILE_S", 30) as u64;
        let client = cluster.client();
        tokio::spawn(async move {
            let profile = apiserver_cpu_profile(client, seconds).await?;
            std::fs::write(&out, profile)
                .with_context(|| format!("writing {}", out.to_string_lossy()))
        })
    });
    let created = Instant::now();
    futures::stream::iter(0..placements)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(
                    &PostParams::default(),
                    &ModelPlacement::new(&format!("p{i:04}"), spec(i)),
                )
                .await
                .map(|_| ())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    let creation = created.elapsed();
    let progress = watch_until_all_planned(&api, placements, created, timeout).await;
    if let Some(profile) = apiserver_profile {
        match profile.await {
            Ok(Ok(())) => println!("scale: the apiserver's CPU profile is written"),
            Ok(Err(err)) => println!("scale: no apiserver profile: {err:#}"),
            Err(err) => println!("scale: no apiserver profile: {err}"),
        }
    }
    if let (Some(before), Some(after)) = (apiserver_cpu, apiserver_pid.and_then(cpu_seconds)) {
        println!(
            "scale: kube-apiserver used {:.1} CPU s from the first creation until all were planned",
            after - before
        );
    }
    // The watch can show the last status before the controller has counted its write.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Printed whether or not every placement was planned: a run that missed its goal shows
    // where the time went.
    let text = reqwest_free_get(&metrics_url).await?;
    print_controller_figures(&text)?;
    let rss = peak_rss_kib(controller_pid).context("peak RSS")?;
    if let Some(profiler) = profiler {
        profiler.stop();
    }
    test_bed
        .print_since(controller_pid, &audit, rss, placements)
        .await;
    match placements_audit.requests_since() {
        Ok(requests) => {
            print_controller_requests(&requests, "once placements were created", placements)
        }
        Err(err) => println!("scale: no request counts: {err:#}"),
    }
    let planned = progress?;
    println!(
        "scale: {placements} placements created in {creation:?}; the first Planned {:?} and all {:?} after the first creation, \
         all {:?} after the last",
        planned.first,
        planned.all,
        planned.all.saturating_sub(creation)
    );
    Ok(())
}

/// The apiserver's Go CPU profile over the next `seconds` (pprof's protobuf, gzipped):
/// `go tool pprof -top FILE` reads it.
async fn apiserver_cpu_profile(client: kube::Client, seconds: u64) -> Result<Vec<u8>> {
    let request =
        http::Request::get(format!("/debug/pprof/profile?seconds={seconds}")).body(Vec::new())?;
    let mut stream = client.request_stream(request).await.context(
        "the apiserver's CPU profile: start the control plane with TC_APISERVER_PROFILING=1",
    )?;
    let mut bytes = Vec::new();
    futures::AsyncReadExt::read_to_end(&mut stream, &mut bytes).await?;
    Ok(bytes)
}

/// `perf record` attached to the controller: CPU-clock samples with DWARF call graphs (the
/// release binary keeps its symbols and unwind tables).
struct Profiler(ChildGuard);

impl Profiler {
    fn attach(pid: u32, out: &std::ffi::OsStr) -> Result<Self> {
        let child = Command::new("perf")
            .args([
                "record",
                "-e",
                "cpu-clock",
                // 49 Hz and 16 KiB of stack a sample: a 10,000-node run is about 75 MB.
                "-F",
                "49",
                "--call-graph",
                "dwarf,16384",
            ])
            .arg("-p")
            .arg(pid.to_string())
            .arg("-o")
            .arg(out)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting perf record (is linux-perf installed?)")?;
        Ok(Self(ChildGuard(child)))
    }

    /// Stops recording (SIGINT, so perf writes its file) and waits for it.
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.0.0.id().to_string()])
            .status();
        let _ = self.0.0.wait();
    }
}

/// The controller's own histograms: reconcile, decide, fleet view, lock wait and writes.
fn print_controller_figures(text: &str) -> Result<()> {
    let (p99, reconciles) =
        quantile_from_metrics(text, "hwaccel_controller_reconcile_duration_seconds", 0.99)
            .context("reconcile histogram")?;
    let (p50, _) =
        quantile_from_metrics(text, "hwaccel_controller_reconcile_duration_seconds", 0.50)
            .context("reconcile histogram")?;
    println!(
        "scale: {reconciles} reconciles, p50 <= {:.1} ms, p99 <= {:.1} ms",
        p50 * 1000.0,
        p99 * 1000.0
    );
    let (wait_p99, _) =
        quantile_from_metrics(text, "hwaccel_controller_reconcile_lock_wait_seconds", 0.99)
            .context("lock wait histogram")?;
    // 100 ms is the goal's p99 (issue 41): the share within it says how far off a miss is.
    for (bound, label) in [(0.05, "50 ms"), (0.1, "100 ms")] {
        if let Some((within, total)) =
            count_at_most(text, "hwaccel_controller_reconcile_duration_seconds", bound)
        {
            println!(
                "scale: {within} of {total} reconciles ({:.2} %) took at most {label}",
                within as f64 * 100.0 / total.max(1) as f64
            );
        }
    }
    println!(
        "scale: lock wait p99 <= {:.1} ms (the ledger lock, for snapshot and commit; {} placement workers)",
        wait_p99 * 1000.0,
        std::env::var("SCALE_WORKERS")
            .ok()
            .as_deref()
            .unwrap_or("default")
    );
    if let Some(conflicts) = metric_value(text, "hwaccel_controller_commit_conflicts_total") {
        println!("scale: {conflicts} plans collided at commit and were planned again");
    }
    for (label, q) in [("p50", 0.5), ("p99", 0.99)] {
        let (decide, _) =
            quantile_from_metrics(text, "hwaccel_controller_decide_duration_seconds", q)
                .context("decide histogram")?;
        println!(
            "scale: decide (planning, no API calls) {label} <= {:.1} ms",
            decide * 1000.0
        );
    }
    if let (Some((p50, builds)), Some((p99, _))) = (
        quantile_from_metrics(
            text,
            "hwaccel_controller_fleet_view_build_duration_seconds",
            0.5,
        ),
        quantile_from_metrics(
            text,
            "hwaccel_controller_fleet_view_build_duration_seconds",
            0.99,
        ),
    ) {
        println!(
            "scale: {builds} fleet view builds, p50 <= {:.1} ms, p99 <= {:.1} ms",
            p50 * 1000.0,
            p99 * 1000.0
        );
    }
    for object in ["finalizer", "node_labels", "status"] {
        let name = format!("hwaccel_controller_api_write_duration_seconds{{object=\"{object}\"}}");
        if let (Some((p50, writes)), Some((p99, _))) = (
            quantile_from_metrics(text, &name, 0.5),
            quantile_from_metrics(text, &name, 0.99),
        ) {
            println!(
                "scale: {writes} {object} writes, p50 <= {:.1} ms, p99 <= {:.1} ms",
                p50 * 1000.0,
                p99 * 1000.0
            );
        }
    }
    Ok(())
}

/// The test bed's processes and their CPU time when the run started.
struct TestBed {
    work: std::path::PathBuf,
    cpu: Vec<(&'static str, Option<u32>, Option<f64>)>,
}

impl TestBed {
    const COMPONENTS: [&'static str; 2] = ["kube-apiserver", "etcd"];

    fn now(work: &std::path::Path) -> Self {
        let cpu = Self::COMPONENTS
            .iter()
            .map(|name| {
                let pid = component_pid(work, name);
                (*name, pid, pid.and_then(cpu_seconds))
            })
            .collect();
        Self {
            work: work.to_path_buf(),
            cpu,
        }
    }

    /// Prints the CPU each process used since [`TestBed::now`], the controller's (which
    /// started then), etcd's database size, and every caller's requests.
    async fn print_since(
        &self,
        controller_pid: u32,
        audit: &AuditCursor,
        rss_kib: u64,
        placements: usize,
    ) {
        let mut cpu = vec![format!(
            "controller {:.1} s (peak RSS {:.1} MiB)",
            cpu_seconds(controller_pid).unwrap_or(f64::NAN),
            rss_kib as f64 / 1024.0
        )];
        for (name, pid, before) in &self.cpu {
            let after = pid.and_then(cpu_seconds);
            if let (Some(before), Some(after)) = (before, after) {
                cpu.push(format!("{name} {:.1} s", after - before));
            }
        }
        println!("scale: CPU used during the run: {}", cpu.join(", "));
        let etcd = std::fs::read_to_string(self.work.join("env"))
            .ok()
            .and_then(|env| {
                env.lines()
                    .find_map(|l| l.strip_prefix("export TESTCLUSTER_ETCD="))
                    .map(|v| v.trim_matches('\'').to_string())
            });
        if let Some(etcd) = etcd {
            match reqwest_free_get(&format!("{etcd}/metrics")).await {
                Ok(text) => match etcd_db_bytes(&text) {
                    Some(bytes) => println!("scale: etcd database {:.1} MiB", bytes / 1048576.0),
                    None => println!("scale: etcd /metrics has no database size"),
                },
                Err(err) => println!("scale: etcd /metrics unreadable: {err:#}"),
            }
        }
        match audit.requests_since() {
            Ok(requests) => {
                print!(
                    "scale: apiserver requests since the controller started, by caller and verb:\n{}",
                    requests.table()
                );
                print_controller_requests(&requests, "since it started", placements);
            }
            Err(err) => println!("scale: no request counts: {err:#}"),
        }
    }
}

/// The controller's requests in `requests` by verb and resource, and per placement.
fn print_controller_requests(requests: &Requests, when: &str, placements: usize) {
    let controller = requests.count("hwaccel-controller");
    print!(
        "scale: the controller's requests {when}, by verb and resource:\n{}",
        requests.resource_table("hwaccel-controller")
    );
    println!(
        "scale: {controller} controller requests {when} for {placements} placements: {:.2} per placement",
        controller as f64 / placements.max(1) as f64
    );
}

/// Polls the controller's /metrics until its start-up gauge says it can reconcile; returns
/// the phases' seconds (from taking the lead), in the order they ended.
async fn wait_for_startup(metrics_url: &str, timeout: Duration) -> Result<Vec<(String, f64)>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(text) = reqwest_free_get(metrics_url).await {
            let mut phases: Vec<(String, f64)> = text
                .lines()
                .filter_map(|l| l.strip_prefix("hwaccel_controller_startup_seconds{phase=\""))
                .filter_map(|rest| {
                    let (phase, value) = rest.split_once("\"} ")?;
                    Some((phase.to_string(), value.trim().parse().ok()?))
                })
                .collect();
            // Every phase is exported from the start, at 0 until it ends.
            if phases.iter().any(|(phase, s)| phase == "ready" && *s > 0.0) {
                phases.sort_by(|a, b| a.1.total_cmp(&b.1));
                return Ok(phases);
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the controller did not finish starting within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until the controller has written `nodes` inventory statuses (its first fleet pass
/// writes each new inventory's once), or a few seconds pass without a new one; returns how
/// many it wrote.
async fn wait_for_inventory_writes(metrics_url: &str, nodes: usize, timeout: Duration) -> u64 {
    let name = "hwaccel_controller_api_write_duration_seconds{object=\"inventory_status\"}";
    let deadline = Instant::now() + timeout;
    let (mut last, mut since) = (0, Instant::now());
    while Instant::now() < deadline {
        let written = match reqwest_free_get(metrics_url).await {
            Ok(text) => histogram_buckets(&text, name).last().map_or(0, |(_, c)| *c),
            Err(_) => last,
        };
        if written >= nodes as u64 || since.elapsed() > Duration::from_secs(5) {
            return written;
        }
        if written != last {
            (last, since) = (written, Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    last
}

/// When the first and the last placement were seen Planned, from the first creation.
#[derive(Debug)]
struct Planned {
    first: Duration,
    all: Duration,
}

/// Watches the placements (a LIST every few hundred ms would load the apiserver the run
/// measures) until `count` of them are Planned; returns the time since `since`.
async fn watch_until_all_planned(
    api: &Api<ModelPlacement>,
    count: usize,
    since: Instant,
    timeout: Duration,
) -> Result<Planned> {
    use kube::runtime::watcher::{self, Event};
    let mut planned = std::collections::HashSet::new();
    let mut first = None;
    let mut events = std::pin::pin!(watcher::watcher(api.clone(), watcher::Config::default()));
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        let event = tokio::select! {
            event = events.try_next() => event?.context("the watch ended")?,
            () = &mut deadline => anyhow::bail!(
                "only {} of {count} placements Planned after {timeout:?} (the first {first:?} after the first creation)",
                planned.len()
            ),
        };
        let (Event::Apply(placement) | Event::InitApply(placement)) = event else {
            continue;
        };
        let name = placement.metadata.name.clone().unwrap_or_default();
        if placement.status.as_ref().and_then(|s| s.state.as_deref()) == Some("Planned") {
            first.get_or_insert_with(|| since.elapsed());
            planned.insert(name);
        } else {
            planned.remove(&name);
        }
        if planned.len() == count {
            let all = since.elapsed();
            return Ok(Planned {
                first: first.unwrap_or(all),
                all,
            });
        }
    }
}

/// GET over plain HTTP/1.1 without another HTTP client crate (a blocking read is fine here).
async fn reqwest_free_get(url: &str) -> Result<String> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").context("http URL")?;
    let (host, path) = rest.split_once('/').context("path")?;
    let mut stream = std::net::TcpStream::connect(host)?;
    stream.write_all(
        format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    Ok(body
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or(body))
}
