//! The fleet loop's pure core: the numbers one fleet pass publishes, as pure functions over
//! the inventories and who holds which device — no client, no clock, no async.
//!
//! | module | job |
//! |---|---|
//! | [`fleet_figures`] | the fleet's numbers per node and product label, asked of `src/fleet` (the one device-state rule), never counted here; unhealthy nodes |
//! | [`model_capacity`] | `--capacity-model`: replicas of chosen models the free devices hold |
//!
//! `tests/architecture.rs` keeps this module free of `kube`, `tokio` and `clap`.

pub mod fleet_figures;
pub mod model_capacity;
