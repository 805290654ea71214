//! The health-taint loop (`--health-taints`): keeps unhealthy nodes' devices out of new
//! placements by the scheduler's own means. It runs inside each fleet pass, on that pass's
//! numbers. A thin driver around a pure [`core`].
//!
//! | module | job |
//! |---|---|
//! | [`core`] | the health-taint mode, our Node taint, DeviceTaintRules |
//! | `sync` | writes them: Node taints, DeviceTaintRules, dry-run Events |

pub mod core;
pub(crate) mod sync;

pub use self::core::HealthTaints;

use kube::core::{ApiResource, GroupVersionKind};

/// The API resource of DeviceTaintRules in `version` (`v1` or `v1beta2`), for a dynamic
/// `Api`. Here, not in [`core`], which names no kube type.
pub fn rules_resource(version: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(self::core::RULES_GROUP, version, "DeviceTaintRule"),
        "devicetaintrules",
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_rules_resource_names_the_version_asked_for() {
        for version in super::core::RULES_VERSIONS {
            let resource = super::rules_resource(version);
            assert_eq!(
                (resource.api_version.as_str(), resource.plural.as_str()),
                (
                    format!("resource.k8s.io/{version}").as_str(),
                    "devicetaintrules"
                )
            );
        }
    }
}
