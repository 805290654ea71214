//! `hwaccel cleanup`: the uninstall path that removes our labels from Nodes.
//!
//! Server-side apply makes this exact: applying an empty label set as a field manager releases
//! every label that manager owns, and the apiserver deletes a released label nobody else owns.
//! Labels other managers set, including ones under our prefixes, stay. The Helm chart runs
//! this as a pre-delete hook; it can also be run by hand.
//!
//! Uninstall must not lose a race with our own writers, nor give up on the first error:
//! - [`stop`] first stops the controller (scale to 0) and the agents (their DaemonSet is
//!   deleted), and waits until their pods are gone and the leader Lease is free, so nothing
//!   re-adds a label behind the cleanup's back.
//! - Nodes are listed in pages (`limit`/`continue`), so a large cluster is never one huge
//!   response; an expired continue token restarts the scan.
//! - Each Node is retried on transient errors, and an error on one Node does not stop the
//!   others. A final scan verifies that no Node still carries labels our managers own; the
//!   [`Summary`] says which ones do, and the binary then exits non-zero.

pub mod stop;

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::agent::node_labels::LabelOwnership;
use crate::backoff::{Backoff, Retries};
use crate::kube_client::is_transient;

/// The field managers whose labels cleanup releases: the agent's, the controller's and the
/// agent's opt-in compatibility labels' (`nvidia.com/gpu.product`...).
pub const FIELD_MANAGERS: [&str; 3] = [
    "hwaccel-agent",
    "hwaccel-controller",
    crate::agent::compat_labels::FIELD_MANAGER,
];

/// What cleanup did to one Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCleanup {
    /// The Node's name.
    pub node: String,
    /// Field managers whose labels were released.
    pub released: Vec<String>,
}

/// One page of a Node list.
#[derive(Debug, Clone, Default)]
pub struct NodePage {
    /// The Nodes of this page.
    pub nodes: Vec<Node>,
    /// The token for the next page; `None` on the last one.
    pub next: Option<String>,
}

/// The Node operations cleanup needs; implemented by `Api<Node>`, and by a fake in tests.
pub trait NodeStore: Sync {
    /// One page of at most `limit` Nodes, continuing after `token`.
    fn list_page(
        &self,
        limit: u32,
        token: Option<&str>,
    ) -> impl Future<Output = Result<NodePage, kube::Error>> + Send;
    /// One Node by name.
    fn get(&self, name: &str) -> impl Future<Output = Result<Node, kube::Error>> + Send;
    /// Releases every label `manager` owns on `node` (server-side apply of no labels).
    fn release(
        &self,
        node: &str,
        manager: &str,
        dry_run: bool,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
}

impl NodeStore for Api<Node> {
    async fn list_page(&self, limit: u32, token: Option<&str>) -> Result<NodePage, kube::Error> {
        let mut params = ListParams::default().limit(limit);
        if let Some(token) = token {
            params = params.continue_token(token);
        }
        let list = self.list(&params).await?;
        Ok(NodePage {
            next: list.metadata.continue_.filter(|token| !token.is_empty()),
            nodes: list.items,
        })
    }

    async fn get(&self, name: &str) -> Result<Node, kube::Error> {
        Api::get(self, name).await
    }

    async fn release(&self, node: &str, manager: &str, dry_run: bool) -> Result<(), kube::Error> {
        let mut params = PatchParams::apply(manager);
        if dry_run {
            params = params.dry_run();
        }
        let patch = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": node, "labels": {} },
        });
        self.patch(node, &params, &Patch::Apply(&patch))
            .await
            .map(drop)
    }
}

/// How cleanup pages, retries and verifies.
#[derive(Debug, Clone)]
pub struct Options {
    /// Ask the apiserver to validate the changes without making them (no verification).
    pub dry_run: bool,
    /// Nodes per list request.
    pub page_size: u32,
    /// Tries per request (list page, get, release) before it counts as failed.
    pub attempts: u32,
    /// Pause before the first retry; doubled for each further one.
    pub retry_pause: Duration,
    /// Release-and-verify rounds: a Node that still carries our labels after a round is
    /// released again in the next one.
    pub rounds: u32,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            dry_run: false,
            page_size: 100,
            attempts: 4,
            retry_pause: Duration::from_millis(500),
            rounds: 3,
        }
    }
}

/// What a cleanup run did and what it could not do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Nodes looked at (in the first round).
    pub scanned: usize,
    /// Nodes whose labels were released (or would be, in a dry run).
    pub released: Vec<NodeCleanup>,
    /// Node name and the last error, for every release that failed after its retries.
    pub failed: Vec<(String, String)>,
    /// Nodes that still carry labels our managers own after the last round.
    pub remaining: Vec<String>,
}

impl Summary {
    /// True when every label of ours is gone (a dry run: when every release was accepted).
    pub fn is_clean(&self) -> bool {
        self.remaining.is_empty() && self.failed.is_empty()
    }
}

/// Releases our labels from the named Nodes, or from every Node when `nodes` is empty, then
/// verifies. Errors on single Nodes are collected in the [`Summary`]; only a list that keeps
/// failing (the Nodes cannot even be enumerated) is an `Err`.
pub async fn release_labels<S: NodeStore>(
    store: &S,
    nodes: &[String],
    options: &Options,
) -> Result<Summary, kube::Error> {
    let mut summary = Summary::default();
    for round in 0..options.rounds.max(1) {
        // Every round re-reads the targets: it verifies the previous round and retries what
        // failed or came back.
        let visits = visit(store, nodes, options).await?;
        if round == 0 {
            summary.scanned = visits.len();
        }
        summary.failed.clear();
        let mut dirty = false;
        for visit in visits {
            if let Some(err) = visit.unreadable {
                summary.failed.push((visit.node, err));
                dirty = true;
                continue;
            }
            if visit.owners.is_empty() {
                continue;
            }
            dirty = true;
            let mut released = Vec::new();
            for manager in visit.owners {
                match retry(options, || {
                    store.release(&visit.node, manager, options.dry_run)
                })
                .await
                {
                    Ok(()) => released.push(manager.to_string()),
                    Err(err) if is_not_found(&err) => {}
                    Err(err) => summary
                        .failed
                        .push((visit.node.clone(), format!("{manager}: {err}"))),
                }
            }
            if !released.is_empty() {
                merge_released(&mut summary.released, visit.node, released);
            }
        }
        if !dirty || options.dry_run {
            return Ok(summary);
        }
    }
    // The last round released something: check that it stuck.
    summary.remaining = visit(store, nodes, options)
        .await?
        .into_iter()
        .filter(|visit| visit.unreadable.is_some() || !visit.owners.is_empty())
        .map(|visit| visit.node)
        .collect();
    if summary.remaining.is_empty() {
        summary.failed.clear();
    }
    Ok(summary)
}

fn merge_released(done: &mut Vec<NodeCleanup>, node: String, released: Vec<String>) {
    match done.iter_mut().find(|entry| entry.node == node) {
        Some(entry) => {
            for manager in released {
                if !entry.released.contains(&manager) {
                    entry.released.push(manager);
                }
            }
        }
        None => done.push(NodeCleanup { node, released }),
    }
}

/// One target Node as a round saw it.
struct Visit {
    node: String,
    /// Our field managers that own at least one of its labels.
    owners: Vec<&'static str>,
    /// Why a named Node could not be read (after retries).
    unreadable: Option<String>,
}

impl Visit {
    fn of(node: &Node) -> Self {
        Self {
            node: node.name_any(),
            owners: FIELD_MANAGERS
                .into_iter()
                .filter(|manager| LabelOwnership::of(node, manager).owns_any())
                .collect(),
            unreadable: None,
        }
    }
}

/// Reads the named Nodes (a missing one is skipped), or every Node page by page.
async fn visit<S: NodeStore>(
    store: &S,
    nodes: &[String],
    options: &Options,
) -> Result<Vec<Visit>, kube::Error> {
    let mut out = Vec::new();
    if !nodes.is_empty() {
        for name in nodes {
            match retry(options, || store.get(name)).await {
                Ok(node) => out.push(Visit::of(&node)),
                Err(err) if is_not_found(&err) => {}
                Err(err) => out.push(Visit {
                    node: name.clone(),
                    owners: Vec::new(),
                    unreadable: Some(err.to_string()),
                }),
            }
        }
        return Ok(out);
    }
    // A continue token expires (410 Gone) when a scan outlives etcd's compaction window; the
    // scan then starts over, a bounded number of times.
    let mut restarts = 0;
    let mut token: Option<String> = None;
    loop {
        let limit = options.page_size.max(1);
        let page = match retry(options, || store.list_page(limit, token.as_deref())).await {
            Ok(page) => page,
            Err(err) if is_gone(&err) && token.is_some() && restarts < 3 => {
                tracing::warn!("the Node list's continue token expired; listing again");
                restarts += 1;
                token = None;
                out.clear();
                continue;
            }
            Err(err) => return Err(err),
        };
        out.extend(page.nodes.iter().map(Visit::of));
        match page.next {
            Some(next) => token = Some(next),
            None => return Ok(out),
        }
    }
}

/// Runs `request` up to `options.attempts` times while it fails with an error worth
/// retrying, pausing as [`retry_backoff`] says.
async fn retry<T, F, Fut>(options: &Options, mut request: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut retries = Retries::new(retry_backoff(options));
    let mut attempt = 1;
    loop {
        match request().await {
            Ok(value) => return Ok(value),
            Err(err) if attempt < options.attempts.max(1) && is_transient(&err) => {
                let pause = retries.next_wait();
                tracing::warn!(error = %err, attempt, retry_in = ?pause, "cleanup request failed; retrying");
                tokio::time::sleep(pause).await;
                attempt += 1;
            }
            Err(err) => return Err(err),
        }
    }
}

/// The pauses between a request's attempts: `retry_pause`, then twice that, and so on (the
/// attempt count bounds them, so the steps need no cap of their own), each jittered into the
/// upper half of its step.
fn retry_backoff(options: &Options) -> Backoff {
    Backoff::new(options.retry_pause, Duration::MAX)
}

fn status_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

fn is_not_found(err: &kube::Error) -> bool {
    status_code(err) == Some(404)
}

fn is_gone(err: &kube::Error) -> bool {
    status_code(err) == Some(410)
}

#[cfg(test)]
mod tests;
