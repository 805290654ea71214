//! The pure core every loop shares: the planner's view of the fleet. Pure functions over plain
//! values — no client, no clock, no async. Each loop keeps its own pure core beside its driver
//! ([`placement::core`](super::placement::core), [`fleet::core`](super::fleet::core),
//! [`taints::core`](super::taints::core)); what more than one loop reads lives here.
//!
//! | module | job |
//! |---|---|
//! | [`claim_holdings`] | devices every allocated claim holds, whoever holds it; claims that outlived their placement |
//! | [`counter_book`] | DRA counter sets in planner ids: which devices what the ledger holds leaves no room for |
//! | [`fleet_figures`] | the fleet's numbers per node and product label, asked of `src/fleet` (the one device-state rule), never counted here; unhealthy nodes. The fleet loop publishes them and hands them to the taint loop |
//! | [`fleet_view`] | inventories → planner nodes, converted once per inventory version |
//! | [`ledger`] | which placement holds which devices; devices held outside it; refusals remembered |
//! | [`outcome`] | what planning a placement concluded, as plain data |
//! | [`placement_key`] | a placement's identity, `namespace/name` |
//! | [`step`] | the steps of a reconcile that can fail, named once for metrics, Events and logs |
//!
//! `tests/architecture.rs` keeps this module and every loop's core free of `kube`, `tokio`
//! and `clap`.

pub mod claim_holdings;
pub mod counter_book;
pub mod fleet_figures;
pub mod fleet_view;
pub mod ledger;
pub mod outcome;
pub mod placement_key;
pub mod step;
