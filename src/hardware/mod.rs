//! Accelerator types shared by the detector, the labeller, the planner and the API: families,
//! vendors, precisions, the per-device profile, per-node facts, and the detection [`Report`]
//! that holds them.
//!
//! Pure data: nothing here does I/O or knows about Kubernetes.

mod device;
pub mod device_state;
mod family;
mod node;
mod precision;
mod report;

pub use device::{Device, Health, HealthStatus, Partition, PcieLink};
pub use family::{Family, Vendor, vendor_from_pci_id};
pub use node::{
    CpuInfo, InterconnectGroup, InterconnectKind, NetworkAdapter, NicKind, NodeFacts, NumaNode,
    RuntimeEnv,
};
pub use precision::{Precision, UnknownPrecision};
pub use report::{BackendTiming, Report, SCHEMA_VERSION, Warning};

/// Bytes in one GiB (2^30), the unit vendor tools mean by "GB" for device memory.
pub const GIB: u64 = 1 << 30;
/// Bytes in one MiB (2^20), the unit of `nvidia-smi --query-gpu=memory.total`.
pub const MIB: u64 = 1 << 20;
