//! Tests for the counter rule on the vendor-shaped fixtures (`fixtures/dra/PROVENANCE.md`):
//! NVIDIA's dynamic MIG (one counter set per GPU) and AMD's AutoPartition (a partition-mode
//! mutex per GPU), plus malformed pools.

use serde_json::{Value, json};

use super::*;
use crate::dra::slices::{SHARED, published_devices};
use crate::testing::dra::fixture_slices;

fn fixture(name: &str) -> Vec<ResourceSlice> {
    fixture_slices(&[name])
}

const MIG_NODE: &str = "h100-mig-node";
const AMD_NODE: &str = "mi300x-autopartition-node";

fn nvidia(device: &str) -> DeviceRef {
    DeviceRef {
        driver: "gpu.nvidia.com".into(),
        pool: MIG_NODE.into(),
        device: device.into(),
    }
}

fn amd(device: &str) -> DeviceRef {
    DeviceRef {
        driver: "gpu.amd.com".into(),
        pool: AMD_NODE.into(),
        device: device.into(),
    }
}

fn held(devices: &[DeviceRef]) -> Vec<(DeviceRef, String)> {
    devices
        .iter()
        .map(|d| (d.clone(), format!("team/claim-{}", d.device)))
        .collect()
}

fn names(blocked: &BTreeMap<DeviceRef, String>, gpu: &str) -> BTreeSet<String> {
    blocked
        .keys()
        .filter(|d| d.device == gpu || d.device.starts_with(&format!("{gpu}-")))
        .map(|d| d.device.clone())
        .collect()
}

#[test]
fn with_nothing_allocated_every_mig_device_and_whole_gpu_fits() {
    let slices = fixture("nvidia-h100-dynamic-mig.yaml");
    assert!(blocked_by_counters(&slices, Vec::new()).is_empty());
    // The counter slice holds no devices and the device slice no counters, yet both are one
    // pool: the whole GPUs are planned on, the MIG devices are partitions.
    let published = published_devices(&slices);
    let devices = published.node(MIG_NODE);
    assert_eq!(devices.len(), 22, "{:?}", published.notes);
    let usable: Vec<&str> = devices
        .iter()
        .filter(|d| d.unusable.is_none())
        .map(|d| d.reference.device.as_str())
        .collect();
    assert_eq!(usable, ["gpu-0", "gpu-1"]);
}

#[test]
fn one_mig_device_blocks_its_gpu_and_the_placements_that_overlap_it_only() {
    let slices = fixture("nvidia-h100-dynamic-mig.yaml");
    let blocked = blocked_by_counters(&slices, held(&[nvidia("gpu-0-mig-1g10gb-19-0")]));
    // Memory slice 0 is taken: the whole GPU, the 7g (slices 0-7) and the first 3g (0-3)
    // need it; the 1g devices on other slices and the second 3g (4-7) still fit.
    assert_eq!(
        names(&blocked, "gpu-0"),
        BTreeSet::from([
            "gpu-0".to_string(),
            "gpu-0-mig-3g40gb-9-0".to_string(),
            "gpu-0-mig-7g80gb-0-0".to_string(),
        ])
    );
    assert!(names(&blocked, "gpu-1").is_empty(), "another GPU's set");
    let why = &blocked[&nvidia("gpu-0")];
    assert!(
        why.contains("counter set gpu-0-counter-set in pool gpu.nvidia.com/h100-mig-node"),
        "{why}"
    );
    assert!(
        why.contains("used by team/claim-gpu-0-mig-1g10gb-19-0 (gpu-0-mig-1g10gb-19-0)"),
        "{why}"
    );
}

#[test]
fn partitions_that_together_use_up_the_compute_block_the_rest() {
    let slices = fixture("nvidia-h100-dynamic-mig.yaml");
    // Two 3g.40gb take all eight memory slices and 120 of 132 SMs.
    let blocked = blocked_by_counters(
        &slices,
        held(&[
            nvidia("gpu-1-mig-3g40gb-9-0"),
            nvidia("gpu-1-mig-3g40gb-9-4"),
        ]),
    );
    let gpu1 = names(&blocked, "gpu-1");
    assert!(gpu1.contains("gpu-1") && gpu1.contains("gpu-1-mig-7g80gb-0-0"));
    assert_eq!(
        gpu1.iter().filter(|d| d.contains("1g10gb")).count(),
        7,
        "no memory slice left: {gpu1:?}"
    );
    assert!(
        !gpu1.contains("gpu-1-mig-3g40gb-9-0"),
        "allocated is taken, not blocked"
    );
}

#[test]
fn the_whole_gpu_allocated_blocks_every_partition_of_it() {
    let slices = fixture("nvidia-h100-dynamic-mig.yaml");
    let blocked = blocked_by_counters(&slices, held(&[nvidia("gpu-0")]));
    let gpu0 = names(&blocked, "gpu-0");
    assert_eq!(gpu0.len(), 10, "every MIG placement of gpu-0: {gpu0:?}");
    assert!(!gpu0.contains("gpu-0"));
    // A device named by two claims (a race the kubelet resolves) consumes once.
    let twice = vec![
        (nvidia("gpu-1-mig-1g10gb-19-6"), "a/one".to_string()),
        (nvidia("gpu-1-mig-1g10gb-19-6"), "b/two".to_string()),
    ];
    let blocked = blocked_by_counters(&slices, twice);
    assert!(!names(&blocked, "gpu-1").contains("gpu-1-mig-1g10gb-19-5"));
}

#[test]
fn amd_autopartition_devices_are_shared_and_one_layout_in_use_blocks_the_others() {
    let slices = fixture("amd-mi300x-autopartition.yaml");
    let published = published_devices(&slices);
    let devices = published.node(AMD_NODE);
    assert_eq!(devices.len(), 8);
    let spx = devices
        .iter()
        .find(|d| d.reference.device == "gpu-0-spx-nps1")
        .expect("spx");
    let why = spx.unusable.as_deref().unwrap_or_default();
    assert!(
        why.starts_with(SHARED) && why.contains("each allocation takes all of its"),
        "whole, but shared: {why}"
    );
    assert_eq!(spx.share, None);
    // The scheduler gave one CPX share of GPU 0 to a pod: its mutex is taken, so no other
    // layout of GPU 0 (the whole GPU included) may be allocated; the CPX layout in use may
    // take more shares (its counters are already consumed) and GPU 1 is untouched.
    let blocked = blocked_by_counters(&slices, held(&[amd("gpu-0-cpx-nps4")]));
    assert_eq!(
        names(&blocked, "gpu-0"),
        BTreeSet::from([
            "gpu-0-spx-nps1".to_string(),
            "gpu-0-dpx-nps2".to_string(),
            "gpu-0-cpx-nps1".to_string(),
        ])
    );
    assert!(names(&blocked, "gpu-1").is_empty());
    assert!(blocked[&amd("gpu-0-spx-nps1")].contains("gpu-0-mutex"));
}

/// A pool of one counter slice and one device slice, generation 1.
fn pool(counters: Value, devices: Value) -> Vec<ResourceSlice> {
    let spec = |name: &str, key: &str, body: Value| {
        serde_json::from_value::<ResourceSlice>(json!({
            "metadata": {"name": name},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": "n",
                "pool": {"name": "n", "generation": 1, "resourceSliceCount": 2},
                key: body,
            }
        }))
        .expect("test slice")
    };
    vec![
        spec("n-counters", "sharedCounters", counters),
        spec("n-devices", "devices", devices),
    ]
}

fn gpu(name: &str, set: &str, counters: Value) -> Value {
    json!({
        "name": name,
        "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA H100 80GB HBM3"}},
        "capacity": {"memory": {"value": "80Gi"}},
        "consumesCounters": [{"counterSet": set, "counters": counters}],
    })
}

#[test]
fn malformed_counters_block_the_device_with_a_reason_and_never_panic() {
    let slices = pool(
        json!([{"name": "set", "counters": {"memory": {"value": "80Gi"}, "odd": {"value": "lots"}}}]),
        json!([
            gpu("ok", "set", json!({"memory": {"value": "40Gi"}})),
            gpu("bad-need", "set", json!({"memory": {"value": "-1"}})),
            gpu("bad-total", "set", json!({"odd": {"value": "1"}})),
            gpu("no-set", "other", json!({"memory": {"value": "1"}})),
            gpu("no-counter", "set", json!({"cores": {"value": "1"}})),
            gpu("too-big", "set", json!({"memory": {"value": "81Gi"}})),
        ]),
    );
    let published = published_devices(&slices);
    let why = |name: &str| {
        published
            .node("n")
            .iter()
            .find(|d| d.reference.device == name)
            .and_then(|d| d.unusable.clone())
    };
    assert_eq!(why("ok"), None);
    for (device, text) in [
        ("bad-need", "(\"-1\") is not a quantity"),
        ("bad-total", "(\"lots\") is not a quantity"),
        ("no-set", "does not publish"),
        ("no-counter", "has no counter cores"),
        (
            "too-big",
            "needs 86973087744 memory, 85899345920 of 85899345920 left",
        ),
    ] {
        let reason = why(device).unwrap_or_else(|| panic!("{device} is usable"));
        assert!(reason.contains(text), "{device}: {reason}");
    }
    // An allocated device whose consumption cannot be read leaves nothing known to share.
    let slices = pool(
        json!([{"name": "set", "counters": {"memory": {"value": "80Gi"}}}]),
        json!([
            gpu("weird", "set", json!({"memory": {"value": "1x3"}})),
            gpu("other", "set", json!({"memory": {"value": "1Gi"}})),
        ]),
    );
    let blocked = blocked_by_counters(
        &slices,
        vec![(
            DeviceRef {
                driver: "gpu.nvidia.com".into(),
                pool: "n".into(),
                device: "weird".into(),
            },
            "a/b".into(),
        )],
    );
    let other = blocked.values().next().expect("other is blocked");
    assert!(other.contains("weird's consumption of memory"), "{other}");
}

#[test]
fn a_counter_set_in_an_incomplete_or_old_generation_is_not_read() {
    let mut slices = pool(
        json!([{"name": "set", "counters": {"memory": {"value": "80Gi"}}}]),
        json!([gpu("g", "set", json!({"memory": {"value": "80Gi"}}))]),
    );
    // Generation 2 is being written: only its device slice is there.
    let mut newer = slices[1].clone();
    newer.metadata.name = Some("n-devices-2".into());
    newer.spec.pool.generation = 2;
    slices.push(newer);
    let taken = DeviceRef {
        driver: "gpu.nvidia.com".into(),
        pool: "n".into(),
        device: "g".into(),
    };
    assert!(blocked_by_counters(&slices, vec![(taken, "a/b".into())]).is_empty());
    assert!(published_devices(&slices).node("n").is_empty());
}

/// Issue 35: the apiserver keeps a quantity written with an exponent (`1e3`) as written; such
/// a counter blocked every device consuming it ("not a quantity"). It reads as its value.
#[test]
fn counters_written_with_exponents_are_read_as_their_value() {
    let slices = pool(
        json!([{"name": "set", "counters": {
            "memory": {"value": "8e10"},
            "multiprocessors": {"value": "1.32E2"},
        }}]),
        json!([
            gpu(
                "a",
                "set",
                json!({"memory": {"value": "4e10"}, "multiprocessors": {"value": "66"}})
            ),
            gpu(
                "b",
                "set",
                json!({"memory": {"value": "40e+9"}, "multiprocessors": {"value": "6.6e1"}})
            ),
            gpu("c", "set", json!({"memory": {"value": "1e3"}})),
        ]),
    );
    let published = published_devices(&slices);
    let unusable: Vec<_> = published
        .node("n")
        .iter()
        .filter_map(|d| d.unusable.clone())
        .collect();
    assert!(unusable.is_empty(), "{unusable:?}");
    let a = DeviceRef {
        driver: "gpu.nvidia.com".into(),
        pool: "n".into(),
        device: "a".into(),
    };
    // `a` and `b` together take the whole set: with `a` allocated `b` still fits, with both
    // allocated `c` (1000 bytes) does not.
    let blocked = blocked_by_counters(&slices, vec![(a.clone(), "ns/a".into())]);
    assert!(blocked.is_empty(), "{blocked:?}");
    let b = DeviceRef {
        device: "b".into(),
        ..a.clone()
    };
    let blocked = blocked_by_counters(&slices, vec![(a, "ns/a".into()), (b, "ns/b".into())]);
    let why = blocked.values().next().expect("c is blocked");
    assert!(
        why.contains("needs 1000 memory, 0 of 80000000000 left"),
        "{why}"
    );
}
