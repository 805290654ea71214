//! The publication audit on the vendor-shaped fixtures (`fixtures/dra/PROVENANCE.md`) and the
//! detection fixtures of the same machines (`fixtures/hosts/`).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::ResourceSlice;

use super::*;
use crate::api::AcceleratorInventoryStatus;
use crate::dra::lint::lint;
use crate::dra::slices::published_devices;
use crate::testing::dra::fixture_slices;
use crate::testing::inventory::fixture_inventory;

const AMD: &str = "amd-mi300x-8x.yaml";
const NVIDIA: &str = "nvidia-h100-8x.yaml";

/// The inputs the controller hands the audit for one node.
struct Node {
    inventory: Option<AcceleratorInventory>,
    slices: Vec<ResourceSlice>,
    labels: BTreeMap<String, String>,
    in_cluster: BTreeSet<String>,
}

impl Node {
    fn new(scenario: &str, slices: &[&str]) -> Self {
        let slices = if slices.is_empty() {
            Vec::new()
        } else {
            fixture_slices(slices)
        };
        Self {
            inventory: Some(fixture_inventory(scenario, scenario)),
            slices,
            labels: BTreeMap::new(),
            in_cluster: BTreeSet::new(),
        }
    }

    fn advertising(mut self, entries: &[(&str, u32)]) -> Self {
        let inventory = self.inventory.as_mut().expect("an inventory");
        let status = inventory
            .status
            .get_or_insert_with(AcceleratorInventoryStatus::default);
        status.device_plugin_resources = Some(
            entries
                .iter()
                .map(|(name, count)| (name.to_string(), *count))
                .collect(),
        );
        self
    }

    fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }

    fn driver_elsewhere(mut self, driver: &str) -> Self {
        self.in_cluster.insert(driver.to_string());
        self
    }

    fn audit(&self) -> Audit {
        let fleet = published_devices(&self.slices);
        let published: Vec<PublishedDevice> = fleet.nodes.values().flatten().cloned().collect();
        let findings = lint(&self.slices);
        let mut in_cluster = self.in_cluster.clone();
        in_cluster.extend(self.slices.iter().map(|s| s.spec.driver.clone()));
        audit(&NodeTruths {
            inventory: self.inventory.as_ref(),
            published: &published,
            findings: &findings,
            labels: &self.labels,
            drivers_in_cluster: &in_cluster,
        })
    }
}

fn reasons(audit: &Audit) -> Vec<Reason> {
    audit.gaps.iter().map(|gap| gap.reason).collect()
}

#[test]
fn a_node_whose_driver_publishes_every_detected_gpu_is_consistent() {
    let audit = Node::new("h100-8x-nvswitch", &[NVIDIA]).audit();
    assert!(audit.published(), "{:?}", audit.gaps);
    assert_eq!(audit.reason(), CONSISTENT);
    assert_eq!(
        audit.message(),
        "8 NVIDIA GPUs detected, gpu.nvidia.com publishes 8"
    );
}

#[test]
fn no_slice_from_a_driver_that_runs_elsewhere_is_a_missing_slice_with_counts() {
    let audit = Node::new("mi300x-8x", &[])
        .driver_elsewhere("gpu.amd.com")
        .audit();
    assert_eq!(reasons(&audit), [Reason::DriverSliceMissing]);
    assert_eq!(audit.reason(), "DriverSliceMissing");
    assert_eq!(
        audit.message(),
        "8 AMD GPUs detected, gpu.amd.com publishes 0"
    );
    assert_eq!(
        audit.devices_by_source(),
        BTreeMap::from([(("gpu.amd.com".to_string(), Reason::DriverSliceMissing), 8)])
    );
}

#[test]
fn a_driver_nobody_runs_is_not_missing_and_an_unread_node_says_nothing_of_plugins() {
    // No AMD driver anywhere and the agent did not report the allocatable: nothing to say.
    let audit = Node::new("mi300x-8x", &[]).audit();
    assert!(audit.published(), "{:?}", audit.gaps);
    assert_eq!(audit.reason(), CONSISTENT);
}

#[test]
fn a_slice_with_fewer_devices_than_the_machine_is_missing_the_rest() {
    // Two slices of four GPUs: the first keeps one.
    let mut node = Node::new("mi300x-8x", &[AMD]);
    node.slices[0]
        .spec
        .devices
        .as_mut()
        .expect("devices")
        .truncate(1);
    let audit = node.audit();
    assert_eq!(audit.gaps[0].reason, Reason::DriverSliceMissing);
    assert_eq!(audit.gaps[0].devices, 3);
    assert!(
        audit
            .message()
            .contains("8 AMD GPUs detected, gpu.amd.com publishes 5"),
        "{}",
        audit.message()
    );
}

#[test]
fn an_empty_slice_publishes_nothing() {
    let mut node = Node::new("mi300x-8x", &[AMD]);
    for slice in &mut node.slices {
        slice.spec.devices = Some(Vec::new());
    }
    let audit = node.audit();
    assert_eq!(audit.reason(), "DriverSliceMissing");
    assert!(
        audit.message().contains("publishes 0"),
        "{}",
        audit.message()
    );
}

#[test]
fn a_device_plugin_instead_of_the_driver_is_a_choice_and_both_are_double_advertising() {
    let plugin_only = Node::new("h100-8x-nvswitch", &[])
        .driver_elsewhere("gpu.nvidia.com")
        .advertising(&[("nvidia.com/gpu", 8)])
        .audit();
    assert!(plugin_only.published(), "{:?}", plugin_only.gaps);
    assert_eq!(
        plugin_only.message(),
        "8 NVIDIA GPUs detected, the device plugin advertises nvidia.com/gpu: 8"
    );

    let both = Node::new("h100-8x-nvswitch", &[NVIDIA])
        .advertising(&[("nvidia.com/gpu", 8)])
        .audit();
    assert_eq!(reasons(&both), [Reason::DoubleAdvertised]);
    assert_eq!(both.gaps[0].devices, 8);
    assert!(
        both.message().starts_with(
            "gpu.nvidia.com publishes 8 and the device plugin advertises nvidia.com/gpu: 8"
        ),
        "{}",
        both.message()
    );
    // A plugin registered with nothing healthy advertises 0: not a second offer.
    let zero = Node::new("h100-8x-nvswitch", &[NVIDIA])
        .advertising(&[("nvidia.com/gpu", 0)])
        .audit();
    assert!(zero.published(), "{:?}", zero.gaps);
}

#[test]
fn gpus_nothing_offers_are_not_advertised_once_the_agent_read_the_node() {
    let audit = Node::new("mi300x-8x", &[]).advertising(&[]).audit();
    assert_eq!(reasons(&audit), [Reason::NotAdvertised]);
    assert_eq!(audit.gaps[0].devices, 8);
    assert_eq!(audit.gaps[0].source, "amd");
}

#[test]
fn sentinel_memory_is_an_attribute_anomaly_per_driver() {
    let mut node = Node::new("mi300x-8x", &[AMD]);
    for slice in &mut node.slices {
        for device in slice.spec.devices.as_mut().expect("devices") {
            let capacity = device.capacity.as_mut().expect("capacity");
            capacity.get_mut("memory").expect("memory").value =
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("0".into());
        }
    }
    let audit = node.audit();
    assert_eq!(audit.reason(), "AttributeAnomaly");
    let by_source = audit.devices_by_source();
    assert_eq!(
        by_source.get(&("gpu.amd.com".to_string(), Reason::AttributeAnomaly)),
        Some(&8),
        "{by_source:?}"
    );
}

#[test]
fn published_memory_far_from_what_detection_read_is_an_anomaly() {
    let mut node = Node::new("h100-8x-nvswitch", &[NVIDIA]);
    let device = &mut node.slices[0].spec.devices.as_mut().expect("devices")[0];
    // The slice fixture's addresses are not the host fixture's: point it at the first GPU.
    device
        .attributes
        .as_mut()
        .expect("attributes")
        .get_mut(crate::dra::drivers::STANDARD_PCI_BUS_ID)
        .expect("a PCI address")
        .string = Some("0000:1b:00.0".into());
    device
        .capacity
        .as_mut()
        .expect("capacity")
        .get_mut("memory")
        .expect("memory")
        .value = k8s_openapi::apimachinery::pkg::api::resource::Quantity("40Gi".into());
    let audit = node.audit();
    assert_eq!(reasons(&audit), [Reason::AttributeAnomaly]);
    assert!(
        audit
            .message()
            .contains("publishes memory 40.0Gi while the agent reads 79."),
        "{}",
        audit.message()
    );
}

#[test]
fn vendor_labels_without_the_devices_are_stale() {
    let stale = Node::new("mi300x-8x", &[AMD])
        .label("nvidia.com/gpu.present", "true")
        .label("nvidia.com/gpu.count", "8")
        .audit();
    assert_eq!(reasons(&stale), [Reason::StaleVendorLabels]);
    assert_eq!(stale.gaps[0].devices, 8);
    assert!(
        stale.message().contains("nvidia.com/gpu.count=8 (written by NVIDIA GPU feature discovery) but the agent detects 0 NVIDIA GPUs"),
        "{}",
        stale.message()
    );
    // The labels of devices that are there, and a `false`, are not stale.
    let current = Node::new("h100-8x-nvswitch", &[NVIDIA])
        .label("nvidia.com/gpu.count", "8")
        .label("nvidia.com/gpu.present", "true")
        .label("amd.com/gpu.present", "false")
        .audit();
    assert!(current.published(), "{:?}", current.gaps);
    // A count that disagrees is stale too.
    let fewer = Node::new("h100-8x-nvswitch", &[NVIDIA])
        .label("nvidia.com/gpu.count", "4")
        .audit();
    assert_eq!(reasons(&fewer), [Reason::StaleVendorLabels]);
    // Without an inventory there is no detection to hold the labels against.
    let mut unknown = Node::new("h100-8x-nvswitch", &[NVIDIA]).label("amd.com/gpu.family", "AI");
    unknown.inventory = None;
    assert!(unknown.audit().published());
}

#[test]
fn the_most_urgent_reason_leads_and_every_gap_is_in_the_message() {
    let audit = Node::new("mi300x-8x", &[])
        .driver_elsewhere("gpu.amd.com")
        .label("nvidia.com/gpu.present", "true")
        .audit();
    assert_eq!(
        reasons(&audit),
        [Reason::DriverSliceMissing, Reason::StaleVendorLabels]
    );
    assert_eq!(audit.reason(), "DriverSliceMissing");
    let message = audit.message();
    assert!(message.contains("publishes 0") && message.contains("nvidia.com/gpu.present"));
}

#[test]
fn a_node_without_accelerators_has_nothing_to_publish() {
    let audit = Node::new("cpu-only-vm", &[]).advertising(&[]).audit();
    assert!(audit.published());
    assert_eq!(audit.reason(), NO_ACCELERATORS);
}

#[test]
fn hostile_labels_and_many_findings_keep_the_message_bounded() {
    let mut node = Node::new("mi300x-8x", &[]).driver_elsewhere("gpu.amd.com");
    node.labels
        .insert("nvidia.com/gpu.present".into(), "x".repeat(5000));
    let audit = node.audit();
    assert!(audit.message().len() <= 1024, "{}", audit.message().len());
}

#[test]
fn the_amd_driver_publishing_every_mi300x_is_consistent() {
    let audit = Node::new("mi300x-8x", &[AMD]).audit();
    assert!(audit.published(), "{:?}", audit.gaps);
    assert_eq!(
        audit.message(),
        "8 AMD GPUs detected, gpu.amd.com publishes 8"
    );
}
