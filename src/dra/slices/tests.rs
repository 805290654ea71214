//! Tests for reading ResourceSlices: pool rules, known drivers, partitions and taints.
//! Device shapes follow the public drivers (see `fixtures/dra/PROVENANCE.md`).

use serde_json::{Value, json};

use super::*;

/// One NVIDIA slice for `node`, shaped like dra-driver-nvidia-gpu publishes it.
fn nvidia_slice(
    name: &str,
    node: &str,
    generation: i64,
    count: i64,
    devices: Value,
) -> ResourceSlice {
    slice(
        name,
        "gpu.nvidia.com",
        node,
        node,
        generation,
        count,
        devices,
    )
}

fn slice(
    name: &str,
    driver: &str,
    node: &str,
    pool: &str,
    generation: i64,
    count: i64,
    devices: Value,
) -> ResourceSlice {
    let mut object = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "devices": devices,
        }
    });
    if !node.is_empty() {
        object["spec"]["nodeName"] = json!(node);
    }
    serde_json::from_value(object).expect("test slice")
}

fn h100(minor: u32, bus: &str) -> Value {
    json!({
        "name": format!("gpu-{minor}"),
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": format!("GPU-5c6d1f2a-0000-4000-8000-00000000000{minor}")},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "resource.kubernetes.io/pciBusID": {"string": bus},
        },
        "capacity": {"memory": {"value": "81559Mi"}}
    })
}

#[test]
fn a_complete_pool_yields_its_devices_with_bus_id_uuid_product_and_memory() {
    let fleet = published_devices(&[nvidia_slice(
        "node-a-gpu.nvidia.com-x",
        "node-a",
        1,
        1,
        json!([h100(0, "0000:18:00.0"), h100(1, "0000:2A:00.0")]),
    )]);
    assert!(fleet.notes.is_empty(), "{:?}", fleet.notes);
    let devices = fleet.node("node-a");
    assert_eq!(devices.len(), 2);
    assert_eq!(
        devices[0].reference.to_string(),
        "gpu.nvidia.com/node-a/gpu-0"
    );
    assert_eq!(devices[1].pci_bus_id.as_deref(), Some("0000:2a:00.0"));
    assert_eq!(devices[0].product.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(devices[0].memory_bytes, Some(81559 << 20));
    assert!(
        devices[0]
            .uuid
            .as_deref()
            .is_some_and(|u| u.starts_with("GPU-"))
    );
    assert_eq!(devices[0].unusable, None);
}

#[test]
fn only_the_highest_generation_counts_and_only_when_complete() {
    let old = nvidia_slice("old", "node-a", 1, 1, json!([h100(0, "0000:18:00.0")]));
    let new_half = nvidia_slice("new-1", "node-a", 2, 2, json!([h100(1, "0000:2a:00.0")]));
    let fleet = published_devices(&[old.clone(), new_half.clone()]);
    assert!(
        fleet.node("node-a").is_empty(),
        "generation 2 is incomplete"
    );
    assert!(
        fleet.notes.iter().any(|n| n.contains("1 of 2 slices")),
        "{:?}",
        fleet.notes
    );
    // The same slice twice does not complete the pool.
    let twice = published_devices(&[new_half.clone(), new_half.clone()]);
    assert!(twice.node("node-a").is_empty());
    let other_half = nvidia_slice("new-2", "node-a", 2, 2, json!([h100(2, "0000:3b:00.0")]));
    let fleet = published_devices(&[old, new_half, other_half]);
    let names: Vec<&str> = fleet
        .node("node-a")
        .iter()
        .map(|d| d.reference.device.as_str())
        .collect();
    assert_eq!(names, ["gpu-1", "gpu-2"], "generation 1's gpu-0 is stale");
}

#[test]
fn unknown_drivers_and_slices_without_a_node_are_ignored_with_notes() {
    let fleet = published_devices(&[
        slice(
            "x",
            "gpu.example.com",
            "node-a",
            "node-a",
            1,
            1,
            json!([h100(0, "0000:18:00.0")]),
        ),
        slice(
            "y",
            "gpu.nvidia.com",
            "",
            "fabric",
            1,
            1,
            json!([h100(0, "0000:18:00.0")]),
        ),
    ]);
    assert!(fleet.nodes.is_empty());
    assert_eq!(fleet.notes.len(), 2, "{:?}", fleet.notes);
    assert!(fleet.notes[0].contains("gpu.example.com"));
    assert!(fleet.notes[1].contains("nodeName"));
}

#[test]
fn partitions_and_blocking_taints_are_unusable_and_partitions_do_not_claim_the_parent_bus() {
    let mig = json!({
        "name": "gpu-0-mig-1g10gb-19-0",
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": "MIG-1a2b3c4d-0000-5000-8000-000000000001"},
            "parentUUID": {"string": "GPU-5c6d1f2a-0000-4000-8000-000000000000"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "profile": {"string": "1g.10gb"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
        },
        "capacity": {"memory": {"value": "9856Mi"}}
    });
    let mut tainted = h100(1, "0000:2a:00.0");
    tainted["taints"] = json!([
        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}
    ]);
    let mut advisory = h100(2, "0000:3b:00.0");
    advisory["taints"] = json!([{"key": "example.com/note", "effect": "None"}]);
    let fleet = published_devices(&[nvidia_slice(
        "s",
        "node-a",
        1,
        1,
        json!([h100(0, "0000:18:00.0"), mig, tainted, advisory]),
    )]);
    let devices = fleet.node("node-a");
    let by_name = |name: &str| {
        devices
            .iter()
            .find(|d| d.reference.device == name)
            .expect(name)
    };
    let mig = by_name("gpu-0-mig-1g10gb-19-0");
    assert!(
        mig.unusable
            .as_deref()
            .is_some_and(|r| r.contains("type=mig"))
    );
    assert_eq!(mig.pci_bus_id, None);
    assert!(
        by_name("gpu-1")
            .unusable
            .as_deref()
            .is_some_and(|r| r.contains("xid=79:NoExecute"))
    );
    assert_eq!(
        by_name("gpu-2").unusable,
        None,
        "an effect None taint does not block"
    );
    assert_eq!(by_name("gpu-0").unusable, None);
}

#[test]
fn qualified_attribute_names_odd_quantities_and_vendor_bus_ids_are_read_safely() {
    let device = json!({
        "name": "gpu-0",
        "attributes": {
            "gpu.intel.com/model": {"string": "Data Center GPU Max 1550"},
            "pciAddress": {"string": "3a:00.0"},
        },
        "capacity": {"memory": {"value": "1e400"}}
    });
    let fleet = published_devices(&[slice("i", "gpu.intel.com", "n", "n", 1, 1, json!([device]))]);
    let d = &fleet.node("n")[0];
    assert_eq!(d.product.as_deref(), Some("Data Center GPU Max 1550"));
    assert_eq!(d.pci_bus_id.as_deref(), Some("0000:3a:00.0"));
    assert_eq!(d.memory_bytes, None, "an exponent is not guessed at");
}

#[test]
fn a_gaudi_reported_unhealthy_is_unusable() {
    let device = json!({
        "name": "0000-33-00-0-0x1020",
        "attributes": {
            "model": {"string": "Gaudi2"},
            "serial": {"string": "AN12345678"},
            "healthy": {"bool": false},
            "pciRoot": {"string": "0000:32"},
        }
    });
    let fleet = published_devices(&[slice(
        "g",
        "gaudi.intel.com",
        "n",
        "n",
        1,
        1,
        json!([device]),
    )]);
    let d = &fleet.node("n")[0];
    assert_eq!(d.uuid.as_deref(), Some("AN12345678"));
    assert!(
        d.unusable
            .as_deref()
            .is_some_and(|r| r.contains("unhealthy"))
    );
}

#[test]
fn a_hostile_pool_is_bounded() {
    let slices: Vec<ResourceSlice> = (0..8)
        .map(|i| {
            let many: Vec<Value> = (0..200)
                .map(|j| json!({"name": format!("s{i}-d{j}")}))
                .collect();
            slice(
                &format!("s{i}"),
                "gpu.nvidia.com",
                "n",
                "n",
                1,
                8,
                json!(many),
            )
        })
        .collect();
    let fleet = published_devices(&slices);
    assert_eq!(fleet.node("n").len(), MAX_DEVICES_PER_NODE);
    assert!(fleet.notes.iter().any(|n| n.contains("more than")));
    let absurd = published_devices(&[slice(
        "s",
        "gpu.nvidia.com",
        "n",
        "n",
        1,
        i64::MAX,
        json!([]),
    )]);
    assert!(absurd.notes.iter().any(|n| n.contains("not usable")));
}

#[test]
fn the_numa_node_is_read_standard_first_then_the_drivers_own() {
    // AMD's driver publishes its own `numaNode` (fixtures/dra/amd-mi300x-8x.yaml); a
    // driver following the 1.37 standard publishes `resource.kubernetes.io/numaNode`, which
    // wins; `-1` (no affinity) and absurd ids are unknown.
    let device = |name: &str, attributes: Value| json!({"name": name, "attributes": attributes, "capacity": {"memory": {"value": "192Gi"}}});
    let devices = json!([
        device(
            "gpu-0",
            json!({"type": {"string": "amdgpu"}, "numaNode": {"int": 1}})
        ),
        device(
            "gpu-1",
            json!({"type": {"string": "amdgpu"}, "gpu.amd.com/numaNode": {"int": 3}})
        ),
        device(
            "gpu-2",
            json!({
                "type": {"string": "amdgpu"},
                "numaNode": {"int": 0},
                "resource.kubernetes.io/numaNode": {"int": 2},
            })
        ),
        device(
            "gpu-3",
            json!({"type": {"string": "amdgpu"}, "numaNode": {"int": -1}})
        ),
        device(
            "gpu-4",
            json!({
                "type": {"string": "amdgpu"},
                "resource.kubernetes.io/numaNode": {"int": 1_000_000},
            })
        ),
        device(
            "gpu-5",
            json!({"type": {"string": "amdgpu"}, "numaNode": {"string": "1"}})
        ),
    ]);
    let fleet = published_devices(&[slice("a", "gpu.amd.com", "n", "n", 1, 1, devices)]);
    let numa: Vec<Option<u32>> = fleet.node("n").iter().map(|d| d.numa_node).collect();
    assert_eq!(numa, [Some(1), Some(3), Some(2), None, None, None]);

    let fleet = published_devices(&crate::testing::dra::fixture_slices(&[
        "amd-mi300x-8x.yaml",
    ]));
    let read: Vec<Option<u32>> = fleet
        .nodes
        .values()
        .flatten()
        .map(|d| d.numa_node)
        .collect();
    assert!(
        !read.is_empty() && read.iter().all(Option::is_some),
        "{read:?}"
    );
}

/// Issue 39: a GPU published shareable by memory (`allowMultipleAllocations`, the example
/// driver's 8Gi-step policy) is plannable and carries its policy; one whose policy the API
/// would refuse, or whose other capacity each allocation takes whole, is not, with the reason.
#[test]
fn a_gpu_shareable_by_memory_carries_its_policy_and_a_bad_one_says_why() {
    let fleet = published_devices(&crate::testing::dra::fixture_slices(&[
        "nvidia-h100-shareable.yaml",
    ]));
    let devices = fleet.node("h100-2x-shared");
    assert_eq!(devices.len(), 2);
    for device in devices {
        assert_eq!(device.unusable, None, "{device:?}");
        let policy = device.share.as_ref().expect("a share policy");
        assert_eq!(policy.capacity, 80 << 30);
        assert_eq!(policy.round(20 << 30), Ok(24 << 30));
    }

    let shared = |capacity: Value| {
        let mut device = h100(0, "0000:18:00.0");
        device["allowMultipleAllocations"] = json!(true);
        device["capacity"] = capacity;
        let fleet = published_devices(&[nvidia_slice("s", "n", 1, 1, json!([device]))]);
        fleet.node("n")[0].clone()
    };
    let refused = shared(json!({"memory": {"value": "80Gi", "requestPolicy": {
        "default": "9Gi", "validRange": {"min": "8Gi", "step": "8Gi"}}}}));
    assert_eq!(refused.share, None);
    assert!(
        refused
            .unusable
            .as_deref()
            .unwrap_or_default()
            .contains("default"),
        "{refused:?}"
    );
    let exclusive = shared(json!({
        "memory": {"value": "80Gi"},
        "multiprocessors": {"value": "132"},
    }));
    assert_eq!(exclusive.share, None);
    let why = exclusive.unusable.unwrap_or_default();
    assert!(
        why.starts_with(SHARED) && why.contains("multiprocessors"),
        "{why}"
    );
    let no_memory = shared(
        json!({"cores": {"value": "8", "requestPolicy": {"default": "1", "validRange": {"min": "1"}}}}),
    );
    assert_eq!(no_memory.unusable.as_deref(), Some(SHARED));
    // A device one claim holds whole has no policy at all.
    let whole = published_devices(&crate::testing::dra::fixture_slices(&[
        "nvidia-h100-8x.yaml",
    ]));
    assert!(
        whole
            .node("h100-8x-nvswitch")
            .iter()
            .all(|d| d.share.is_none())
    );
}

/// Issue 39: NVIDIA's MIG devices stay unusable as devices, but each names its profile and
/// parent so the planner may take one as a fraction of that GPU.
#[test]
fn mig_devices_name_their_profile_and_parent() {
    let fleet = published_devices(&crate::testing::dra::fixture_slices(&[
        "nvidia-h100-dynamic-mig.yaml",
    ]));
    let devices = fleet.node("h100-mig-node");
    let migs: Vec<&PublishedDevice> = devices
        .iter()
        .filter(|d| d.reference.device.contains("-mig-"))
        .collect();
    assert!(!migs.is_empty());
    for mig in &migs {
        assert!(
            mig.unusable
                .as_deref()
                .unwrap_or_default()
                .contains("partition")
        );
        let part = mig.partition.as_ref().expect("a partition");
        let ParentRef::Uuid(parent_uuid) = &part.parent else {
            panic!("a MIG device names its parent by UUID: {part:?}");
        };
        let parent = devices
            .iter()
            .find(|d| d.uuid.as_deref() == Some(parent_uuid.as_str()))
            .expect("its parent is published");
        assert!(mig.reference.device.starts_with(&parent.reference.device));
        let slug = part.profile.replace('.', "");
        assert!(mig.reference.device.contains(&slug), "{mig:?}");
    }
    assert!(
        devices
            .iter()
            .filter(|d| d.partition.is_none())
            .all(|d| !d.reference.device.contains("-mig-"))
    );
}

/// Issue 39: AMD's partitions of a GPU partitioned on the node (the 2026 layout's
/// pre-partitioned DPX GPU) name their profile and their parent by the PCI bus id they carry;
/// VFIO siblings and AutoPartition layouts (shared devices, no `partitionProfile`) are no
/// partitions to plan on.
#[test]
fn amd_partitions_name_their_profile_and_parent_bus() {
    let fleet = published_devices(&crate::testing::dra::fixture_slices(&[
        "amd-mi300x-2026.yaml",
        "amd-mi300x-autopartition.yaml",
    ]));
    let node = fleet.nodes.keys().find(|n| !n.contains("autopartition"));
    let devices = fleet.node(node.expect("the 2026 node"));
    let parts: Vec<&PublishedDevice> = devices.iter().filter(|d| d.partition.is_some()).collect();
    assert_eq!(parts.len(), 2, "{devices:#?}");
    for part in &parts {
        let partition = part.partition.as_ref().expect("a partition");
        assert_eq!(partition.profile, "dpx_nps2");
        assert_eq!(
            partition.parent,
            ParentRef::PciBusId("0000:46:00.0".to_string())
        );
        assert_eq!(part.memory_bytes, Some(98_296 << 20));
        assert!(part.unusable.is_some() && !part.whole);
    }
    assert!(
        devices
            .iter()
            .filter(|d| d.partition.is_none())
            .all(|d| d.whole || d.unusable.is_some())
    );
    let auto = fleet.node("mi300x-autopartition-node");
    assert!(!auto.is_empty());
    assert!(auto.iter().all(|d| d.partition.is_none()), "{auto:#?}");
}

/// An informational taint (`effect: None`) keeps nothing off the device: it stays usable,
/// carrying the taint as a notice; a blocking taint still makes it unusable.
#[test]
fn an_informational_taint_is_a_notice_not_a_reason_to_skip() {
    let tainted = |effect: &str| {
        let mut device = h100(0, "0000:18:00.0");
        device["taints"] = json!([{"key": "gpu.nvidia.com/xid", "value": "48", "effect": effect}]);
        let fleet = published_devices(&[nvidia_slice("s", "n", 1, 1, json!([device]))]);
        fleet.node("n")[0].clone()
    };
    let informational = tainted("None");
    assert_eq!(informational.unusable, None);
    assert!(
        informational
            .notice
            .as_deref()
            .is_some_and(|n| n.contains("gpu.nvidia.com/xid=48") && n.contains("informational")),
        "{informational:?}"
    );
    // An effect this reader does not know is treated as `None`, as the API asks.
    assert!(
        tainted("PreferNoSchedule")
            .notice
            .is_some_and(|n| n.contains("PreferNoSchedule"))
    );
    let blocking = tainted("NoSchedule");
    assert!(blocking.unusable.is_some());
    assert_eq!(blocking.notice, None);
}
