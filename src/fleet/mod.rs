//! Fleet questions, answered from inventories and reservations without a cluster: which
//! accelerators are sick or missing (`health`, `expected`), and what the free devices could
//! still run, in units of models (`capacity`).
//!
//! Pure like the planner it builds on: the CLI (`hwaccel fleet`), the agent and the
//! controller feed it core types and turn its answers into tables, conditions and metrics.

pub mod capacity;
pub mod expected;
pub mod health;
