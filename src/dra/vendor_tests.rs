//! The vendor drivers' current slices (AMD's 2026 layout, AWS Neuron, Intel GPU health), read
//! and merged end to end from `fixtures/dra/` (provenance in its `PROVENANCE.md`), and the
//! rule that a driver's unknown or sentinel values never become a device the planner uses.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::PublishedDevice;
use super::merge::{MergedNode, merge_node};
use super::slices::published_devices;
use crate::hardware::HealthStatus;
use crate::plan::units::Bytes;
use crate::testing::dra::fixture_slices;
use crate::testing::inventory::fixture_inventory;

fn devices(file: &str, node: &str) -> Vec<PublishedDevice> {
    let fleet = published_devices(&fixture_slices(&[file]));
    assert!(fleet.notes.is_empty(), "{:?}", fleet.notes);
    fleet.node(node).to_vec()
}

fn by_name<'a>(devices: &'a [PublishedDevice], name: &str) -> &'a PublishedDevice {
    devices
        .iter()
        .find(|d| d.reference.device == name)
        .unwrap_or_else(|| panic!("{name} not published"))
}

/// Planner device ids of a merged node, sorted.
fn planned(merged: &MergedNode) -> Vec<&str> {
    let mut ids: Vec<&str> = merged.node.devices.iter().map(|d| d.id.as_str()).collect();
    ids.sort_unstable();
    ids
}

#[test]
fn amd_2026_whole_gpus_alone_carry_the_shared_pci_address() {
    let devices = devices("amd-mi300x-2026.yaml", "mi300x-2026");
    assert_eq!(devices.len(), 6, "one device per published entry");
    let whole = by_name(&devices, "gpu-1-128");
    assert_eq!(whole.pci_bus_id.as_deref(), Some("0000:05:00.0"));
    assert_eq!(whole.memory_bytes, Some(196_592 << 20));
    assert_eq!(whole.product.as_deref(), Some("AMD_Instinct_MI300X"));
    assert_eq!(whole.unusable, None);
    // The VFIO sibling and the partitions carry their parent's address, only as a parent.
    for name in ["gpu-vfio-0", "gpu-3-130", "gpu-9-136"] {
        let part = by_name(&devices, name);
        assert_eq!(part.pci_bus_id, None, "{name}");
        assert!(part.parent_bus_id.is_some(), "{name}");
        assert!(
            part.unusable.as_deref().unwrap_or("").contains("partition"),
            "{name}: {:?}",
            part.unusable
        );
    }
    assert_eq!(
        by_name(&devices, "gpu-vfio-0").parent_bus_id.as_deref(),
        Some("0000:05:00.0")
    );
    // `memory: 0` is the driver's "unreadable", never a size.
    let unread = by_name(&devices, "gpu-2-129");
    assert_eq!(unread.memory_bytes, None);
    assert!(
        unread
            .memory_unknown
            .as_deref()
            .unwrap()
            .contains("unknown")
    );
}

/// On a node without our agent, the whole GPUs of known memory are planned, and the GPU
/// published only as its two DPX partitions stands as one device (named after its bus id,
/// its memory their sum) that is planned only through them.
#[test]
fn amd_2026_on_a_dra_only_node_plans_whole_gpus_of_known_memory_and_partitions() {
    let devices = devices("amd-mi300x-2026.yaml", "mi300x-2026");
    let merged = merge_node("mi300x-2026", None, &devices);
    assert_eq!(
        planned(&merged),
        [
            "gpu-amd-com-0000-46-00-0",
            "gpu-amd-com-gpu-1-128",
            "gpu-amd-com-gpu-4-131"
        ]
    );
    assert_eq!(merged.present.len(), 7);
    let split = merged
        .node
        .devices
        .iter()
        .find(|d| d.partitions_only)
        .expect("the partitioned GPU");
    assert_eq!(split.partitions.len(), 2);
    assert_eq!(split.product, "AMD Instinct MI300X");
    assert!(
        merged.unusable["gpu-amd-com-gpu-2-129"].contains("memory size unknown"),
        "{:?}",
        merged.unusable
    );
    assert!(
        merged
            .node
            .devices
            .iter()
            .all(|d| d.memory == Bytes(196_592 << 20))
    );
}

#[test]
fn amd_2026_merged_with_an_inventory_folds_nothing_and_plans_a_split_gpu_by_its_partitions() {
    let inventory = fixture_inventory("mi300x-8x", "mi300x-2026");
    let names: Vec<String> = inventory
        .spec
        .devices
        .iter()
        .map(|d| d.name.clone())
        .collect();
    let devices = devices("amd-mi300x-2026.yaml", "mi300x-2026");
    let merged = merge_node("mi300x-2026", Some(&inventory), &devices);
    // Eight inventory GPUs plus the three published entries no whole GPU stands for.
    assert_eq!(
        merged.present.len(),
        names.len() + 3,
        "{:?}",
        merged.present
    );
    let split = names
        .iter()
        .find(|n| n.contains("46-00-0"))
        .expect("the GPU at 0000:46:00.0");
    // Published only as its two DPX partitions: planned only through them (issue 39).
    assert!(
        !merged.unusable.contains_key(split),
        "{:?}",
        merged.unusable
    );
    let spec = merged
        .node
        .devices
        .iter()
        .find(|d| &d.id == split)
        .expect("the partitioned GPU stays");
    assert!(spec.partitions_only, "{spec:?}");
    let profiles: Vec<(&str, Bytes)> = spec
        .partitions
        .iter()
        .map(|p| (p.profile.as_str(), p.memory))
        .collect();
    assert_eq!(
        profiles,
        [
            ("dpx_nps2", Bytes(98_296 << 20)),
            ("dpx_nps2", Bytes(98_296 << 20))
        ]
    );
    // The GPU whose VRAM the driver could not read keeps the size the agent measured.
    let unread = names.iter().find(|n| n.contains("26-00-0")).unwrap();
    assert!(planned(&merged).contains(&unread.as_str()));
    assert_eq!(planned(&merged).len(), names.len());
    // The VFIO sibling is a device of its own, not folded into gpu-1-128's match.
    assert_eq!(
        merged
            .dra
            .values()
            .filter(|r| r.device == "gpu-vfio-0")
            .count(),
        1
    );
}

#[test]
fn two_whole_entries_with_one_pci_address_stay_two_devices_and_one_is_planned() {
    let inventory = fixture_inventory("mi300x-8x", "n");
    let mut devices = devices("amd-mi300x-2026.yaml", "mi300x-2026");
    devices.retain(|d| d.reference.device == "gpu-1-128");
    let mut twin = devices[0].clone();
    twin.reference.device = "gpu-1-spx-nps1".into();
    devices.push(twin);
    let merged = merge_node("n", Some(&inventory), &devices);
    assert_eq!(merged.present.len(), inventory.spec.devices.len() + 1);
    assert_eq!(planned(&merged).len(), inventory.spec.devices.len());
    assert!(
        merged
            .unusable
            .values()
            .any(|why| why.contains("already stands for")),
        "{:?}",
        merged.unusable
    );
}

#[test]
fn neuron_devices_are_trainium2_from_the_instance_type_in_one_neuronlink_group() {
    let node = "ip-10-0-1-23.us-west-2.compute.internal";
    let devices = devices("aws-trn2-16x.yaml", node);
    assert_eq!(devices.len(), 16);
    for device in &devices {
        assert_eq!(device.product.as_deref(), Some("AWS Trainium2"));
        assert_eq!(device.memory_bytes, None, "the driver publishes no memory");
        assert_eq!(device.domain.as_deref(), Some("neuronlink:0"));
        assert_eq!(device.reference.pool, node);
        assert_eq!(device.unusable, None);
    }
    let merged = merge_node(node, None, &devices);
    assert_eq!(merged.node.devices.len(), 16);
    let first = &merged.node.devices[0];
    assert_eq!(first.product, "AWS Trainium2");
    assert_eq!(first.memory, Bytes(96 << 30), "from the product table");
    assert_eq!(first.domain.as_deref(), Some("neuronlink:0"));
}

#[test]
fn intel_gpu_health_goes_through_the_one_rule() {
    let devices = devices("intel-max1550-4x.yaml", "max1550-4x");
    let healthy = by_name(&devices, "0000-29-00-0-0x0bd5");
    assert_eq!(healthy.health, HealthStatus::Healthy);
    assert_eq!(healthy.unusable, None);
    let sick = by_name(&devices, "0000-3a-00-0-0x0bd5");
    assert_eq!(sick.health, HealthStatus::Unhealthy);
    assert!(sick.unusable.is_some());
    let unknown = by_name(&devices, "0000-9a-00-0-0x0bd5");
    assert_eq!(unknown.health, HealthStatus::Unknown);
    assert_eq!(unknown.unusable, None, "unknown health is plannable");
    assert!(unknown.memory_unknown.is_some(), "0Mi is no size");
    let vf = by_name(&devices, "0000-29-00-1-0x0bd5");
    assert!(vf.unusable.as_deref().unwrap().contains("type=vf"));

    let merged = merge_node("max1550-4x", None, &devices);
    assert_eq!(planned(&merged), ["gpu-intel-com-0000-29-00-0-0x0bd5"]);
    assert_eq!(merged.present.len(), 4);
}

/// A slice of `driver` on node `n` with the given devices.
fn slice(driver: &str, devices: Value) -> k8s_openapi::api::resource::v1::ResourceSlice {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": format!("n-{driver}")},
        "spec": {
            "driver": driver,
            "nodeName": "n",
            "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        }
    }))
    .expect("test slice")
}

fn whole_amd(name: &str, product: &str, memory: &str) -> Value {
    json!({
        "name": name,
        "attributes": {
            "type": {"string": "amdgpu"},
            "productName": {"string": product},
        },
        "capacity": {"memory": {"value": memory}},
    })
}

#[test]
fn sentinel_and_garbage_values_never_become_a_planned_device() {
    // Each entry is a whole AMD GPU whose product or memory is a value no driver means as
    // a fact: none may be planned, and none may leave a size or name behind.
    let bad = [
        whole_amd("zero", "AMD_Instinct_MI300X", "0"),
        whole_amd("zero-mi", "AMD_Instinct_MI300X", "0Mi"),
        whole_amd("negative", "AMD_Instinct_MI300X", "-192Gi"),
        whole_amd("fraction", "AMD_Instinct_MI300X", "500m"),
        whole_amd("huge", "AMD_Instinct_MI300X", "17Ti"),
        whole_amd("overflow", "AMD_Instinct_MI300X", "99999999999Ei"),
        whole_amd("unknown-name", "Unknown", "196592Mi"),
        whole_amd("na-name", "N/A", "196592Mi"),
        whole_amd("dash-name", " --- ", "196592Mi"),
        whole_amd("empty-name", "", "196592Mi"),
        json!({"name": "no-name", "attributes": {"type": {"string": "amdgpu"}},
               "capacity": {"memory": {"value": "196592Mi"}}}),
    ];
    let mut slices = vec![slice("gpu.amd.com", Value::Array(bad.to_vec()))];
    // Neuron entries whose instance type names no accelerator, and the whole-node entry.
    let neuron = |name: &str, instance: Value, extra: Value| {
        let mut attributes = json!({"instanceType": instance});
        if let (Some(a), Some(e)) = (attributes.as_object_mut(), extra.as_object()) {
            a.extend(e.clone());
        }
        json!({"name": name, "attributes": attributes})
    };
    slices.push(slice(
        "neuron.aws.com",
        json!([
            neuron("garbage", json!({"string": "garbage"}), json!({})),
            neuron("bare-family", json!({"string": "trn2"}), json!({})),
            neuron("future", json!({"string": "trn9.48xlarge"}), json!({})),
            neuron("int-typed", json!({"int": 2}), json!({})),
            neuron(
                "whole-node",
                json!({"string": "trn2u.48xlarge"}),
                json!({"resourceType": {"string": "neuron_node"}})
            ),
        ]),
    ));
    let fleet = published_devices(&slices);
    let published = fleet.node("n");
    assert_eq!(published.len(), bad.len() + 5);
    for device in published {
        assert!(
            device.memory_bytes.is_none_or(|b| b > 0 && b < (17 << 40)),
            "{}: {:?}",
            device.reference,
            device.memory_bytes
        );
        let product = device.product.as_deref().unwrap_or("");
        assert!(
            !["Unknown", "N/A", "---", ""].contains(&product.trim()) || device.product.is_none(),
            "{}: {product:?}",
            device.reference
        );
    }
    let merged = merge_node("n", None, published);
    assert!(
        merged.node.devices.is_empty(),
        "planned on sentinel values: {:?}",
        merged.node.devices
    );
    assert_eq!(merged.present.len(), published.len());
    let reasons: BTreeSet<&str> = merged.unusable.values().map(String::as_str).collect();
    assert!(
        reasons.iter().any(|r| r.contains("no product name")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("memory size unknown")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("several devices")),
        "{reasons:?}"
    );
}

#[test]
fn instance_types_name_the_accelerator_aws_documents() {
    use super::drivers::aws_accelerator;
    assert_eq!(aws_accelerator("trn2.48xlarge"), Some("AWS Trainium2"));
    assert_eq!(aws_accelerator("trn2u.48xlarge"), Some("AWS Trainium2"));
    assert_eq!(aws_accelerator("trn1n.32xlarge"), Some("AWS Trainium"));
    assert_eq!(aws_accelerator("inf2.xlarge"), Some("AWS Inferentia2"));
    for garbage in ["", "trn2", "trn2.", "p5.48xlarge", "TRN2", ".48xlarge"] {
        assert_eq!(aws_accelerator(garbage), None, "{garbage:?}");
    }
}
