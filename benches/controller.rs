//! The pure part of a ModelPlacement reconcile at fleet scale: building the planner's view of
//! 1,000 inventories (done once per fleet change), planning one placement against it with
//! nothing and with 250 placements' devices reserved, and a decision that first plans 16
//! older waiting placements (the "older first" burst).
//!
//! The inventories are detected from the fixture hosts (8 x H100 NVSwitch, 8 x MI300X,
//! 8 x A100 with MIG) through the real detection code, then renamed per node.
//!
//! Run: `cargo bench --bench controller -- --warm-up-time 1 --measurement-time 3`

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::Criterion;
use hwaccel::api::AcceleratorInventory;
use hwaccel::api::placement::{ModelPlacementSpec, PrecisionChoice};
use hwaccel::controller::core::fleet_view::{FleetView, PartCache};
use hwaccel::controller::core::ledger::{Ledger, PlacementKey, Precedence};
use hwaccel::controller::fleet::core::model_capacity::{self, CountedModel};
use hwaccel::controller::placement::core::decide::{Candidate, decide};
use hwaccel::controller::placement::core::evaluate::evaluate;
use hwaccel::plan::Reservations;
use hwaccel::testing::PlacementBuilder;
use hwaccel::testing::fixture::fixture_report;
use hwaccel::testing::inventory::fleet;

const NODES: usize = 1000;
const SCENARIOS: [&str; 3] = ["h100-8x-nvswitch", "mi300x-8x", "a100-mig"];

/// The fleet size of the issue-11 target: one plan against 10,000 inventories under 50 ms.
const LARGE_FLEET: usize = 10_000;

fn inventories() -> Vec<AcceleratorInventory> {
    inventories_of(NODES)
}

fn inventories_of(nodes: usize) -> Vec<AcceleratorInventory> {
    let reports: Vec<_> = SCENARIOS.iter().map(|s| fixture_report(s)).collect();
    fleet(&reports, nodes)
}

/// Serving a 70B model at bf16 for `concurrency` requests: half of an 8 x H100 node.
fn spec(concurrency: u32) -> ModelPlacementSpec {
    PlacementBuilder::serve("llama-3.1-70b")
        .concurrency(concurrency)
        .precision(PrecisionChoice::Bf16)
        .spec()
}

fn candidate<'a>(index: usize, spec: &'a ModelPlacementSpec) -> Candidate<'a> {
    let name = format!("p{index:04}");
    Candidate {
        precedence: Precedence {
            created: i64::try_from(index).unwrap_or(i64::MAX),
            key: PlacementKey::new("bench", name.clone()),
        },
        uid: name,
        generation: 1,
        spec,
    }
}

fn main() {
    let inventories = inventories();
    let labels = BTreeMap::new();
    let fleet = FleetView::new(inventories.iter(), &labels);
    let spec = spec(1);
    let mut criterion = Criterion::default().configure_from_args();

    criterion.bench_function("fleet_view/1000_inventories", |b| {
        b.iter(|| FleetView::new(black_box(&inventories).iter(), &labels));
    });
    criterion.bench_function("fleet_view/1000_inventories_one_changed", |b| {
        let mut cache = PartCache::default();
        cache.refresh(inventories.iter());
        let mut changed = inventories.clone();
        let mut version = 0u64;
        b.iter(|| {
            version += 1;
            changed[0].metadata.resource_version = Some(format!("changed-{version}"));
            FleetView::from_parts(cache.refresh(changed.iter()), &labels)
        });
    });
    criterion.bench_function("evaluate/1000_nodes_free", |b| {
        b.iter(|| {
            evaluate(
                &spec,
                "bench",
                "one",
                black_box(&fleet),
                &Reservations::none(),
            )
        });
    });

    // 250 placements hold devices; 16 more wait, older than the one reconciled.
    let mut held = Ledger::new();
    for index in 0..250 {
        decide(&mut held, &candidate(index, &spec), &[], &fleet);
    }
    let reserved = held.reserved_by_others(&PlacementKey::new("bench", "none"));
    criterion.bench_function("evaluate/1000_nodes_250_held", |b| {
        b.iter(|| evaluate(&spec, "bench", "one", black_box(&fleet), &reserved));
    });
    // The chart's default counted models, on the fleet with 250 placements held.
    let counted = CountedModel::parse_all(&[
        "llama-3.1-8b@8192/bf16".to_string(),
        "llama-3.1-70b@8192/bf16".to_string(),
    ])
    .unwrap_or_default();
    criterion.bench_function("model_capacity/1000_nodes_250_held_2_models", |b| {
        b.iter(|| model_capacity::count(&counted, black_box(fleet.nodes()), &reserved));
    });
    let waiting: Vec<Candidate<'_>> = (250..266).map(|index| candidate(index, &spec)).collect();
    let me = candidate(266, &spec);
    criterion.bench_function("decide/16_older_waiting_then_one", |b| {
        b.iter_batched(
            || held.clone(),
            |mut ledger| decide(&mut ledger, &me, black_box(&waiting), &fleet),
            criterion::BatchSize::LargeInput,
        );
    });
    criterion.bench_function("decide/kept_plan", |b| {
        let mut ledger = held.clone();
        let kept = candidate(10, &spec);
        b.iter(|| decide(&mut ledger, black_box(&kept), &[], &fleet));
    });
    // The same plan against ten times the fleet (built once: converting 10,000 inventories
    // belongs to start-up, see fleet_view/1000_inventories).
    let large = inventories_of(LARGE_FLEET);
    let large_fleet = FleetView::new(large.iter(), &labels);
    drop(large);
    criterion.bench_function("evaluate/10000_inventories_free", |b| {
        b.iter(|| {
            evaluate(
                &spec,
                "bench",
                "one",
                black_box(&large_fleet),
                &Reservations::none(),
            )
        });
    });
    criterion.final_summary();
}
