//! The node agent: detect, then publish node labels and the node's AcceleratorInventory.

pub mod hotplug;
pub mod metrics;
pub mod node_labels;
pub mod presence;
