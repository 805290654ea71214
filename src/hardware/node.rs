//! Facts about a whole machine: CPU and memory, NUMA layout, how its accelerators are wired
//! to each other (interconnect groups), its high-speed NICs, and where it runs.

use serde::{Deserialize, Serialize};

/// The host CPU and memory, and the limits of the container we run in.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuInfo {
    /// CPU model name (`AMD EPYC 9654 96-Core Processor`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// CPU vendor id (`GenuineIntel`, `AuthenticAMD`, `ARM`...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// Instruction set (`x86_64`, `aarch64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// Physical packages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets: Option<u32>,
    /// Physical cores across all sockets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// Hardware threads (logical CPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// AI-relevant ISA extensions present (`avx2`, `avx512f`, `avx512_bf16`, `amx_tile`...),
    /// sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ai_flags: Vec<String>,
    /// Total system memory in bytes (`MemTotal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// The cgroup memory limit of this process, when one is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_memory_limit_bytes: Option<u64>,
    /// The cgroup CPU quota of this process in millicores, when one is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_cpu_limit_millis: Option<u64>,
}

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NumaNode {
    /// Node number.
    pub id: u32,
    /// CPU list in kernel syntax (`0-47,96-143`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
    /// Memory on the node in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

/// How a set of accelerators is linked to each other beyond PCIe.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum InterconnectKind {
    /// NVIDIA NVLink point-to-point links.
    Nvlink,
    /// NVIDIA NVLink through NVSwitch: all-to-all at full bandwidth.
    Nvswitch,
    /// AMD Infinity Fabric (XGMI) hive.
    Xgmi,
    /// Google TPU inter-chip interconnect.
    Ici,
    /// AWS NeuronLink ring/torus between Neuron devices.
    Neuronlink,
    /// Intel Gaudi on-chip RoCE scale-up links.
    Gaudilink,
    /// Intel Xe Link between data-center GPUs.
    Xelink,
    /// Any other vendor fabric.
    Other,
}

/// A group of devices that share a fast interconnect domain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterconnectGroup {
    /// The fabric.
    pub kind: InterconnectKind,
    /// Stable group id (hive id, NVLink domain, or the sorted member list when none is exposed).
    pub id: String,
    /// Member device ids (the `Device::id` values), sorted.
    pub devices: Vec<String>,
    /// Links per device, when known (NVLink lanes up, XGMI links).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub links_per_device: Option<u32>,
    /// Per-device unidirectional bandwidth in GB/s, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_gbps: Option<f64>,
    /// Topology string where the fabric has one (`2x2`, `4x4x4`, `ring`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
}

/// The kind of high-speed network adapter.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum NicKind {
    /// InfiniBand link layer.
    Infiniband,
    /// RDMA over Converged Ethernet.
    Roce,
    /// AWS Elastic Fabric Adapter.
    Efa,
}

/// An RDMA-capable network adapter port (from `/sys/class/infiniband`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkAdapter {
    /// RDMA device and port (`mlx5_0/1`).
    pub name: String,
    /// Link layer kind.
    pub kind: NicKind,
    /// Port rate in Gb/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_gbps: Option<u32>,
    /// Port state (`ACTIVE`, `DOWN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The PCI bus id of the adapter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
    /// NUMA node of the adapter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// The subnet prefix (InfiniBand) that identifies a fabric shared with other nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<String>,
}

/// Where the detector runs: container, Kubernetes, cloud.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeEnv {
    /// Container runtime when inside one (`docker`, `containerd`, `podman`, `kubepods`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// True when running in a Kubernetes pod.
    #[serde(default)]
    pub kubernetes: bool,
    /// Cloud provider from DMI (`aws`, `gcp`, `azure`, `oci`...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud: Option<String>,
    /// Instance type from DMI (`p5.48xlarge`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// Kernel release (`6.8.0-1015-aws`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// OS name from os-release (`Ubuntu 22.04.4 LTS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
}

/// Everything about the node that is not a per-device fact.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeFacts {
    /// Host CPU and memory.
    #[serde(default)]
    pub cpu: CpuInfo,
    /// NUMA nodes, by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub numa: Vec<NumaNode>,
    /// Runtime environment.
    #[serde(default)]
    pub runtime: RuntimeEnv,
}
