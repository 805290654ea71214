//! Placement labels: the Node label that marks the nodes a ModelPlacement was given, and the
//! `nodeSelector` built from it. Pure.
//!
//! The key is `placement.hwaccel.io/<slug>` with the slug derived from `<namespace>.<name>`.
//! A namespace is a DNS label (no dots), so splitting at the first dot is unambiguous and two
//! placements never share a key unless a long slug's hash suffix collides. Label names are
//! limited to 63 characters: longer slugs keep a readable head and end in a hash of the full
//! `namespace/name`, the same way the agent shortens long product names.

use std::collections::{BTreeMap, BTreeSet};

use crate::controller::core::ledger::HeldNodes;
use crate::names::{MAX_LABEL_LENGTH, shorten_with_hash};

/// The prefix of every placement label; the controller writes no other Node label.
pub use crate::names::keys::PLACEMENT_LABEL_PREFIX;

/// The prefix of the role label on the nodes of a disaggregated placement's prefill pool.
pub use crate::names::keys::PREFILL_LABEL_PREFIX;

/// The prefix of the role label on the nodes of a disaggregated placement's decode pool.
pub use crate::names::keys::DECODE_LABEL_PREFIX;

pub use crate::names::keys::{OWNED_LABEL_PREFIXES, is_placement_label};

/// The value every placement label carries.
pub const PLACEMENT_LABEL_VALUE: &str = "true";

/// The placement label key for the placement `namespace/name`.
pub fn placement_label_key(namespace: &str, name: &str) -> String {
    let raw = format!("{namespace}.{name}");
    let slug = sanitise_name(&raw);
    let slug = if slug.len() > MAX_LABEL_LENGTH || slug != raw {
        // Anything changed or shortened carries a hash of the exact identity, so two
        // placements whose names differ only in characters we had to drop stay apart.
        shorten_with_hash(&slug, &format!("{namespace}/{name}"), MAX_LABEL_LENGTH)
    } else {
        slug
    };
    format!("{PLACEMENT_LABEL_PREFIX}{slug}")
}

/// A role label key of the placement `namespace/name`: `prefix` (one of
/// [`PREFILL_LABEL_PREFIX`], [`DECODE_LABEL_PREFIX`]) with the placement key's name, so the
/// three keys of one placement differ only in their prefix.
pub fn role_label_key(prefix: &str, namespace: &str, name: &str) -> String {
    let key = placement_label_key(namespace, name);
    let slug = key.strip_prefix(PLACEMENT_LABEL_PREFIX).unwrap_or(&key);
    format!("{prefix}{slug}")
}

/// The `nodeSelector` that selects exactly the nodes carrying a role label.
pub fn role_node_selector(prefix: &str, namespace: &str, name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(
        role_label_key(prefix, namespace, name),
        PLACEMENT_LABEL_VALUE.to_string(),
    )])
}

/// Keeps the characters a label name allows (`[A-Za-z0-9._-]`), trimmed so it starts and ends
/// with an alphanumeric character.
fn sanitise_name(raw: &str) -> String {
    let kept: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '-'
            }
        })
        .collect();
    kept.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The `nodeSelector` that selects exactly the nodes carrying the placement's label.
pub fn node_selector(namespace: &str, name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(
        placement_label_key(namespace, name),
        PLACEMENT_LABEL_VALUE.to_string(),
    )])
}

/// The complete set of placement labels each node should carry, from the nodes each
/// placement holds (`(namespace, name) -> nodes`): the placement key on all of them, and for
/// a disaggregated placement the role keys on each pool's (a node may carry both). Nodes
/// holding nothing are absent: the caller applies an empty set to them so their old labels
/// go by omission.
pub fn labels_by_node<'a>(
    holdings: impl IntoIterator<Item = (&'a str, &'a str, &'a HeldNodes)>,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut by_node: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut mark = |nodes: &BTreeSet<String>, key: &str| {
        for node in nodes {
            by_node
                .entry(node.clone())
                .or_default()
                .insert(key.to_string(), PLACEMENT_LABEL_VALUE.to_string());
        }
    };
    for (namespace, name, held) in holdings {
        mark(&held.all, &placement_label_key(namespace, name));
        if let Some((prefill, decode)) = &held.roles {
            mark(
                prefill,
                &role_label_key(PREFILL_LABEL_PREFIX, namespace, name),
            );
            mark(
                decode,
                &role_label_key(DECODE_LABEL_PREFIX, namespace, name),
            );
        }
    }
    by_node
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{is_valid_label_key, is_valid_label_value};

    #[test]
    fn short_names_stay_readable() {
        assert_eq!(
            placement_label_key("ml", "llama-70b"),
            "placement.hwaccel.io/ml.llama-70b"
        );
        assert!(is_valid_label_key(&placement_label_key("ml", "llama-70b")));
        assert!(is_valid_label_value(PLACEMENT_LABEL_VALUE));
    }

    #[test]
    fn long_names_are_shortened_valid_and_distinct() {
        let namespace = "n".repeat(63);
        let a = placement_label_key(&namespace, &format!("{}-a", "m".repeat(240)));
        let b = placement_label_key(&namespace, &format!("{}-b", "m".repeat(240)));
        for key in [&a, &b] {
            let name = key.strip_prefix(PLACEMENT_LABEL_PREFIX).unwrap();
            assert!(name.len() <= MAX_LABEL_LENGTH, "{key}");
            assert!(is_valid_label_key(key), "{key}");
        }
        assert_ne!(a, b);
    }

    #[test]
    fn namespace_and_name_cannot_be_confused() {
        // `a` + `b.c` and `a.b` + `c` would give the same raw slug; namespaces have no dots,
        // but the key must differ even for odd inputs, and it is stable.
        assert_ne!(
            placement_label_key("a", "b.c"),
            placement_label_key("a-b", "c")
        );
        assert_eq!(
            placement_label_key("a", "b.c"),
            placement_label_key("a", "b.c")
        );
        let odd = placement_label_key("ns", "weird_name.");
        assert!(is_valid_label_key(&odd), "{odd}");
    }

    #[test]
    fn selector_matches_exactly_the_labelled_nodes() {
        let first = HeldNodes::plain(["n1", "n2"].map(String::from).into());
        let second = HeldNodes::plain(["n2", "n3"].map(String::from).into());
        let by_node = labels_by_node([("ml", "a", &first), ("ml", "b", &second)]);
        let selector = node_selector("ml", "a");
        let selected: Vec<&str> = by_node
            .iter()
            .filter(|(_, labels)| selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
            .map(|(node, _)| node.as_str())
            .collect();
        assert_eq!(selected, ["n1", "n2"]);
        assert_eq!(by_node["n2"].len(), 2);
        assert!(by_node.keys().all(|n| n != "n4"));
        assert!(by_node["n1"].keys().all(|k| is_placement_label(k)));
    }

    #[test]
    fn role_labels_mark_each_pool_and_share_the_placement_slug() {
        let nodes = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        let held = HeldNodes {
            all: nodes(&["p1", "both", "d1"]),
            roles: Some((nodes(&["p1", "both"]), nodes(&["both", "d1"]))),
        };
        let by_node = labels_by_node([("ml", "llama", &held)]);
        let prefill = role_node_selector(PREFILL_LABEL_PREFIX, "ml", "llama");
        let decode = role_node_selector(DECODE_LABEL_PREFIX, "ml", "llama");
        let whole = node_selector("ml", "llama");
        let selected = |selector: &BTreeMap<String, String>| -> Vec<&str> {
            by_node
                .iter()
                .filter(|(_, labels)| selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
                .map(|(node, _)| node.as_str())
                .collect()
        };
        assert_eq!(selected(&prefill), ["both", "p1"]);
        assert_eq!(selected(&decode), ["both", "d1"]);
        assert_eq!(selected(&whole), ["both", "d1", "p1"]);
        assert_eq!(
            role_label_key(PREFILL_LABEL_PREFIX, "ml", "llama"),
            "prefill.placement.hwaccel.io/ml.llama"
        );
        for labels in by_node.values() {
            for key in labels.keys() {
                assert!(is_placement_label(key), "{key}");
                assert!(is_valid_label_key(key), "{key}");
            }
        }
        // A long name's role key is as valid as its placement key.
        let long = role_label_key(DECODE_LABEL_PREFIX, &"n".repeat(63), &"m".repeat(250));
        assert!(is_valid_label_key(&long), "{long}");
        assert!(!is_placement_label("hwaccel.io/product"));
        assert!(!is_placement_label("xprefill.placement.hwaccel.io/a"));
    }
}
