//! The `hwaccel.io/v1alpha1` API: CRD types (kube derive + schemars), their conversions from
//! and to the core detection types, status-condition helpers, and the generated CRD YAML.
//!
//! Only this module and the ones that talk to a cluster import `kube`; the conversions depend
//! on the pure core (`hardware`, its `Report`, `labels` for product slugs), never the
//! other way round.

/// The static half of `kube::Resource` for a wrapper around a kind `K` (`Lenient<K>`,
/// `Projected<K>`): the wrapper is listed and watched as `K` itself.
macro_rules! wrapper_resource_statics {
    () => {
        type DynamicType = ();
        type Scope = K::Scope;

        fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
            K::kind(dt)
        }

        fn group(dt: &()) -> std::borrow::Cow<'_, str> {
            K::group(dt)
        }

        fn version(dt: &()) -> std::borrow::Cow<'_, str> {
            K::version(dt)
        }

        fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
            K::plural(dt)
        }
    };
}
pub(crate) use wrapper_resource_statics;

pub mod bounds;
pub mod conditions;
mod convert;
pub mod crds;
mod device_ref;
mod inventory;
pub mod lenient;
pub mod placement;
pub mod projection;
pub mod quantity;

pub use device_ref::DeviceRef;
pub use inventory::{
    AcceleratorInventory, AcceleratorInventorySpec, AcceleratorInventoryStatus, DeviceAttribute,
    InventoryCpu, InventoryDevice, InventoryNodeFacts, InventoryNumaNode, InventoryPartition,
    InventorySummary, MAX_ATTRIBUTE_STRING_LENGTH, MAX_ATTRIBUTES_AND_CAPACITIES, attribute,
    owner_reference_for_node,
};
pub use lenient::Lenient;
pub use placement::ModelPlacement;

/// The API group.
pub const GROUP: &str = crate::names::keys::DOMAIN;
/// The API version within the group.
pub const VERSION: &str = "v1alpha1";
/// `group/version`, as written in `apiVersion`.
pub const API_VERSION: &str = crate::names::keys::API_VERSION;

#[cfg(test)]
mod tests {
    use kube::Resource as _;

    use super::*;

    /// The `group = "..."` in the CRD derives must be a literal; it is checked against the
    /// registry here instead.
    #[test]
    fn the_crds_are_in_the_registered_domain() {
        assert_eq!(ModelPlacement::group(&()), crate::names::keys::DOMAIN);
        assert_eq!(AcceleratorInventory::group(&()), crate::names::keys::DOMAIN);
        assert_eq!(ModelPlacement::api_version(&()), API_VERSION);
        assert_eq!(AcceleratorInventory::api_version(&()), API_VERSION);
    }
}
