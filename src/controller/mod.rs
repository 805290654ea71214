//! The ModelPlacement controller.

pub mod labels;
pub mod ledger;
