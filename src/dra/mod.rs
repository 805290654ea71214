//! Dynamic Resource Allocation (`resource.k8s.io/v1`): what the operator reads from and writes
//! to the DRA API.
//!
//! | module | job |
//! |---|---|
//! | [`drivers`] | the vendor DRA drivers we know: names, attribute keys, family |
//! | `pools` | a pool's complete highest generation, where slices and counters both start |
//! | [`share`] | a shareable device's `memory` capacity and request policy, read from its slice |
//! | [`slices`] | ResourceSlices → the devices each node's drivers publish |
//! | [`lint`] | what is wrong with slices: the apiserver's rules, empty slices, the dictionary's facts |
//! | [`device_plugins`] | the extended resources vendors' device plugins advertise on a Node |
//! | [`audit`] | one node's three truths compared: detected, published in DRA, advertised by plugins |
//! | [`inventory_node`] | an inventory → the planner's node and the fleet roll-up's, before any merge |
//! | [`merge`] | an inventory + published devices → one planner node, one device each |
//! | [`own_slices`] | driverless devices → the agent's own `hwaccel.io` slice, never double-exposed |
//! | [`counters`] | shared counters (partitionable devices): which devices the allocated ones block |
//! | [`claims`] | a planned placement → ResourceClaims allocated to exactly its devices |
//! | [`claim_template`] | ordered alternatives → a ResourceClaimTemplate (`firstAvailable`) |
//! | [`device_classes`] | the capability table → cross-vendor DeviceClasses for the chart |
//!
//! A device is named in DRA by `(driver, pool, device)`: [`DeviceRef`]. The same physical
//! device seen by our agent and by a vendor driver is one device, matched by PCI bus id or
//! UUID ([`merge`]).

use crate::hardware::{Family, HealthStatus, Vendor};
use crate::plan::share::{SharePolicy, Shareable};

pub mod audit;
pub mod claim_template;
pub mod claims;
pub mod counters;
pub mod device_classes;
pub mod device_plugins;
pub mod drivers;
pub mod inventory_node;
pub mod lint;
pub mod merge;
pub mod own_slices;
mod pools;
pub mod share;
pub mod slices;
#[cfg(test)]
mod vendor_tests;

pub use crate::api::DeviceRef;

/// One device a DRA driver publishes for a node, reduced to what merging and planning need.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishedDevice {
    /// The node the device is on (`spec.nodeName` of its slice).
    pub node: String,
    /// Its DRA name.
    pub reference: DeviceRef,
    /// PCI bus id, lowercase with domain (`0000:18:00.0`), when the driver publishes one.
    pub pci_bus_id: Option<String>,
    /// For an entry that is not a whole device (a partition, a VFIO sibling), the PCI bus id
    /// it publishes: its parent's. Never used to match; it tells merging that an inventory
    /// device is published only in parts.
    pub parent_bus_id: Option<String>,
    /// Vendor UUID or serial, when published.
    pub uuid: Option<String>,
    /// Product name as the driver publishes it (`NVIDIA H100 80GB HBM3`).
    pub product: Option<String>,
    /// Device memory in bytes (the `memory` capacity), when published as a usable size.
    pub memory_bytes: Option<u64>,
    /// NUMA node, when published: DRA's standard `resource.kubernetes.io/numaNode`, else the
    /// driver's own `numaNode` (AMD's `gpu.amd.com/numaNode`).
    pub numa_node: Option<u32>,
    /// Why a published memory capacity was not taken as a size (`0`, the AMD driver's
    /// "unreadable"; a negative, fractional or implausibly large value): the device's memory
    /// is then unknown, and a device known only from its slice is not planned on. `None` when
    /// the size was usable or no capacity was published.
    pub memory_unknown: Option<String>,
    /// Health as the driver publishes it; `Unknown` when it publishes none.
    pub health: HealthStatus,
    /// The scale-up group the driver puts the device in (`neuronlink:<devicegroup16_id>`),
    /// in the planner's domain form, when it publishes one.
    pub domain: Option<String>,
    /// A whole physical device: not a partition, a VFIO sibling or an entry that stands for
    /// several devices (what the publication audit counts against detection).
    pub whole: bool,
    /// Maker, from the driver.
    pub vendor: Vendor,
    /// Kind, from the driver.
    pub family: Family,
    /// Why the device must not be planned on (a NoSchedule/NoExecute taint, a partition
    /// rather than a whole device, a shared device, counters it can never get), or `None`
    /// when it is usable.
    pub unusable: Option<String>,
    /// For a device published shareable (`allowMultipleAllocations`) whose `memory` capacity a
    /// claim can take a share of: the policy, checked. `None` for every other device.
    pub share: Option<SharePolicy>,
    /// For a partition entry of a driver whose partitions may be planned on (NVIDIA's MIG
    /// devices, AMD's partitions of a GPU partitioned on the node): its profile and its parent, when it is healthy, untainted, of known memory
    /// and its counters can be met. It stays `unusable` as a whole device.
    pub partition: Option<PublishedPartition>,
    /// An informational taint the driver put on the device (`effect: None`, as NVIDIA's
    /// driver does for XID events), as a reason: the device stays plannable and is shown
    /// degraded.
    pub notice: Option<String>,
}

/// A partition a placement may take instead of its whole parent device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedPartition {
    /// The profile as the driver names it (`3g.40gb`).
    pub profile: String,
    /// The parent device, as the partition names it.
    pub parent: ParentRef,
}

/// The device a partition is part of, as the partition names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParentRef {
    /// By the parent's UUID.
    Uuid(String),
    /// By the parent's PCI bus id, canonical (`0000:0c:00.0`).
    PciBusId(String),
}

impl PublishedDevice {
    /// Its share policy as the planner takes it, nothing consumed yet: what claims consume
    /// is the controller's to add.
    pub fn shareable(&self) -> Option<Shareable> {
        self.share.clone().map(|policy| Shareable {
            policy,
            consumed: 0,
        })
    }
}
