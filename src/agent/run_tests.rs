//! The agent's publish against the in-process fake apiserver: which writes a cycle makes after
//! someone else (the controller, a user) wrote the inventory, what it logs, and whether the
//! conditions keep their transition times. `tests/cluster_agent.rs` runs the same flow
//! against a real kube-apiserver.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::metrics::AgentMetrics;
use super::run::{Agent, AgentConfig, PublishOutcome};
use crate::api::AcceleratorInventory;
use crate::controller::fake_apiserver::FakeApiserver;
use crate::detect::{HostRoot, ProcessView};
use crate::hardware::Report;
use crate::testing::fixture::{fixture_report, host_dir};

const NODE: &str = "n1";
const NODE_PATH: &str = "/api/v1/nodes/n1";
const INVENTORY_PATH: &str = "/apis/hwaccel.io/v1alpha1/acceleratorinventories/n1";
/// A transition time long past, so a time the agent resets is plain to see.
const LONG_AGO: &str = "2020-01-01T00:00:00Z";

/// An agent for `n1` over the fake, with a process view of an empty directory (the tests
/// never depend on where they run).
fn agent(client: Client) -> (Agent, tempfile::TempDir) {
    let scenario = "h100-8x-nvswitch";
    let config = AgentConfig {
        node_name: NODE.to_string(),
        host_root: host_dir(scenario),
        backends: "all,-vulkan".parse().unwrap(),
        tool_paths: vec![host_dir(scenario).join("commands")],
        tool_timeout: Duration::from_secs(10),
        interval: Duration::from_secs(60),
        hotplug_poll: Duration::from_secs(5),
        misses_to_remove: 3,
        max_backoff: Duration::from_secs(2),
    };
    let metrics = AgentMetrics::register(&mut prometheus_client::registry::Registry::default());
    let process = tempfile::tempdir().unwrap();
    let agent = Agent::new(config, client, metrics)
        .with_process(ProcessView::new(HostRoot::new(process.path()), false));
    (agent, process)
}

/// A fake with the Node `n1` and no inventory yet.
fn fake() -> (Client, FakeApiserver) {
    let (client, fake) = FakeApiserver::start();
    fake.insert(
        NODE_PATH,
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": NODE, "uid": "uid-n1", "resourceVersion": "1"}}),
    );
    (client, fake)
}

/// Log lines written while `f` runs on this thread.
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn publish_logged(agent: &mut Agent, report: &Report) -> (PublishOutcome, String) {
    let buffer = Arc::new(Mutex::new(Vec::new()));
    let writer = Arc::clone(&buffer);
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || Captured(Arc::clone(&writer)))
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    let outcome = agent.publish(report).await.unwrap();
    drop(guard);
    let logged = String::from_utf8_lossy(&buffer.lock().unwrap()).into_owned();
    (outcome, logged)
}

/// The stored inventory's conditions, by type: (status, lastTransitionTime).
fn conditions(fake: &FakeApiserver) -> Vec<(String, String, String)> {
    let stored = fake.object(INVENTORY_PATH).unwrap();
    stored["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let text = |key: &str| c[key].as_str().unwrap_or_default().to_string();
            (text("type"), text("status"), text("lastTransitionTime"))
        })
        .collect()
}

/// Moves every stored transition time to [`LONG_AGO`] without a new resourceVersion: time
/// passing, not a write.
fn age_conditions(fake: &FakeApiserver) {
    let mut stored = fake.object(INVENTORY_PATH).unwrap();
    for condition in stored["status"]["conditions"].as_array_mut().unwrap() {
        condition["lastTransitionTime"] = Value::String(LONG_AGO.into());
    }
    fake.insert(INVENTORY_PATH, stored);
}

/// What the controller does after every change in use: `status.freeDevices` by server-side
/// apply as its own field manager.
async fn controller_writes_free_devices(client: &Client, free: u32) {
    let inventories: Api<AcceleratorInventory> = Api::all(client.clone());
    let patch = json!({
        "apiVersion": "hwaccel.io/v1alpha1",
        "kind": "AcceleratorInventory",
        "status": {"freeDevices": free},
    });
    let params = PatchParams::apply("hwaccel-controller").force();
    inventories
        .patch_status(NODE, &params, &Patch::Apply(&patch))
        .await
        .unwrap();
}

fn inventory_writes(fake: &FakeApiserver) -> Vec<String> {
    fake.patches()
        .into_iter()
        .filter(|r| r.path.starts_with(INVENTORY_PATH))
        .map(|r| r.path)
        .collect()
}

/// Issue 28: the controller's `freeDevices` write made the next cycle log "changed by
/// someone else", rewrite the inventory and reset every condition's transition time.
#[tokio::test]
async fn the_controllers_free_devices_write_costs_the_agent_no_write() {
    let (client, fake) = fake();
    let (mut agent, _process) = agent(client.clone());
    let report = fixture_report("h100-8x-nvswitch");
    let first = agent.publish(&report).await.unwrap();
    assert!(first.inventory_written && first.status_written, "{first:?}");
    // Transition times have whole seconds: let a reset show.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    controller_writes_free_devices(&client, 5).await;
    let before = conditions(&fake);
    assert_eq!(before.len(), 4, "{before:?}");
    fake.clear();
    for _ in 0..3 {
        let (outcome, logged) = publish_logged(&mut agent, &report).await;
        assert_eq!(outcome, PublishOutcome::default(), "{logged}");
        assert!(!logged.contains("someone else"), "{logged}");
    }
    assert_eq!(inventory_writes(&fake), Vec::<String>::new());
    assert_eq!(conditions(&fake), before);
    let stored = fake.object(INVENTORY_PATH).unwrap();
    assert_eq!(stored["status"]["freeDevices"], 5);
}

/// A real edit of the agent's fields is still written back (and said so), and the conditions
/// whose status did not change keep their transition times.
#[tokio::test]
async fn an_edit_of_the_agents_fields_is_written_back_keeping_transition_times() {
    let (client, fake) = fake();
    let (mut agent, _process) = agent(client.clone());
    let report = fixture_report("h100-8x-nvswitch");
    agent.publish(&report).await.unwrap();

    // Someone flips Ready to False (and, to make kept times plain, dates every condition
    // long ago) in one write.
    let inventories: Api<AcceleratorInventory> = Api::all(client.clone());
    let stored = fake.object(INVENTORY_PATH).unwrap();
    let mut edited = stored["status"]["conditions"].clone();
    for condition in edited.as_array_mut().unwrap() {
        condition["lastTransitionTime"] = Value::String(LONG_AGO.into());
        if condition["type"] == "Ready" {
            condition["status"] = Value::String("False".into());
        }
    }
    let patch = json!({"status": {"conditions": edited}});
    inventories
        .patch_status(NODE, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();

    fake.clear();
    let (outcome, logged) = publish_logged(&mut agent, &report).await;
    assert!(
        outcome.status_written && !outcome.inventory_written,
        "{outcome:?}"
    );
    assert!(logged.contains("changed by someone else"), "{logged}");
    for (kind, status, time) in conditions(&fake) {
        if kind == "Ready" {
            assert_eq!(status, "True");
            assert_ne!(time, LONG_AGO, "Ready flipped back, so its time moves");
        } else {
            assert_eq!(time, LONG_AGO, "{kind} did not change");
        }
    }
}

/// After a failed cycle the agent re-reads what is stored instead of starting from nothing,
/// so a retry neither rewrites an unchanged inventory nor resets transition times.
#[tokio::test]
async fn a_retry_after_an_error_keeps_transition_times() {
    let (client, fake) = fake();
    let (mut agent, _process) = agent(client.clone());
    let report = fixture_report("h100-8x-nvswitch");
    agent.publish(&report).await.unwrap();
    age_conditions(&fake);
    let before = conditions(&fake);
    agent.invalidate();
    fake.clear();
    let (outcome, logged) = publish_logged(&mut agent, &report).await;
    assert!(
        !outcome.inventory_written && !outcome.status_written,
        "{outcome:?}"
    );
    assert!(!logged.contains("someone else"), "{logged}");
    assert_eq!(conditions(&fake), before);
}

/// The inventory a pod's agent writes says Kubernetes from its own process, though the host
/// root (a fixture without `/proc/self` or a service-account directory) says nothing.
#[tokio::test]
async fn the_agents_runtime_facts_are_its_own_process() {
    let (client, fake) = fake();
    let (agent, _unused) = agent(client);
    let pod = tempfile::tempdir().unwrap();
    let token = pod
        .path()
        .join("var/run/secrets/kubernetes.io/serviceaccount");
    std::fs::create_dir_all(&token).unwrap();
    std::fs::write(token.join("token"), "x").unwrap();
    assert!(!host_dir("h100-8x-nvswitch").join("proc/self").exists());
    let mut agent = agent.with_process(ProcessView::new(HostRoot::new(pod.path()), true));
    if let Err(err) = agent.cycle().await {
        let requests: Vec<String> = fake
            .requests()
            .iter()
            .map(|r| format!("{} {} {}", r.method, r.path, r.content_type))
            .collect();
        panic!("{err}: {requests:#?}");
    }
    let stored = fake.object(INVENTORY_PATH).unwrap();
    assert_eq!(
        stored["spec"]["node"]["runtime"]["kubernetes"], true,
        "{stored:#}"
    );
}

/// Issue 28: host mounts left writable by the runtime are reported in the inventory (and the
/// gauge); a node whose runtime mounts them recursively read-only says so too.
#[tokio::test]
async fn writable_host_mounts_are_a_condition_of_the_inventory() {
    let (client, fake) = fake();
    let (agent, _process) = agent(client);
    let writable = vec!["/dev/shm".to_string(), "/sys/fs/cgroup/pids".to_string()];
    let mut agent = agent.with_writable_host_mounts(writable);
    agent
        .publish(&fixture_report("h100-8x-nvswitch"))
        .await
        .unwrap();
    let stored = fake.object(INVENTORY_PATH).unwrap();
    let condition = stored["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "HostMountsWritable")
        .cloned()
        .unwrap();
    assert_eq!(condition["status"], "True", "{condition}");
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains("/dev/shm, /sys/fs/cgroup/pids"),
        "{message}"
    );

    let (client, fake) = self::fake();
    let (mut agent, _process) = self::agent(client);
    agent
        .publish(&fixture_report("h100-8x-nvswitch"))
        .await
        .unwrap();
    let kinds = conditions(&fake);
    assert!(
        kinds
            .iter()
            .any(|(kind, status, _)| kind == "HostMountsWritable" && status == "False"),
        "{kinds:?}"
    );
}

#[test]
fn the_publish_backoff_starts_at_a_second_and_stops_at_max_backoff() {
    let backoff = super::run::publish_backoff(Duration::from_secs(60));
    let steps: Vec<u64> = [1, 2, 6, 7, 40]
        .map(|retry| backoff.step(retry).as_secs())
        .to_vec();
    assert_eq!(steps, [1, 2, 32, 60, 60]);
    for retry in 1..=10 {
        let wait = backoff.wait(retry);
        assert!(wait >= Duration::from_millis(500) && wait <= Duration::from_secs(60));
    }
}

/// The inventory's `DevicesMissing` condition and `expectedDevices`, as stored.
fn devices_missing(fake: &FakeApiserver) -> (String, Value) {
    let stored = fake.object(INVENTORY_PATH).unwrap();
    let status = conditions(fake)
        .into_iter()
        .find(|(kind, _, _)| kind == "DevicesMissing")
        .map(|(_, status, _)| status)
        .unwrap();
    (status, stored["status"]["expectedDevices"].clone())
}

/// Issue 35: a forged inventory (eight more H100s, and `expectedDevices` 48) left a restarted
/// agent's `DevicesMissing` True for ever after the forged devices expired, because the
/// expected count was seeded from the stored status and raised by the seeded devices. Only
/// the agent's own detections raise it now: once the grace is over the node is whole again.
#[tokio::test]
async fn a_forged_inventory_leaves_no_missing_devices_after_the_grace() {
    let (client, fake) = fake();
    let (mut first, _process) = agent(client.clone());
    let report = fixture_report("h100-8x-nvswitch");
    first.publish(&report).await.unwrap();
    assert_eq!(devices_missing(&fake), ("False".into(), json!(8)));

    let mut stored: AcceleratorInventory =
        serde_json::from_value(fake.object(INVENTORY_PATH).unwrap()).unwrap();
    let real = stored.spec.devices[0].clone();
    for n in 0..8 {
        let mut forged = real.clone();
        forged.name = format!("gpu-0000-e{n}-00-0");
        forged.full_values.clear();
        forged.attributes.remove(crate::api::attribute::PCI_BUS_ID);
        forged.attributes.insert(
            crate::api::attribute::ID.to_string(),
            crate::api::DeviceAttribute::String(format!("0000:e{n}:00.0")),
        );
        stored.spec.devices.push(forged);
    }
    let status = stored.status.as_mut().unwrap();
    status.expected_devices = Some(48);
    fake.insert(INVENTORY_PATH, serde_json::to_value(&stored).unwrap());

    // A restart: the forged devices are kept for the grace (three misses), missing meanwhile.
    let (mut restarted, _process) = agent(client.clone());
    restarted.publish(&report).await.unwrap();
    assert_eq!(devices_missing(&fake), ("True".into(), json!(16)));
    for _ in 0..3 {
        restarted.publish(&report).await.unwrap();
    }
    assert_eq!(devices_missing(&fake), ("False".into(), json!(8)));
    let devices = fake.object(INVENTORY_PATH).unwrap()["spec"]["devices"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(devices, 8, "the eight real GPUs only");
}
