//! The detection report: what a node has, merged from every detection backend into one
//! deterministic value (devices sorted by id, every list sorted). Detection
//! ([`crate::detect`]) produces it; the labeller, the planner, the API conversions and the
//! agent read it. Pure data, like the rest of `hardware`.

use serde::{Deserialize, Serialize};

use super::{Device, Family, InterconnectGroup, NetworkAdapter, NodeFacts};

/// The report format's version; bump on incompatible changes.
pub const SCHEMA_VERSION: u32 = 1;

/// A warning, attributed to the backend that raised it.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Warning {
    /// The backend name.
    pub backend: String,
    /// What went wrong.
    pub message: String,
}

/// How long one backend took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BackendTiming {
    /// The backend name.
    pub backend: String,
    /// Wall-clock time in microseconds.
    pub micros: u64,
}

/// The merged result of a detection run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Node-wide facts.
    pub node: NodeFacts,
    /// Devices, sorted by id.
    #[serde(default)]
    pub devices: Vec<Device>,
    /// Interconnect groups, sorted by kind and id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interconnects: Vec<InterconnectGroup>,
    /// RDMA adapters, sorted by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<NetworkAdapter>,
    /// Backends that ran, in registry order.
    #[serde(default)]
    pub backends: Vec<String>,
    /// Warnings, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<Warning>,
    /// Per-backend timings; empty unless the caller asked for them, because they differ
    /// between otherwise identical runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timings: Vec<BackendTiming>,
}

impl Report {
    /// An empty report.
    pub fn empty() -> Self {
        Self {
            schema_version: SCHEMA_VERSION,
            node: NodeFacts::default(),
            devices: Vec::new(),
            interconnects: Vec::new(),
            nics: Vec::new(),
            backends: Vec::new(),
            warnings: Vec::new(),
            timings: Vec::new(),
        }
    }

    /// Accelerators only: the devices that are not the host CPU.
    pub fn accelerators(&self) -> impl Iterator<Item = &Device> {
        self.devices.iter().filter(|d| d.family != Family::Cpu)
    }
}
