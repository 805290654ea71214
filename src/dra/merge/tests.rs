//! Tests for merging an inventory with published devices: one device each, by bus id or
//! UUID; slice-only devices planned on; unusable ones left out.

use super::*;
use crate::hardware::{Family, Vendor};
use crate::testing::inventory::fixture_inventory;

/// Bus ids and UUIDs of the h100-8x-nvswitch fixture host (its `nvidia-smi` output).
const BUSES: [&str; 8] = [
    "0000:1b:00.0",
    "0000:43:00.0",
    "0000:52:00.0",
    "0000:61:00.0",
    "0000:9d:00.0",
    "0000:c3:00.0",
    "0000:d1:00.0",
    "0000:df:00.0",
];
const UUIDS: [&str; 8] = [
    "GPU-6513270e-269e-0d37-f2a7-4de452e6b438",
    "GPU-d23f0824-128b-2f33-0c5c-7fd0a6a3a450",
    "GPU-9531985d-5d9d-c9f8-1818-e811892f902b",
    "GPU-36f675cc-81e7-4ef5-e8e2-5d940ed90475",
    "GPU-6b0d549b-6f03-675a-1600-a35a099950d8",
    "GPU-8d116ece-1738-f7d9-3d9c-172411e20b8f",
    "GPU-90c192cf-d3ac-94af-0f21-ddb66cad4a26",
    "GPU-a170b338-3926-3059-f28c-105d1fb17c23",
];

/// What dra-driver-nvidia-gpu publishes for GPU `minor` of the h100-8x-nvswitch fixture.
fn h100(node: &str, minor: usize) -> PublishedDevice {
    PublishedDevice {
        node: node.to_string(),
        reference: DeviceRef {
            driver: "gpu.nvidia.com".into(),
            pool: node.into(),
            device: format!("gpu-{minor}"),
        },
        pci_bus_id: Some(BUSES[minor].to_string()),
        uuid: Some(UUIDS[minor].to_string()),
        product: Some("NVIDIA H100 80GB HBM3".into()),
        memory_bytes: Some(81559 << 20),
        numa_node: None,
        memory_unknown: None,
        parent_bus_id: None,
        health: crate::hardware::HealthStatus::Unknown,
        domain: None,
        whole: true,
        vendor: Vendor::Nvidia,
        family: Family::Gpu,
        unusable: None,
        share: None,
        partition: None,
        notice: None,
    }
}

#[test]
fn a_device_seen_by_both_is_one_device_with_its_dra_name() {
    let inventory = fixture_inventory("h100-8x-nvswitch", "a");
    let published: Vec<PublishedDevice> = (0..8).map(|i| h100("a", i)).collect();
    let merged = merge_node("a", Some(&inventory), &published);
    assert_eq!(merged.node.devices.len(), 8, "eight GPUs, not sixteen");
    assert_eq!(
        merged
            .dra
            .get("gpu-0000-1b-00-0")
            .map(ToString::to_string)
            .as_deref(),
        Some("gpu.nvidia.com/a/gpu-0")
    );
    assert_eq!(merged.dra.len(), 8);
    // The inventory's topology survives the merge.
    assert!(merged.node.devices.iter().all(|d| d.domain.is_some()));
    assert!(merged.notes.is_empty(), "{:?}", merged.notes);
}

/// A GPU its driver publishes shareable keeps the inventory's name and gains the policy,
/// nothing consumed yet; the others stay whole devices.
#[test]
fn a_shareable_published_gpu_carries_its_policy_onto_the_inventorys_device() {
    let inventory = fixture_inventory("h100-8x-nvswitch", "a");
    let mut published: Vec<PublishedDevice> = (0..8).map(|i| h100("a", i)).collect();
    let policy = crate::plan::share::SharePolicy::checked(
        80 << 30,
        None,
        crate::plan::share::ShareRule::Any,
    )
    .unwrap();
    published[0].share = Some(policy.clone());
    let merged = merge_node("a", Some(&inventory), &published);
    let shared: Vec<_> = merged
        .node
        .devices
        .iter()
        .filter_map(|d| d.share.as_ref().map(|s| (d.id.as_str(), s)))
        .collect();
    assert_eq!(shared.len(), 1, "{shared:?}");
    assert_eq!(shared[0].0, "gpu-0000-1b-00-0");
    assert_eq!((&shared[0].1.policy, shared[0].1.consumed), (&policy, 0));
}

#[test]
fn without_a_bus_id_the_uuid_matches_case_insensitively() {
    let inventory = fixture_inventory("h100-8x-nvswitch", "a");
    let mut device = h100("a", 3);
    device.pci_bus_id = None;
    device.uuid = device.uuid.map(|u| u.to_ascii_lowercase());
    let merged = merge_node("a", Some(&inventory), &[device]);
    assert_eq!(merged.node.devices.len(), 8);
    assert_eq!(
        merged
            .dra
            .get("gpu-0000-61-00-0")
            .map(|r| r.device.as_str()),
        Some("gpu-3")
    );
}

#[test]
fn a_tainted_match_leaves_the_planner_node_with_a_reason() {
    let inventory = fixture_inventory("h100-8x-nvswitch", "a");
    let mut device = h100("a", 1);
    device.unusable = Some("tainted gpu.nvidia.com/xid=79:NoExecute".into());
    let merged = merge_node("a", Some(&inventory), &[device]);
    assert_eq!(merged.node.devices.len(), 7);
    assert!(
        !merged
            .node
            .devices
            .iter()
            .any(|d| d.id == "gpu-0000-43-00-0")
    );
    assert!(merged.unusable["gpu-0000-43-00-0"].contains("xid"));
    assert!(merged.present.contains("gpu-0000-43-00-0"));
    assert_eq!(merged.notes.len(), 1);
}

#[test]
fn a_slice_only_node_is_planned_from_the_product_table() {
    let published: Vec<PublishedDevice> = (0..2).map(|i| h100("b", i)).collect();
    let merged = merge_node("b", None, &published);
    let ids: Vec<&str> = merged.node.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["gpu-nvidia-com-gpu-0", "gpu-nvidia-com-gpu-1"]);
    assert_eq!(merged.node.devices[0].memory, Bytes(81559 << 20));
    assert!(
        merged.node.devices[0].bandwidth_tbps.is_some(),
        "from the product table"
    );
    assert_eq!(
        merged.products["gpu-nvidia-com-gpu-0"],
        "nvidia-h100-80gb-hbm3"
    );
    assert_eq!(merged.dra["gpu-nvidia-com-gpu-1"].device, "gpu-1");
}

#[test]
fn unknown_products_need_memory_and_partitions_never_become_devices() {
    let mut unknown = h100("c", 0);
    unknown.product = Some("Imaginary Accelerator 9000".into());
    let mut no_memory = h100("c", 1);
    no_memory.product = Some("Imaginary Accelerator 9000".into());
    no_memory.memory_bytes = None;
    let mut mig = h100("c", 2);
    mig.reference.device = "gpu-2-mig-1g10gb-19-0".into();
    mig.unusable = Some("a partition (type=mig), not a whole device".into());
    let merged = merge_node("c", None, &[unknown, no_memory, mig]);
    assert_eq!(merged.node.devices.len(), 1);
    let kept = &merged.node.devices[0];
    assert_eq!(kept.product, "Imaginary Accelerator 9000");
    assert_eq!(kept.bandwidth_tbps, None);
    assert!(!kept.precisions.is_empty());
    assert_eq!(merged.notes.len(), 2, "{:?}", merged.notes);
    assert_eq!(merged.present.len(), 3);
}

#[test]
fn derived_ids_are_unique_dns_labels() {
    let mut a = h100("d", 0);
    a.reference.device = "x".repeat(63);
    let mut b = a.clone();
    b.reference.pool = "other".into();
    b.pci_bus_id = Some(BUSES[1].into());
    let merged = merge_node("d", None, &[a, b]);
    let ids: Vec<&String> = merged.node.devices.iter().map(|d| &d.id).collect();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
    assert!(
        ids.iter()
            .all(|id| id.len() <= 63 && crate::names::is_valid_label_value(id))
    );
}

#[test]
fn the_numa_node_comes_from_the_inventory_else_from_the_driver() {
    let mut inventory = fixture_inventory("h100-8x-nvswitch", "e");
    // Detection's node wins over what a driver says; an inventory written before the
    // standard name (`numaNode` only) is still read; a device detection placed nowhere takes
    // the driver's.
    fn entry<'a>(inventory: &'a mut AcceleratorInventory, name: &str) -> &'a mut InventoryDevice {
        inventory
            .spec
            .devices
            .iter_mut()
            .find(|d| d.name == name)
            .expect("fixture device")
    }
    let legacy = entry(&mut inventory, "gpu-0000-43-00-0");
    let node = legacy
        .attributes
        .remove(attribute::NUMA_NODE)
        .expect("detection's node");
    legacy
        .attributes
        .insert(attribute::LEGACY_NUMA_NODE.into(), node);
    entry(&mut inventory, "gpu-0000-52-00-0")
        .attributes
        .remove(attribute::NUMA_NODE);
    let mut published: Vec<PublishedDevice> = (0..3).map(|i| h100("e", i)).collect();
    for device in &mut published {
        device.numa_node = Some(7);
    }
    let mut extra = h100("e", 0);
    extra.reference.device = "gpu-9".into();
    extra.pci_bus_id = Some("0000:ee:00.0".into());
    extra.uuid = None;
    extra.numa_node = Some(1);
    published.push(extra);
    let merged = merge_node("e", Some(&inventory), &published);
    assert_eq!(merged.numa["gpu-0000-1b-00-0"], 0, "detection's node");
    assert_eq!(merged.numa["gpu-0000-43-00-0"], 0, "the old attribute name");
    assert_eq!(
        merged.numa["gpu-0000-52-00-0"], 7,
        "the driver's, detection had none"
    );
    assert_eq!(
        merged.numa["gpu-nvidia-com-gpu-9"], 1,
        "a slice-only device"
    );
}
