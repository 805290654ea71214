//! One plan against synthetic fleets of 1,000 and 10,000 nodes (a mix of 8 x H100 NVSwitch
//! nodes in InfiniBand pods, 8 x A100, 8 x MI300X, 1-4 x L4 and CPU-only nodes, a tenth of the
//! devices already reserved), and against one hostile node claiming 10,000 devices that all
//! differ in memory size, so that every device is a device class of its own (issue 11: such an
//! inventory once made one plan take 41 s). Before timing, prints the bytes allocated by one
//! plan at each fleet size, to show memory grows linearly with the fleet, and the time of one
//! plan against hostile nodes of 2,000, 9,251 and 10,000 devices.
//!
//! The controller plans many placements on one fleet view and keeps the planner's index of it
//! (`FleetIndex`): `serve_70b_bf16_indexed` times a plan through such an index.
//!
//! Run: `cargo bench --bench planner -- --warm-up-time 1 --measurement-time 3`
//! (`HWACCEL_BENCH_ONE_SHOT=only` prints the one-shot figures and times nothing else.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use criterion::Criterion;
use hwaccel::hardware::{Family, Precision, Vendor};
use hwaccel::plan::model::presets;
use hwaccel::plan::products;
use hwaccel::plan::search::{PlanRequest, plan, plan_indexed};
use hwaccel::plan::{Bytes, DeviceSpec, FleetIndex, Model, NodeSpec, Reservations};

/// Counts bytes allocated, to report the memory one plan needs.
struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

// The only unsafe code in the crate: a global allocator must implement an unsafe trait. It
// forwards every call to the system allocator and adds a counter.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn device(product: &str, id: usize, domain: Option<&str>) -> DeviceSpec {
    let mut spec = match products::lookup(product, None) {
        Some(p) => DeviceSpec::of_product(p, format!("gpu{id}"), None),
        None => DeviceSpec {
            id: format!("cpu{id}"),
            product: "Intel Xeon".into(),
            vendor: Vendor::Intel,
            family: Family::Cpu,
            memory: Bytes::gib(512),
            precisions: [Precision::Fp32].into_iter().collect(),
            domain: None,
            bandwidth_tbps: None,
            aliases: Vec::new(),
            driver_version: None,
            share: None,
            partitions: Vec::new(),
            partitions_only: false,
        },
    };
    spec.domain = domain.map(str::to_string);
    spec
}

/// A deterministic mixed fleet of `count` nodes.
fn fleet(count: usize) -> (Vec<NodeSpec>, Reservations) {
    let mut reserved = Reservations::none();
    let nodes = (0..count)
        .map(|i| {
            let name = format!("node-{i:05}");
            let (devices, fabric): (Vec<DeviceSpec>, Option<String>) = match i % 10 {
                0..=2 => (
                    (0..8)
                        .map(|d| device("H100", d, Some("nvswitch:0")))
                        .collect(),
                    Some(format!("ib-pod-{}", i / 64)),
                ),
                3 | 4 => (
                    (0..8)
                        .map(|d| device("A100-80GB", d, Some("nvswitch:0")))
                        .collect(),
                    None,
                ),
                5 => (
                    (0..8)
                        .map(|d| device("MI300X", d, Some("xgmi:0")))
                        .collect(),
                    None,
                ),
                6..=8 => (
                    (0..1 + i % 4).map(|d| device("L4", d, None)).collect(),
                    None,
                ),
                _ => (vec![device("cpu", 0, None)], None),
            };
            if i % 10 == 1 {
                reserved.insert(&name, "gpu0");
                reserved.insert(&name, "gpu1");
            }
            NodeSpec {
                name,
                devices,
                fabric,
                labels: Default::default(),
            }
        })
        .collect();
    (nodes, reserved)
}

/// Llama-3.1-70B in BF16 at 8k context for 64 concurrent requests: several TP replicas.
fn request() -> PlanRequest {
    PlanRequest::serve(Some(8192), 64).with_precision(Precision::Bf16)
}

/// One node claiming `count` H100-like devices whose memory sizes all differ (80 GiB minus
/// `i` MiB), so each is a device class of its own: the adversarial inventory.
fn one_node_many_sizes(count: usize) -> Vec<NodeSpec> {
    let devices = (0..count)
        .map(|i| {
            let mut spec = device("H100", i, None);
            let minus = u64::try_from(i).unwrap_or(u64::MAX);
            spec.memory = Bytes(Bytes::gib(80).0 - minus * (1 << 20));
            spec
        })
        .collect();
    vec![NodeSpec {
        name: "hostile".to_string(),
        devices,
        fabric: None,
        labels: Default::default(),
    }]
}

/// The hostile-node requests: 70B in BF16 fits no single device (a refusal, which explains
/// itself per device class), 8B in BF16 fits any one.
fn hostile_requests<'m>(
    model: &'m Model,
    small: &'m Model,
) -> [(&'static str, &'m Model, PlanRequest); 2] {
    [
        ("refuse_70b_bf16", model, request()),
        (
            "fit_8b_bf16",
            small,
            PlanRequest::serve(Some(8192), 1).with_precision(Precision::Bf16),
        ),
    ]
}

/// Times one plan against hostile nodes of several sizes (the old planner took tens of
/// seconds here, too long for criterion's repetitions).
fn report_hostile(model: &Model, small: &Model) {
    for count in [2_000, 9_251, 10_000] {
        let nodes = one_node_many_sizes(count);
        for (name, model, request) in hostile_requests(model, small) {
            let start = Instant::now();
            let result = plan(model, &nodes, &Reservations::none(), &request);
            let elapsed = start.elapsed();
            let fits = result.map(|p| p.fits).unwrap_or(false);
            println!(
                "planner/one_node_{count}_memory_sizes/{name}: one plan took {:.1} ms (fits: {fits})",
                elapsed.as_secs_f64() * 1e3
            );
        }
    }
}

fn report_memory(model: &Model) {
    for count in [1_000, 10_000] {
        let (nodes, reserved) = fleet(count);
        let before = ALLOCATED.load(Ordering::Relaxed);
        let result = plan(model, &nodes, &reserved, &request());
        let after = ALLOCATED.load(Ordering::Relaxed);
        let fits = result.map(|p| p.fits).unwrap_or(false);
        println!(
            "planner/{count}_nodes: {} bytes allocated by one plan (fits: {fits})",
            after - before
        );
    }
}

fn main() {
    let (Ok(Some(model)), Ok(Some(big)), Ok(Some(small))) = (
        presets::find("llama-3.1-70b"),
        presets::find("llama-3.1-405b"),
        presets::find("llama-3.1-8b"),
    ) else {
        eprintln!("the built-in presets are missing");
        return;
    };
    report_memory(&model);
    report_hostile(&model, &small);
    if std::env::var("HWACCEL_BENCH_ONE_SHOT").as_deref() == Ok("only") {
        return;
    }
    let mut criterion = Criterion::default().configure_from_args();
    for count in [1_000, 10_000] {
        let (nodes, reserved) = fleet(count);
        let request = request();
        criterion.bench_function(&format!("planner/serve_70b_bf16/{count}_nodes"), |b| {
            b.iter(|| {
                plan(
                    black_box(&model),
                    black_box(&nodes),
                    black_box(&reserved),
                    black_box(&request),
                )
            })
        });
    }
    // The controller's case: the same nodes planned again and again, indexed once (the
    // index is built outside the timed loop, as a fleet view builds it once).
    for count in [1_000, 10_000] {
        let (nodes, reserved) = fleet(count);
        let index = FleetIndex::new(&nodes);
        let request = request();
        criterion.bench_function(
            &format!("planner/serve_70b_bf16_indexed/{count}_nodes"),
            |b| {
                b.iter(|| {
                    plan_indexed(
                        black_box(&model),
                        (black_box(&nodes), black_box(&index)),
                        black_box(&reserved),
                        black_box(&request),
                    )
                })
            },
        );
    }
    let (nodes, reserved) = fleet(10_000);
    let multi_node = PlanRequest::serve(Some(8192), 1).with_precision(Precision::Bf16);
    criterion.bench_function("planner/serve_405b_bf16_two_nodes/10000_nodes", |b| {
        b.iter(|| {
            plan(
                black_box(&big),
                black_box(&nodes),
                black_box(&reserved),
                black_box(&multi_node),
            )
        })
    });
    // 10,000 nodes, and the 405B asked onto one node: a refusal that explains itself and
    // tries "more nodes like this one" per device class.
    let one_node = PlanRequest {
        max_nodes: Some(1),
        ..multi_node.clone()
    };
    criterion.bench_function("planner/refuse_405b_bf16_one_node/10000_nodes", |b| {
        b.iter(|| {
            plan(
                black_box(&big),
                black_box(&nodes),
                black_box(&reserved),
                black_box(&one_node),
            )
        })
    });
    let hostile = one_node_many_sizes(10_000);
    for (name, model, request) in hostile_requests(&model, &small) {
        criterion.bench_function(
            &format!("planner/one_node_10000_memory_sizes/{name}"),
            |b| {
                b.iter(|| {
                    plan(
                        black_box(model),
                        black_box(&hostile),
                        black_box(&Reservations::none()),
                        black_box(&request),
                    )
                })
            },
        );
    }
    criterion.final_summary();
}
