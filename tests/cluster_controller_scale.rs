//! Scale run of the controller: kwok fake Nodes with synthetic inventories (a mixed fleet of
//! 8 x H100 NVSwitch, 8 x A100 80GB, 8 x MI300X, 1-4 x L4 and CPU-only nodes) and hundreds
//! of ModelPlacements, against the `hwaccel controller` binary as its own process so its
//! peak RSS can be read. Prints the figures `docs/benchmarks.md` records.
//!
//! `scripts/scale.sh` (or `make scale`) runs it with `SCALE_RUN=1` (`SCALE_NODES`, default
//! 1000; `SCALE_PLACEMENTS`, default 300); without `SCALE_RUN` it returns at once, so
//! `make cluster-test` does not pay for it.

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
use support::process::{ChildGuard, free_port, peak_rss_kib};
use support::{DEFAULT_TIMEOUT, TEST_LABEL, TestCluster, install_crds};

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
                let node = Node {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        labels: Some(labels),
                        // kwok keeps these fake Nodes Ready.
                        annotations: Some(BTreeMap::from([(
                            "kwok.x-k8s.io/node".to_string(),
                            "fake".to_string(),
                        )])),
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
    if std::env::var_os("SCALE_RUN").is_none() {
        eprintln!("skipped: set SCALE_RUN=1 (scripts/scale.sh does) to run the scale test");
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
    let metrics_url = format!("http://127.0.0.1:{port}/metrics");
    // Let it take the Lease and sync its caches before the clock starts.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
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
    let all_planned = watch_until_all_planned(&api, placements, created).await?;
    // The watch can show the last status before the controller has counted its write.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let text = reqwest_free_get(&metrics_url).await?;
    let (p99, reconciles) =
        quantile_from_metrics(&text, "hwaccel_controller_reconcile_duration_seconds", 0.99)
            .context("reconcile histogram")?;
    let (p50, _) =
        quantile_from_metrics(&text, "hwaccel_controller_reconcile_duration_seconds", 0.50)
            .context("reconcile histogram")?;
    let (wait_p99, _) = quantile_from_metrics(
        &text,
        "hwaccel_controller_reconcile_lock_wait_seconds",
        0.99,
    )
    .context("lock wait histogram")?;
    if let Some((within, total)) =
        count_at_most(&text, "hwaccel_controller_reconcile_duration_seconds", 0.05)
    {
        println!(
            "scale: {within} of {total} reconciles ({:.2} %) took at most 50 ms",
            within as f64 * 100.0 / total.max(1) as f64
        );
    }
    println!(
        "scale: lock wait p99 <= {:.1} ms (the ledger lock, for snapshot and commit; {} placement workers)",
        wait_p99 * 1000.0,
        workers.as_deref().unwrap_or("default")
    );
    if let Some(conflicts) = metric_value(&text, "hwaccel_controller_commit_conflicts_total") {
        println!("scale: {conflicts} plans collided at commit and were planned again");
    }
    for (label, q) in [("p50", 0.5), ("p99", 0.99)] {
        let (decide, _) =
            quantile_from_metrics(&text, "hwaccel_controller_decide_duration_seconds", q)
                .context("decide histogram")?;
        println!(
            "scale: decide (planning, no API calls) {label} <= {:.1} ms",
            decide * 1000.0
        );
    }
    if let (Some((p50, builds)), Some((p99, _))) = (
        quantile_from_metrics(
            &text,
            "hwaccel_controller_fleet_view_build_duration_seconds",
            0.5,
        ),
        quantile_from_metrics(
            &text,
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
            quantile_from_metrics(&text, &name, 0.5),
            quantile_from_metrics(&text, &name, 0.99),
        ) {
            println!(
                "scale: {writes} {object} writes, p50 <= {:.1} ms, p99 <= {:.1} ms",
                p50 * 1000.0,
                p99 * 1000.0
            );
        }
    }
    let rss = peak_rss_kib(controller.0.id()).context("peak RSS")?;
    println!(
        "scale: {placements} placements created in {creation:?}, all Planned {all_planned:?} after the first creation; \
         {reconciles} reconciles, p50 <= {:.1} ms, p99 <= {:.1} ms; controller peak RSS {:.1} MiB",
        p50 * 1000.0,
        p99 * 1000.0,
        rss as f64 / 1024.0
    );
    assert!(all_planned < Duration::from_secs(60), "planned within 60 s");
    Ok(())
}

/// Watches the placements (a LIST every few hundred ms would load the apiserver the run
/// measures) until `count` of them are Planned; returns the time since `since`.
async fn watch_until_all_planned(
    api: &Api<ModelPlacement>,
    count: usize,
    since: Instant,
) -> Result<Duration> {
    use kube::runtime::watcher::{self, Event};
    let mut planned = std::collections::HashSet::new();
    let mut events = std::pin::pin!(watcher::watcher(api.clone(), watcher::Config::default()));
    let deadline = tokio::time::sleep(DEFAULT_TIMEOUT);
    tokio::pin!(deadline);
    loop {
        let event = tokio::select! {
            event = events.try_next() => event?.context("the watch ended")?,
            () = &mut deadline => anyhow::bail!(
                "only {} of {count} placements Planned after {DEFAULT_TIMEOUT:?}",
                planned.len()
            ),
        };
        let (Event::Apply(placement) | Event::InitApply(placement)) = event else {
            continue;
        };
        let name = placement.metadata.name.clone().unwrap_or_default();
        if placement.status.as_ref().and_then(|s| s.state.as_deref()) == Some("Planned") {
            planned.insert(name);
        } else {
            planned.remove(&name);
        }
        if planned.len() == count {
            return Ok(since.elapsed());
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
