//! hwaccel-operator: finds every AI accelerator on every Kubernetes node and decides where and
//! how a model should run on them.
//!
//! The crate is one library behind one binary, `hwaccel`. Its modules split along one line:
//! the pure core never imports `kube`, and only the Kubernetes-facing modules do.
//!
//! | module | job | talks to Kubernetes |
//! |---|---|---|
//! | [`hardware`] | accelerator types, precisions, device profile | no |
//! | [`detect`] | backends over a host view, merged into a report | no |
//! | [`plan`] | model memory, precision and parallelism search, placement | no |
//! | [`labels`] | report to node labels | no |
//! | [`api`] | CRD types | types only |
//! | [`agent`] | node loop: detect, label, publish the inventory | yes |
//! | [`controller`] | ModelPlacement reconciler | yes |
//!
//! `testing` (builders for reports, inventories and placements) exists only in test builds
//! and under the `test-support` feature, which tests and benches turn on.

pub mod agent;
pub mod api;
pub mod cleanup;
pub mod controller;
pub mod detect;
pub mod duration;
#[cfg(test)]
mod fuzz_tests;
pub mod hardware;
pub mod health;
pub mod kube_client;
pub mod labels;
pub mod output;
pub mod plan;
pub mod server;
pub mod shutdown;
pub mod signals;
pub mod telemetry;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
