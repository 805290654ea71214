//! The `AcceleratorInventory` custom resource: one cluster-scoped object per node, named after
//! the node and owned by it, listing every device with DRA-style typed attributes and byte
//! capacities, plus the node's interconnects, CPU/NUMA/NIC facts and detector warnings.
//!
//! The device entries are shaped like `resource.k8s.io/v1` `ResourceSlice` devices (a DNS-label
//! `name`, `attributes` typed `int | bool | string | version`, `capacity` as quantities) and
//! stay inside DRA's limits (≤32 attributes and capacities per device, strings ≤64 bytes), so
//! an entry can be mirrored into a ResourceSlice or matched with the same CEL later.
//! Attribute names are in [`attribute`]; the conversion from a detection report is in
//! `convert.rs`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::hardware::Warning;
use crate::hardware::{InterconnectGroup, NetworkAdapter, RuntimeEnv};

/// DRA's limit on attributes plus capacities per device.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// DRA's limit on a string or version attribute, in bytes.
pub const MAX_ATTRIBUTE_STRING_LENGTH: usize = 64;

/// Names of the device attributes and capacities the inventory writes. Unqualified names
/// belong to `hwaccel.io`, as unqualified DRA attribute names belong to the driver's domain.
pub mod attribute {
    /// The device's stable id (`Device::id`): a PCI bus id, or `<backend>:<index>`.
    pub const ID: &str = "id";
    /// DRA's standard PCI address attribute, set when the id is a PCI bus id.
    pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
    /// The vendor tool's index (int).
    pub const INDEX: &str = "index";
    /// `nvidia`, `amd`...
    pub const VENDOR: &str = "vendor";
    /// `gpu`, `tpu`, `npu`, `asic`, `cpu`.
    pub const FAMILY: &str = "family";
    /// The vendor's model name (`NVIDIA H100 80GB HBM3`).
    pub const MODEL: &str = "model";
    /// The readable product slug the node labels count by (`nvidia-h100-80gb-hbm3`).
    pub const PRODUCT: &str = "product";
    /// The detector backend that found the device.
    pub const BACKEND: &str = "backend";
    /// Architecture (`hopper`, `gfx942`).
    pub const ARCHITECTURE: &str = "architecture";
    /// CUDA compute capability (`9.0`).
    pub const COMPUTE_CAPABILITY: &str = "computeCapability";
    /// Kernel driver version, exactly as the vendor prints it.
    pub const DRIVER_VERSION: &str = "driverVersion";
    /// Firmware or VBIOS version.
    pub const FIRMWARE_VERSION: &str = "firmwareVersion";
    /// Vendor UUID or serial.
    pub const UUID: &str = "uuid";
    /// Native precisions, comma-separated, widest first (`fp32,tf32,bf16,fp16,fp8,int8`).
    pub const PRECISIONS: &str = "precisions";
    /// NUMA node (int): DRA's standard attribute, which `matchAttribute` constraints can
    /// align across drivers (a GPU and a NIC on one NUMA node).
    pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";
    /// NUMA node (int) as agents wrote it before the standard name: still read, no longer
    /// written.
    pub const LEGACY_NUMA_NODE: &str = "numaNode";
    /// Negotiated PCIe generation (int).
    pub const PCIE_GENERATION: &str = "pcieGeneration";
    /// Negotiated PCIe lane count (int).
    pub const PCIE_WIDTH: &str = "pcieWidth";
    /// Highest PCIe generation the device supports (int).
    pub const PCIE_MAX_GENERATION: &str = "pcieMaxGeneration";
    /// Highest PCIe lane count the device supports (int).
    pub const PCIE_MAX_WIDTH: &str = "pcieMaxWidth";
    /// The kind of the device's fast interconnect (`nvswitch`, `xgmi`), when it has one.
    pub const INTERCONNECT: &str = "interconnect";
    /// The id of the device's interconnect group; devices with equal values share a fabric
    /// domain (an NVLink domain, an XGMI hive), which is what tensor parallelism needs.
    pub const INTERCONNECT_GROUP: &str = "interconnectGroup";
    /// Health verdict: `unknown`, `healthy`, `degraded`, `unhealthy`.
    pub const HEALTH: &str = "health";
    /// Whether ECC is on (bool).
    pub const ECC_ENABLED: &str = "eccEnabled";
    /// Corrected ECC errors since driver load (int).
    pub const ECC_CORRECTED: &str = "eccCorrected";
    /// Uncorrected ECC errors since driver load (int).
    pub const ECC_UNCORRECTED: &str = "eccUncorrected";
    /// Retired or remapped memory pages (int).
    pub const RETIRED_PAGES: &str = "retiredPages";
    /// Capacity: device memory in bytes.
    pub const MEMORY: &str = "memory";
    /// Capacity: compute units (SMs, CUs, cores).
    pub const COMPUTE_UNITS: &str = "computeUnits";
}

/// The inventory of one node's accelerators, as its agent last detected them. Written only
/// by that node's agent (field manager `hwaccel-agent`).
// Each `printcolumn(...)` repeats `type_ = "string"`; clippy mistakes that for a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "hwaccel.io",
    version = "v1alpha1",
    kind = "AcceleratorInventory",
    // The controller places by spec.nodeName, write rights are granted by object name: the
    // two must agree, or one node's agent could describe (and attract models to) another.
    validation = Rule::new("self.spec.nodeName == self.metadata.name").message("spec.nodeName must equal metadata.name: an inventory describes the Node it is named after"),
    plural = "acceleratorinventories",
    singular = "acceleratorinventory",
    shortname = "accinv",
    category = "hwaccel",
    status = "AcceleratorInventoryStatus",
    derive = "PartialEq",
    selectable = ".spec.nodeName",
    doc = "The accelerators, interconnects and host facts of one node, published by its hwaccel agent.",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(
        name = "Accelerators",
        type_ = "integer",
        json_path = ".spec.summary.accelerators"
    ),
    printcolumn(
        name = "Product",
        type_ = "string",
        json_path = ".spec.summary.product"
    ),
    printcolumn(
        name = "Memory",
        type_ = "string",
        json_path = ".spec.summary.memoryLayout"
    ),
    printcolumn(
        name = "Healthy",
        type_ = "integer",
        json_path = ".spec.summary.healthy"
    ),
    printcolumn(
        name = "Degraded",
        type_ = "integer",
        json_path = ".spec.summary.degraded"
    ),
    printcolumn(name = "Free", type_ = "integer", json_path = ".status.freeDevices"),
    printcolumn(
        name = "Missing",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"DevicesMissing\")].status",
        priority = 1
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        priority = 1
    ),
    printcolumn(
        name = "DetectorDegraded",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Degraded\")].status",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
// One owner for the whole spec: the agent applies all of it every time it changes, so
// server-side apply need not track each device and attribute as a field of its own. Granular,
// the `hwaccel-agent` entry of `managedFields` listed every path and was as large as the spec
// (10.6 of 22 KB stored for an 8-GPU node); atomic, it is `f:spec: {}`
// (tests/cluster_agent_cost.rs measures the stored size). Status stays granular: the
// controller writes `status.freeDevices` beside the agent's conditions.
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct AcceleratorInventorySpec {
    /// The node this inventory describes (equal to the object's name).
    #[schemars(length(max = 253))]
    pub node_name: String,
    /// The detection report format the inventory was built from.
    pub schema_version: u32,
    /// The hwaccel version that produced it.
    pub detector_version: String,
    /// Totals for `kubectl get accinv`.
    ///
    /// They live in `spec`, not `status`, on purpose: the agent is the only writer of the
    /// whole object and derives them from the same detection as the devices, so one
    /// server-side apply writes devices and totals together (the printer columns never
    /// disagree with the device list), and `status` keeps only what is status, the
    /// Ready/Degraded conditions of the detection itself.
    #[schemars(description = "Totals for `kubectl get accinv`, derived from the devices.")]
    pub summary: InventorySummary,
    /// Every device, sorted by name; the host CPU is listed too (family `cpu`) so CPU-only
    /// nodes are described, but it does not count as an accelerator.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[schemars(length(max = 1024))] // bounds::MAX_DEVICES
    pub devices: Vec<InventoryDevice>,
    /// Fast-interconnect groups; member lists hold the devices' `id` attribute values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interconnects: Vec<InterconnectGroup>,
    /// Node-wide facts.
    pub node: InventoryNodeFacts,
    /// The detector backends that ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<String>,
    /// Problems the detectors reported (a tool that failed or printed garbage).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<Warning>,
}

/// The figures `kubectl get accinv` prints.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventorySummary {
    /// Accelerators on the node (devices other than the host CPU).
    pub accelerators: u32,
    /// The product when there is one, `A+B` for two, `mixed` for more; absent without
    /// accelerators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    /// Total accelerator memory, when any device reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// The same memory as people read it: `8×80Gi`, or `4×80Gi+2×48Gi` on a mixed node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub memory_layout: Option<String>,
    /// Accelerators whose health is `healthy` (absent from agents older than the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<u32>,
    /// Accelerators whose health is `degraded`: still plannable, worth a person's look
    /// (absent from agents older than the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<u32>,
}

/// One device, shaped like a DRA `ResourceSlice` device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventoryDevice {
    /// Stable DNS label derived from family and id (`gpu-0000-18-00-0`).
    #[schemars(length(max = 63))]
    pub name: String,
    /// Typed attributes (`vendor`, `model`, `resource.kubernetes.io/numaNode`...); strings at
    /// most 64 bytes.
    #[serde(default)]
    #[schemars(extend("maxProperties" = 32))] // MAX_ATTRIBUTES_AND_CAPACITIES
    pub attributes: BTreeMap<String, DeviceAttribute>,
    /// Quantities: `memory` in bytes, `computeUnits`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32))] // MAX_ATTRIBUTES_AND_CAPACITIES
    pub capacity: BTreeMap<String, Quantity>,
    /// Hardware partitions (MIG instances, AMD compute/memory modes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<InventoryPartition>,
    /// Why health is not `healthy`, in the backend's words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health_reasons: Vec<String>,
    /// Backend-specific facts that are not attributes (kept out of the 32-attribute budget).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub details: BTreeMap<String, String>,
    /// The untruncated text of every string attribute that had to be shortened to 64 bytes,
    /// by attribute name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub full_values: BTreeMap<String, String>,
}

/// A typed attribute value, serialised as DRA's `DeviceAttribute`: an object with exactly one
/// of `int`, `bool`, `string`, `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DeviceAttribute {
    /// A 64-bit integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A string of at most 64 bytes.
    String(String),
    /// A semantic version (semver 2.0) of at most 64 bytes.
    Version(String),
}

impl DeviceAttribute {
    /// The string of a `string` or `version` attribute.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) | Self::Version(s) => Some(s),
            _ => None,
        }
    }

    /// The value of an `int` attribute.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Self::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The value of a `bool` attribute.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Self::Bool(b) => Some(*b),
            _ => None,
        }
    }
}

/// A hardware partition of a device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventoryPartition {
    /// The scheme (`mig`, `amd-compute`, `amd-memory`).
    pub kind: String,
    /// Profile or mode (`1g.10gb`, `CPX`, `NPS4`).
    pub profile: String,
    /// Instance id or UUID, for instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Memory of the partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
}

/// Facts about the node that are not per-device.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventoryNodeFacts {
    /// Host CPU and memory.
    pub cpu: InventoryCpu,
    /// NUMA nodes, by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub numa: Vec<InventoryNumaNode>,
    /// Where the agent runs (container, cloud, kernel, OS).
    pub runtime: RuntimeEnv,
    /// RDMA adapters (InfiniBand, RoCE, EFA), by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<NetworkAdapter>,
}

/// The host CPU, with memory as quantities.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventoryCpu {
    /// Model name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Vendor id (`GenuineIntel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// Instruction set (`x86_64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// Physical packages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets: Option<u32>,
    /// Physical cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// Hardware threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// AI-relevant ISA extensions, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ai_flags: Vec<String>,
    /// System memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// The agent container's memory limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_memory_limit: Option<Quantity>,
    /// The agent container's CPU limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_cpu_limit: Option<Quantity>,
}

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventoryNumaNode {
    /// Node number.
    pub id: u32,
    /// CPU list in kernel syntax (`0-47,96-143`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
    /// Memory on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
}

/// What the agent observed about its own detection.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AcceleratorInventoryStatus {
    /// `Ready` (the inventory reflects a successful detection) and `Degraded` (a detector
    /// failed or devices are unhealthy), one entry per type, written by the agent; and
    /// `DRAPublished` (what DRA drivers publish and device plugins advertise agrees with
    /// detection), written by the controller.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` the agent last reconciled the status against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Accelerators the node should have (written by the agent): the Node's
    /// `hwaccel.io/expected-devices` annotation, else its instance type's count, else the most
    /// the agent has seen on it. `DevicesMissing` compares detection against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_devices: Option<u32>,
    /// Where `expectedDevices` comes from: `annotation`, `instanceType` or `seen`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub expected_source: Option<String>,
    /// Accelerator resources the Node's device plugins advertise in its `status.allocatable`
    /// (`nvidia.com/gpu: 8`), as the agent last read them: only the names of
    /// `dra::device_plugins` and whole counts, at most 16. The publication audit compares
    /// them with what DRA drivers publish. Absent when the agent has not read its Node's
    /// allocatable (an agent older than the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 16))] // dra::device_plugins::MAX_ADVERTISED
    pub device_plugin_resources: Option<BTreeMap<String, u32>>,
    /// Plannable accelerators (every health but `unhealthy`) that no placement and no
    /// allocated claim holds: the planner's free set on this node (written by the controller,
    /// field manager `hwaccel-controller`); absent until the controller has seen the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_devices: Option<u32>,
}

/// The owner reference that makes a node's inventory go away with its Node.
///
/// `blockOwnerDeletion` is left unset: setting it needs delete rights on Nodes under the
/// OwnerReferencesPermissionEnforcement admission plugin, which a node agent must not hold,
/// and nothing needs the Node's deletion to wait for the inventory. `controller` is unset
/// because the Node does not manage the object.
pub fn owner_reference_for_node(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".to_string(),
        kind: "Node".to_string(),
        name: name.to_string(),
        uid: uid.to_string(),
        block_owner_deletion: None,
        controller: None,
    }
}

impl AcceleratorInventory {
    /// The same object, owned by its Node (the agent learns the uid from the Node).
    pub fn owned_by_node(mut self, node_uid: &str) -> Self {
        let name = self.spec.node_name.clone();
        self.metadata.owner_references = Some(vec![owner_reference_for_node(&name, node_uid)]);
        self
    }
}
