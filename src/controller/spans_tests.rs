//! Every line the controller logs while working on an object says which object: a placement
//! reconcile runs in a `reconcile` span carrying `placement="namespace/name"`, a fleet pass in
//! a `fleet_pass` span and its work on one node in a `node` span carrying `node`. Checked on
//! the JSON lines the production subscriber writes, against the fake apiserver.

use std::time::Duration;

use http::StatusCode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use serde_json::{Value, json};

use crate::controller::fleet::pass::Memory;
use crate::controller::fleet_loop::fleet_and_taints;
use crate::controller::placement::reconcile_tests::{Harness, placement};
use crate::controller::taints::core::HealthTaints;
use crate::controller::taints::sync::Taints;
use crate::telemetry::capture::Capture;

/// Our own lines only: the client's lines come from tasks the fake apiserver runs.
const OURS: &str = "hwaccel=debug";

fn message(line: &Value) -> &str {
    line["message"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn every_line_a_reconcile_logs_names_its_placement() {
    let mut harness = Harness::new();
    let mut placement = placement();
    harness.store(&placement);
    harness.reconcile(&placement).await.expect("plan");
    harness.sync_node_cache();
    placement.meta_mut().deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    harness.store(&placement);

    let capture = Capture::start(OURS);
    harness.reconcile(&placement).await.expect("cleanup");
    let lines = capture.lines();

    assert!(
        lines
            .iter()
            .any(|l| message(l) == "placement deleted; its devices are free"),
        "{lines:?}"
    );
    for line in &lines {
        assert_eq!(
            line["spans"][0],
            json!({"name": "reconcile", "placement": "ml/p"}),
            "{line}"
        );
    }
}

#[tokio::test]
async fn a_fleet_pass_names_the_node_each_line_is_about() {
    let harness = Harness::new();
    // n1's status write (freeDevices and DRAPublished) is refused: the pass logs it, on n1's behalf.
    harness.fake.refuse(
        "PATCH",
        "/acceleratorinventories/n1/status",
        StatusCode::INTERNAL_SERVER_ERROR,
    );
    let mut taints = Taints::new(
        &harness.ctx,
        HealthTaints::None,
        None,
        Duration::from_secs(60),
    )
    .await;

    let capture = Capture::start(OURS);
    fleet_and_taints(&harness.ctx, &mut Memory::default(), &mut taints).await;
    let lines = capture.lines();

    let refused: Vec<&Value> = lines
        .iter()
        .filter(|l| message(l).starts_with("writing the inventory's status failed"))
        .collect();
    assert_eq!(refused.len(), 1, "{lines:?}");
    assert_eq!(
        refused[0]["spans"],
        json!([{"name": "fleet_pass"}, {"name": "node", "node": "n1"}]),
        "{}",
        refused[0]
    );
    for line in &lines {
        assert_eq!(line["spans"][0]["name"], "fleet_pass", "{line}");
    }
}
