//! The vendor DRA drivers the operator knows, and where each publishes the facts we need.
//!
//! Attribute names come from each driver's public source (see `docs/dra.md` for the
//! provenance). Unqualified attribute names in a slice belong to the driver's own domain;
//! `resource.kubernetes.io/...` names are the cross-vendor standard ones.

use crate::hardware::{Family, Vendor};

/// DRA's standard PCI address attribute.
pub const STANDARD_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// DRA's standard PCIe root attribute.
pub const STANDARD_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

/// One known DRA driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownDriver {
    /// `spec.driver` of its slices.
    pub name: &'static str,
    /// Maker of its devices.
    pub vendor: Vendor,
    /// Kind of its devices.
    pub family: Family,
    /// Attribute holding the product name.
    pub product: &'static str,
    /// Attribute holding the UUID or serial, if any.
    pub uuid: Option<&'static str>,
    /// Vendor-specific PCI address attribute, if any (checked after the standard one).
    pub pci_address: Option<&'static str>,
    /// Capacity holding device memory in bytes, if any.
    pub memory: Option<&'static str>,
    /// An attribute and the value it has on whole devices (partitions have another value),
    /// if the driver publishes partitions next to whole devices.
    pub whole_device: Option<(&'static str, &'static str)>,
    /// A bool attribute that is `false` on a device the driver itself reports unhealthy, if
    /// the driver publishes one (drivers that use DRA device taints need none).
    pub healthy: Option<&'static str>,
}

/// Every driver we know, by name.
///
/// Not here, for want of a public driver source to take attribute names from (none found
/// when this table was checked, 2026-11): AWS Neuron and Google TPU. A slice of either is
/// ignored with a note rather than read with guessed names.
pub const KNOWN_DRIVERS: &[KnownDriver] = &[
    // kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/deviceinfo.go
    // (GpuInfo.Attributes: `type`=gpu, `uuid`, `productName`, the standard pciBusID; the
    // `memory` capacity in bytes). MIG devices carry `type`=mig and their own `MIG-` uuid.
    KnownDriver {
        name: "gpu.nvidia.com",
        vendor: Vendor::Nvidia,
        family: Family::Gpu,
        product: "productName",
        uuid: Some("uuid"),
        pci_address: None,
        memory: Some("memory"),
        whole_device: Some(("type", "gpu")),
        healthy: None,
    },
    // ROCm/k8s-gpu-dra-driver cmd/gpu-kubeletplugin/deviceinfo.go and pkg/consts/consts.go
    // (`type` is `amdgpu` for a whole GPU, `amdgpu-partition` for a compute partition;
    // `pciAddr` only on VFIO devices, whole GPUs carry the standard pciBusID; no uuid
    // attribute).
    KnownDriver {
        name: "gpu.amd.com",
        vendor: Vendor::Amd,
        family: Family::Gpu,
        product: "productName",
        uuid: None,
        pci_address: Some("pciAddr"),
        memory: Some("memory"),
        whole_device: Some(("type", "amdgpu")),
        healthy: None,
    },
    // intel/intel-resource-drivers-for-kubernetes doc/gpu/USAGE.md
    KnownDriver {
        name: "gpu.intel.com",
        vendor: Vendor::Intel,
        family: Family::Gpu,
        product: "model",
        uuid: None,
        pci_address: Some("pciAddress"),
        memory: Some("memory"),
        whole_device: None,
        healthy: None,
    },
    // intel/intel-resource-drivers-for-kubernetes cmd/kubelet-gaudi-plugin/node_state.go
    // (`model` is the SKU name such as `Gaudi2`, `serial`, `healthy`, `pciRoot`; no
    // memory capacity) and doc/gaudi/USAGE.md.
    KnownDriver {
        name: "gaudi.intel.com",
        vendor: Vendor::Intel,
        family: Family::Asic,
        product: "model",
        uuid: Some("serial"),
        pci_address: None,
        memory: None,
        whole_device: None,
        healthy: Some("healthy"),
    },
];

/// The known driver called `name`.
pub fn known(name: &str) -> Option<&'static KnownDriver> {
    KNOWN_DRIVERS.iter().find(|driver| driver.name == name)
}
