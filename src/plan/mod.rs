//! The placement planner: model memory, precision choice, parallelism search and fleet
//! placement. Pure: no I/O except [`load`], which reads model configs and inventories from
//! files for the CLI; no Kubernetes, no `clap` (the `kubernetes` feature is off when this
//! compiles alone). The command line (`cli::plan`) and the controller both ask their question
//! as a [`request::PlanInput`] and get the planner's request from [`request::prepare`].
//!
//! | module | job |
//! |---|---|
//! | [`model`] | model description: presets, `config.json`, parameter counts |
//! | [`weights`] | weight bytes per precision and per device under TP/PP |
//! | [`kv`] | KV-cache bytes per request |
//! | [`layout`] | a replica's layout: pipeline stage split, expert parallelism, DP attention |
//! | [`memory`] | serving memory budget per device (vLLM's equation) |
//! | [`runtime_memory`] | what the runtime lets an engine allocate of a device's memory |
//! | [`share`] | a shareable device's memory policy and how a request for a share is rounded |
//! | [`training`] | fine-tuning memory per method and ZeRO stage |
//! | [`capability`] | which precisions a device and a model allow |
//! | [`inventory`], [`products`], [`shorthand`] | hardware input |
//! | [`packing`] | the free devices as classes and bins; packing replicas onto nodes |
//! | [`search`] | the search over precision, TP, PP and replicas; refusals |
//! | [`throughput`] | decode-throughput estimate |
//! | [`report`] | the answer as plain data: the plan (its JSON), engine settings, suggestions |
//! | [`render`] | the plan as a table, the engines' command lines |
//! | [`engine`] | the serving engines' arguments (vLLM, SGLang) for a plan that fits |
//! | [`request`] | one way in: a [`request::PlanInput`] to a model and a [`PlanRequest`] |
//! | [`load`] | model configs and inventory files (Kubernetes objects via the caller's reader) |

pub mod capability;
pub mod engine;
pub mod error;
pub mod inventory;
pub mod kv;
pub mod layout;
pub mod load;
pub mod memory;
pub mod model;
pub mod packing;
pub mod products;
pub mod render;
pub mod report;
pub mod request;
pub mod runtime_memory;
pub mod search;
pub mod share;
pub mod shorthand;
pub mod throughput;
pub mod training;
pub mod units;
pub mod weights;

pub use error::{PlanError, Result};
pub use inventory::{DeviceSpec, NodeSpec, Reservations};
pub use model::Model;
pub use packing::FleetIndex;
pub use search::{Goal, PlanRequest, plan, plan_indexed};
pub use units::Bytes;
