//! The controller's fleet pass against a real kube-apiserver: the fleet gauges equal what the
//! inventories and the placement say, `status.freeDevices` is written and follows a
//! placement, an inventory's `DevicesMissing` turning True gives a Warning Event on the Node,
//! `hwaccel_fleet_nodes_missing_devices` and (enforce) the Node taint, and turning back
//! clears them; a dry run taints nothing, the scheduler still places pods on the node, and
//! the report Event names the pods on it. The replicas of a counted model
//! (`hwaccel_fleet_model_replicas`) follow the placement too.
//!
//! The inventories are written directly (spec as the agent would, status as admin), so these
//! tests do not depend on the agent. Run with the cluster up: `tests/cluster/up.sh --full &&
//! cargo test --test cluster_tier -- --ignored cluster_fleet:: --test-threads=1`.

#![allow(clippy::expect_used)] // test helpers may panic on impossible setup errors

use crate::support;

use anyhow::Result;
use hwaccel::api::placement::{ModelPlacementStatus, PrecisionChoice};
use hwaccel::api::{AcceleratorInventory, DeviceAttribute, ModelPlacement, attribute};
use std::sync::Arc;
use std::time::Duration;

use hwaccel::controller::fleet::core::model_capacity::CountedModel;
use hwaccel::controller::{CapacityCounting, HealthTaints};
use hwaccel::testing::{InventoryBuilder, PlacementBuilder};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::controller::{scrape, start_controller, start_controller_with};
use support::nodes::{apply_inventory, create_kwok_node, node_events, wait_node_event};
use support::{DEFAULT_TIMEOUT, TEST_LABEL, TestCluster, install_crds, wait_for};

const TAINT_KEY: &str = "hwaccel.io/devices-unhealthy";
/// The model the controller counts in units of replicas.
const COUNTED: &str = "llama-3.1-70b@8192/fp8";

/// The labels of the counted model's series.
fn counted_labels() -> [(&'static str, &'static str); 3] {
    [
        ("model", "llama-3.1-70b"),
        ("context", "8192"),
        ("precision", "fp8"),
    ]
}

/// A kwok Node with the fixture host's inventory, every accelerator `healthy`. Returns the
/// node name and its accelerator count.
async fn add_node(cluster: &TestCluster, scenario: &str) -> Result<(String, u64)> {
    let name = cluster.unique_name(scenario);
    create_kwok_node(cluster, &name).await?;
    let mut inventory = InventoryBuilder::fixture(scenario)
        .node(&name)
        .label(TEST_LABEL, cluster.prefix())
        .build();
    let mut accelerators = 0;
    for device in &mut inventory.spec.devices {
        if device
            .attributes
            .get(attribute::FAMILY)
            .and_then(|a| a.as_str())
            == Some("cpu")
        {
            continue;
        }
        accelerators += 1;
        device.attributes.insert(
            attribute::HEALTH.to_string(),
            DeviceAttribute::String("healthy".to_string()),
        );
    }
    apply_inventory(&cluster.client(), &inventory).await?;
    Ok((name, accelerators))
}

/// Writes the inventory's `DevicesMissing` condition as the agent would (its own field
/// manager, server-side apply of its status fields, without `freeDevices`).
async fn set_devices_missing(cluster: &TestCluster, node: &str, missing: bool) -> Result<()> {
    let (status, reason, message) = if missing {
        (
            "True",
            "DevicesMissing",
            "2 of 8 expected accelerators are missing",
        )
    } else {
        (
            "False",
            "AllDevicesPresent",
            "all 8 expected accelerators are present",
        )
    };
    let patch = json!({
        "apiVersion": "hwaccel.io/v1alpha1",
        "kind": "AcceleratorInventory",
        "status": {
            "expectedDevices": 8,
            "expectedSource": "annotation",
            "conditions": [{
                "type": "DevicesMissing",
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }],
        },
    });
    Api::<AcceleratorInventory>::all(cluster.client())
        .patch_status(
            node,
            &PatchParams::apply("hwaccel-agent").force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}

/// The sum over every series of `metric` whose labels contain all of `labels`.
fn sum(text: &str, metric: &str, labels: &[(&str, &str)]) -> i64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let name = series.split('{').next()?;
            (name == metric
                && labels
                    .iter()
                    .all(|(k, v)| series.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<i64>().ok())?
        })
        .sum()
}

async fn wait_planned(cluster: &TestCluster, name: &str) -> Result<ModelPlacementStatus> {
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    wait_for(DEFAULT_TIMEOUT, &format!("{name} Planned"), || {
        let api = api.clone();
        async move {
            let placement = api.get(name).await?;
            Ok(placement
                .status
                .filter(|s| s.state.as_deref() == Some("Planned")))
        }
    })
    .await
}

async fn free_devices(cluster: &TestCluster, node: &str) -> Result<Option<u32>> {
    let inventory = Api::<AcceleratorInventory>::all(cluster.client())
        .get(node)
        .await?;
    Ok(inventory.status.and_then(|s| s.free_devices))
}

async fn our_taint(cluster: &TestCluster, node: &str) -> Result<Option<String>> {
    let node = Api::<Node>::all(cluster.client()).get(node).await?;
    Ok(node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .find(|t| t.key == TAINT_KEY)
        .map(|t| t.value.unwrap_or_default()))
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn aggregates_free_devices_events_and_the_enforced_taint_follow_the_inventories() -> Result<()>
{
    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let (node, accelerators) = add_node(&cluster, "h100-8x-nvswitch").await?;
    // Someone else's taint, which the controller must never touch.
    Api::<Node>::all(cluster.client())
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [
                {"key": "example.com/maintenance", "value": "planned", "effect": "PreferNoSchedule"}
            ]}})),
        )
        .await?;
    let (_controller, registry) = start_controller_with(&cluster, |config| {
        config.health_taints = HealthTaints::Enforce;
        config.taint_check = Duration::from_secs(1);
        config.capacity = CapacityCounting {
            models: Arc::new(vec![CountedModel::parse(COUNTED).expect("a preset")]),
            interval: Duration::ZERO,
        };
    });

    // Before any placement: every healthy device is free, and 70B in FP8 at 8k tokens (TP 2
    // on an H100: one device leaves no room for a request's KV cache) fits four times.
    wait_for(DEFAULT_TIMEOUT, "4 replicas of the counted model", || {
        let text = scrape(&registry);
        async move {
            Ok((sum(&text, "hwaccel_fleet_model_replicas", &counted_labels()) == 4).then_some(()))
        }
    })
    .await?;
    wait_for(DEFAULT_TIMEOUT, "freeDevices = all", || {
        let cluster = &cluster;
        let node = node.clone();
        async move {
            Ok((free_devices(cluster, &node).await? == Some(accelerators as u32)).then_some(()))
        }
    })
    .await?;

    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    api.create(
        &PostParams::default(),
        &ModelPlacement::new(
            "llama",
            PlacementBuilder::serve("llama-3.1-70b")
                .precision(PrecisionChoice::Bf16)
                .spec(),
        ),
    )
    .await?;
    let status = wait_planned(&cluster, "llama").await?;
    let held: u64 = status
        .assignments
        .iter()
        .filter(|a| a.node == node)
        .map(|a| a.devices.len() as u64)
        .sum();
    assert!(held > 0, "{status:?}");
    let expected_free = accelerators - held;

    // freeDevices follows the placement.
    wait_for(DEFAULT_TIMEOUT, "freeDevices after the placement", || {
        let cluster = &cluster;
        let node = node.clone();
        async move {
            Ok((free_devices(cluster, &node).await? == Some(expected_free as u32)).then_some(()))
        }
    })
    .await?;
    // The aggregates equal what the inventory and the placement say.
    let text = wait_for(DEFAULT_TIMEOUT, "fleet gauges", || {
        let text = scrape(&registry);
        async move {
            Ok((sum(&text, "hwaccel_fleet_devices_reserved", &[]) == held as i64).then_some(text))
        }
    })
    .await?;
    assert_eq!(
        sum(&text, "hwaccel_fleet_devices", &[]),
        accelerators as i64,
        "{text}"
    );
    assert_eq!(
        sum(&text, "hwaccel_fleet_devices_healthy", &[]),
        accelerators as i64
    );
    assert_eq!(
        sum(&text, "hwaccel_fleet_devices_free", &[]),
        expected_free as i64
    );
    assert_eq!(
        sum(&text, "hwaccel_fleet_devices", &[("vendor", "nvidia")]),
        accelerators as i64,
        "{text}"
    );
    assert_eq!(sum(&text, "hwaccel_fleet_nodes_missing_devices", &[]), 0);
    // The count follows the placement: pairs of the devices left, an odd one stranded.
    wait_for(
        DEFAULT_TIMEOUT,
        "the counted model after the placement",
        || {
            let text = scrape(&registry);
            async move {
                let replicas = sum(&text, "hwaccel_fleet_model_replicas", &counted_labels());
                let stranded = sum(
                    &text,
                    "hwaccel_fleet_model_stranded_devices",
                    &counted_labels(),
                );
                Ok(
                    ((replicas, stranded) == (expected_free as i64 / 2, expected_free as i64 % 2))
                        .then_some(()),
                )
            }
        },
    )
    .await?;
    let ns = cluster.namespace();
    assert_eq!(
        sum(
            &text,
            "hwaccel_placement_devices",
            &[("namespace", ns), ("placement", "llama")]
        ),
        status
            .assignments
            .iter()
            .map(|a| a.devices.len() as i64)
            .sum::<i64>()
    );
    assert_eq!(
        sum(
            &text,
            "hwaccel_placement_state",
            &[
                ("namespace", ns),
                ("placement", "llama"),
                ("state", "Planned")
            ]
        ),
        1
    );
    assert_eq!(our_taint(&cluster, &node).await?, None);

    // Devices go missing: Warning Event, gauge, taint.
    set_devices_missing(&cluster, &node, true).await?;
    let warning = wait_node_event(&cluster, &node, "Warning|DevicesMissing|").await?;
    assert!(warning.contains("2 of 8 expected"), "{warning}");
    wait_for(DEFAULT_TIMEOUT, "nodes_missing_devices = 1", || {
        let text = scrape(&registry);
        async move {
            Ok((sum(&text, "hwaccel_fleet_nodes_missing_devices", &[]) == 1).then_some(()))
        }
    })
    .await?;
    let taint = wait_for(DEFAULT_TIMEOUT, "the health taint", || {
        let cluster = &cluster;
        let node = node.clone();
        async move { our_taint(cluster, &node).await }
    })
    .await?;
    assert_eq!(taint, "DevicesMissing");
    // Someone removes it by hand while the devices are still missing: it comes back.
    cluster
        .kubectl_ok(&["taint", "node", &node, &format!("{TAINT_KEY}-")])
        .await?;
    let taint = wait_for(DEFAULT_TIMEOUT, "the health taint restored", || {
        let cluster = &cluster;
        let node = node.clone();
        async move { our_taint(cluster, &node).await }
    })
    .await?;
    assert_eq!(taint, "DevicesMissing");
    // The agent's status write left the controller's field alone.
    assert_eq!(
        free_devices(&cluster, &node).await?,
        Some(expected_free as u32)
    );

    // They come back: Normal Event, gauge 0, taint gone, the other taint still there.
    set_devices_missing(&cluster, &node, false).await?;
    wait_node_event(&cluster, &node, "Normal|DevicesRestored|").await?;
    wait_for(DEFAULT_TIMEOUT, "the health taint removed", || {
        let cluster = &cluster;
        let node = node.clone();
        async move { Ok(our_taint(cluster, &node).await?.is_none().then_some(())) }
    })
    .await?;
    let text = scrape(&registry);
    assert_eq!(
        sum(&text, "hwaccel_fleet_nodes_missing_devices", &[]),
        0,
        "{text}"
    );
    let taints = Api::<Node>::all(cluster.client())
        .get(&node)
        .await?
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default();
    // (kube-controller-manager may add its own node.kubernetes.io/ taints meanwhile.)
    assert!(
        taints
            .iter()
            .any(|t| t.key == "example.com/maintenance" && t.value.as_deref() == Some("planned")),
        "{taints:?}"
    );
    // No repeat: one Warning and one Normal for one transition each.
    let events = node_events(&cluster, &node).await?;
    assert_eq!(
        events
            .iter()
            .filter(|e| e.starts_with("Warning|DevicesMissing|"))
            .count(),
        1,
        "{events:?}"
    );

    // The placement goes: its series go, every device is free again.
    api.delete("llama", &Default::default()).await?;
    wait_for(DEFAULT_TIMEOUT, "the placement's series removed", || {
        let text = scrape(&registry);
        async move { Ok((!text.contains("placement=\"llama\"")).then_some(())) }
    })
    .await?;
    wait_for(DEFAULT_TIMEOUT, "freeDevices back to all", || {
        let cluster = &cluster;
        let node = node.clone();
        async move {
            Ok((free_devices(cluster, &node).await? == Some(accelerators as u32)).then_some(()))
        }
    })
    .await?;
    Api::<Node>::all(cluster.client())
        .delete(&node, &Default::default())
        .await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_dry_run_taints_nothing_and_names_the_pods_on_the_node() -> Result<()> {
    let cluster = TestCluster::new().await?;
    if !cluster.full() {
        eprintln!("skipped: needs the full tier (kube-scheduler, kwok)");
        return Ok(());
    }
    install_crds(&cluster.client()).await?;
    let (node, _) = add_node(&cluster, "h100-8x-nvswitch").await?;
    let (_controller, registry) = start_controller(&cluster, HealthTaints::DryRun);
    let pods: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    let pod = |name: &str| -> Result<Pod> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node.clone()},
                "containers": [{"name": "model", "image": "registry.invalid/model:test"}],
            },
        }))?)
    };
    let scheduled = |name: &'static str| {
        let pods = pods.clone();
        let node = node.clone();
        async move {
            wait_for(DEFAULT_TIMEOUT, &format!("{name} scheduled"), || {
                let pods = pods.clone();
                let node = node.clone();
                async move {
                    let pod = pods.get(name).await?;
                    Ok(pod
                        .spec
                        .and_then(|s| s.node_name)
                        .filter(|n| *n == node)
                        .map(|_| ()))
                }
            })
            .await
        }
    };
    pods.create(&PostParams::default(), &pod("before")?).await?;
    scheduled("before").await?;

    set_devices_missing(&cluster, &node, true).await?;
    let report = wait_node_event(&cluster, &node, "Normal|DevicesUnhealthyDryRun|").await?;
    assert!(report.contains("before"), "{report}");
    assert!(report.contains("DevicesMissing"), "{report}");
    wait_node_event(&cluster, &node, "Warning|DevicesMissing|").await?;
    let text = scrape(&registry);
    assert_eq!(
        sum(&text, "hwaccel_controller_health_taint_targets", &[]),
        1,
        "{text}"
    );
    // Scheduling is unchanged: no taint, and a new pod still lands on the node.
    assert_eq!(our_taint(&cluster, &node).await?, None);
    pods.create(&PostParams::default(), &pod("after")?).await?;
    scheduled("after").await?;
    assert_eq!(our_taint(&cluster, &node).await?, None);

    set_devices_missing(&cluster, &node, false).await?;
    wait_node_event(&cluster, &node, "Normal|DevicesRestored|").await?;
    Api::<Node>::all(cluster.client())
        .delete(&node, &Default::default())
        .await?;
    Ok(())
}

/// Issue 24: on the demo's fleet (an 8x H100 node with one GPU degraded by a retired page, an
/// 8x MI300X node, a CPU-only node), after a placement, every view counts the same: the
/// inventories' summary (`kubectl get accinv`), `status.freeDevices`, the controller's gauges,
/// `hwaccel fleet -o json` over the cluster, and the planner's free set. The degraded GPU is
/// plannable, so it counts free, and it is counted degraded in every view.
#[tokio::test]
#[ignore = "needs cluster"]
async fn every_view_of_the_demo_fleet_counts_the_same_after_a_placement() -> Result<()> {
    use hwaccel::dra::inventory_node::{PlannerDeviceIds, planner_node};
    use hwaccel::hardware::{Family, HealthStatus};
    use hwaccel::testing::fixture::fixture_report;
    use std::collections::{BTreeMap, BTreeSet};

    let cluster = TestCluster::new().await?;
    install_crds(&cluster.client()).await?;
    let mut nodes = Vec::new();
    for scenario in ["h100-8x-nvswitch", "mi300x-8x", "cpu-only-vm"] {
        let name = cluster.unique_name(scenario);
        create_kwok_node(&cluster, &name).await?;
        let mut report = fixture_report(scenario);
        if scenario == "h100-8x-nvswitch" {
            let gpu = report
                .devices
                .iter_mut()
                .find(|d| d.family == Family::Gpu)
                .expect("a GPU");
            gpu.health.status = HealthStatus::Degraded;
            gpu.health.retired_pages = Some(1);
            gpu.health.reasons = vec!["1 retired pages or remapped rows".into()];
        }
        let inventory = InventoryBuilder::from_report(report)
            .node(&name)
            .label(TEST_LABEL, cluster.prefix())
            .build();
        apply_inventory(&cluster.client(), &inventory).await?;
        nodes.push(name);
    }
    let (_controller, registry) = start_controller(&cluster, HealthTaints::None);
    let api: Api<ModelPlacement> = Api::namespaced(cluster.client(), cluster.namespace());
    api.create(
        &PostParams::default(),
        &ModelPlacement::new(
            "llama",
            PlacementBuilder::serve("llama-3.1-70b")
                .precision(PrecisionChoice::Bf16)
                .spec(),
        ),
    )
    .await?;
    let status = wait_planned(&cluster, "llama").await?;
    let mut held: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for a in &status.assignments {
        held.entry(a.node.clone())
            .or_default()
            .extend(a.devices.iter().cloned());
    }
    let held_count: usize = held.values().map(BTreeSet::len).sum();
    assert!(held_count > 0, "{status:?}");

    // The planner's free set per node: the devices it plans on that the placement does not
    // hold.
    let inventories: Vec<AcceleratorInventory> = {
        let api = Api::<AcceleratorInventory>::all(cluster.client());
        let mut read = Vec::new();
        for node in &nodes {
            read.push(api.get(node).await?);
        }
        read
    };
    let planner_free: BTreeMap<String, u32> = inventories
        .iter()
        .map(|inventory| {
            let (node, _) = planner_node(inventory, PlannerDeviceIds::InventoryNames);
            let free = node
                .devices
                .iter()
                .filter(|d| !held.get(&node.name).is_some_and(|h| h.contains(&d.id)))
                .count();
            (node.name, free as u32)
        })
        .collect();
    let free_total: u32 = planner_free.values().sum();

    // `status.freeDevices`, once the controller has written it for every node.
    for node in &nodes {
        let want = planner_free[node];
        wait_for(DEFAULT_TIMEOUT, &format!("freeDevices of {node}"), || {
            let cluster = &cluster;
            async move { Ok((free_devices(cluster, node).await? == Some(want)).then_some(())) }
        })
        .await?;
    }

    // The agent's summary (`kubectl get accinv`).
    let summed = |f: fn(&hwaccel::api::InventorySummary) -> Option<u32>| -> i64 {
        inventories
            .iter()
            .map(|i| i64::from(f(&i.spec.summary).unwrap_or(0)))
            .sum()
    };
    let devices = summed(|s| Some(s.accelerators));
    let healthy = summed(|s| s.healthy);
    let degraded = summed(|s| s.degraded);
    assert!(degraded >= 1, "the demo's degraded H100: {degraded}");
    assert_eq!(devices, 16);

    // The controller's gauges.
    let text = wait_for(DEFAULT_TIMEOUT, "gauges after the placement", || {
        let text = scrape(&registry);
        async move {
            Ok(
                (sum(&text, "hwaccel_fleet_devices_reserved", &[]) == held_count as i64)
                    .then_some(text),
            )
        }
    })
    .await?;
    assert_eq!(sum(&text, "hwaccel_fleet_devices", &[]), devices, "{text}");
    assert_eq!(sum(&text, "hwaccel_fleet_devices_healthy", &[]), healthy);
    assert_eq!(sum(&text, "hwaccel_fleet_devices_degraded", &[]), degraded);
    assert_eq!(
        sum(&text, "hwaccel_fleet_devices_free", &[]),
        i64::from(free_total)
    );

    // `hwaccel fleet -o json` over the cluster (other tests' nodes are left out).
    let report = support::process::hwaccel_json(
        &cluster,
        &[
            "fleet",
            "--model",
            "llama-3.1-8b",
            "--context",
            "8192",
            "-o",
            "json",
        ],
    )
    .await?;
    let ours: Vec<&serde_json::Value> = report["health"]["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| nodes.iter().any(|name| n["name"] == name.as_str()))
        .collect();
    assert_eq!(ours.len(), nodes.len(), "{report}");
    let field = |key: &str| -> i64 { ours.iter().map(|n| n[key].as_i64().unwrap_or(0)).sum() };
    assert_eq!(field("devices"), devices);
    assert_eq!(field("healthy"), healthy);
    assert_eq!(field("degraded"), degraded);
    assert_eq!(field("reserved"), held_count as i64);
    for node in &ours {
        let name = node["name"].as_str().unwrap_or_default();
        assert_eq!(node["free"], planner_free[name], "{node}");
    }
    let h100 = ours
        .iter()
        .find(|n| n["degraded"] == 1)
        .expect("the degraded H100's node");
    assert_eq!(h100["attention"][0]["health"], "degraded", "{h100}");
    Ok(())
}
