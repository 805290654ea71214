//! The fleet loop's pure core — no client, no clock, no async. The numbers one fleet pass
//! publishes are counted in the shared core (`controller::core::fleet_figures`), since the
//! taint loop reads them too.
//!
//! | module | job |
//! |---|---|
//! | [`model_capacity`] | `--capacity-model`: replicas of chosen models the free devices hold |
//! | [`node_stats`] | each node's numbers kept between passes, counted again only where their inputs changed |
//!
//! `tests/architecture.rs` keeps this module free of `kube`, `tokio` and `clap`.

pub mod model_capacity;
pub mod node_stats;
