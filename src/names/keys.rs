//! Every name the operator writes on the wire and others match on: label and annotation keys,
//! label prefixes, the finalizer, the taint key, the DRA driver and class domain, the API
//! version and the field managers, each built from the one domain.
//!
//! The admission policies in the chart match on these strings, dashboards and users'
//! nodeSelectors on the labels, kubectl users on the finalizer: a key renamed in one file and
//! not in another is a silent break. So the keys live here only (`tests/architecture.rs`
//! refuses a `hwaccel.io` string literal anywhere else in `src/` outside tests, and checks that
//! the chart's admission policies name only keys listed in [`ALL`]); the modules that use one
//! re-export it under the name their readers know.

/// The domain, as a literal for `concat!`.
macro_rules! domain {
    () => {
        "hwaccel.io"
    };
}

/// `hwaccel.io/<name>`.
macro_rules! key {
    ($name:literal) => {
        concat!(domain!(), "/", $name)
    };
}

/// The API group, the DRA driver name of the agent's own slices, the domain of the device
/// classes and of their extended resources.
pub const DOMAIN: &str = domain!();

/// The end of the name of the ResourceSlice an agent publishes for its node
/// (`<node>-hwaccel.io`), which the agent-slices admission policy checks.
pub const OWN_SLICE_SUFFIX: &str = concat!("-", domain!());

/// `apiVersion` of the operator's CRDs.
pub const API_VERSION: &str = concat!(domain!(), "/v1alpha1");

/// The prefix of every Node label the agent writes (`hwaccel.io/product`, ...), and of the
/// label and annotation keys below.
pub const LABEL_PREFIX: &str = key!("");

/// Node label: `true` while devices the node is expected to have are missing (agent).
pub const DEVICES_MISSING_LABEL: &str = key!("devices-missing");

/// Node annotation: the accelerator count an operator expects on the node (read, not
/// written).
pub const EXPECTED_DEVICES_ANNOTATION: &str = key!("expected-devices");

/// Node label prefix of a placement's nodes (`placement.hwaccel.io/<namespace>.<name>`,
/// controller).
pub const PLACEMENT_LABEL_PREFIX: &str = concat!("placement.", domain!(), "/");

/// Node label prefix of a disaggregated placement's prefill nodes.
pub const PREFILL_LABEL_PREFIX: &str = concat!("prefill.placement.", domain!(), "/");

/// Node label prefix of a disaggregated placement's decode nodes.
pub const DECODE_LABEL_PREFIX: &str = concat!("decode.placement.", domain!(), "/");

/// Every Node label prefix the controller owns (the chart's admission policy lists the same).
pub const OWNED_LABEL_PREFIXES: [&str; 3] = [
    PLACEMENT_LABEL_PREFIX,
    PREFILL_LABEL_PREFIX,
    DECODE_LABEL_PREFIX,
];

/// Whether `key` is a Node label the controller owns (under one of
/// [`OWNED_LABEL_PREFIXES`]); every loop and watch that tells ours from others' asks this.
pub fn is_placement_label(key: &str) -> bool {
    OWNED_LABEL_PREFIXES
        .iter()
        .any(|prefix| key.starts_with(prefix))
}

/// The finalizer on a ModelPlacement that releases its labels and claims.
pub const PLACEMENT_FINALIZER: &str = key!("placement-cleanup");

/// Label on ResourceClaims and ResourceClaimTemplates: the placement they belong to.
pub const PLACEMENT_LABEL: &str = key!("placement");

/// Label on a placement's ResourceClaims: the replica index.
pub const REPLICA_LABEL: &str = key!("replica");

/// Label on a placement's ResourceClaims: the pipeline stage index.
pub const STAGE_LABEL: &str = key!("stage");

/// Annotation on a placement's ResourceClaims: the node the claim's devices are on.
pub const NODE_ANNOTATION: &str = key!("node");

/// Annotation on a ResourceClaimTemplate: the hash of the spec the controller wrote.
pub const SPEC_HASH_ANNOTATION: &str = key!("spec-hash");

/// Annotation on the chart's DeviceClasses: what the class selects, in words.
pub const DESCRIPTION_ANNOTATION: &str = key!("description");

/// The Node taint the controller sets on a node with unhealthy devices.
pub const TAINT_KEY: &str = key!("devices-unhealthy");

/// Label on DeviceTaintRules the controller owns.
pub const MANAGED_BY_LABEL: &str = key!("managed-by");

/// Label on DeviceTaintRules: the namespace scope of the controller that wrote them.
pub const SCOPE_LABEL: &str = key!("scope");

/// Field manager of the agent's Node labels and inventories.
pub const AGENT_FIELD_MANAGER: &str = "hwaccel-agent";

/// Field manager of the agent's vendor-compatible labels.
pub const COMPAT_LABELS_FIELD_MANAGER: &str = "hwaccel-compat-labels";

/// Field manager (and Event reporter) of the controller.
pub const CONTROLLER_FIELD_MANAGER: &str = "hwaccel-controller";

/// What a wire name is, for the checks each kind must pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A label, annotation, finalizer or taint key: a qualified name.
    Key,
    /// The start of keys: a DNS subdomain and `/`.
    Prefix,
    /// A DNS subdomain (API group, driver, class and resource domain).
    Domain,
    /// `group/version`.
    ApiVersion,
    /// A field manager (free text, at most 128 bytes).
    FieldManager,
    /// The end of an object name (a node's name and this make a DNS subdomain).
    NameSuffix,
}

/// Every name above, with its kind.
pub const ALL: &[(&str, Kind)] = &[
    (DOMAIN, Kind::Domain),
    (API_VERSION, Kind::ApiVersion),
    (OWN_SLICE_SUFFIX, Kind::NameSuffix),
    (LABEL_PREFIX, Kind::Prefix),
    (DEVICES_MISSING_LABEL, Kind::Key),
    (EXPECTED_DEVICES_ANNOTATION, Kind::Key),
    (PLACEMENT_LABEL_PREFIX, Kind::Prefix),
    (PREFILL_LABEL_PREFIX, Kind::Prefix),
    (DECODE_LABEL_PREFIX, Kind::Prefix),
    (PLACEMENT_FINALIZER, Kind::Key),
    (PLACEMENT_LABEL, Kind::Key),
    (REPLICA_LABEL, Kind::Key),
    (STAGE_LABEL, Kind::Key),
    (NODE_ANNOTATION, Kind::Key),
    (SPEC_HASH_ANNOTATION, Kind::Key),
    (DESCRIPTION_ANNOTATION, Kind::Key),
    (TAINT_KEY, Kind::Key),
    (MANAGED_BY_LABEL, Kind::Key),
    (SCOPE_LABEL, Kind::Key),
    (AGENT_FIELD_MANAGER, Kind::FieldManager),
    (COMPAT_LABELS_FIELD_MANAGER, Kind::FieldManager),
    (CONTROLLER_FIELD_MANAGER, Kind::FieldManager),
];

/// Whether `text` is a name in [`ALL`], or a key under one of its prefixes.
pub fn is_registered(text: &str) -> bool {
    ALL.iter().any(|(name, kind)| match kind {
        Kind::Prefix => text == *name || text.starts_with(name),
        Kind::NameSuffix => text == *name || text.ends_with(name),
        _ => text == *name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{is_valid_dns_subdomain, is_valid_label_key};

    #[test]
    fn every_name_passes_the_rules_of_its_kind() {
        for (name, kind) in ALL {
            let valid = match kind {
                Kind::Key => is_valid_label_key(name),
                Kind::Prefix => {
                    name.strip_suffix('/').is_some_and(is_valid_dns_subdomain)
                        && is_valid_label_key(&format!("{name}x"))
                }
                Kind::Domain => is_valid_dns_subdomain(name),
                Kind::ApiVersion => name
                    .split_once('/')
                    .is_some_and(|(group, version)| group == DOMAIN && !version.is_empty()),
                Kind::FieldManager => !name.is_empty() && name.len() <= 128,
                Kind::NameSuffix => is_valid_dns_subdomain(&format!("node-a{name}")),
            };
            assert!(valid, "{name:?} is not a valid {kind:?}");
        }
    }

    #[test]
    fn every_key_is_built_from_the_one_domain() {
        for (name, kind) in ALL {
            if *kind != Kind::FieldManager {
                assert!(name.contains(DOMAIN), "{name}");
            }
        }
        let names: Vec<&str> = ALL.iter().map(|(name, _)| *name).collect();
        let unique: std::collections::BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(unique.len(), names.len(), "a name is listed twice");
    }

    #[test]
    fn registered_means_listed_or_under_a_listed_prefix() {
        assert!(is_registered("hwaccel.io/placement-cleanup"));
        assert!(is_registered("placement.hwaccel.io/ml.llama"));
        assert!(is_registered("hwaccel.io/product"));
        assert!(!is_registered(
            "hwaccel.io".replace("hwaccel", "hwaccelx").as_str()
        ));
        assert!(!is_registered("example.com/placement"));
    }
}
