//! The profile of one accelerator: identity, memory, capability, placement on the bus, and
//! health.
//!
//! Every field a backend cannot learn stays `None` or empty rather than guessed, so consumers
//! can tell "zero" from "unknown".

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Family, Precision, Vendor};

/// One accelerator device (a GPU, TPU chip, NPU, ASIC card, or the host CPU).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Stable identifier: the PCI bus id in canonical form (`0000:18:00.0`) where the device
    /// has one, otherwise `<backend>:<index>` (for example `apple:gpu0`).
    pub id: String,
    /// The vendor tool's own index for the device (`nvidia-smi -i`), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// The maker.
    pub vendor: Vendor,
    /// The kind of accelerator.
    pub family: Family,
    /// Marketing or driver name, as the vendor reports it (`NVIDIA H100 80GB HBM3`).
    pub model: String,
    /// The detector that found it (`nvidia`, `amd`, `pci`...).
    pub backend: String,
    /// Device memory in bytes (HBM/GDDR; for unified-memory parts, the share usable by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Architecture name or code (`hopper`, `gfx942`, `v5e`, `trn1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// NVIDIA CUDA compute capability (`9.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<String>,
    /// Kernel driver version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// Firmware or VBIOS version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware_version: Option<String>,
    /// Vendor UUID or serial, when exposed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Precisions the device computes in natively, widest first.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub precisions: BTreeSet<Precision>,
    /// Compute units (SMs, CUs, cores, NeuronCores, TensorCores), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_units: Option<u32>,
    /// The NUMA node the device is attached to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// The PCIe link, for PCI devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie: Option<PcieLink>,
    /// Hardware partitions (MIG instances, AMD compute/memory partition modes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<Partition>,
    /// Health as far as the backend can tell.
    #[serde(default)]
    pub health: Health,
    /// Further backend-specific facts (string values, sorted by key).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}

impl Device {
    /// A device with only the required fields set; backends fill in the rest.
    pub fn new(
        id: impl Into<String>,
        vendor: Vendor,
        family: Family,
        model: impl Into<String>,
        backend: &str,
    ) -> Self {
        Self {
            id: id.into(),
            index: None,
            vendor,
            family,
            model: model.into(),
            backend: backend.to_string(),
            memory_bytes: None,
            architecture: None,
            compute_capability: None,
            driver_version: None,
            firmware_version: None,
            uuid: None,
            precisions: BTreeSet::new(),
            compute_units: None,
            numa_node: None,
            pcie: None,
            partitions: Vec::new(),
            health: Health::default(),
            attributes: BTreeMap::new(),
        }
    }
}

/// A PCIe link: current and maximum generation and width.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct PcieLink {
    /// Negotiated generation (1-6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u8>,
    /// Negotiated lane count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u8>,
    /// Highest generation the device supports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_generation: Option<u8>,
    /// Highest lane count the device supports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_width: Option<u8>,
}

impl PcieLink {
    /// Maps a sysfs link speed (`16.0 GT/s PCIe`, `32 GT/s`) to its PCIe generation.
    pub fn generation_from_speed(speed: &str) -> Option<u8> {
        let gts: f64 = speed.split_whitespace().next()?.parse().ok()?;
        // 2.5, 5, 8, 16, 32, 64 GT/s are generations 1 to 6.
        [
            (2.5, 1),
            (5.0, 2),
            (8.0, 3),
            (16.0, 4),
            (32.0, 5),
            (64.0, 6),
        ]
        .iter()
        .find(|(rate, _)| (gts - rate).abs() < 0.5)
        .map(|&(_, generation)| generation)
    }
}

/// A hardware partition of a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Partition {
    /// The partitioning scheme (`mig`, `amd-compute`, `amd-memory`).
    pub kind: String,
    /// Profile or mode name (`1g.10gb`, `CPX`, `NPS4`).
    pub profile: String,
    /// Instance id or UUID where the partition is an instance (MIG).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Memory of the partition in bytes, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

/// Overall health verdict.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Default,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    /// The backend could not tell.
    #[default]
    Unknown,
    /// No sign of trouble.
    Healthy,
    /// Usable but with errors worth attention (corrected ECC storms, retired pages).
    Degraded,
    /// Not usable (uncorrectable errors, pending retirement, fallen off the bus).
    Unhealthy,
}

/// Health counters and the verdict drawn from them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    /// The verdict.
    pub status: HealthStatus,
    /// Whether ECC is enabled on the device memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_enabled: Option<bool>,
    /// Corrected ECC errors (volatile, since the driver loaded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_corrected: Option<u64>,
    /// Uncorrected ECC errors (volatile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_uncorrected: Option<u64>,
    /// Retired or remapped memory pages/rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_pages: Option<u64>,
    /// Human-readable reasons behind a non-healthy verdict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}
