//! The ModelPlacement controller.

pub mod build;
pub mod labels;
pub mod ledger;
pub mod metrics;
pub mod reconcile;
