//! The controller's fast tier: whole reconciles against the in-process fake apiserver
//! ([`FakeApiserver`]), checking which writes a reconcile makes (Node labels, status,
//! finalizer, Events), in which shape, and what happens when the apiserver refuses one.
//! Each test runs in milliseconds; `tests/cluster_controller.rs` runs the same flows against
//! a real kube-apiserver.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use http::StatusCode;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::PartialObjectMetaExt;
use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tokio::sync::{Mutex, mpsc};

use super::core::decide::tests::half_node;
use super::core::labels::placement_label_key;
use super::reconcile::{Error, FINALIZER, error_policy, reconcile};
use crate::api::placement::ModelPlacementStatus;
use crate::api::{Lenient, ModelPlacement};
use crate::controller::context::{Context, FIELD_MANAGER, State};
use crate::controller::core::ledger::PlacementKey;
use crate::controller::core::step::Step;
use crate::controller::events::Recorder;
use crate::controller::fake_apiserver::{FakeApiserver, Recorded};
use crate::controller::metrics::ControllerMetrics;
use crate::testing::dra::fixture_slices;
use crate::testing::inventory::fixture_inventory;

const NODE_PATH: &str = "/api/v1/nodes/n1";
const PLACEMENT_PATH: &str = "/apis/hwaccel.io/v1alpha1/namespaces/ml/modelplacements/p";

/// A controller context over one 8 x H100 node `n1` and the fake apiserver.
pub(crate) struct Harness {
    pub(crate) ctx: Arc<Context>,
    pub(crate) fake: FakeApiserver,
    nodes: Writer<kube::api::PartialObjectMeta<Node>>,
    placements: Writer<Lenient<ModelPlacement>>,
    /// The ResourceClaim watch cache (with [`Harness::with_dra`]).
    pub(crate) claims: Writer<ResourceClaim>,
    /// Where the metrics are registered, to read the gauges back.
    pub(crate) registry: Registry,
    _requeue: mpsc::UnboundedReceiver<()>,
    _requeue_one: mpsc::UnboundedReceiver<crate::controller::core::placement_key::PlacementKey>,
}

impl Harness {
    pub(crate) fn new() -> Self {
        Self::build(None)
    }

    /// The same, on a cluster that serves DRA: `n1`'s GPUs are also published by the NVIDIA
    /// driver (the vendor-shaped slice of `fixtures/dra/`, moved to `n1` and given `n1`'s
    /// PCI bus ids in order, so each published GPU is one of the inventory's), and claims are
    /// watched.
    pub(crate) fn with_dra() -> Self {
        const BUS_ID: &str = "resource.kubernetes.io/pciBusID";
        let inventory = fixture_inventory("h100-8x-nvswitch", "n1");
        let mut ours: Vec<String> = inventory
            .spec
            .devices
            .iter()
            .filter_map(|d| d.attributes.get(BUS_ID)?.as_str().map(str::to_string))
            .collect();
        ours.sort();
        let mut slices = Writer::default();
        for mut slice in fixture_slices(&["nvidia-h100-8x.yaml"]) {
            slice.spec.node_name = Some("n1".into());
            slice.spec.pool.name = "n1".into();
            let devices = slice.spec.devices.iter_mut().flatten();
            let bus_ids = devices.filter_map(|d| d.attributes.as_mut()?.get_mut(BUS_ID));
            let mut theirs: Vec<&mut String> = bus_ids.filter_map(|a| a.string.as_mut()).collect();
            let mut distinct: Vec<String> = theirs.iter().map(|id| id.to_string()).collect();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), ours.len(), "one bus id per GPU");
            for id in &mut theirs {
                let index = distinct.binary_search(id).unwrap_or_default();
                **id = ours[index].clone();
            }
            slices.apply_watcher_event(&watcher::Event::Apply(slice));
        }
        Self::build(Some(slices))
    }

    fn build(slices: Option<Writer<ResourceSlice>>) -> Self {
        let (client, fake) = FakeApiserver::start();
        let mut inventories = Writer::default();
        let inventory = fixture_inventory("h100-8x-nvswitch", "n1");
        inventories.apply_watcher_event(&watcher::Event::Apply(Lenient::Decoded(inventory)));
        let mut nodes = Writer::default();
        nodes.apply_watcher_event(&watcher::Event::Apply(node_meta(BTreeMap::new())));
        fake.insert(
            NODE_PATH,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
        );
        let placements = Writer::default();
        let claims = Writer::default();
        let (requeue, requeue_rx) = mpsc::unbounded_channel();
        let (requeue_one, requeue_one_rx) = mpsc::unbounded_channel();
        let mut registry = Registry::default();
        let dra = slices.is_some();
        let ctx = Context {
            recorder: recorder(&client),
            client,
            placements: placements.as_reader(),
            inventories: inventories.as_reader(),
            nodes: nodes.as_reader(),
            state: Mutex::new(State::default()),
            node_writes: crate::controller::context::NodeWriteLocks::default(),
            in_flight: Default::default(),
            metrics: ControllerMetrics::register(&mut registry),
            requeue,
            requeue_one,
            failures: std::sync::Mutex::new(HashMap::new()),
            idle_devices: std::sync::Mutex::new(HashMap::new()),
            conformance_checked: std::sync::Mutex::new(HashMap::new()),
            fleet_epoch: Arc::new(AtomicU64::new(0)),
            inventory_grace: Duration::from_secs(300),
            device_health_interval: Duration::from_secs(60),
            conformance_list_pods: true,
            pod_index: None,
            fleet_changed: Arc::default(),
            claims: dra.then(|| claims.as_reader()),
            slices: slices.map(|slices| slices.as_reader()),
            scope: None,
        };
        Self {
            ctx: Arc::new(ctx),
            fake,
            nodes,
            placements,
            claims,
            registry,
            _requeue: requeue_rx,
            _requeue_one: requeue_one_rx,
        }
    }

    /// Puts `placement` into the watch cache and the fake's storage, as the apiserver and
    /// the controller's watch would see it.
    pub(crate) fn store(&mut self, placement: &ModelPlacement) {
        let value = serde_json::to_value(placement).unwrap_or(Value::Null);
        let path = format!(
            "/apis/hwaccel.io/v1alpha1/namespaces/{}/modelplacements/{}",
            placement.namespace().unwrap_or_default(),
            placement.name_any()
        );
        self.fake.insert(&path, value);
        let event = watcher::Event::Apply(Lenient::Decoded(placement.clone()));
        self.placements.apply_watcher_event(&event);
    }

    /// Puts the labels the fake's Node carries into the Node watch cache.
    pub(crate) fn sync_node_cache(&mut self) {
        let labels = self
            .fake
            .object(NODE_PATH)
            .and_then(|node| serde_json::from_value(node["metadata"]["labels"].clone()).ok())
            .unwrap_or_default();
        self.nodes
            .apply_watcher_event(&watcher::Event::Apply(node_meta(labels)));
    }

    pub(crate) async fn reconcile(&self, placement: &ModelPlacement) -> Result<Action, Error> {
        let object = Arc::new(Lenient::Decoded(placement.clone()));
        reconcile(object, self.ctx.clone()).await
    }
}

fn recorder(client: &Client) -> Recorder {
    let reporter = Reporter {
        controller: FIELD_MANAGER.to_string(),
        instance: None,
    };
    Recorder::new(client.clone(), reporter)
}

fn node_meta(labels: BTreeMap<String, String>) -> kube::api::PartialObjectMeta<Node> {
    ObjectMeta {
        name: Some("n1".into()),
        labels: Some(labels),
        ..ObjectMeta::default()
    }
    .into_response_partial::<Node>()
}

/// Placement `ml/p`: 70B at bf16 for 40 requests (half of `n1`), finalizer already added.
pub(crate) fn placement() -> ModelPlacement {
    let mut placement = ModelPlacement::new("p", half_node());
    let meta = placement.meta_mut();
    meta.namespace = Some("ml".into());
    meta.uid = Some("uid-p".into());
    meta.generation = Some(1);
    meta.finalizers = Some(vec![FINALIZER.to_string()]);
    meta.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    placement
}

fn node_label_writes(fake: &FakeApiserver) -> Vec<Recorded> {
    let patches = fake.patches();
    patches
        .into_iter()
        .filter(|r| r.path == NODE_PATH)
        .collect()
}

fn status_writes(fake: &FakeApiserver) -> Vec<ModelPlacementStatus> {
    status_writes_of(fake, PLACEMENT_PATH)
}

/// The statuses written to the placement at `path`, in order.
pub(crate) fn status_writes_of(fake: &FakeApiserver, path: &str) -> Vec<ModelPlacementStatus> {
    let status_path = format!("{path}/status");
    let patches = fake.patches();
    patches
        .into_iter()
        .filter(|r| r.path == status_path)
        .filter_map(|r| serde_json::from_value(r.body["status"].clone()).ok())
        .collect()
}

fn condition<'a>(status: &'a ModelPlacementStatus, kind: &str) -> (&'a str, &'a str) {
    crate::api::conditions::find(&status.conditions, kind)
        .map_or(("", ""), |c| (c.status.as_str(), c.reason.as_str()))
}

fn is_forced_apply(write: &Recorded) -> bool {
    write.content_type == "application/apply-patch+yaml"
        && write.query.contains("fieldManager=hwaccel-controller")
        && write.query.contains("force=true")
}

#[tokio::test]
async fn a_new_plan_labels_its_node_and_writes_a_ready_status_once() {
    let mut harness = Harness::new();
    let placement = placement();
    harness.store(&placement);
    let action = harness.reconcile(&placement).await.expect("reconcile");
    assert_eq!(action, Action::requeue(Duration::from_secs(600)));

    let labels = node_label_writes(&harness.fake);
    assert_eq!(labels.len(), 1, "one label write: {labels:?}");
    assert!(is_forced_apply(&labels[0]), "{:?}", labels[0]);
    let key = placement_label_key("ml", "p");
    assert_eq!(labels[0].body["metadata"]["labels"][&key], json!("true"));

    let statuses = status_writes(&harness.fake);
    assert_eq!(statuses.len(), 1, "one status write");
    let status = &statuses[0];
    assert_eq!(status.state.as_deref(), Some("Planned"));
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(condition(status, "Planned"), ("True", "Planned"));
    assert_eq!(condition(status, "Ready"), ("True", "NodesLabelled"));
    assert_eq!(
        status.node_selector.get(&key).map(String::as_str),
        Some("true")
    );
    let devices: usize = status.assignments.iter().map(|a| a.devices.len()).sum();
    assert_eq!(devices, 4, "half of the node");

    // A first plan is routine: the Planned condition says it, no Event repeats it.
    // Events are published in the background: give one time to arrive before looking.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        harness.fake.events(0).await.is_empty(),
        "no Event for a first plan"
    );
}

#[tokio::test]
async fn a_steady_placement_writes_nothing() {
    let mut harness = Harness::new();
    let mut placement = placement();
    harness.store(&placement);
    harness
        .reconcile(&placement)
        .await
        .expect("first reconcile");
    // The watches catch up with what was written.
    placement.status = status_writes(&harness.fake).pop();
    harness.store(&placement);
    harness.sync_node_cache();
    harness.fake.clear();
    // Long after the label write: only the cache's labels say the Node is up to date.
    harness.ctx.state.lock().await.applied_labels.clear();

    harness
        .reconcile(&placement)
        .await
        .expect("second reconcile");
    assert_eq!(
        harness.fake.patches().len(),
        0,
        "{:?}",
        harness.fake.patches()
    );
}

#[tokio::test]
async fn a_refused_label_write_fails_the_reconcile_and_takes_ready_back() {
    let mut harness = Harness::new();
    let placement = placement();
    harness.store(&placement);
    harness
        .fake
        .refuse("PATCH", "/nodes/n1", StatusCode::FORBIDDEN);

    let error = harness.reconcile(&placement).await.expect_err("must fail");
    // Inside kube-runtime's finalizer helper, but the label write is what failed.
    assert_eq!(error.step(), Step::Apply, "{error}");
    assert!(
        error.to_string().contains("refused by the fake apiserver"),
        "{error}"
    );
    // Ready was written on the assumption the labels land, then taken back.
    let statuses = status_writes(&harness.fake);
    assert_eq!(statuses.len(), 2, "{statuses:?}");
    assert_eq!(condition(&statuses[0], "Ready"), ("True", "NodesLabelled"));
    assert_eq!(
        condition(&statuses[1], "Ready"),
        ("False", "LabelWriteFailed")
    );
    assert_eq!(condition(&statuses[1], "Planned"), ("True", "Planned"));

    // While the refusal lasts, a retry writes the labels first and never says Ready.
    let mut placement = placement;
    placement.status = statuses.last().cloned();
    harness.store(&placement);
    harness.fake.clear();
    harness
        .reconcile(&placement)
        .await
        .expect_err("still refused");
    assert_eq!(node_label_writes(&harness.fake).len(), 1);
    let retried = status_writes(&harness.fake);
    assert!(
        retried.iter().all(|s| condition(s, "Ready").0 == "False"),
        "{retried:?}"
    );

    // The devices stay held, so the retry writes the labels once they are allowed, and
    // only then does the status say Ready.
    harness.fake.stop_refusing();
    harness.fake.clear();
    harness.reconcile(&placement).await.expect("retry");
    let paths: Vec<String> = harness.fake.patches().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        [NODE_PATH.to_string(), format!("{PLACEMENT_PATH}/status")]
    );
    let statuses = status_writes(&harness.fake);
    assert_eq!(condition(&statuses[0], "Ready"), ("True", "NodesLabelled"));
}

/// A reconcile of the usual placement whose status write the fake apiserver refuses: the
/// harness, the placement and the reconcile's error.
async fn reconcile_with_a_refused_status_write() -> (Harness, ModelPlacement, Error) {
    let mut harness = Harness::new();
    let placement = placement();
    harness.store(&placement);
    harness.fake.refuse(
        "PATCH",
        "/modelplacements/p/status",
        StatusCode::INTERNAL_SERVER_ERROR,
    );
    let error = harness.reconcile(&placement).await.expect_err("must fail");
    (harness, placement, error)
}

#[tokio::test]
async fn a_refused_status_write_fails_the_reconcile_after_labelling() {
    let (harness, _, error) = reconcile_with_a_refused_status_write().await;
    assert!(
        error.to_string().contains("refused by the fake apiserver"),
        "{error}"
    );
    assert_eq!(error.step(), Step::Status, "{error}");
    assert_eq!(node_label_writes(&harness.fake).len(), 1);
    let state = harness.ctx.state.lock().await;
    assert!(state.ledger.get(&PlacementKey::new("ml", "p")).is_some());
}

#[tokio::test]
async fn a_failed_reconcile_is_counted_and_reported_under_the_step_that_failed() {
    use prometheus_client::encoding::text::encode;
    let (harness, placement, error) = reconcile_with_a_refused_status_write().await;
    harness.fake.clear();

    let object = Arc::new(Lenient::Decoded(placement));
    let action = error_policy(object, &error, harness.ctx.clone());
    assert_ne!(action, Action::await_change(), "a failure is retried");

    let mut text = String::new();
    encode(&mut text, &harness.registry).expect("encode");
    let series = |step: &str| {
        let prefix = format!("hwaccel_controller_reconcile_failures_total{{step=\"{step}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix).map(str::to_string))
    };
    assert_eq!(series("status").as_deref(), Some("1"), "{text}");
    // Every other step's series is there, at zero.
    for step in Step::ALL.iter().filter(|s| **s != Step::Status) {
        assert_eq!(series(step.as_label()).as_deref(), Some("0"), "{text}");
    }
    let events = harness.fake.events(1).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].body["reason"], json!("StatusFailed"));
    assert_eq!(events[0].body["type"], json!("Warning"));
    let note = events[0].body["note"].as_str().unwrap_or_default();
    assert!(note.starts_with("the status step failed: "), "{note}");
    assert!(note.contains("refused by the fake apiserver"), "{note}");
}

#[tokio::test]
async fn deleting_a_placement_removes_its_labels_then_its_finalizer() {
    let mut harness = Harness::new();
    let mut placement = placement();
    harness.store(&placement);
    harness.reconcile(&placement).await.expect("plan");
    harness.sync_node_cache();
    harness.fake.clear();

    placement.meta_mut().deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    harness.store(&placement);
    let action = harness.reconcile(&placement).await.expect("cleanup");
    assert_eq!(action, Action::await_change());

    let writes = harness.fake.patches();
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(writes[0].path, NODE_PATH);
    assert!(is_forced_apply(&writes[0]));
    assert_eq!(writes[0].body["metadata"]["labels"], json!({}));
    assert_eq!(writes[1].path, PLACEMENT_PATH);
    assert_eq!(writes[1].content_type, "application/json-patch+json");
    let finalizers = harness
        .fake
        .object(PLACEMENT_PATH)
        .map(|p| p["metadata"]["finalizers"].clone());
    assert_eq!(finalizers, Some(json!([])));
    let state = harness.ctx.state.lock().await;
    assert!(state.ledger.get(&PlacementKey::new("ml", "p")).is_none());
}

#[tokio::test]
async fn an_undecodable_placement_is_reported_and_nothing_is_written() {
    let harness = Harness::new();
    let object = Arc::new(Lenient::<ModelPlacement>::Undecodable {
        metadata: placement().metadata,
        error: "spec.goal: nested too deep".into(),
    });
    let action = reconcile(object, harness.ctx.clone())
        .await
        .expect("skipped");
    assert_eq!(action, Action::await_change());
    assert_eq!(harness.fake.patches().len(), 0);
    let events = harness.fake.events(1).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].body["reason"], json!("Undecodable"));
    assert_eq!(events[0].body["type"], json!("Warning"));
}

#[test]
fn a_failing_placement_waits_one_second_doubling_up_to_five_minutes() {
    use super::reconcile::ERROR_BACKOFF;
    let steps: Vec<u64> = [1, 2, 9, 10, 1000]
        .map(|retry| ERROR_BACKOFF.step(retry).as_secs())
        .to_vec();
    assert_eq!(steps, [1, 2, 256, 300, 300]);
    for retry in 1..=12 {
        let wait = ERROR_BACKOFF.wait(retry);
        assert!(wait >= Duration::from_millis(500) && wait <= Duration::from_secs(300));
    }
}

/// Issue 35: Events about a placement named near the 253-character limit were named past it
/// (`<name>.<nanoseconds>`), so the apiserver refused every one. Their names are shortened
/// now; the Event still names the placement whole.
#[tokio::test]
async fn a_placement_named_near_the_limit_gets_events_with_valid_names() {
    let mut harness = Harness::new();
    let mut placement = placement();
    let name = format!("{}.llama", "a".repeat(246));
    assert_eq!(name.len(), 252);
    placement.meta_mut().name = Some(name.clone());
    // A refusal has an Event (a first plan has none): 405B in BF16 is more than one node.
    placement.spec = crate::testing::PlacementBuilder::serve("llama-3.1-405b")
        .precision(crate::api::placement::PrecisionChoice::Bf16)
        .spec();
    harness.store(&placement);
    harness.reconcile(&placement).await.expect("reconcile");
    let events = harness.fake.events(1).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let event_name = events[0].body["metadata"]["name"]
        .as_str()
        .unwrap_or_default();
    assert!(
        event_name.len() <= 253 && event_name.starts_with("aaaa"),
        "{event_name} ({} bytes)",
        event_name.len()
    );
    assert!(
        event_name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'),
        "{event_name}"
    );
    assert_eq!(events[0].body["regarding"]["name"], json!(name));
}
