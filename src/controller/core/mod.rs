//! The placement core: every decision the controller makes, as pure functions over plain
//! values — no client, no clock, no async. The driver around it (`reconcile.rs`, `apply.rs`,
//! `status.rs`) only reads caches, calls in here, and writes what comes out.
//!
//! | module | job |
//! |---|---|
//! | [`build`] | spec → planner request, plan → status |
//! | [`claims`] | which ResourceClaims hold a plan |
//! | [`claim_holdings`] | devices every allocated claim holds; claims that outlived their placement |
//! | [`fleet_figures`] | the fleet's numbers per node and product label, asked of `src/fleet`; unhealthy nodes |
//! | [`fleet_view`] | inventories → planner nodes, converted once per inventory version |
//! | [`health_taints`] | the health-taint mode, our Node taint, DeviceTaintRules |
//! | [`ledger`] | which placement holds which devices |
//! | [`decide`] | keep, plan or refuse one placement, older waiting placements first |
//! | [`desired`] | the status and conditions a decision leads to |
//! | [`labels`] | placement label keys and nodeSelectors |
//! | [`model_capacity`] | `--capacity-model`: replicas of chosen models the free devices hold |
//! | [`no_match`] | why no node is left for a placement; constraints that can never match |
//! | [`template`] | the planner's alternatives for a ResourceClaimTemplate |
//!
//! `tests/` and a unit test keep this module free of `kube`, `tokio` and `clap`.

pub mod build;
pub mod claim_holdings;
pub mod claims;
pub mod decide;
pub mod desired;
pub mod fleet_figures;
pub mod fleet_view;
pub mod health_taints;
pub mod labels;
pub mod ledger;
pub mod model_capacity;
pub mod no_match;
pub mod template;
