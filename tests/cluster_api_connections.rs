//! What a process's connections to the apiserver are, on the real apiserver (issue 41, ADR
//! 0013): the project's client speaks HTTP/2, so an agent's watches and its calls share one
//! TLS connection, where kube's own stack (HTTP/1.1) holds one per watch.
//!
//! `the_agents_watches_share_one_connection` runs in the cluster tier. The scale variant
//! (`SCALE_RUN=1`, `AGENT_WATCH_AGENTS`, default 1,000) opens that many agents' watches as
//! agents held them before issue 41 (three: the Node, the inventory's metadata, the slices,
//! each on its own HTTP/1.1 connection) and as they hold them now (the Node and the slices
//! over one HTTP/2 connection), and prints the apiserver memory each agent costs (RSS and Go
//! heap), the figures in docs/benchmarks.md:
//!
//! ```text
//! TC_APISERVER_PROFILING=1 tests/cluster/up.sh DIR; set -a; . DIR/env; set +a
//! SCALE_RUN=1 AGENT_WATCH_AGENTS=1000 [AGENT_WATCH_ORDER=now-first] \
//!   cargo test --test cluster_tier -- --ignored --nocapture cluster_api_connections::apiserver_memory
//! ```

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use futures::future::try_join_all;
use futures::{Stream, StreamExt as _};
use hwaccel::agent::own_objects::WATCHES;
use hwaccel::api::AcceleratorInventory;
use hwaccel::kube_client::{DEFAULT_API_TIMEOUT, HttpVersions, client_over};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{ListParams, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use support::{TestCluster, install_crds};

/// One of the watches an agent holds, scoped to its node as the agent scopes it.
#[derive(Debug, Clone, Copy)]
enum Watch {
    /// Its Node, by `metadata.name`.
    Node,
    /// Its inventory's metadata, by `metadata.name` (before issue 41).
    Inventory,
    /// Its node's ResourceSlices, by `spec.nodeName`.
    Slices,
}

/// The watches an agent holds now (`hwaccel::agent::own_objects`).
const NOW: [Watch; WATCHES] = [Watch::Node, Watch::Slices];
/// The watches an agent held before issue 41, each on its own HTTP/1.1 connection.
const BEFORE: [Watch; 3] = [Watch::Node, Watch::Inventory, Watch::Slices];

/// The apiserver's port, from `https://127.0.0.1:<port>`.
fn apiserver_port(cluster: &TestCluster) -> Result<u16> {
    let url = &cluster.env().apiserver;
    url.rsplit(':')
        .next()
        .and_then(|port| port.trim_end_matches('/').parse().ok())
        .with_context(|| format!("no port in {url}"))
}

/// Established TCP connections of this process to `port`: its socket inodes (`/proc/self/fd`)
/// matched with the kernel's connection tables.
fn connections_to(port: u16) -> Result<usize> {
    let mut inodes = BTreeSet::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let Ok(target) = std::fs::read_link(entry?.path()) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|rest| rest.strip_suffix(']'))
        {
            inodes.insert(inode.to_string());
        }
    }
    let mut count = 0;
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local, remote, state ("01" established), ..., inode (field 9).
            let (Some(remote), Some(state), Some(inode)) =
                (fields.get(2), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let remote_port = remote
                .rsplit(':')
                .next()
                .and_then(|hex| u16::from_str_radix(hex, 16).ok());
            if remote_port == Some(port) && *state == "01" && inodes.contains(*inode) {
                count += 1;
            }
        }
    }
    Ok(count)
}

/// A client as the agent makes one, from the test cluster's admin kubeconfig.
async fn client(cluster: &TestCluster, versions: HttpVersions) -> Result<Client> {
    let kubeconfig = Kubeconfig::read_from(&cluster.env().kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(client_over(config, DEFAULT_API_TIMEOUT, versions)?)
}

/// A held watch's event stream.
type Held = std::pin::Pin<Box<dyn Stream<Item = ()> + Send>>;

/// Holds `stream` open, dropping its events (none arrive: nothing carries the watched names).
fn hold<S: Stream + Send + 'static>(stream: S) -> Held {
    Box::pin(stream.map(|_| ()))
}

/// An agent's `watches` for the node `node` (which need not exist), held open; one list made
/// meanwhile, as the agent's calls share the client.
async fn open_agent_watches(client: &Client, node: &str, watches: &[Watch]) -> Result<Vec<Held>> {
    let by_name = format!("metadata.name={node}");
    let params = |selector: &str| WatchParams::default().fields(selector).timeout(290);
    let mut held = Vec::new();
    for watch in watches {
        held.push(match watch {
            Watch::Node => hold(
                Api::<Node>::all(client.clone())
                    .watch(&params(&by_name), "0")
                    .await?,
            ),
            Watch::Inventory => hold(
                Api::<AcceleratorInventory>::all(client.clone())
                    .watch_metadata(&params(&by_name), "0")
                    .await?,
            ),
            Watch::Slices => hold(
                Api::<ResourceSlice>::all(client.clone())
                    .watch(&params(&format!("spec.nodeName={node}")), "0")
                    .await?,
            ),
        });
    }
    Api::<Node>::all(client.clone())
        .list_metadata(&ListParams::default().limit(1))
        .await?;
    Ok(held)
}

/// The connections one agent-like client opens for its watches and a call.
async fn connections_of_one_agent(cluster: &TestCluster, versions: HttpVersions) -> Result<usize> {
    let port = apiserver_port(cluster)?;
    let before = connections_to(port)?;
    let client = client(cluster, versions).await?;
    let held = open_agent_watches(&client, &cluster.unique_name("conn"), &BEFORE).await?;
    let during = connections_to(port)?;
    drop(held);
    Ok(during.saturating_sub(before))
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn the_agents_watches_share_one_connection() -> Result<()> {
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let multiplexed = connections_of_one_agent(&cluster, HttpVersions::Http2Preferred).await?;
    assert_eq!(
        multiplexed, 1,
        "three watches and a call over HTTP/2 should share one connection"
    );
    // The same calls over HTTP/1.1 hold a connection per watch: what the count above saves.
    let separate = connections_of_one_agent(&cluster, HttpVersions::Http1Only).await?;
    assert!(
        separate >= BEFORE.len(),
        "over HTTP/1.1 each watch holds a connection: {separate}"
    );
    Ok(())
}

/// The apiserver's resident memory and Go heap in use, in bytes, right after a garbage
/// collection (asking for a heap profile with `gc=1` runs one first, so the heap figure is
/// what is live, not what the collector has yet to free).
async fn apiserver_memory(cluster: &TestCluster) -> Result<(f64, f64)> {
    cluster
        .client()
        .request_text(http::Request::get("/debug/pprof/heap?gc=1&debug=1").body(Vec::new())?)
        .await
        .context("the apiserver's heap profile: start the cluster with TC_APISERVER_PROFILING=1")?;
    let pid = std::fs::read_to_string(cluster.env().work.join("run/kube-apiserver.pid"))?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim()))?;
    let rss_kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")?;
    let metrics = cluster
        .client()
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    let heap: f64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("go_memstats_heap_inuse_bytes "))
        .and_then(|value| value.trim().parse().ok())
        .context("no go_memstats_heap_inuse_bytes")?;
    Ok((rss_kib * 1024.0, heap))
}

/// Opens `agents` agents' `watches` over `versions` and prints what each agent costs the
/// apiserver.
async fn watch_memory(
    cluster: &TestCluster,
    agents: usize,
    (versions, watches): (HttpVersions, &[Watch]),
) -> Result<()> {
    let port = apiserver_port(cluster)?;
    let (rss_before, heap_before) = apiserver_memory(cluster).await?;
    let connections_before = connections_to(port)?;
    let mut held = Vec::new();
    for start in (0..agents).step_by(50) {
        let batch = (start..agents.min(start + 50)).map(|agent| async move {
            let client = client(cluster, versions).await?;
            let held =
                open_agent_watches(&client, &cluster.unique_name(&format!("a{agent}")), watches)
                    .await?;
            anyhow::Ok((client, held))
        });
        held.extend(try_join_all(batch).await?);
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (rss, heap) = apiserver_memory(cluster).await?;
    let connections = connections_to(port)? - connections_before;
    let per = |after: f64, before: f64| (after - before) / agents as f64 / 1024.0;
    println!(
        "watch memory: {agents} agents x {watches:?} over {versions:?}: \
         {connections} connections; apiserver per agent: RSS {:.1} KiB, Go heap {:.1} KiB",
        per(rss, rss_before),
        per(heap, heap_before)
    );
    drop(held);
    tokio::time::sleep(Duration::from_secs(10)).await;
    Ok(())
}

#[tokio::test]
#[ignore = "scale run: scripts/scale.sh"]
async fn apiserver_memory_per_agent() -> Result<()> {
    if !support::scale_run("measure the agents' watches") {
        return Ok(());
    }
    let agents: usize = std::env::var("AGENT_WATCH_AGENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    raise_open_files(agents * (BEFORE.len() + 2) + 1024)?;
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    // Both from the same apiserver, measured apart; the agents as before issue 41 first unless
    // `AGENT_WATCH_ORDER=now-first` (the apiserver keeps some memory it grew for the first,
    // so running both orders shows how much that flatters the second).
    let mut order = [
        (HttpVersions::Http1Only, &BEFORE[..]),
        (HttpVersions::Http2Preferred, &NOW[..]),
    ];
    if std::env::var("AGENT_WATCH_ORDER").as_deref() == Ok("now-first") {
        order.reverse();
    }
    for shape in order {
        watch_memory(&cluster, agents, shape).await?;
    }
    Ok(())
}

/// Lets this process hold `wanted` files (a connection each), within the hard limit.
fn raise_open_files(wanted: usize) -> Result<()> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain libc calls on a local struct.
    #[allow(unsafe_code)]
    let ok = unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && {
            limit.rlim_cur = limit
                .rlim_max
                .min(wanted as libc::rlim_t)
                .max(limit.rlim_cur);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0
        }
    };
    if !ok || (limit.rlim_cur as usize) < wanted {
        bail!("cannot hold {wanted} open files (limit {})", limit.rlim_cur);
    }
    Ok(())
}
