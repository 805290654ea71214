//! Cleanup against an in-memory Node store: pages, retries, errors on single Nodes, an
//! expired continue token, and a label that comes back after its release.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::api::ObjectMeta;
use kube::core::Status;
use serde_json::json;

use super::*;

fn api_error(code: u16) -> kube::Error {
    kube::Error::Api(Box::new(Status {
        code,
        message: format!("injected {code}"),
        reason: "Injected".to_string(),
        ..Status::default()
    }))
}

/// A Node whose labels `managers` own through server-side apply.
fn node(name: &str, managers: &[&str]) -> Node {
    let managed = managers
        .iter()
        .map(|manager| ManagedFieldsEntry {
            manager: Some((*manager).to_string()),
            operation: Some("Apply".to_string()),
            fields_v1: Some(FieldsV1(json!({
                "f:metadata": { "f:labels": { format!("f:{manager}.example/x"): {} } }
            }))),
            ..ManagedFieldsEntry::default()
        })
        .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            managed_fields: Some(managed),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

#[derive(Default)]
struct Fake {
    nodes: Mutex<BTreeMap<String, Node>>,
    /// Node -> errors its next releases fail with, in order.
    release_errors: Mutex<BTreeMap<String, Vec<u16>>>,
    /// Node -> how many times a writer re-adds its labels after a release.
    comes_back: Mutex<BTreeMap<String, u32>>,
    /// The next list request with a continue token fails with 410 Gone, once.
    expire_token_once: Mutex<bool>,
    /// Every list request: (limit, continue token).
    lists: Mutex<Vec<(u32, Option<String>)>>,
    /// Every release attempt: (node, manager).
    releases: Mutex<Vec<(String, String)>>,
}

impl Fake {
    fn with_nodes(nodes: Vec<Node>) -> Self {
        let fake = Self::default();
        {
            let mut map = fake.nodes.lock().expect("lock");
            for node in nodes {
                map.insert(node.name_any(), node);
            }
        }
        fake
    }
}

impl NodeStore for Fake {
    async fn list_page(&self, limit: u32, token: Option<&str>) -> Result<NodePage, kube::Error> {
        self.lists
            .lock()
            .expect("lock")
            .push((limit, token.map(str::to_string)));
        if token.is_some() && std::mem::take(&mut *self.expire_token_once.lock().expect("lock")) {
            return Err(api_error(410));
        }
        let start: usize = token.map_or(0, |token| token.parse().expect("our token"));
        let nodes = self.nodes.lock().expect("lock");
        let page: Vec<Node> = nodes
            .values()
            .skip(start)
            .take(limit as usize)
            .cloned()
            .collect();
        let end = start + page.len();
        Ok(NodePage {
            nodes: page,
            next: (end < nodes.len()).then(|| end.to_string()),
        })
    }

    async fn get(&self, name: &str) -> Result<Node, kube::Error> {
        let nodes = self.nodes.lock().expect("lock");
        nodes.get(name).cloned().ok_or_else(|| api_error(404))
    }

    async fn release(&self, node: &str, manager: &str, dry_run: bool) -> Result<(), kube::Error> {
        self.releases
            .lock()
            .expect("lock")
            .push((node.to_string(), manager.to_string()));
        if let Some(errors) = self.release_errors.lock().expect("lock").get_mut(node)
            && !errors.is_empty()
        {
            return Err(api_error(errors.remove(0)));
        }
        if dry_run {
            return Ok(());
        }
        let mut comes_back = self.comes_back.lock().expect("lock");
        if let Some(times) = comes_back.get_mut(node)
            && *times > 0
        {
            // A writer still running puts the label straight back.
            *times -= 1;
            return Ok(());
        }
        let mut nodes = self.nodes.lock().expect("lock");
        if let Some(entry) = nodes.get_mut(node)
            && let Some(fields) = entry.metadata.managed_fields.as_mut()
        {
            fields.retain(|field| field.manager.as_deref() != Some(manager));
        }
        Ok(())
    }
}

fn options() -> Options {
    Options {
        page_size: 2,
        retry_pause: Duration::from_millis(1),
        ..Options::default()
    }
}

fn names(summary_nodes: &[NodeCleanup]) -> Vec<&str> {
    summary_nodes
        .iter()
        .map(|done| done.node.as_str())
        .collect()
}

#[tokio::test]
async fn every_page_is_visited_with_the_limit_and_the_continue_token() {
    let fake = Fake::with_nodes(vec![
        node("a", &["hwaccel-agent"]),
        node("b", &[]),
        node("c", &["hwaccel-controller"]),
        node("d", &["other-manager"]),
        node("e", &["hwaccel-agent", "hwaccel-controller"]),
    ]);
    let summary = release_labels(&fake, &[], &options())
        .await
        .expect("cleanup");
    assert!(summary.is_clean(), "{summary:?}");
    assert_eq!(summary.scanned, 5);
    assert_eq!(names(&summary.released), ["a", "c", "e"]);
    let lists = fake.lists.lock().expect("lock").clone();
    // Round 1 (3 pages), then the verifying round (3 pages).
    assert_eq!(
        lists[..3],
        [
            (2, None),
            (2, Some("2".to_string())),
            (2, Some("4".to_string()))
        ]
    );
    assert_eq!(lists.len(), 6);
    // Labels of other managers are never touched.
    let releases = fake.releases.lock().expect("lock").clone();
    assert!(releases.iter().all(|(node, _)| node != "d" && node != "b"));
}

#[tokio::test]
async fn an_error_on_one_node_does_not_stop_the_others_and_transient_ones_are_retried() {
    let fake = Fake::with_nodes(vec![
        node("a", &["hwaccel-agent"]),
        node("b", &["hwaccel-agent"]),
        node("c", &["hwaccel-agent"]),
    ]);
    fake.release_errors.lock().expect("lock").extend([
        // Refused every time: reported, never retried within a round.
        ("a".to_string(), vec![403, 403, 403, 403]),
        // Two server errors, then it lands.
        ("b".to_string(), vec![500, 503]),
    ]);
    let summary = release_labels(&fake, &[], &options())
        .await
        .expect("cleanup");
    assert!(!summary.is_clean());
    assert_eq!(summary.remaining, ["a"]);
    assert_eq!(summary.failed.len(), 1, "{summary:?}");
    assert!(summary.failed[0].1.contains("injected 403"), "{summary:?}");
    assert_eq!(names(&summary.released), ["b", "c"]);
    let releases = fake.releases.lock().expect("lock").clone();
    let tries_on = |name: &str| releases.iter().filter(|(node, _)| node == name).count();
    assert_eq!(tries_on("b"), 3, "two retries then success");
    assert_eq!(tries_on("a"), 3, "one try per round, 3 rounds");
}

#[tokio::test]
async fn a_label_that_comes_back_is_released_again() {
    let fake = Fake::with_nodes(vec![node("a", &["hwaccel-controller"])]);
    fake.comes_back
        .lock()
        .expect("lock")
        .insert("a".to_string(), 1);
    let summary = release_labels(&fake, &[], &options())
        .await
        .expect("cleanup");
    assert!(summary.is_clean(), "{summary:?}");
    assert_eq!(fake.releases.lock().expect("lock").len(), 2);

    // A writer that never stops: the summary says so (and the binary exits non-zero).
    let fake = Fake::with_nodes(vec![node("a", &["hwaccel-controller"])]);
    fake.comes_back
        .lock()
        .expect("lock")
        .insert("a".to_string(), 100);
    let summary = release_labels(&fake, &[], &options())
        .await
        .expect("cleanup");
    assert_eq!(summary.remaining, ["a"]);
    assert!(!summary.is_clean());
}

#[tokio::test]
async fn an_expired_continue_token_restarts_the_scan() {
    let fake = Fake::with_nodes(vec![
        node("a", &["hwaccel-agent"]),
        node("b", &["hwaccel-agent"]),
        node("c", &["hwaccel-agent"]),
    ]);
    *fake.expire_token_once.lock().expect("lock") = true;
    let summary = release_labels(&fake, &[], &options())
        .await
        .expect("cleanup");
    assert!(summary.is_clean(), "{summary:?}");
    assert_eq!(summary.scanned, 3, "no Node counted twice");
    assert_eq!(names(&summary.released), ["a", "b", "c"]);
    let lists = fake.lists.lock().expect("lock").clone();
    assert_eq!(lists[1], (2, Some("2".to_string())), "the expired request");
    assert_eq!(lists[2], (2, None), "started over");
}

#[tokio::test]
async fn named_nodes_missing_ones_skipped_and_dry_run_changes_nothing() {
    let fake = Fake::with_nodes(vec![node("a", &["hwaccel-agent"]), node("b", &[])]);
    let nodes = ["a".to_string(), "gone".to_string()];
    let dry = Options {
        dry_run: true,
        ..options()
    };
    let summary = release_labels(&fake, &nodes, &dry).await.expect("cleanup");
    assert_eq!(names(&summary.released), ["a"]);
    assert!(
        fake.lists.lock().expect("lock").is_empty(),
        "named: no list"
    );
    let still = fake.get("a").await.expect("a");
    assert!(LabelOwnership::of(&still, "hwaccel-agent").owns_any());

    let summary = release_labels(&fake, &nodes, &options())
        .await
        .expect("cleanup");
    assert!(summary.is_clean(), "{summary:?}");
    let after = fake.get("a").await.expect("a");
    assert!(!LabelOwnership::of(&after, "hwaccel-agent").owns_any());
}

#[tokio::test]
async fn a_list_that_keeps_failing_is_an_error() {
    struct Broken;
    impl NodeStore for Broken {
        async fn list_page(&self, _: u32, _: Option<&str>) -> Result<NodePage, kube::Error> {
            Err(api_error(503))
        }
        async fn get(&self, _: &str) -> Result<Node, kube::Error> {
            Err(api_error(503))
        }
        async fn release(&self, _: &str, _: &str, _: bool) -> Result<(), kube::Error> {
            Ok(())
        }
    }
    assert!(release_labels(&Broken, &[], &options()).await.is_err());
    // A named Node that cannot be read is reported, not claimed clean.
    let summary = release_labels(&Broken, &["a".to_string()], &options())
        .await
        .expect("named");
    assert_eq!(summary.remaining, ["a"]);
}

#[test]
fn cleanup_pauses_double_from_the_retry_pause() {
    let options = Options {
        retry_pause: Duration::from_millis(500),
        ..Options::default()
    };
    let backoff = super::retry_backoff(&options);
    let steps: Vec<u128> = [1, 2, 3]
        .map(|retry| backoff.step(retry).as_millis())
        .to_vec();
    assert_eq!(steps, [500, 1000, 2000]);
    let wait = backoff.wait(3);
    assert!(wait >= Duration::from_millis(1000) && wait <= Duration::from_millis(2000));
}
