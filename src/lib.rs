//! hwaccel-operator: finds every AI accelerator on every Kubernetes node and decides where and
//! how a model should run on them.
//!
//! The crate is one library behind one binary, `hwaccel`. Its modules split along one line:
//! the pure core never imports `kube`, `k8s-openapi`, `tokio` or `clap`, and only the modules
//! behind the default `kubernetes` feature do. `cargo check --lib --no-default-features`
//! (part of `make lint`) builds the core alone, so an import that crosses the line fails;
//! `tests/architecture.rs` names the offending line, and keeps the controller's pure cores
//! (`controller::core` and each loop's `core`) free of `kube`, `tokio` and `clap` too.
//!
//! | module | job | needs `kubernetes` |
//! |---|---|---|
//! | [`hardware`] | accelerator types, precisions, device profile, the detection report | no |
//! | [`detect`] | backends over a host view, merged into a report | no |
//! | [`plan`] | model memory, precision and parallelism search, placement; [`plan::request`] is the one way in | no |
//! | [`labels`] | report to node labels | no |
//! | [`names`] | Kubernetes naming rules: label syntax, sanitising, hashing shortener, slugs | no |
//! | [`fleet`] | fleet questions: expected and missing devices, health roll-up, capacity in units of models | no |
//! | [`output`], [`duration`] | tables, JSON/YAML, byte sizes; duration-flag grammar | no |
//! | [`backoff`] | the one jittered exponential backoff of every retry loop | no |
//! | `api` | CRD types and their conversions to and from the core types | yes |
//! | `agent` | node loop: detect, label, publish the inventory | yes |
//! | `controller` | three control loops, one folder each (`placement`, `fleet`, `taints`), each a pure `core` beside a thin driver, plus what they share (context, leader election, DRA watches) | yes |
//! | `cleanup` | uninstall: release our labels | yes |
//! | `server`, `health`, `telemetry`, `kube_client`, `signals`, `shutdown` | the process around the agent and controller | yes |
//! | `cli` | every subcommand's flags and output (`main.rs` calls `cli::main`) | yes |
//!
//! `testing` (builders for reports, inventories and placements) exists only in test builds
//! and under the `test-support` feature, which tests and benches turn on.

#[cfg(feature = "kubernetes")]
pub mod agent;
#[cfg(feature = "kubernetes")]
pub mod api;
pub mod backoff;
#[cfg(feature = "kubernetes")]
pub mod cleanup;
#[cfg(feature = "kubernetes")]
pub mod cli;
#[cfg(feature = "kubernetes")]
pub mod controller;
pub mod detect;
#[cfg(feature = "kubernetes")]
pub mod dra;
pub mod duration;
pub mod fleet;
#[cfg(test)]
#[cfg(feature = "kubernetes")]
mod fuzz_tests;
pub mod hardware;
#[cfg(feature = "kubernetes")]
pub mod health;
#[cfg(feature = "kubernetes")]
pub mod kube_client;
pub mod labels;
pub mod names;
pub mod output;
pub mod plan;
#[cfg(feature = "kubernetes")]
pub mod server;
#[cfg(feature = "kubernetes")]
pub mod shutdown;
#[cfg(feature = "kubernetes")]
pub mod signals;
#[cfg(feature = "kubernetes")]
pub mod telemetry;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
