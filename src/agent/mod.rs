//! The node agent: detect, then publish node labels and the node's AcceleratorInventory.

pub mod presence;
