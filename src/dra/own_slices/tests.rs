//! Tests for the agent's own slice: opt-in families, the never-double-expose rule, limits.
//! Devices mirror what the detectors report on the fixture hosts `cloud-ai100` (Qualcomm
//! Cloud AI 100, PCI vendor 0x17cb) and `ryzen-ai-laptop` (XDNA2 NPU at 0000:c5:00.1).

use serde_json::json;

use super::*;

fn device(
    name: &str,
    vendor: &str,
    family: &str,
    backend: &str,
    pci: Option<&str>,
) -> InventoryDevice {
    let mut attributes = json!({
        "vendor": {"string": vendor},
        "family": {"string": family},
        "backend": {"string": backend},
        "model": {"string": "test model"},
        "numaNode": {"int": 0},
        "eccEnabled": {"bool": true},
        "firmwareVersion": {"version": "1.0.0"},
    });
    if let Some(pci) = pci {
        attributes["id"] = json!({"string": pci});
        attributes["resource.kubernetes.io/pciBusID"] = json!({"string": pci});
    }
    serde_json::from_value(json!({
        "name": name,
        "attributes": attributes,
        "capacity": {"memory": "32Gi"},
    }))
    .expect("test device")
}

fn qaic(bus: &str) -> InventoryDevice {
    let slug = bus.replace([':', '.'], "-");
    device(
        &format!("asic-{slug}"),
        "qualcomm",
        "asic",
        "qualcomm",
        Some(bus),
    )
}

fn npu() -> InventoryDevice {
    device(
        "npu-0000-c5-00-1",
        "amd",
        "npu",
        "xdna",
        Some("0000:c5:00.1"),
    )
}

fn families(names: &[&str]) -> BTreeSet<OwnFamily> {
    names.iter().map(|n| n.parse().expect("family")).collect()
}

fn names(slice: &ResourceSlice) -> Vec<String> {
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .map(|d| d.name.clone())
        .collect()
}

fn other_slice(driver: &str, node: &str, pci: &str) -> ResourceSlice {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-{driver}")},
        "spec": {
            "driver": driver, "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "dev-0", "attributes": {
                "resource.kubernetes.io/pciBusID": {"string": pci}}}]
        }
    }))
    .expect("test slice")
}

#[test]
fn publishes_opted_in_devices_as_they_are() {
    let devices = vec![qaic("0000:01:00.0"), qaic("0000:02:00.0"), npu()];
    let slice = own_slice(
        "node-a",
        &devices,
        &families(&["qualcomm-ai100"]),
        &Exposed::default(),
        3,
    )
    .expect("a slice");
    assert_eq!(slice.metadata.name.as_deref(), Some("node-a-hwaccel.io"));
    assert_eq!(slice.spec.driver, OWN_DRIVER);
    assert_eq!(slice.spec.node_name.as_deref(), Some("node-a"));
    assert_eq!(slice.spec.pool.name, "node-a");
    assert_eq!(slice.spec.pool.generation, 3);
    assert_eq!(slice.spec.pool.resource_slice_count, 1);
    // The NPU is not opted in.
    assert_eq!(names(&slice), ["asic-0000-01-00-0", "asic-0000-02-00-0"]);
    let first = &slice.spec.devices.as_ref().expect("devices")[0];
    let attrs = first.attributes.as_ref().expect("attributes");
    assert_eq!(attrs["vendor"].string.as_deref(), Some("qualcomm"));
    // An inventory from an agent before the standard name: published under it all the same.
    assert_eq!(attrs["resource.kubernetes.io/numaNode"].int, Some(0));
    assert!(!attrs.contains_key("numaNode"), "{attrs:?}");
    assert_eq!(attrs["eccEnabled"].bool, Some(true));
    assert_eq!(attrs["firmwareVersion"].version.as_deref(), Some("1.0.0"));
    let capacity = first.capacity.as_ref().expect("capacity");
    assert_eq!(capacity["memory"].value.0, "32Gi");
}

#[test]
fn nothing_when_not_opted_in_or_no_device() {
    let devices = vec![qaic("0000:01:00.0"), npu()];
    assert!(own_slice("n", &devices, &BTreeSet::new(), &Exposed::default(), 1).is_none());
    assert!(own_slice("n", &[], &families(&["xdna"]), &Exposed::default(), 1).is_none());
    let slice =
        own_slice("n", &devices, &families(&["xdna"]), &Exposed::default(), 1).expect("the NPU");
    assert_eq!(names(&slice), ["npu-0000-c5-00-1"]);
}

#[test]
fn never_a_device_another_driver_publishes() {
    let devices = vec![qaic("0000:01:00.0"), qaic("0000:02:00.0")];
    // An unknown driver publishing the standard PCI attribute, upper-case and all.
    let slices = vec![
        other_slice("qaic.example.com", "node-a", "0000:01:00.0"),
        // Another node's slice must not hide this node's device.
        other_slice("qaic.example.com", "node-b", "0000:02:00.0"),
    ];
    let exposed = Exposed::on_node("node-a", &slices, &BTreeMap::new());
    let result = own_slice_with_notes(
        "node-a",
        &devices,
        &families(&["qualcomm-ai100"]),
        &exposed,
        1,
    );
    assert_eq!(
        names(result.slice.as_ref().expect("one left")),
        ["asic-0000-02-00-0"]
    );
    assert_eq!(result.skipped.len(), 1);
    assert!(
        result.skipped[0].contains("0000:01:00.0"),
        "{:?}",
        result.skipped
    );
}

#[test]
fn our_own_slice_does_not_hide_our_devices() {
    let slices = vec![other_slice(OWN_DRIVER, "node-a", "0000:01:00.0")];
    let exposed = Exposed::on_node("node-a", &slices, &BTreeMap::new());
    assert!(exposed.pci_bus_ids.is_empty());
}

#[test]
fn never_a_device_a_device_plugin_exposes() {
    let devices = vec![qaic("0000:01:00.0"), npu()];
    let allocatable = BTreeMap::from([
        ("qualcomm.com/qaic".to_string(), Quantity("2".to_string())),
        ("amd.com/npu".to_string(), Quantity("0".to_string())),
        ("cpu".to_string(), Quantity("64".to_string())),
    ]);
    let exposed = Exposed::on_node("node-a", &[], &allocatable);
    let result = own_slice_with_notes(
        "node-a",
        &devices,
        &families(&["qualcomm-ai100", "xdna"]),
        &exposed,
        1,
    );
    // A registered plugin with zero devices exposes none: the NPU stays ours.
    assert_eq!(
        names(result.slice.as_ref().expect("npu")),
        ["npu-0000-c5-00-1"]
    );
    assert!(
        result.skipped[0].contains("qualcomm.com/qaic"),
        "{:?}",
        result.skipped
    );
}

#[test]
fn vulkan_gpu_without_ids_is_left_to_a_driver_of_its_kind() {
    let gpu = device("gpu-vulkan-0", "nvidia", "gpu", "vulkan", None);
    let nvidia: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "node-a-gpu.nvidia.com"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"},
                "uuid": {"string": "GPU-1"}, "productName": {"string": "NVIDIA L4"}}}]}
    }))
    .expect("slice");
    let vulkan = families(&["vulkan"]);
    assert!(
        own_slice(
            "node-a",
            std::slice::from_ref(&gpu),
            &vulkan,
            &Exposed::default(),
            1
        )
        .is_some()
    );
    let exposed = Exposed::on_node("node-a", &[nvidia], &BTreeMap::new());
    assert!(own_slice("node-a", &[gpu], &vulkan, &exposed, 1).is_none());
}

#[test]
fn at_most_128_devices() {
    let devices: Vec<InventoryDevice> = (0..200)
        .map(|i| qaic(&format!("0000:{:02x}:00.0", i)))
        .collect();
    let result = own_slice_with_notes(
        "n",
        &devices,
        &families(&["qualcomm-ai100"]),
        &Exposed::default(),
        1,
    );
    assert_eq!(
        result.slice.as_ref().map(names).map(|n| n.len()),
        Some(MAX_DEVICES_PER_SLICE)
    );
    assert_eq!(result.skipped.len(), 200 - MAX_DEVICES_PER_SLICE);
}

#[test]
fn long_node_names_are_shortened() {
    let node = "a".repeat(253);
    let name = own_slice_name(&node);
    assert!(name.len() <= 253);
    assert_ne!(name, own_slice_name(&"a".repeat(252)));
    assert_eq!(own_slice_name("n1"), "n1-hwaccel.io");
}

#[test]
fn family_names_round_trip_and_reject_unknown() {
    for family in OwnFamily::ALL {
        assert_eq!(family.as_str().parse::<OwnFamily>(), Ok(family));
    }
    assert!("gaudi".parse::<OwnFamily>().is_err());
}

#[test]
fn same_content_ignores_generation_only() {
    let devices = vec![qaic("0000:01:00.0")];
    let f = families(&["qualcomm-ai100"]);
    let a = own_slice("n", &devices, &f, &Exposed::default(), 1).expect("slice");
    let b = own_slice("n", &devices, &f, &Exposed::default(), 2).expect("slice");
    assert!(same_content(&a, &b));
    let c = own_slice("n", &[qaic("0000:02:00.0")], &f, &Exposed::default(), 1).expect("slice");
    assert!(!same_content(&a, &c));
}
