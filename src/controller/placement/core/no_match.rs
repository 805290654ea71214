//! Why no node is left for a placement, in words a user can act on, and which constraints can
//! never match anything.
//!
//! The planner only sees the nodes a placement's constraints leave; when none are left it
//! could only say "the inventory has no nodes", which was wrong on a fleet of CPU-only nodes
//! or with a typo in a selector (issues 27 and 28). Here the whole fleet is at hand, so the
//! refusal names the nodes without accelerators and the constraint that excluded the rest.
//! Names are listed up to [`MAX_NAMED`] with a count of the others, so a big fleet gives a
//! short message.

use std::collections::{BTreeMap, BTreeSet};

use crate::names::{
    MAX_LABEL_LENGTH, is_valid_label_key, is_valid_label_value, slugify, truncate_at_char_boundary,
};
use crate::plan::NodeSpec;

use crate::controller::core::fleet_view::{DeviceFilter, FleetView};

/// Most names one list in a message holds; the rest are counted.
pub const MAX_NAMED: usize = 5;

/// What a spec's constraints say that can never match a node or device: selector keys and
/// values that are not label syntax, products that are not product slugs. One line each.
pub fn invalid_constraints(
    node_selector: &BTreeMap<String, String>,
    products: &[String],
) -> Vec<String> {
    let mut reasons = Vec::new();
    for (key, value) in node_selector {
        if !is_valid_label_key(key) {
            reasons.push(format!(
                "constraints.nodeSelector: key {} is not a valid label key",
                quoted(key)
            ));
        }
        if !is_valid_label_value(value) {
            reasons.push(format!(
                "constraints.nodeSelector: value {} of {} is not a valid label value",
                quoted(value),
                quoted(key)
            ));
        }
    }
    for product in products {
        if !is_product_slug(product) {
            let hint = slugify(product);
            let hint = if hint.is_empty() || hint == *product {
                String::new()
            } else {
                format!(" (did you mean {}?)", quoted(&hint))
            };
            reasons.push(format!(
                "constraints.products: {} is not a product slug as the {}product label \
                 spells it, like \"nvidia-h100-80gb-hbm3\"{hint}",
                quoted(product),
                crate::names::keys::LABEL_PREFIX
            ));
        }
    }
    // A spec may list 64 products and any number of labels: name a few, count the rest.
    if reasons.len() > MAX_NAMED {
        let more = reasons.len() - MAX_NAMED;
        reasons.truncate(MAX_NAMED);
        reasons.push(format!("and {more} more invalid constraint(s)"));
    }
    reasons
}

/// A product slug: a non-empty label value in lowercase (slugs and their hashed short forms
/// never hold capitals), so it can equal a `hwaccel.io/product` label.
fn is_product_slug(product: &str) -> bool {
    !product.is_empty()
        && is_valid_label_value(product)
        && !product.bytes().any(|b| b.is_ascii_uppercase())
}

/// Why `left` (the fleet after `filter`) holds no accelerator at all, or `None` when some
/// node still has one (then the planner explains what does not fit).
pub fn why_nothing_left(
    fleet: &FleetView,
    filter: &DeviceFilter,
    left: &[NodeSpec],
) -> Option<String> {
    if left.iter().any(|node| !node.devices.is_empty()) {
        return None;
    }
    let all = fleet.nodes();
    if all.is_empty() {
        return Some("no node has an AcceleratorInventory yet".to_string());
    }
    let selected: Vec<&NodeSpec> = all
        .iter()
        .filter(|node| filter.selects_node(node))
        .collect();
    if selected.is_empty() {
        return Some(format!(
            "constraints.nodeSelector {} matches none of the {} node(s)",
            selector_text(&filter.node_selector),
            all.len()
        ));
    }
    let (bare, equipped): (Vec<&NodeSpec>, Vec<&NodeSpec>) =
        selected.iter().partition(|node| node.devices.is_empty());
    let scope = if filter.node_selector.is_empty() {
        String::new()
    } else {
        format!(" selected by {}", selector_text(&filter.node_selector))
    };
    let without = (!bare.is_empty()).then(|| {
        format!(
            "node(s){scope} with no usable accelerator: {}",
            named(bare.iter().map(|node| node.name.as_str()))
        )
    });
    if equipped.is_empty() {
        return without;
    }
    let mut excluded = Vec::new();
    if !filter.families.is_empty() {
        excluded.push(format!(
            "families {}",
            named(filter.families.iter().map(String::as_str))
        ));
    }
    if !filter.products.is_empty() {
        excluded.push(format!(
            "products {}",
            named(filter.products.iter().map(String::as_str))
        ));
    }
    if filter.dra_only {
        excluded.push("devices a DRA driver publishes".to_string());
    }
    let products: BTreeSet<&str> = equipped
        .iter()
        .flat_map(|node| {
            node.devices
                .iter()
                .filter_map(|device| fleet.product(&node.name, &device.id))
        })
        .collect();
    let mut reason = format!(
        "no device on the {} node(s){scope} with accelerators is among {}; products there: {}",
        equipped.len(),
        excluded.join(", "),
        named(products.into_iter())
    );
    if let Some(without) = without {
        reason.push_str("; ");
        reason.push_str(&without);
    }
    Some(reason)
}

/// `names`, the first [`MAX_NAMED`] of them, then how many more; `none` when empty.
pub fn named<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    if names.is_empty() {
        return "none".to_string();
    }
    let shown: Vec<String> = names.iter().take(MAX_NAMED).map(|n| short(n)).collect();
    let mut text = shown.join(", ");
    if names.len() > MAX_NAMED {
        text.push_str(&format!(" and {} more", names.len() - MAX_NAMED));
    }
    text
}

fn selector_text(selector: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = selector
        .iter()
        .take(MAX_NAMED)
        .map(|(k, v)| format!("{}={}", short(k), short(v)))
        .collect();
    let more = selector.len().saturating_sub(MAX_NAMED);
    if more > 0 {
        format!("{{{} and {more} more}}", pairs.join(", "))
    } else {
        format!("{{{}}}", pairs.join(", "))
    }
}

/// A user's text cut to a label's length: a status message never grows with what is typed.
fn short(text: &str) -> String {
    let cut = truncate_at_char_boundary(text, MAX_LABEL_LENGTH + 253 + 1);
    if cut.len() < text.len() {
        format!("{cut}...")
    } else {
        cut.to_string()
    }
}

/// A user's text quoted with escapes (a newline stays `\n`), cut to a label's length.
fn quoted(text: &str) -> String {
    let cut = truncate_at_char_boundary(text, MAX_LABEL_LENGTH);
    if cut.len() < text.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::inventory::fixture_inventory;

    const H100: &str = "h100-8x-nvswitch";
    const CPU_ONLY: &str = "cpu-only-vm";

    /// One node of a test fleet: fixture scenario, node name, node labels.
    type TestNode<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

    /// A fleet of (scenario, node, labels).
    fn fleet(nodes: &[TestNode<'_>]) -> FleetView {
        let inventories: Vec<_> = nodes
            .iter()
            .map(|(scenario, name, _)| fixture_inventory(scenario, name))
            .collect();
        let labels = nodes
            .iter()
            .map(|(_, name, labels)| {
                let labels = labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                (name.to_string(), labels)
            })
            .collect();
        FleetView::new(&inventories, &labels)
    }

    #[test]
    fn a_cpu_only_fleet_names_its_nodes() {
        let fleet = fleet(&[(CPU_ONLY, "cpu-1", &[])]);
        let filter = DeviceFilter {
            families: BTreeSet::from(["gpu".to_string()]),
            ..DeviceFilter::default()
        };
        let left = fleet.filtered(&filter);
        let why = why_nothing_left(&fleet, &filter, &left).unwrap();
        assert_eq!(why, "node(s) with no usable accelerator: cpu-1");
        // Without a filter too: the planner gets the node, but no accelerator on it.
        let why = why_nothing_left(&fleet, &DeviceFilter::default(), fleet.nodes()).unwrap();
        assert_eq!(why, "node(s) with no usable accelerator: cpu-1");
    }

    #[test]
    fn long_lists_are_bounded() {
        let names: Vec<String> = (0..12).map(|i| format!("cpu-{i:02}")).collect();
        let nodes: Vec<TestNode<'_>> = names
            .iter()
            .map(|name| (CPU_ONLY, name.as_str(), &[][..]))
            .collect();
        let fleet = fleet(&nodes);
        let why = why_nothing_left(&fleet, &DeviceFilter::default(), fleet.nodes()).unwrap();
        assert_eq!(
            why,
            "node(s) with no usable accelerator: cpu-00, cpu-01, cpu-02, cpu-03, cpu-04 and 7 more"
        );
    }

    #[test]
    fn a_selector_that_matches_nothing_says_so() {
        let fleet = fleet(&[(H100, "gpu-1", &[("pool", "a")]), (CPU_ONLY, "cpu-1", &[])]);
        let filter = DeviceFilter {
            node_selector: BTreeMap::from([("pool".to_string(), "b".to_string())]),
            ..DeviceFilter::default()
        };
        let left = fleet.filtered(&filter);
        assert_eq!(
            why_nothing_left(&fleet, &filter, &left).unwrap(),
            "constraints.nodeSelector {pool=b} matches none of the 2 node(s)"
        );
    }

    #[test]
    fn a_product_no_node_has_names_the_products_there() {
        let fleet = fleet(&[(H100, "gpu-1", &[]), (CPU_ONLY, "cpu-1", &[])]);
        let filter = DeviceFilter {
            products: BTreeSet::from(["amd-mi300x".to_string()]),
            ..DeviceFilter::default()
        };
        let left = fleet.filtered(&filter);
        let why = why_nothing_left(&fleet, &filter, &left).unwrap();
        assert!(
            why.starts_with(
                "no device on the 1 node(s) with accelerators is among products amd-mi300x; \
                 products there: nvidia-h100-80gb-hbm3"
            ),
            "{why}"
        );
        assert!(
            why.ends_with("; node(s) with no usable accelerator: cpu-1"),
            "{why}"
        );
    }

    #[test]
    fn a_fleet_with_accelerators_left_is_the_planners_to_explain() {
        let fleet = fleet(&[(H100, "gpu-1", &[])]);
        assert_eq!(
            why_nothing_left(&fleet, &DeviceFilter::default(), fleet.nodes()),
            None
        );
    }

    #[test]
    fn label_syntax_and_product_slugs_are_checked() {
        let selector = BTreeMap::from([
            ("pool".to_string(), "a".to_string()),
            ("bad key".to_string(), "ok".to_string()),
            ("k".to_string(), "bad\nvalue".to_string()),
        ]);
        let products = vec![
            "nvidia-h100-80gb-hbm3".to_string(),
            "NVIDIA H100".to_string(),
            String::new(),
        ];
        let reasons = invalid_constraints(&selector, &products);
        assert_eq!(reasons.len(), 4, "{reasons:#?}");
        assert!(reasons[0].contains("key \"bad key\""), "{}", reasons[0]);
        assert!(reasons[1].contains("\"bad\\nvalue\""), "{}", reasons[1]);
        assert!(
            reasons[2].contains("did you mean \"nvidia-h100\"?"),
            "{}",
            reasons[2]
        );
        assert!(
            reasons[3].contains("\"\" is not a product slug"),
            "{}",
            reasons[3]
        );
        assert!(invalid_constraints(&BTreeMap::new(), &["amd-mi300x".into()]).is_empty());
        // What a user typed is cut in the message.
        let long = "X".repeat(10_000);
        let reasons = invalid_constraints(&BTreeMap::new(), &[long]);
        assert!(reasons[0].len() < 400, "{}", reasons[0]);
    }
}
