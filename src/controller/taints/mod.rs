//! The health-taint loop (`--health-taints`): keeps unhealthy nodes' devices out of new
//! placements by the scheduler's own means. It runs inside each fleet pass, on that pass's
//! numbers. A thin driver around a pure [`core`].
//!
//! | module | job |
//! |---|---|
//! | [`core`] | the health-taint mode, our Node taint, DeviceTaintRules |
//! | `sync` | writes them: Node taints, DeviceTaintRules, dry-run Events |

pub mod core;
pub(crate) mod sync;

pub use self::core::HealthTaints;
