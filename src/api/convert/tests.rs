//! Conversion tests: concrete inventories for the hand-built reports, byte-for-byte
//! determinism, DRA limits, stable device names, and the round trip back to a report.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use proptest::prelude::*;

use super::*;
use crate::api::inventory::MAX_ATTRIBUTES_AND_CAPACITIES;
use crate::api::owner_reference_for_node;
use crate::testing::arbitrary::arb_report;
use crate::testing::golden::assert_golden;
use crate::testing::report::{
    cpu_only, h100_x8, mixed_l4_a100, overlong_product, report_with, scenarios, with_node_facts,
};

fn attr<'a>(device: &'a InventoryDevice, name: &str) -> &'a DeviceAttribute {
    device
        .attributes
        .get(name)
        .unwrap_or_else(|| panic!("{} has no {name}", device.name))
}

fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

#[test]
fn h100_node_inventory() {
    let inventory = AcceleratorInventory::from_report("gpu-node-1", &with_node_facts(h100_x8()));
    assert_eq!(inventory.metadata.name.as_deref(), Some("gpu-node-1"));
    let spec = &inventory.spec;
    assert_eq!(spec.node_name, "gpu-node-1");
    assert_eq!(spec.summary.accelerators, 8);
    assert_eq!(
        spec.summary.product.as_deref(),
        Some("NVIDIA H100 80GB HBM3")
    );
    assert_eq!(
        spec.summary.memory.as_ref().map(|q| q.0.as_str()),
        Some("652472Mi")
    );
    assert_eq!(spec.devices.len(), 8);

    let first = &spec.devices[0];
    assert_eq!(first.name, "gpu-0000-18-00-0");
    let expect_string = [
        (attribute::ID, "0000:18:00.0"),
        (attribute::PCI_BUS_ID, "0000:18:00.0"),
        (attribute::VENDOR, "nvidia"),
        (attribute::FAMILY, "gpu"),
        (attribute::MODEL, "NVIDIA H100 80GB HBM3"),
        (attribute::PRODUCT, "nvidia-h100-80gb-hbm3"),
        (attribute::ARCHITECTURE, "hopper"),
        (attribute::COMPUTE_CAPABILITY, "9.0"),
        (attribute::DRIVER_VERSION, "550.54.15"),
        (attribute::PRECISIONS, "fp32,tf32,bf16,fp16,fp8,int8,int4"),
        (attribute::INTERCONNECT, "nvswitch"),
        (attribute::INTERCONNECT_GROUP, "nvlink-domain-0"),
        (attribute::HEALTH, "healthy"),
    ];
    for (name, value) in expect_string {
        assert_eq!(
            attr(first, name),
            &DeviceAttribute::String(value.into()),
            "{name}"
        );
    }
    assert_eq!(attr(first, attribute::NUMA_NODE), &DeviceAttribute::Int(0));
    assert_eq!(
        attr(first, attribute::PCIE_GENERATION),
        &DeviceAttribute::Int(5)
    );
    assert_eq!(attr(first, attribute::INDEX), &DeviceAttribute::Int(0));
    assert_eq!(
        attr(&spec.devices[7], attribute::NUMA_NODE),
        &DeviceAttribute::Int(1)
    );
    assert_eq!(first.capacity[attribute::MEMORY].0, "81559Mi");
    assert_eq!(first.capacity[attribute::COMPUTE_UNITS].0, "132");
    assert!(first.full_values.is_empty());

    assert_eq!(
        spec.node.cpu.memory.as_ref().map(|q| q.0.as_str()),
        Some("2Ti")
    );
    assert_eq!(spec.node.numa.len(), 2);
    assert_eq!(spec.node.nics.len(), 1);
    assert_eq!(spec.warnings.len(), 1);
    assert_eq!(spec.interconnects[0].devices.len(), 8);
}

#[test]
fn memory_layout_reads_like_people_say_it() {
    // 81559 MiB is 79.6 GiB: sold, and shown, as 80Gi.
    let h100 = AcceleratorInventorySpec::from_report("n", &h100_x8());
    assert_eq!(h100.summary.memory_layout.as_deref(), Some("8×80Gi"));
    assert_eq!(h100.summary.healthy, Some(8));

    // Largest first on a mixed node.
    let mixed = AcceleratorInventorySpec::from_report("n", &mixed_l4_a100());
    let layout = mixed.summary.memory_layout.clone().unwrap_or_default();
    let sizes: Vec<&str> = layout.split('+').collect();
    assert_eq!(sizes.len(), 2, "{layout}");
    let gib = |part: &str| -> u64 {
        part.split('×')
            .nth(1)
            .and_then(|s| s.strip_suffix("Gi"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    assert!(gib(sizes[0]) > gib(sizes[1]), "{layout}");

    // Unknown memory is `?`, last; a sick device is not counted healthy.
    let mut report = h100_x8();
    report.devices.truncate(3);
    report.devices[0].memory_bytes = None;
    report.devices[1].memory_bytes = Some(48 * crate::hardware::GIB + 100);
    report.devices[2].health.status = HealthStatus::Unhealthy;
    let spec = AcceleratorInventorySpec::from_report("n", &report);
    assert_eq!(
        spec.summary.memory_layout.as_deref(),
        Some("1×80Gi+1×48Gi+1×?")
    );
    assert_eq!(spec.summary.healthy, Some(2));

    // A tiny device reads in MiB rather than `0Gi`.
    let mut report = h100_x8();
    report.devices.truncate(1);
    report.devices[0].memory_bytes = Some(256 << 20);
    let spec = AcceleratorInventorySpec::from_report("n", &report);
    assert_eq!(spec.summary.memory_layout.as_deref(), Some("1×256Mi"));
}

#[test]
fn memory_layout_stays_within_its_bound() {
    let mut report = h100_x8();
    let template = report.devices[0].clone();
    report.devices = (0..200u64)
        .map(|i| {
            let mut device = template.clone();
            device.id = format!("0000:{:02x}:{:02x}.0", i / 32, i % 32);
            device.memory_bytes = Some((i + 1) * crate::hardware::GIB);
            device
        })
        .collect();
    let spec = AcceleratorInventorySpec::from_report("n", &report);
    let layout = spec.summary.memory_layout.unwrap_or_default();
    assert!(layout.len() <= MAX_MEMORY_LAYOUT_LENGTH, "{layout}");
    assert!(layout.starts_with("1×200Gi+1×199Gi"), "{layout}");
    assert!(layout.ends_with("+…"), "{layout}");
}

#[test]
fn summaries_of_mixed_and_cpu_only_nodes() {
    let mixed = AcceleratorInventorySpec::from_report("n", &mixed_l4_a100());
    assert_eq!(mixed.summary.accelerators, 3);
    assert_eq!(
        mixed.summary.product.as_deref(),
        Some("NVIDIA A100-SXM4-40GB+NVIDIA L4")
    );
    assert_eq!(
        mixed.summary.memory.as_ref().map(|q| q.0.as_str()),
        Some("87028Mi")
    );

    let mut three = mixed_l4_a100();
    let mut t4 = three.devices[0].clone();
    t4.id = "0000:d8:00.0".into();
    t4.model = "Tesla T4".into();
    three.devices.push(t4);
    let three = AcceleratorInventorySpec::from_report("n", &three);
    assert_eq!(three.summary.product.as_deref(), Some("mixed"));

    let cpu = AcceleratorInventorySpec::from_report("n", &cpu_only());
    assert_eq!(cpu.summary.accelerators, 0);
    assert_eq!(cpu.summary.product, None);
    assert_eq!(cpu.summary.memory, None);
    assert_eq!(cpu.summary.memory_layout, None);
    assert_eq!(cpu.summary.healthy, Some(0));
    assert_eq!(cpu.devices.len(), 1, "the CPU is listed but not counted");
    assert_eq!(cpu.devices[0].name, "cpu-cpu-0");
    assert_eq!(cpu.node.cpu.ai_flags.len(), 4);
}

#[test]
fn overlong_model_is_shortened_and_kept_whole() {
    let report = overlong_product();
    let spec = AcceleratorInventorySpec::from_report("n", &report);
    let device = &spec.devices[0];
    let model = attr(device, attribute::MODEL).as_str().unwrap();
    assert!(model.len() <= MAX_ATTRIBUTE_STRING_LENGTH);
    assert!(model.starts_with("Contoso Hyperscale Inference Accelerator Module Gen3"));
    assert!(model.ends_with(&hash_hex(&report.devices[0].model)));
    assert_eq!(
        device.full_values[attribute::MODEL],
        report.devices[0].model
    );
    assert_eq!(spec.to_devices()[0].model, report.devices[0].model);
    // The summary is not length-limited, so it carries the full name too.
    assert_eq!(
        spec.summary.product.as_deref(),
        Some(report.devices[0].model.as_str())
    );
}

#[test]
fn same_report_same_bytes() {
    let report = with_node_facts(h100_x8());
    let a = crate::output::to_yaml(&AcceleratorInventory::from_report("n", &report)).unwrap();
    let b =
        crate::output::to_yaml(&AcceleratorInventory::from_report("n", &report.clone())).unwrap();
    assert_eq!(a, b);
    // Device order in the report does not matter either.
    let mut reversed = report;
    reversed.devices.reverse();
    let c = crate::output::to_yaml(&AcceleratorInventory::from_report("n", &reversed)).unwrap();
    assert_eq!(a, c);
}

#[test]
fn fully_populated_device_stays_within_dra_limits() {
    let mut report = h100_x8();
    let device = &mut report.devices[0];
    device.firmware_version = Some("96.00.89.00.01".into());
    device.health.ecc_enabled = Some(true);
    device.health.ecc_corrected = Some(3);
    device.health.ecc_uncorrected = Some(0);
    device.health.retired_pages = Some(1);
    let spec = AcceleratorInventorySpec::from_report("n", &report);
    let entry = &spec.devices[0];
    // Every attribute the conversion knows is set on this device.
    assert_eq!(entry.attributes.len(), 26, "{:?}", entry.attributes.keys());
    assert!(entry.attributes.len() + entry.capacity.len() <= MAX_ATTRIBUTES_AND_CAPACITIES);
}

#[test]
fn device_names_are_stable_and_unique() {
    let gpu = |id: &str| Device::new(id, Vendor::Nvidia, Family::Gpu, "X", "t");
    let devices = [
        gpu("0000:18:00.0"),
        gpu("apple:gpu0"),
        gpu("a:b"),
        gpu("a.b"),
        gpu("A:B"),
    ];
    let refs: Vec<&Device> = devices.iter().collect();
    let names = device_names(&refs);
    assert_eq!(names[0], "gpu-0000-18-00-0");
    assert_eq!(names[1], "gpu-apple-gpu0");
    assert_eq!(names[2], "gpu-a-b");
    assert!(names[3].starts_with("gpu-a-b-") && names[3] != names[4]);
    let unique: BTreeSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len());
    // A device's name does not depend on which other devices are present.
    assert_eq!(device_names(&[&devices[1]]), ["gpu-apple-gpu0"]);
    let long = gpu(&"x".repeat(200));
    assert!(is_dns_label(&device_names(&[&long])[0]));
}

#[test]
fn round_trip_of_a_full_report() {
    let report = with_node_facts(h100_x8());
    let back = AcceleratorInventory::from_report("n", &report).to_report();
    assert_eq!(back, report);
}

#[test]
fn hand_edited_values_degrade_gracefully() {
    let mut spec = AcceleratorInventorySpec::from_report("n", &h100_x8());
    let entry = &mut spec.devices[0];
    entry.attributes.insert(
        attribute::VENDOR.into(),
        DeviceAttribute::String("acme".into()),
    );
    entry
        .attributes
        .insert(attribute::FAMILY.into(), DeviceAttribute::Int(3));
    entry
        .attributes
        .insert(attribute::NUMA_NODE.into(), DeviceAttribute::Int(-1));
    entry
        .capacity
        .insert(attribute::MEMORY.into(), Quantity("lots".into()));
    let device = &spec.to_devices()[0];
    assert_eq!(device.vendor, Vendor::Other);
    assert_eq!(device.family, Family::Asic);
    assert_eq!(device.numa_node, None);
    assert_eq!(device.memory_bytes, None);
    assert_eq!(device.model, "NVIDIA H100 80GB HBM3");
}

#[test]
fn owner_reference_points_at_the_node() {
    let reference = owner_reference_for_node("gpu-node-1", "6f0c-uid");
    assert_eq!(
        (reference.api_version.as_str(), reference.kind.as_str()),
        ("v1", "Node")
    );
    assert_eq!(
        (reference.name.as_str(), reference.uid.as_str()),
        ("gpu-node-1", "6f0c-uid")
    );
    assert_eq!(reference.block_owner_deletion, None);
    let owned = AcceleratorInventory::from_report("gpu-node-1", &report_with(vec![]))
        .owned_by_node("6f0c-uid");
    assert_eq!(owned.metadata.owner_references, Some(vec![reference]));
}

#[test]
fn golden_inventories() {
    for (name, report) in scenarios() {
        let inventory = AcceleratorInventory::from_report(name, &report);
        let yaml = crate::output::to_yaml(&inventory).unwrap();
        assert_golden(&format!("{name}.inventory.yaml"), &yaml);
        let parsed: AcceleratorInventory = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(parsed, inventory, "{name}: YAML does not read back");
    }
}

#[test]
fn real_inventories_fit_the_crd_bounds_uncut() {
    for (name, report) in scenarios() {
        let spec = AcceleratorInventorySpec::from_report(name, &report);
        assert!(
            spec.warnings.iter().all(|w| w.backend != "inventory"),
            "{name}: {:?}",
            spec.warnings
        );
    }
}

#[test]
fn an_absurd_report_is_cut_to_the_bounds_and_says_so() {
    // 2,000 GPUs and a 10,000-character model name: what a hostile or broken tool can print.
    let mut report = h100_x8();
    let template = report.devices[0].clone();
    report.devices = (0..2000)
        .map(|i| {
            let mut device = template.clone();
            device.id = format!("0000:{:02x}:{:02x}.0", i / 256, i % 256);
            device
        })
        .collect();
    report.warnings = (0..5000)
        .map(|i| crate::hardware::Warning {
            backend: "nvidia".into(),
            message: format!("warning {i} {}", "x".repeat(10_000)),
        })
        .collect();
    let spec = AcceleratorInventorySpec::from_report("node", &report);
    assert_eq!(spec.devices.len() as u64, crate::api::bounds::MAX_DEVICES);
    assert_eq!(
        spec.warnings.len() as u64,
        crate::api::bounds::DEFAULT_MAX_ITEMS
    );
    let last = spec.warnings.last().expect("a warning");
    assert_eq!(last.backend, "inventory");
    assert!(last.message.contains("spec.devices"), "{}", last.message);
    assert!(
        spec.warnings
            .iter()
            .all(|w| w.message.chars().count() as u64 <= crate::api::bounds::DEFAULT_MAX_LENGTH)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn any_report_round_trips(report in arb_report()) {
        let report = with_node_facts(report);
        let inventory = AcceleratorInventory::from_report("node", &report);
        prop_assert_eq!(inventory.to_report(), report);
    }

    #[test]
    fn any_report_stays_within_limits(report in arb_report()) {
        let spec = AcceleratorInventorySpec::from_report("node", &report);
        let mut names = BTreeSet::new();
        for device in &spec.devices {
            prop_assert!(is_dns_label(&device.name), "{}", device.name);
            prop_assert!(names.insert(device.name.clone()), "duplicate {}", device.name);
            prop_assert!(device.attributes.len() + device.capacity.len()
                <= MAX_ATTRIBUTES_AND_CAPACITIES);
            for (name, value) in &device.attributes {
                if let Some(text) = value.as_str() {
                    prop_assert!(text.len() <= MAX_ATTRIBUTE_STRING_LENGTH, "{name}: {text:?}");
                }
            }
        }
    }

    #[test]
    fn same_report_same_json(report in arb_report()) {
        let a = serde_json::to_string(&AcceleratorInventory::from_report("n", &report)).unwrap();
        let b = serde_json::to_string(&AcceleratorInventory::from_report("n", &report)).unwrap();
        prop_assert_eq!(a, b);
    }
}
