//! Test support shared by the unit tests, the integration tests under `tests/` (as
//! `hwaccel::testing`) and the benches: builders for the three things nearly every test of
//! the controller, the labeller or the CRDs starts from.
//!
//! | module | builds |
//! |---|---|
//! | [`report`] | detection reports: hand-built nodes and [`report::ReportBuilder`] |
//! | [`fixture`] | reports detected from the fixture hosts under `fixtures/hosts/` |
//! | [`inventory`] | AcceleratorInventories from either, one node or a fleet |
//! | [`placement`] | ModelPlacements: [`placement::PlacementBuilder`] |
//! | [`golden`] | golden-file comparison |
//! | [`dra`] | vendor-shaped ResourceSlices from `fixtures/dra/` |
//! | `arbitrary` | proptest strategies (unit tests only: proptest is a dev-dependency) |
//!
//! Compiled for `cfg(test)` and under the `test-support` feature, which the crate's own
//! dev-dependency on itself turns on for tests and benches; a normal build leaves it out
//! (docs/decisions/0006-test-support-feature.md).

// Test helpers fail loudly on broken setup: a panic names the fixture or file at fault.
#![allow(clippy::expect_used)]

#[cfg(test)]
pub mod arbitrary;
pub mod dra;
pub mod fixture;
pub mod golden;
pub mod inventory;
pub mod placement;
pub mod report;

pub use inventory::{InventoryBuilder, fixture_inventory};
pub use placement::PlacementBuilder;
pub use report::ReportBuilder;
