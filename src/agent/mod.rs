//! The node agent: detect, then publish node labels and the node's AcceleratorInventory.
//!
//! [`run::Agent`] does one cycle (detect → debounce → publish where changed) and
//! [`run::run`] loops it on an interval and on hot-plug. The pieces are separate so each can be
//! tested alone: [`presence`] (pure debouncing), [`node_labels`] (server-side apply of labels),
//! [`hotplug`] (device-directory fingerprint), [`own_slice`] (the opt-in `hwaccel.io`
//! ResourceSlice), [`devices_missing`] (expected versus present devices), [`host_mounts`]
//! (host mounts left writable by the runtime), [`compat_labels`] (the opt-in vendor labels
//! other tools read), [`watched`] and [`own_objects`] (the watches of the agent's own Node
//! and slices that a steady cycle reads instead of the API), [`metrics`].

pub mod compat_labels;
pub mod devices_missing;
pub mod dra_labels;
pub mod host_mounts;
pub mod hotplug;
pub mod metrics;
pub mod node_labels;
pub mod own_objects;
pub mod own_slice;
pub mod presence;
pub mod run;
#[cfg(test)]
mod run_tests;
pub mod watched;

pub use run::{Agent, AgentConfig, FIELD_MANAGER, PublishOutcome};
