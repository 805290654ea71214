//! Issue 24: every view of the fleet counts the same. Over generated fleets (fixture hosts,
//! random health including degraded, devices gone missing, devices held by placements and by
//! other claims), the agent's inventory summary (`kubectl get accinv`), `hwaccel fleet -o json`
//! (read from files as the command reads them), the controller's gauges (rendered `/metrics`
//! text) and `status.freeDevices`, and the planner's free set give the same counts.
//!
//! `hwaccel fleet` reads placements, not ResourceClaims: its free count is compared with the
//! planner's free set given the placements' devices, the controller's with the planner's free
//! set given every holder.

// Test helpers panic on setup failures by design; clippy only exempts `#[test]` bodies.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use clap::Parser;
use hwaccel::api::{AcceleratorInventory, AcceleratorInventoryStatus};
use hwaccel::cli::fleet::{FleetArgs, answer};
use hwaccel::cli::fleet_input::from_files;
use hwaccel::controller::core::fleet_figures::{FleetTotals, NodeStats};
use hwaccel::controller::metrics::fleet::FleetMetrics;
use hwaccel::detect::Report;
use hwaccel::dra::inventory_node::{PlannerDeviceIds, planner_node};
use hwaccel::fleet::health::Holdings;
use hwaccel::hardware::{Family, HealthStatus};
use hwaccel::plan::Reservations;
use hwaccel::testing::fixture::fixture_report;
use prometheus_client::registry::Registry;
use proptest::prelude::*;
use serde_json::{Value, json};

/// Hosts with every kind of health reading: NVIDIA and AMD GPUs (read), a GPU split into MIG
/// instances (not plannable), TPU and Neuron devices (no reading: `unknown`), Gaudi.
const SCENARIOS: [&str; 6] = [
    "h100-8x-nvswitch",
    "mi300x-8x",
    "a100-mig",
    "tpu-v5e-4",
    "trn1-32xl",
    "gaudi2-8x",
];

/// The fixture hosts' reports, detected once.
fn reports() -> &'static [Report] {
    static REPORTS: OnceLock<Vec<Report>> = OnceLock::new();
    REPORTS.get_or_init(|| SCENARIOS.iter().map(|s| fixture_report(s)).collect())
}

/// One generated node: a fixture host, a health per device (0 as detected, then healthy,
/// degraded, unhealthy, unknown) and which devices went missing.
#[derive(Debug, Clone)]
struct NodeCase {
    scenario: usize,
    health: Vec<u8>,
    gone: Vec<bool>,
}

/// What holds a device: 0 nobody, 1 a placement, 2 another claim.
#[derive(Debug, Clone)]
struct FleetCase {
    nodes: Vec<NodeCase>,
    held: Vec<u8>,
}

fn fleet_case() -> impl Strategy<Value = FleetCase> {
    let node = (
        0..SCENARIOS.len(),
        prop::collection::vec(0u8..5, 1..12),
        prop::collection::vec(prop::bool::weighted(0.15), 1..12),
    )
        .prop_map(|(scenario, health, gone)| NodeCase {
            scenario,
            health,
            gone,
        });
    (
        prop::collection::vec(node, 1..5),
        prop::collection::vec(0u8..3, 1..24),
    )
        .prop_map(|(nodes, held)| FleetCase { nodes, held })
}

/// The inventories the agents would publish for `case`.
fn inventories(case: &FleetCase) -> Vec<AcceleratorInventory> {
    case.nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let mut report = reports()[node.scenario].clone();
            let before = report.accelerators().count();
            let mut k = 0;
            report.devices.retain_mut(|device| {
                if device.family == Family::Cpu {
                    return true;
                }
                let pick = k;
                k += 1;
                let health = &mut device.health;
                match node.health[pick % node.health.len()] {
                    1 => health.status = HealthStatus::Healthy,
                    2 => {
                        health.status = HealthStatus::Degraded;
                        health.retired_pages = Some(1);
                        health.reasons = vec!["1 retired pages or remapped rows".into()];
                    }
                    3 => health.status = HealthStatus::Unhealthy,
                    4 => health.status = HealthStatus::Unknown,
                    _ => {}
                }
                !node.gone[pick % node.gone.len()]
            });
            let name = format!("node-{i}");
            let mut inventory = AcceleratorInventory::from_report(&name, &report);
            inventory.status = Some(AcceleratorInventoryStatus {
                expected_devices: Some(u32::try_from(before).unwrap()),
                ..AcceleratorInventoryStatus::default()
            });
            inventory
        })
        .collect()
}

/// Devices held by placements and by other claims, by inventory device name.
fn holders(case: &FleetCase, inventories: &[AcceleratorInventory]) -> (Reservations, Reservations) {
    let (mut placements, mut claims) = (Reservations::none(), Reservations::none());
    let mut k = 0;
    for inventory in inventories {
        for facts in inventory.device_facts() {
            match case.held[k % case.held.len()] {
                1 => placements.insert(inventory.spec.node_name.clone(), facts.name),
                2 => claims.insert(inventory.spec.node_name.clone(), facts.name),
                _ => {}
            }
            k += 1;
        }
    }
    (placements, claims)
}

/// One Planned placement per node, holding that node's placement-held devices, as
/// `kubectl get mp -A -o yaml` prints them.
fn placement_list(placements: &Reservations) -> Value {
    let mut per_node: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (node, device) in placements.iter() {
        per_node.entry(node).or_default().push(device);
    }
    let items: Vec<Value> = per_node
        .iter()
        .enumerate()
        .map(|(i, (node, devices))| {
            json!({
                "apiVersion": "hwaccel.io/v1alpha1",
                "kind": "ModelPlacement",
                "metadata": {
                    "name": format!("p{i}"),
                    "namespace": "default",
                    "uid": format!("00000000-0000-4000-8000-{i:012}"),
                    "generation": 1,
                    "creationTimestamp": format!("2026-01-01T00:{:02}:00Z", i % 60),
                },
                "spec": {"model": {"preset": "llama-3.1-8b"}, "goal": {"serve": {"context": 8192}}},
                "status": {
                    "observedGeneration": 1,
                    "state": "Planned",
                    "assignments": [{"node": node, "devices": devices, "replica": 0, "stage": 0}],
                },
            })
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// `hwaccel fleet --inventory DIR --placements FILE --model llama-3.1-8b -o json`, in process.
fn fleet_json(inventories: &[AcceleratorInventory], placements: &Reservations) -> Value {
    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        args: FleetArgs,
    }
    let dir = tempfile::tempdir().unwrap();
    let inventory_dir = dir.path().join("inventories");
    std::fs::create_dir(&inventory_dir).unwrap();
    for inventory in inventories {
        let path = inventory_dir.join(format!("{}.json", inventory.spec.node_name));
        std::fs::write(path, serde_json::to_string(inventory).unwrap()).unwrap();
    }
    let placement_file = dir.path().join("placements.json");
    std::fs::write(&placement_file, placement_list(placements).to_string()).unwrap();
    let command = Command::try_parse_from([
        "fleet",
        "--inventory",
        inventory_dir.to_str().unwrap(),
        "--placements",
        placement_file.to_str().unwrap(),
        "--model",
        "llama-3.1-8b",
        "--context",
        "8192",
        "-o",
        "json",
    ])
    .unwrap();
    let input = from_files(&command.args.inventory, &command.args.placements).unwrap();
    let report = answer(&command.args, input).unwrap();
    serde_json::to_value(&report).unwrap()
}

/// The controller's gauges for the fleet, as `/metrics` serves them, and each node's
/// `status.freeDevices`.
fn controller_view(
    inventories: &[AcceleratorInventory],
    held: &Holdings<'_>,
) -> (String, BTreeMap<String, u32>) {
    let stats: Vec<NodeStats> = inventories
        .iter()
        .map(|inventory| NodeStats::of(inventory, held, None))
        .collect();
    let mut registry = Registry::default();
    let metrics = FleetMetrics::register(&mut registry);
    metrics.publish(&FleetTotals::of(&stats), &BTreeMap::new());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let free = stats
        .iter()
        .map(|s| (s.node.clone(), s.free_devices()))
        .collect();
    (text, free)
}

/// The sum of every series of `metric`.
fn gauge(text: &str, metric: &str) -> u64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (series.split('{').next()? == metric).then(|| value.parse::<u64>().ok())?
        })
        .sum()
}

/// The planner's free set per node: the devices it plans on that nobody in `held` holds.
fn planner_free(
    inventories: &[AcceleratorInventory],
    held: &[&Reservations],
) -> BTreeMap<String, u32> {
    inventories
        .iter()
        .map(|inventory| {
            let (node, _) = planner_node(inventory, PlannerDeviceIds::InventoryNames);
            let free = node
                .devices
                .iter()
                .filter(|d| !held.iter().any(|r| r.contains(&node.name, &d.id)))
                .count();
            (node.name, u32::try_from(free).unwrap())
        })
        .collect()
}

fn total(values: &BTreeMap<String, u32>) -> u64 {
    values.values().map(|v| u64::from(*v)).sum()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn the_summary_fleet_json_gauges_and_planner_count_alike(case in fleet_case()) {
        let inventories = inventories(&case);
        let (placements, claims) = holders(&case, &inventories);

        // The agent's summary (`kubectl get accinv`).
        let sum = |f: fn(&hwaccel::api::InventorySummary) -> Option<u32>| -> u64 {
            inventories.iter().map(|i| u64::from(f(&i.spec.summary).unwrap_or(0))).sum()
        };
        let devices = sum(|s| Some(s.accelerators));
        let healthy = sum(|s| s.healthy);
        let degraded = sum(|s| s.degraded);

        // `hwaccel fleet -o json`: placements only.
        let report = fleet_json(&inventories, &placements);
        let t = &report["health"]["total"];
        let n = |key: &str| t[key].as_u64().unwrap();
        prop_assert_eq!(n("devices"), devices, "{}", t);
        prop_assert_eq!(n("healthy"), healthy, "{}", t);
        prop_assert_eq!(n("degraded"), degraded, "{}", t);
        prop_assert_eq!(
            n("devices"),
            n("healthy") + n("degraded") + n("unhealthy") + n("unknown")
        );
        prop_assert_eq!(n("reserved"), placements.len() as u64);
        let free_by_placements = planner_free(&inventories, &[&placements]);
        prop_assert_eq!(n("free"), total(&free_by_placements), "{}", t);
        for node in report["health"]["nodes"].as_array().unwrap() {
            let name = node["name"].as_str().unwrap();
            prop_assert_eq!(
                node["free"].as_u64().unwrap(),
                u64::from(free_by_placements[name]),
                "{}", node
            );
        }
        let missing: u64 = inventories
            .iter()
            .map(|i| {
                let expected = i.status.as_ref().and_then(|s| s.expected_devices).unwrap_or(0);
                u64::from(expected.saturating_sub(i.spec.summary.accelerators))
            })
            .sum();
        prop_assert_eq!(n("missing"), missing);

        // The controller: gauges and status.freeDevices, every holder counted.
        let held = Holdings { placements: &placements, claims: Some(&claims) };
        let (text, written) = controller_view(&inventories, &held);
        prop_assert_eq!(gauge(&text, "hwaccel_fleet_devices"), devices, "{}", text);
        prop_assert_eq!(gauge(&text, "hwaccel_fleet_devices_healthy"), healthy);
        prop_assert_eq!(gauge(&text, "hwaccel_fleet_devices_degraded"), degraded);
        prop_assert_eq!(
            gauge(&text, "hwaccel_fleet_devices_reserved"),
            (placements.len() + claims.len()) as u64
        );
        let free_by_all = planner_free(&inventories, &[&placements, &claims]);
        prop_assert_eq!(gauge(&text, "hwaccel_fleet_devices_free"), total(&free_by_all));
        prop_assert_eq!(&written, &free_by_all);
    }
}
