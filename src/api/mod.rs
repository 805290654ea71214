//! Custom resource types of the `hwaccel.io/v1alpha1` API.

pub mod placement;

pub use placement::ModelPlacement;
