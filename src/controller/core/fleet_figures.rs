//! The fleet's numbers as the controller publishes them, asked of `src/fleet/` rather than
//! counted here: per inventory, the state of each accelerator by the one device-state rule
//! (`hardware::device_state`, through `AcceleratorInventory::device_facts`), summed into counts
//! per node and per (product, vendor) label; which nodes are unhealthy and why.
//!
//! What is the controller's own is only what it publishes: label values cut and bounded for
//! dashboards, the `DevicesMissing` condition it turns into Events and taints, and the
//! `status.freeDevices` it last wrote. Pure: the driver (`fleet/pass.rs`) hands in the inventories
//! and who holds which device, and turns the answer into metrics, `status.freeDevices`, Node
//! Events and taints.

use std::collections::BTreeMap;

use crate::api::{AcceleratorInventory, attribute, conditions};
use crate::controller::core::fleet_view::FleetView;
use crate::fleet::health::{Holdings, states_of};
use crate::hardware::device_state::{Counts, health_name, tainted};
use crate::plan::Reservations;

/// Longest product or vendor label value; longer ones are cut (label values are read by
/// people on dashboards, and a hostile inventory must not bloat every scrape).
pub const MAX_LABEL_LENGTH: usize = 63;
/// Most distinct (product, vendor) series; the rest are summed under `other`, so a fleet
/// of odd products (or forged inventories) cannot grow the series count without bound.
pub const MAX_PRODUCTS: usize = 128;
/// The label value for devices whose inventory names no product or vendor.
pub const UNKNOWN: &str = "unknown";
/// The label value the products beyond [`MAX_PRODUCTS`] are summed under.
pub const OTHER: &str = "other";

/// Why a node is unhealthy, in the words its taint value and Events use.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unhealthy {
    /// The inventory says `DevicesMissing=True`; the condition's message.
    DevicesMissing(String),
    /// Devices the one rule makes unplannable for their health (`unhealthy`), by name, with
    /// their health.
    Devices(BTreeMap<String, String>),
}

impl Unhealthy {
    /// The reason as a taint value and Event reason: `DevicesMissing` or `DeviceUnhealthy`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::DevicesMissing(_) => "DevicesMissing",
            Self::Devices(_) => "DeviceUnhealthy",
        }
    }

    /// One sentence for an Event.
    pub fn message(&self) -> String {
        match self {
            Self::DevicesMissing(message) if !message.is_empty() => message.clone(),
            Self::DevicesMissing(_) => "the inventory reports missing devices".to_string(),
            Self::Devices(devices) => {
                let listed: Vec<String> = devices
                    .iter()
                    .map(|(name, health)| format!("{name} ({health})"))
                    .collect();
                format!("devices not healthy: {}", listed.join(", "))
            }
        }
    }
}

/// One inventory's numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStats {
    /// The node.
    pub node: String,
    /// Its device counts, by the one rule.
    pub counts: Counts,
    /// Counts by (product, vendor) label, values already cut.
    pub by_product: BTreeMap<(String, String), Counts>,
    /// `DevicesMissing=True`: the condition's message.
    pub missing: Option<String>,
    /// Devices health taints name (the rule's `tainted`), with their health.
    pub sick: BTreeMap<String, String>,
    /// The inventory's current `status.freeDevices`.
    pub written_free: Option<u32>,
}

impl NodeStats {
    /// The numbers of `inventory`, with `held` saying which devices placements and other
    /// claims hold, and `published` which devices the planner's merged node leaves out for
    /// what their DRA driver publishes (`FleetView::unplannable_on`; `None` without DRA).
    pub fn of(
        inventory: &AcceleratorInventory,
        held: &Holdings<'_>,
        published: Option<&BTreeMap<String, String>>,
    ) -> Self {
        Self::with_notices(inventory, held, published, None)
    }

    /// [`NodeStats::of`], with the informational taints its DRA drivers put on devices
    /// (`FleetView::notices_on`): such a device counts degraded, still free.
    pub fn with_notices(
        inventory: &AcceleratorInventory,
        held: &Holdings<'_>,
        published: Option<&BTreeMap<String, String>>,
        notices: Option<&BTreeMap<String, String>>,
    ) -> Self {
        let node = inventory.spec.node_name.clone();
        let facts: Vec<_> = inventory
            .device_facts()
            .into_iter()
            .map(|facts| {
                let verdict = published
                    .and_then(|p| p.get(&facts.name))
                    .map(String::as_str);
                let notice = notices.and_then(|n| n.get(&facts.name)).map(String::as_str);
                facts
                    .with_published_verdict(verdict)
                    .with_published_notice(notice)
            })
            .collect();
        let states = states_of(&node, &facts, held);
        let labels: BTreeMap<&str, (String, String)> = inventory
            .spec
            .devices
            .iter()
            .map(|entry| {
                let product = label_value(entry.text(attribute::PRODUCT).as_deref());
                let vendor = label_value(entry.text(attribute::VENDOR).as_deref());
                (entry.name.as_str(), (product, vendor))
            })
            .collect();
        let mut counts = Counts::default();
        let mut by_product: BTreeMap<(String, String), Counts> = BTreeMap::new();
        let mut sick = BTreeMap::new();
        for state in &states {
            counts.count(state);
            let key = labels
                .get(state.name.as_str())
                .cloned()
                .unwrap_or_else(|| (UNKNOWN.to_string(), UNKNOWN.to_string()));
            by_product.entry(key).or_default().count(state);
            if tainted(state.health) {
                sick.insert(state.name.clone(), health_name(state.health).to_string());
            }
        }
        let missing = inventory
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, conditions::DEVICES_MISSING))
            .filter(|c| c.status == "True")
            .map(|c| c.message.clone());
        Self {
            node,
            counts,
            by_product,
            missing,
            sick,
            written_free: inventory.status.as_ref().and_then(|s| s.free_devices),
        }
    }

    /// `status.freeDevices` as it should be: the planner's free set on this node.
    pub fn free_devices(&self) -> u32 {
        self.counts.free
    }

    /// Why the node is unhealthy; `None` when it is not. Missing devices come first: they
    /// are the bigger news, and the taint carries one reason.
    pub fn unhealthy(&self) -> Option<Unhealthy> {
        if let Some(message) = &self.missing {
            return Some(Unhealthy::DevicesMissing(message.clone()));
        }
        (!self.sick.is_empty()).then(|| Unhealthy::Devices(self.sick.clone()))
    }
}

/// The fleet's sums.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetTotals {
    /// Counts by (product, vendor), at most [`MAX_PRODUCTS`] + 1 entries.
    pub by_product: BTreeMap<(String, String), Counts>,
    /// Nodes whose inventory says `DevicesMissing=True`.
    pub nodes_missing_devices: u64,
}

impl FleetTotals {
    /// Sums the nodes' numbers.
    pub fn of<'a>(nodes: impl IntoIterator<Item = &'a NodeStats>) -> Self {
        let mut all: BTreeMap<(String, String), Counts> = BTreeMap::new();
        let mut nodes_missing_devices = 0;
        for node in nodes {
            for (key, counts) in &node.by_product {
                all.entry(key.clone()).or_default().add(counts);
            }
            nodes_missing_devices += u64::from(node.missing.is_some());
        }
        Self {
            by_product: bound_products(all),
            nodes_missing_devices,
        }
    }
}

/// Keeps the [`MAX_PRODUCTS`] largest products and sums the rest under `other`.
fn bound_products(all: BTreeMap<(String, String), Counts>) -> BTreeMap<(String, String), Counts> {
    if all.len() <= MAX_PRODUCTS {
        return all;
    }
    let mut ranked: Vec<((String, String), Counts)> = all.into_iter().collect();
    // Largest first, then by name, so the cut is the same on every pass.
    ranked.sort_by(|a, b| b.1.devices.cmp(&a.1.devices).then_with(|| a.0.cmp(&b.0)));
    let rest = ranked.split_off(MAX_PRODUCTS);
    let mut kept: BTreeMap<(String, String), Counts> = ranked.into_iter().collect();
    let other = kept
        .entry((OTHER.to_string(), OTHER.to_string()))
        .or_default();
    for (_, counts) in rest {
        other.add(&counts);
    }
    kept
}

/// Bytes of memory left for shares, per (product, vendor) label, on the devices DRA drivers
/// publish shareable by memory: each device's capacity less what `held` consumes of it
/// (placements' shares and claims' `consumedCapacity`), nothing for one held whole. At most
/// [`MAX_PRODUCTS`] series (the roomiest), the rest summed under `other`.
pub fn share_headroom(view: &FleetView, held: &Reservations) -> BTreeMap<(String, String), u64> {
    let mut all: BTreeMap<(String, String), u64> = BTreeMap::new();
    for node in view.nodes() {
        for device in view.shareable_on(&node.name) {
            let Some(share) = &device.share else { continue };
            let left = if held.contains(&node.name, &device.id) {
                0
            } else {
                share
                    .policy
                    .capacity
                    .saturating_sub(share.consumed)
                    .saturating_sub(held.consumed(&node.name, &device.id))
            };
            let key = (
                label_value(view.product(&node.name, &device.id)),
                label_value(Some(device.vendor.as_str())),
            );
            let sum = all.entry(key).or_default();
            *sum = sum.saturating_add(left);
        }
    }
    if all.len() <= MAX_PRODUCTS {
        return all;
    }
    let mut ranked: Vec<((String, String), u64)> = all.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let rest: u64 = ranked
        .split_off(MAX_PRODUCTS)
        .into_iter()
        .fold(0u64, |sum, (_, left)| sum.saturating_add(left));
    let mut kept: BTreeMap<(String, String), u64> = ranked.into_iter().collect();
    kept.insert((OTHER.to_string(), OTHER.to_string()), rest);
    kept
}

/// A product or vendor as a label value: present, cut to [`MAX_LABEL_LENGTH`] characters.
fn label_value(text: Option<&str>) -> String {
    match text.map(str::trim).filter(|t| !t.is_empty()) {
        Some(text) => text.chars().take(MAX_LABEL_LENGTH).collect(),
        None => UNKNOWN.to_string(),
    }
}

/// One model's capacity now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCount {
    /// The preset key.
    pub model: String,
    /// Tokens per request.
    pub context: u64,
    /// The precision asked for.
    pub precision: String,
    /// Replicas (one full-context request each) the free devices hold, every device class
    /// packed in turn.
    pub replicas: u32,
    /// Free devices left that no further replica can use.
    pub stranded_devices: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AcceleratorInventoryStatus, DeviceAttribute};
    use crate::plan::Reservations;
    use crate::testing::InventoryBuilder;

    fn inventory(scenario: &str, node: &str) -> AcceleratorInventory {
        InventoryBuilder::fixture(scenario).node(node).build()
    }

    fn set_health(inventory: &mut AcceleratorInventory, device: usize, health: &str) {
        inventory.spec.devices[device].attributes.insert(
            attribute::HEALTH.to_string(),
            DeviceAttribute::String(health.to_string()),
        );
    }

    fn accelerators(inventory: &AcceleratorInventory) -> Vec<String> {
        inventory
            .spec
            .devices
            .iter()
            .filter(|d| d.attributes.get(attribute::FAMILY).and_then(|a| a.as_str()) != Some("cpu"))
            .map(|d| d.name.clone())
            .collect()
    }

    fn position(inventory: &AcceleratorInventory, name: &str) -> usize {
        inventory
            .spec
            .devices
            .iter()
            .position(|d| d.name == name)
            .expect("present")
    }

    #[test]
    fn held_devices_are_not_free_unhealthy_ones_are_neither_and_degraded_ones_are_free() {
        let mut inv = inventory("h100-8x-nvswitch", "n1");
        let names = accelerators(&inv);
        assert!(names.len() >= 5, "{names:?}");
        for index in 0..inv.spec.devices.len() {
            set_health(&mut inv, index, "healthy");
        }
        let sick = position(&inv, &names[0]);
        set_health(&mut inv, sick, "unhealthy");
        let degraded = position(&inv, &names[4]);
        set_health(&mut inv, degraded, "degraded");
        let mut placements = Reservations::none();
        placements.insert("n1", names[1].clone());
        // Another node's device with the same name is not this node's.
        placements.insert("n2", names[3].clone());
        let mut claims = Reservations::none();
        claims.insert("n1", names[2].clone());
        let held = Holdings {
            placements: &placements,
            claims: Some(&claims),
        };
        let stats = NodeStats::of(&inv, &held, None);
        let total = names.len() as u32;
        assert_eq!(stats.counts.devices, total);
        assert_eq!(stats.counts.healthy, total - 2);
        assert_eq!(stats.counts.degraded, 1);
        assert_eq!(stats.counts.reserved, 2);
        assert_eq!(stats.free_devices(), total - 3, "the degraded one is free");
        let unhealthy = stats.unhealthy().expect("one unhealthy GPU");
        assert_eq!(unhealthy.reason(), "DeviceUnhealthy");
        assert_eq!(
            stats.sick.keys().collect::<Vec<_>>(),
            [&names[0]],
            "a degraded GPU is not tainted"
        );
        let totals = FleetTotals::of([&stats]);
        let summed: u32 = totals.by_product.values().map(|c| c.devices).sum();
        assert_eq!(summed, total);
        assert_eq!(totals.nodes_missing_devices, 0);
    }

    /// Issue 39 item 4: a GPU its driver marks with an informational taint (`effect: None`)
    /// counts degraded, with the taint among its reasons, and stays free.
    #[test]
    fn a_gpu_with_an_informational_taint_counts_degraded_and_free() {
        let node = "h100-xid-node";
        let inv = inventory("h100-8x-nvswitch", node);
        let names = accelerators(&inv);
        let first = &names[0];
        let none = Reservations::none();
        let held = Holdings::placements(&none);
        let notices = BTreeMap::from([(
            first.clone(),
            "tainted gpu.nvidia.com/xid=79 by its DRA driver (effect None: informational)"
                .to_string(),
        )]);
        let plain = NodeStats::of(&inv, &held, None);
        let noted = NodeStats::with_notices(&inv, &held, None, Some(&notices));
        assert_eq!(noted.counts.degraded, plain.counts.degraded + 1);
        assert_eq!(
            noted.free_devices(),
            plain.free_devices(),
            "degraded is still free"
        );
        assert_eq!(noted.counts.devices, plain.counts.devices);
    }

    #[test]
    fn a_gpu_its_driver_publishes_as_shared_is_not_free_as_the_planner_does_not_plan_it() {
        use std::sync::Arc;

        use crate::controller::core::fleet_view::{FleetView, NodePart};
        use crate::dra::slices::{SHARED, published_devices};
        use crate::hardware::Family;

        // AMD's AutoPartition publishes every layout of a GPU as shared
        // (allowMultipleAllocations); the whole one (SPX) carries the GPU's PCI address, so
        // it is the inventory's GPU at that address (the fixture's two GPUs moved to the
        // first two of the inventory's).
        let node = "mi300x-autopartition-node";
        let inv = inventory("mi300x-8x", node);
        let names = accelerators(&inv);
        let bus_id = |name: &str| {
            let entry = inv.spec.devices.iter().find(|d| d.name == name);
            entry
                .and_then(|d| d.text(attribute::PCI_BUS_ID))
                .expect("a PCI bus id")
        };
        let slices = crate::testing::dra::fixture_slices(&["amd-mi300x-autopartition.yaml"]);
        let text = serde_json::to_string(&slices)
            .expect("slices")
            // Through placeholders: the fixture's addresses are the inventory's own, in
            // whichever order `accelerators` lists them.
            .replace("0000:05:00.0", "first-gpu")
            .replace("0000:26:00.0", "second-gpu")
            .replace("first-gpu", &bus_id(&names[0]))
            .replace("second-gpu", &bus_id(&names[1]));
        let slices: Vec<k8s_openapi::api::resource::v1::ResourceSlice> =
            serde_json::from_str(&text).expect("slices");
        let published = published_devices(&slices);
        let part = NodePart::with_published(node, Some(&inv), published.node(node));
        let view = FleetView::from_parts([Arc::new(part)], &BTreeMap::new());
        let verdicts = view.unplannable_on(node).expect("the node");
        let shared: Vec<&String> = names
            .iter()
            .filter(|name| {
                verdicts
                    .get(*name)
                    .is_some_and(|why| why.starts_with(SHARED))
            })
            .collect();
        assert_eq!(shared, [&names[0], &names[1]], "{verdicts:?}");
        let none = Reservations::none();
        let held = Holdings::placements(&none);
        let before = NodeStats::of(&inv, &held, None);
        let stats = NodeStats::of(&inv, &held, Some(verdicts));
        assert_eq!(stats.free_devices(), before.free_devices() - 2);
        assert_eq!(stats.counts.unusable, before.counts.unusable + 2);
        assert_eq!(stats.counts.devices, before.counts.devices);
        // Free is exactly what the planner may plan on.
        let plannable = view.nodes()[0]
            .devices
            .iter()
            .filter(|d| d.family != Family::Cpu)
            .inspect(|d| assert!(!shared.contains(&&d.id), "{} planned", d.id))
            .count();
        assert_eq!(stats.free_devices() as usize, plannable);
    }

    #[test]
    fn devices_missing_comes_from_the_condition_and_wins_over_sick_devices() {
        let mut inv = inventory("h100-8x-nvswitch", "n1");
        let first = position(&inv, &accelerators(&inv)[0]);
        set_health(&mut inv, first, "unhealthy");
        let mut status = AcceleratorInventoryStatus::default();
        status.conditions.push(conditions::condition(
            conditions::DEVICES_MISSING,
            Some(true),
            "DevicesMissing",
            "2 of 8 expected accelerators are missing",
            None,
            &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        ));
        inv.status = Some(status);
        let none = Reservations::none();
        let stats = NodeStats::of(&inv, &Holdings::placements(&none), None);
        let unhealthy = stats.unhealthy().expect("unhealthy");
        assert_eq!(unhealthy.reason(), "DevicesMissing");
        assert_eq!(
            unhealthy.message(),
            "2 of 8 expected accelerators are missing"
        );
        assert_eq!(FleetTotals::of([&stats]).nodes_missing_devices, 1);
    }

    #[test]
    fn unknown_health_is_not_sick_and_is_free() {
        let mut inv = inventory("h100-8x-nvswitch", "n1");
        for index in 0..inv.spec.devices.len() {
            set_health(&mut inv, index, "unknown");
        }
        let none = Reservations::none();
        let stats = NodeStats::of(&inv, &Holdings::placements(&none), None);
        assert_eq!(stats.unhealthy(), None);
        assert_eq!(stats.counts.healthy, 0);
        assert_eq!(stats.counts.unknown, stats.counts.devices);
        assert_eq!(stats.free_devices(), stats.counts.devices);
    }

    #[test]
    fn products_beyond_the_bound_are_summed_under_other() {
        let mut all = BTreeMap::new();
        for i in 0..(MAX_PRODUCTS + 5) {
            all.insert(
                (format!("p{i:04}"), "v".to_string()),
                Counts {
                    devices: i as u32 + 1,
                    ..Counts::default()
                },
            );
        }
        let total: u32 = all.values().map(|c| c.devices).sum();
        let bounded = bound_products(all);
        assert_eq!(bounded.len(), MAX_PRODUCTS + 1);
        assert_eq!(bounded.values().map(|c| c.devices).sum::<u32>(), total);
        // The smallest products went to `other`.
        assert!(!bounded.contains_key(&("p0000".to_string(), "v".to_string())));
    }

    #[test]
    fn label_values_are_cut_and_never_empty() {
        assert_eq!(label_value(Some(&"x".repeat(200))).len(), MAX_LABEL_LENGTH);
        assert_eq!(label_value(Some("  ")), UNKNOWN);
        assert_eq!(label_value(None), UNKNOWN);
    }

    /// Issue 39: the memory left for shares on shareable GPUs, per product: the capacity less
    /// what shares consume, nothing for a GPU held whole.
    #[test]
    fn memory_left_for_shares_is_the_capacity_less_what_shares_consume() {
        const GIB: u64 = 1 << 30;
        let node = "h100-2x-shared";
        let slices = crate::testing::dra::fixture_slices(&["nvidia-h100-shareable.yaml"]);
        let published = crate::dra::slices::published_devices(&slices);
        let part = std::sync::Arc::new(
            crate::controller::core::fleet_view::NodePart::with_published(
                node,
                None,
                published.node(node),
            ),
        );
        let view = FleetView::from_parts([part], &BTreeMap::new());
        let ids: Vec<String> = view
            .shareable_on(node)
            .iter()
            .map(|d| d.id.clone())
            .collect();
        let mut held = Reservations::none();
        assert_eq!(
            share_headroom(&view, &held).values().sum::<u64>(),
            160 * GIB
        );
        held.consume(node, ids[0].clone(), 48 * GIB);
        let left = share_headroom(&view, &held);
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!(left.values().sum::<u64>(), 112 * GIB);
        held.insert(node, ids[1].clone());
        assert_eq!(share_headroom(&view, &held).values().sum::<u64>(), 32 * GIB);
        let key = left.keys().next().unwrap();
        assert_eq!(key.1, "nvidia");
    }
}
