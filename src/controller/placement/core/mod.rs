//! The placement loop's pure core: every decision a reconcile makes, as pure functions over
//! plain values — no client, no clock, no async. The driver around it
//! ([`reconcile`](super::reconcile), [`apply`](super::apply), [`status`](super::status)) only
//! reads caches, calls in here, and writes what comes out.
//!
//! | module | job |
//! |---|---|
//! | [`plan_input`] | a spec's shapes and the API's enums → the planner's input; where the API meets the planner |
//! | [`request`] | spec → planner request, and the nodes it may use |
//! | [`evaluate`] | a spec on the fleet → its outcome: the one entry to planning |
//! | [`outcome`] | one request's plan → status |
//! | [`claims`] | which ResourceClaims hold a plan |
//! | [`conformance`] | do the pods that run a placement run its plan (ranks, image, memory arguments) |
//! | [`decide`] | keep, plan or refuse one placement, older waiting placements first |
//! | [`desired`] | the status and conditions a decision leads to |
//! | [`device_health`] | held devices that claims' `status.devices` or pods report unhealthy |
//! | [`labels`] | placement label keys and nodeSelectors |
//! | [`no_match`] | why no node is left for a placement; constraints that can never match |
//! | [`template`] | the planner's alternatives for a ResourceClaimTemplate |
//!
//! `tests/architecture.rs` keeps this module free of `kube`, `tokio` and `clap`.

pub mod claims;
pub mod conformance;
pub mod decide;
pub mod desired;
pub mod device_health;
pub mod evaluate;
pub mod labels;
pub mod no_match;
pub mod outcome;
pub mod plan_input;
pub mod request;
pub mod template;
