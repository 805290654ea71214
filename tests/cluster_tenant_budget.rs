//! What one tenant can make the controller hold (issue 27 item 1), on the real apiserver.
//!
//! - The apiserver refuses an inline `config.json` longer than its bound, a config given as an
//!   object, and node-selector entries longer than a label's, so a placement's spec is bounded
//!   as a whole (the CRD schema, no CEL cost for the config).
//! - The most a namespace can store, restarted into: `TENANT_PLACEMENTS` placements (default
//!   200; the chart sets no ResourceQuota, see `docs/security.md`), each with the longest
//!   config and the largest annotations the apiserver takes (256 KiB in all), then a fresh
//!   `hwaccel controller` process lists and reconciles them all; its peak RSS (VmHWM) stays
//!   under the chart's memory limit. The figure goes into `docs/benchmarks.md`.

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, Result};
use futures::{StreamExt, TryStreamExt};
use hwaccel::api::ModelPlacement;
use hwaccel::api::placement::MAX_CONFIG_CHARS;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};
use support::process::{ChildGuard, free_port, peak_rss_kib};
use support::{DEFAULT_TIMEOUT, TEST_LABEL, TestCluster, install_crds, wait_for};

/// The apiserver's bound on all of an object's annotations together (keys and values).
const ANNOTATIONS_BYTES: usize = 256 * 1024;

/// A real config (Llama 3.1 8B), padded with a key the planner never reads to `length`
/// characters.
fn config_text(length: usize) -> String {
    let mut config = json!({
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 128256, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
        "tie_word_embeddings": false, "padding": "",
    });
    let bare = config.to_string().len();
    config["padding"] = Value::String("x".repeat(length.saturating_sub(bare)));
    let text = config.to_string();
    assert_eq!(text.len(), length.max(bare));
    text
}

fn placement(name: &str, spec: Value, annotations: Option<BTreeMap<String, String>>) -> Value {
    json!({
        "apiVersion": "hwaccel.io/v1alpha1",
        "kind": "ModelPlacement",
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
    })
}

fn serve(model: Value) -> Value {
    json!({"model": model, "goal": {"serve": {"context": 4096, "concurrency": 1}}})
}

fn api(cluster: &TestCluster) -> Api<DynamicObject> {
    Api::namespaced_with(
        cluster.client(),
        cluster.namespace(),
        &ApiResource::erase::<ModelPlacement>(&()),
    )
}

async fn create(api: &Api<DynamicObject>, object: Value) -> Result<(), kube::Error> {
    let object: DynamicObject = serde_json::from_value(object).expect("a placement");
    api.create(&PostParams::default(), &object)
        .await
        .map(|_| ())
}

/// The apiserver's refusal message, or a panic if it accepted.
fn refused(result: Result<(), kube::Error>, what: &str) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.code == 422 => status.message,
        other => panic!("{what}: expected a 422 refusal, got {other:?}"),
    }
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn the_apiserver_bounds_everything_a_tenant_stores_in_a_spec() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let api = api(&cluster);
    let max = MAX_CONFIG_CHARS as usize;

    // The longest config is taken, one character more is not.
    let longest = json!({"huggingFaceConfig": config_text(max)});
    create(&api, placement("longest", serve(longest), None)).await?;
    let longer = json!({"huggingFaceConfig": config_text(max + 1)});
    let message = refused(
        create(&api, placement("longer", serve(longer), None)).await,
        "a config one character over the bound",
    );
    assert!(message.contains("huggingFaceConfig"), "{message}");
    assert!(message.contains("Too long"), "{message}");

    // 1.3 MB as an object (what was stored before) is no longer a config at all.
    let mut object = serde_json::Map::new();
    for i in 0..512 {
        object.insert(format!("k{i}"), Value::String("x".repeat(2500)));
    }
    let message = refused(
        create(
            &api,
            placement("object", serve(json!({"huggingFaceConfig": object})), None),
        )
        .await,
        "a config as an object",
    );
    assert!(message.contains("huggingFaceConfig"), "{message}");

    // Node-selector keys and values no longer than a label's (keys were unbounded).
    let long_key = format!("example.com/{}", "k".repeat(400));
    let mut spec = serve(json!({"preset": "llama-3.1-8b"}));
    spec["constraints"] = json!({"nodeSelector": {long_key: "v"}});
    let message = refused(
        create(&api, placement("selector", spec, None)).await,
        "a 412-character nodeSelector key",
    );
    assert!(message.contains("nodeSelector"), "{message}");
    let mut spec = serve(json!({"preset": "llama-3.1-8b"}));
    spec["constraints"] = json!({"products": ["p".repeat(129)]});
    let message = refused(
        create(&api, placement("products", spec, None)).await,
        "a 129-character product",
    );
    assert!(message.contains("products"), "{message}");
    Ok(())
}

fn start_controller(cluster: &TestCluster, metrics: u16) -> Result<ChildGuard> {
    let child = Command::new(env!("CARGO_BIN_EXE_hwaccel"))
        .args(["controller", "--namespace", cluster.namespace()])
        .args(["--selector", &format!("{TEST_LABEL}={}", cluster.prefix())])
        .args(["--leader-election-namespace", cluster.namespace()])
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics}")])
        .args(["--health-addr", "127.0.0.1:0", "--identity", "budget"])
        .env("KUBECONFIG", &cluster.env().kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    Ok(ChildGuard(child))
}

/// Reconciles the controller has finished, from its metrics (0 while it is not up).
fn reconciles(metrics: u16) -> u64 {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", metrics)) else {
        return 0;
    };
    let _ = stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text.lines()
        .filter_map(|l| l.strip_prefix("hwaccel_controller_reconcile_duration_seconds_count"))
        .filter_map(|rest| rest.split_whitespace().last()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The controller's memory limit in the chart's values (`controller.resources.limits.memory`).
fn chart_memory_limit_mib() -> u64 {
    let values = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/charts/hwaccel-operator/values.yaml"
    ))
    .expect("values.yaml");
    let controller = values
        .split("\ncontroller:")
        .nth(1)
        .expect("a controller section");
    let limits = controller.split("limits:").nth(1).expect("limits");
    let memory = limits
        .lines()
        .find_map(|l| l.trim().strip_prefix("memory:"))
        .expect("a memory limit")
        .trim();
    memory
        .strip_suffix("Mi")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("memory limit {memory:?} not in Mi"))
}

/// Waits until the controller at `metrics` has finished `count` reconciles.
async fn reconciled(metrics: u16, count: u64) -> Result<()> {
    wait_for(
        DEFAULT_TIMEOUT,
        "every placement reconciled",
        || async move {
            let done = tokio::task::spawn_blocking(move || reconciles(metrics)).await?;
            Ok((done >= count).then_some(()))
        },
    )
    .await
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_controller_restarted_under_the_most_a_namespace_stores_stays_under_its_limit()
-> Result<()> {
    let count: usize = std::env::var("TENANT_PLACEMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let api = api(&cluster);
    // Every placement at its largest: the longest config, and annotations up to the
    // apiserver's own bound (a tenant's `kubectl apply` keeps a copy of the object there).
    let config = config_text(MAX_CONFIG_CHARS as usize);
    let blob = "a".repeat(ANNOTATIONS_BYTES - 64);
    let annotations = BTreeMap::from([("tenant.example.com/blob".to_string(), blob)]);
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let object = placement(
                &format!("p{i:04}"),
                serve(json!({"huggingFaceConfig": config})),
                Some(annotations.clone()),
            );
            let api = api.clone();
            async move { create(&api, object).await }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await
        .context("creating the placements")?;
    let stored = config.len() + ANNOTATIONS_BYTES;
    println!(
        "tenant budget: {count} placements of {:.0} KiB each ({:.1} MiB) created in {:.1?}",
        stored as f64 / 1024.0,
        (count * stored) as f64 / 1024.0 / 1024.0,
        started.elapsed()
    );

    // A first controller plans them (writes statuses and finalizers, as in real life)...
    let first_port = free_port()?;
    let first = start_controller(&cluster, first_port)?;
    reconciled(first_port, count as u64).await?;
    let first_peak = peak_rss_kib(first.0.id()).context("VmHWM")?;
    drop(first);
    // ...then a restart lists and reconciles all of them at once.
    let restarted = Instant::now();
    let port = free_port()?;
    let second = start_controller(&cluster, port)?;
    reconciled(port, count as u64).await?;
    let peak = peak_rss_kib(second.0.id()).context("VmHWM")?;
    let limit = chart_memory_limit_mib();
    println!(
        "tenant budget: first controller peak RSS {:.1} MiB; restarted controller peak RSS \
         {:.1} MiB after reconciling all {count} in {:.1?} (chart limit {limit} MiB)",
        first_peak as f64 / 1024.0,
        peak as f64 / 1024.0,
        restarted.elapsed()
    );
    assert!(
        peak < limit * 1024,
        "peak RSS {peak} KiB over the chart's {limit} MiB"
    );
    Ok(())
}

/// Labels on each grown object (issue 35 High 3: the most that fit the apiserver's object size
/// limit with the managedFields that name each of them).
const GROWN_LABELS: usize = 55_000;
/// Objects of each kind in the grown test.
const GROWN_OBJECTS: usize = 40;

/// `GROWN_LABELS` short labels (key `kNNNNN`, empty value), plus the test's own.
fn grown_labels(cluster: &TestCluster) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = (0..GROWN_LABELS)
        .map(|i| (format!("k{i:05}"), String::new()))
        .collect();
    labels.insert(TEST_LABEL.to_string(), cluster.prefix().to_string());
    labels
}

/// Issue 35 High 3: 40 placements with 55,000 labels each took a fresh controller to 331 MB,
/// and 40 ResourceClaims (anyone's: no hwaccel rights, only the ordinary DRA right to create
/// claims) with 55,000 labels and a 255 KiB annotation to 546 MB, over the chart's 256 MiB
/// limit on every start. The caches now keep only what the controller reads of them.
#[tokio::test]
#[ignore = "needs cluster"]
async fn placements_and_foreign_claims_grown_by_labels_keep_a_fresh_controller_under_its_limit()
-> Result<()> {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let placements = api(&cluster);
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client(), cluster.namespace());
    let labels = grown_labels(&cluster);
    let blob = "a".repeat(255 * 1024);
    let started = Instant::now();
    futures::stream::iter(0..GROWN_OBJECTS)
        .map(|i| {
            let placement = json!({
                "apiVersion": "hwaccel.io/v1alpha1",
                "kind": "ModelPlacement",
                "metadata": {"name": format!("grown-{i:02}"), "labels": labels},
                "spec": serve(json!({"parameters": "8B"})),
            });
            let claim: ResourceClaim = serde_json::from_value(json!({
                "metadata": {
                    "name": format!("foreign-{i:02}"),
                    "labels": labels,
                    "annotations": {"tenant.example.com/blob": blob},
                },
                "spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}
                ]}},
            }))
            .expect("a claim");
            let (placements, claims) = (placements.clone(), claims.clone());
            async move {
                create(&placements, placement).await?;
                claims.create(&PostParams::default(), &claim).await?;
                Ok::<(), kube::Error>(())
            }
        })
        .buffer_unordered(4)
        .try_collect::<Vec<()>>()
        .await
        .context("creating the grown placements and claims")?;
    println!(
        "grown objects: {GROWN_OBJECTS} placements and {GROWN_OBJECTS} claims with \
         {GROWN_LABELS} labels each created in {:.1?}",
        started.elapsed()
    );

    let port = free_port()?;
    let controller = start_controller(&cluster, port)?;
    reconciled(port, GROWN_OBJECTS as u64).await?;
    let peak = peak_rss_kib(controller.0.id()).context("VmHWM")?;
    let limit = chart_memory_limit_mib();
    println!(
        "grown objects: fresh controller peak RSS {:.1} MiB after reconciling all \
         {GROWN_OBJECTS} placements (chart limit {limit} MiB)",
        peak as f64 / 1024.0
    );
    assert!(
        peak < limit * 1024,
        "peak RSS {peak} KiB over the chart's {limit} MiB"
    );
    Ok(())
}
