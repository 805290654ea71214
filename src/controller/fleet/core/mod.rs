//! The fleet loop's pure core: the numbers one fleet pass publishes, as pure functions over
//! the inventories and the ledger — no client, no clock, no async.
//!
//! | module | job |
//! |---|---|
//! | [`fleet_stats`] | devices, healthy, reserved, free per node and product; unhealthy nodes |
//! | [`model_capacity`] | `--capacity-model`: replicas of chosen models the free devices hold |
//!
//! `tests/architecture.rs` keeps this module free of `kube`, `tokio` and `clap`.

pub mod fleet_stats;
pub mod model_capacity;
