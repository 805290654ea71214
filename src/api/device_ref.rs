//! A device as Dynamic Resource Allocation names it, `(driver, pool, device)`: what an
//! allocation result carries and what a placement's status lists. A plain API type here so the
//! CRD types need nothing from `dra`, which builds on them.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A device as DRA names it: the driver, the pool within the driver and the device within
/// the pool. Exactly what an allocation result carries.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRef {
    /// The DRA driver (`gpu.nvidia.com`).
    #[schemars(length(max = 63))]
    pub driver: String,
    /// The pool (usually the node name).
    #[schemars(length(max = 253))]
    pub pool: String,
    /// The device's name within the pool (`gpu-0`).
    #[schemars(length(max = 63))]
    pub device: String,
}

impl fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}
