//! The fleet loop: one pass per burst of inventory or placement changes publishes the fleet
//! gauges, each inventory's `status.freeDevices`, Node Events and (through
//! [`taints`](super::taints)) the health taints; the model capacity is counted at most once
//! per interval. A thin driver around a pure [`core`].
//!
//! | module | job |
//! |---|---|
//! | [`core`] | the pure fleet core: fleet stats, model capacity |
//! | `pass` | the pass: when it runs, what it writes |
//! | `publication` | the publication audit per node: the `DRAPublished` condition, its series and Events |
//! | `controller::metrics::fleet` | the fleet gauges: devices per product, per placement, per model (shared, beside the other loops' metrics) |

pub mod core;
pub(crate) mod pass;
pub(crate) mod publication;

pub use self::pass::CapacityCounting;
