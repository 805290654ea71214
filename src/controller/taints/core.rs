//! What health taints look like: the mode (`none`, `dryRun`, `enforce`), the Node taint
//! `hwaccel.io/devices-unhealthy=<reason>:NoSchedule` edited into a Node's taint list
//! without touching anyone else's, and one DRA DeviceTaintRule per unhealthy device, in the
//! newest `resource.k8s.io` version the apiserver serves it in ([`rules_version`]).
//!
//! Pure: the driver (`sync.rs`, beside it) decides when to call these and writes
//! what they return.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::Taint;
// The rule is built with the `v1beta2` types because the k8s-openapi feature this crate
// compiles (`v1_36`) has no `resource.k8s.io/v1` DeviceTaintRule (GA in 1.37). Both versions
// have exactly the same fields (k8s.io/api v0.37 `resource/v1` and `resource/v1beta2`
// `types.go`), so one body serves either: [`rule_document`] stamps the version that is served.
use k8s_openapi::api::resource::v1beta2::{
    DeviceTaint, DeviceTaintRule, DeviceTaintRuleSpec, DeviceTaintSelector,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::dra::DeviceRef;

/// The label on every DeviceTaintRule the controller writes (value `hwaccel-controller`),
/// so it lists and deletes only its own.
pub use crate::names::keys::MANAGED_BY_LABEL;
/// The key of the Node taint and of every DeviceTaintRule's taint.
pub use crate::names::keys::TAINT_KEY;
/// That label's value.
pub const MANAGED_BY: &str = "hwaccel-controller";
/// The label naming the scope of the controller that wrote a DeviceTaintRule: `all` for a
/// controller watching every node, else a hash of its `--selector`. Each controller lists,
/// keeps and deletes only its own scope's rules, so a canary never deletes the fleet's.
pub use crate::names::keys::SCOPE_LABEL;
/// The scope of a controller watching every node.
pub const WHOLE_CLUSTER: &str = "all";
/// Longest object name (DNS subdomain).
const MAX_NAME: usize = 253;
/// The API group of DeviceTaintRules.
pub const RULES_GROUP: &str = "resource.k8s.io";
/// The versions of `resource.k8s.io` that may serve DeviceTaintRules, in the order they are
/// preferred: `v1` (GA and on by default since Kubernetes 1.37), then `v1beta2` (1.36, or 1.37
/// with `--runtime-config=resource.k8s.io/v1beta2=true`, behind the DRADeviceTaintRules gate).
pub const RULES_VERSIONS: [&str; 2] = ["v1", "v1beta2"];

/// The version DeviceTaintRules are written in: the first of [`RULES_VERSIONS`] that
/// `serves` says the apiserver serves them in; `None` when neither does (Node taints then).
pub fn rules_version(serves: impl Fn(&str) -> bool) -> Option<&'static str> {
    RULES_VERSIONS.into_iter().find(|version| serves(version))
}

/// `rule` as the body of a server-side apply in `version` (the fields are the same in every
/// served version; only `apiVersion` differs).
pub fn rule_document(rule: &DeviceTaintRule, version: &str) -> serde_json::Value {
    let mut body = serde_json::to_value(rule).unwrap_or_default();
    body["apiVersion"] = format!("{RULES_GROUP}/{version}").into();
    body["kind"] = "DeviceTaintRule".into();
    body
}

/// The taint effect of a DeviceTaintRule read back as JSON (any served version), if it has one.
pub fn rule_effect(rule: &serde_json::Value) -> Option<&str> {
    rule.pointer("/spec/taint/effect")?.as_str()
}

/// What the controller does about unhealthy nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HealthTaints {
    /// Nothing beyond conditions, Events and metrics.
    #[default]
    None,
    /// Report what would be tainted: DeviceTaintRules with effect `None` where DRA serves
    /// them, otherwise an Event listing the pods on the node; scheduling never changes.
    DryRun,
    /// Taint: DeviceTaintRules with effect `NoSchedule`, or the Node taint without them.
    Enforce,
}

impl HealthTaints {
    /// The DeviceTaintRule effect for this mode; `None` (the Rust one) when nothing is
    /// written.
    pub fn rule_effect(self) -> Option<&'static str> {
        match self {
            Self::None => None,
            Self::DryRun => Some("None"),
            Self::Enforce => Some("NoSchedule"),
        }
    }
}

impl fmt::Display for HealthTaints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::DryRun => "dryRun",
            Self::Enforce => "enforce",
        })
    }
}

/// A mode name that is not `none`, `dryRun` or `enforce`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("health taints must be none, dryRun or enforce, not {0:?}")]
pub struct UnknownMode(String);

impl FromStr for HealthTaints {
    type Err = UnknownMode;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "none" => Ok(Self::None),
            "dryRun" => Ok(Self::DryRun),
            "enforce" => Ok(Self::Enforce),
            other => Err(UnknownMode(other.chars().take(32).collect())),
        }
    }
}

/// The taint list `current` should become: ours set to `reason` (when `Some`) or removed
/// (when `None`); every other taint kept as it is, in its place. `None` when nothing
/// changes, so the caller writes nothing.
pub fn edited_taints(current: &[Taint], reason: Option<&str>) -> Option<Vec<Taint>> {
    let ours = current.iter().find(|t| t.key == TAINT_KEY);
    match (ours, reason) {
        (None, None) => None,
        (Some(taint), Some(reason))
            if taint.value.as_deref() == Some(reason) && taint.effect == "NoSchedule" =>
        {
            None
        }
        (_, None) => Some(
            current
                .iter()
                .filter(|t| t.key != TAINT_KEY)
                .cloned()
                .collect(),
        ),
        (_, Some(reason)) => {
            let mut next: Vec<Taint> = current
                .iter()
                .filter(|t| t.key != TAINT_KEY)
                .cloned()
                .collect();
            next.push(node_taint(reason));
            Some(next)
        }
    }
}

/// The Node taint for `reason`.
pub fn node_taint(reason: &str) -> Taint {
    Taint {
        key: TAINT_KEY.to_string(),
        value: Some(reason.to_string()),
        effect: "NoSchedule".to_string(),
        time_added: None,
    }
}

/// The name of the DeviceTaintRule for `device` (its inventory name) on `node`:
/// `hwaccel-<node>-<device>`, cut to a valid name, always followed by a hash of the pair.
///
/// The readable part alone is not unique: `node-a` + `gpu-x` and `node-a-gpu` + `x` join to
/// the same text, and the second sick device would then get no rule of its own, silently. The
/// hash is taken over the two parts with a separator that neither a node nor a device name can
/// hold, and SHA-256 (cut to 64 bits) so that an agent choosing its device names cannot aim at
/// another node's rule.
pub fn rule_name(node: &str, device: &str) -> String {
    let raw = format!("hwaccel-{node}-{device}").to_ascii_lowercase();
    let clean: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let hash = pair_hash(node, device);
    let keep = MAX_NAME - hash.len() - 1;
    let head: String = clean.chars().take(keep).collect();
    format!("{}-{hash}", head.trim_end_matches(['-', '.']))
}

/// The first 16 hex digits of SHA-256 over `node`, a newline and `device`.
fn pair_hash(node: &str, device: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(node.as_bytes())
        .chain_update(b"\n")
        .chain_update(device.as_bytes())
        .finalize();
    digest
        .iter()
        .take(8)
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The scope label value of a controller with `selector` (see [`SCOPE_LABEL`]).
pub fn scope_of(selector: Option<&str>) -> String {
    match selector {
        None => WHOLE_CLUSTER.to_string(),
        Some(selector) => format!("{:016x}", fnv1a(selector.as_bytes())),
    }
}

/// Whether a rule of ours with `labels` belongs to the controller of `scope`: its scope label
/// says so, or the controller watches every node and the rule has no scope label (written
/// before scopes existed, so by a controller watching every node).
pub fn in_scope(labels: Option<&BTreeMap<String, String>>, scope: &str) -> bool {
    match labels.and_then(|l| l.get(SCOPE_LABEL)) {
        Some(label) => label == scope,
        None => scope == WHOLE_CLUSTER,
    }
}

/// The DeviceTaintRule for one unhealthy device DRA publishes as `device`, written by the
/// controller of `scope`.
pub fn device_taint_rule(
    node: &str,
    inventory_device: &str,
    device: &DeviceRef,
    (reason, effect): (&str, &str),
    scope: &str,
) -> DeviceTaintRule {
    DeviceTaintRule {
        metadata: ObjectMeta {
            name: Some(rule_name(node, inventory_device)),
            labels: Some(
                [
                    (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
                    (SCOPE_LABEL.to_string(), scope.to_string()),
                ]
                .into_iter()
                .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: DeviceTaintRuleSpec {
            device_selector: Some(DeviceTaintSelector {
                driver: Some(device.driver.clone()),
                pool: Some(device.pool.clone()),
                device: Some(device.device.clone()),
            }),
            taint: DeviceTaint {
                key: TAINT_KEY.to_string(),
                value: Some(reason.to_string()),
                effect: effect.to_string(),
                time_added: None,
            },
        },
        status: None,
    }
}

/// FNV-1a, 64 bits: stable across builds and platforms (std's hasher is not).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.to_string(),
            value: Some(value.to_string()),
            effect: effect.to_string(),
            time_added: None,
        }
    }

    #[test]
    fn rules_go_to_v1_first_then_v1beta2_then_nowhere() {
        assert_eq!(rules_version(|_| true), Some("v1"));
        assert_eq!(rules_version(|v| v == "v1"), Some("v1"));
        assert_eq!(rules_version(|v| v == "v1beta2"), Some("v1beta2"));
        assert_eq!(rules_version(|v| v == "v1alpha3"), None);
        assert_eq!(rules_version(|_| false), None);
    }

    #[test]
    fn one_rule_body_is_written_in_whichever_version_is_served() {
        let device = DeviceRef {
            driver: "gpu.nvidia.com".into(),
            pool: "node-a".into(),
            device: "gpu-0".into(),
        };
        let rule = device_taint_rule(
            "node-a",
            "gpu-0",
            &device,
            ("DeviceUnhealthy", "NoSchedule"),
            "all",
        );
        for version in RULES_VERSIONS {
            let body = rule_document(&rule, version);
            assert_eq!(body["apiVersion"], format!("resource.k8s.io/{version}"));
            assert_eq!(body["kind"], "DeviceTaintRule");
            assert_eq!(body["spec"]["deviceSelector"]["device"], "gpu-0");
            assert_eq!(rule_effect(&body), Some("NoSchedule"));
        }
        assert_eq!(rule_effect(&serde_json::json!({"spec": {}})), None);
    }

    #[test]
    fn modes_parse_and_print_as_the_flag_spells_them() {
        for mode in [
            HealthTaints::None,
            HealthTaints::DryRun,
            HealthTaints::Enforce,
        ] {
            assert_eq!(mode.to_string().parse::<HealthTaints>(), Ok(mode));
        }
        assert!("Enforce".parse::<HealthTaints>().is_err());
        assert_eq!(HealthTaints::DryRun.rule_effect(), Some("None"));
        assert_eq!(HealthTaints::Enforce.rule_effect(), Some("NoSchedule"));
        assert_eq!(HealthTaints::None.rule_effect(), None);
    }

    #[test]
    fn our_taint_is_added_changed_and_removed_without_touching_others() {
        let other = taint("example.com/maintenance", "x", "NoExecute");
        let added =
            edited_taints(std::slice::from_ref(&other), Some("DevicesMissing")).expect("a change");
        assert_eq!(added, vec![other.clone(), node_taint("DevicesMissing")]);
        assert_eq!(edited_taints(&added, Some("DevicesMissing")), None);
        let changed = edited_taints(&added, Some("DeviceUnhealthy")).expect("a change");
        assert_eq!(changed, vec![other.clone(), node_taint("DeviceUnhealthy")]);
        let removed = edited_taints(&changed, None).expect("a change");
        assert_eq!(removed, vec![other.clone()]);
        assert_eq!(edited_taints(&removed, None), None);
    }

    #[test]
    fn a_rule_selects_exactly_the_published_device_with_the_modes_effect() {
        let device = DeviceRef {
            driver: "gpu.nvidia.com".to_string(),
            pool: "node-a".to_string(),
            device: "gpu-3".to_string(),
        };
        let rule = device_taint_rule(
            "node-a",
            "nvidia-3",
            &device,
            ("DeviceUnhealthy", "None"),
            WHOLE_CLUSTER,
        );
        let name = rule.metadata.name.as_deref().unwrap_or_default();
        assert!(name.starts_with("hwaccel-node-a-nvidia-3-"), "{name}");
        assert_eq!(
            rule.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MANAGED_BY_LABEL))
                .map(String::as_str),
            Some(MANAGED_BY)
        );
        let selector = rule.spec.device_selector.expect("a selector");
        assert_eq!(selector.driver.as_deref(), Some("gpu.nvidia.com"));
        assert_eq!(selector.pool.as_deref(), Some("node-a"));
        assert_eq!(selector.device.as_deref(), Some("gpu-3"));
        assert_eq!(rule.spec.taint.effect, "None");
        assert_eq!(rule.spec.taint.key, TAINT_KEY);
    }

    #[test]
    fn each_scope_owns_only_its_rules() {
        let canary = scope_of(Some("pool=canary"));
        assert_ne!(canary, scope_of(Some("pool=other")));
        assert_eq!(canary, scope_of(Some("pool=canary")));
        assert!(canary.len() <= 63 && canary.chars().all(|c| c.is_ascii_hexdigit()));
        let labels = |scope: Option<&str>| {
            let mut labels =
                BTreeMap::from([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())]);
            if let Some(scope) = scope {
                labels.insert(SCOPE_LABEL.to_string(), scope.to_string());
            }
            labels
        };
        assert!(in_scope(Some(&labels(Some(&canary))), &canary));
        assert!(!in_scope(Some(&labels(Some(&canary))), WHOLE_CLUSTER));
        assert!(!in_scope(Some(&labels(Some(WHOLE_CLUSTER))), &canary));
        // Rules from before scopes belong to the whole-cluster controller only.
        assert!(in_scope(Some(&labels(None)), WHOLE_CLUSTER));
        assert!(!in_scope(Some(&labels(None)), &canary));
        assert!(!in_scope(None, &canary));
    }

    #[test]
    fn names_that_join_to_the_same_text_stay_apart() {
        // Before the hash was always there, both were `hwaccel-node-a-gpu-0000-d1`.
        let a = rule_name("node-a", "gpu-0000-d1");
        let b = rule_name("node-a-gpu", "0000-d1");
        assert_ne!(a, b);
        assert!(a.starts_with("hwaccel-node-a-gpu-0000-d1-"), "{a}");
        for name in [&a, &b] {
            assert!(name.len() <= MAX_NAME);
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
        }
        // Stable: the controller finds its rules again after a restart.
        assert_eq!(a, rule_name("node-a", "gpu-0000-d1"));
    }

    #[test]
    fn long_or_odd_names_are_cut_valid_and_kept_apart() {
        let long = "n".repeat(300);
        let a = rule_name(&long, "gpu-0");
        let b = rule_name(&long, "gpu-1");
        assert!(a.len() <= MAX_NAME && b.len() <= MAX_NAME);
        assert_ne!(a, b);
        let odd = rule_name("Node_A", "gpu:0");
        assert!(
            odd.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'),
            "{odd}"
        );
    }
}
