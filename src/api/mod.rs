//! The `hwaccel.io/v1alpha1` API: CRD types (kube derive + schemars), their conversions from
//! and to the core detection types, status-condition helpers, and the generated CRD YAML.
//!
//! Only this module and the ones that talk to a cluster import `kube`; the conversions depend
//! on the pure core (`hardware`, its `Report`, `labels` for product slugs), never the
//! other way round.

pub mod bounds;
pub mod conditions;
mod convert;
pub mod crds;
pub mod dra;
mod inventory;
pub mod lenient;
pub mod placement;
pub mod projection;
pub mod quantity;

pub use convert::{PlannerDeviceIds, planner_node_from_object};
pub use inventory::{
    AcceleratorInventory, AcceleratorInventorySpec, AcceleratorInventoryStatus, DeviceAttribute,
    InventoryCpu, InventoryDevice, InventoryNodeFacts, InventoryNumaNode, InventoryPartition,
    InventorySummary, MAX_ATTRIBUTE_STRING_LENGTH, MAX_ATTRIBUTES_AND_CAPACITIES, attribute,
    owner_reference_for_node,
};
pub use lenient::Lenient;
pub use placement::ModelPlacement;

/// The API group.
pub const GROUP: &str = "hwaccel.io";
/// The API version within the group.
pub const VERSION: &str = "v1alpha1";
/// `group/version`, as written in `apiVersion`.
pub const API_VERSION: &str = "hwaccel.io/v1alpha1";
