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

/// Where a driver publishes what product a device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProductSource {
    /// A string attribute holding the product name.
    Attribute(&'static str),
    /// A string attribute holding the EC2 instance type (`trn2.48xlarge`); the product is the
    /// accelerator that instance family carries ([`aws_accelerator`]).
    AwsInstanceType(&'static str),
}

impl ProductSource {
    /// The attribute that holds the product name itself, when the driver publishes one (CEL
    /// selectors on the product are written against it).
    pub fn attribute(self) -> Option<&'static str> {
        match self {
            Self::Attribute(name) => Some(name),
            Self::AwsInstanceType(_) => None,
        }
    }
}

/// How a driver publishes a device's health, if it does (drivers that use DRA device taints
/// need none: a NoSchedule/NoExecute taint already makes a device unusable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthSource {
    /// A bool attribute, `false` on a device the driver reports unhealthy.
    Bool(&'static str),
    /// A string attribute: `Healthy`, `Unhealthy` or `Unknown` (any other text is unknown).
    Text(&'static str),
}

/// One known DRA driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownDriver {
    /// `spec.driver` of its slices.
    pub name: &'static str,
    /// Maker of its devices.
    pub vendor: Vendor,
    /// Kind of its devices.
    pub family: Family,
    /// Where the product name comes from.
    pub product: ProductSource,
    /// Attribute holding the UUID or serial, if any.
    pub uuid: Option<&'static str>,
    /// Vendor-specific PCI address attribute, if any (checked after the standard one).
    pub pci_address: Option<&'static str>,
    /// Capacity holding device memory in bytes, if any.
    pub memory: Option<&'static str>,
    /// An attribute and the value it has on whole devices (partitions have another value),
    /// if the driver publishes partitions next to whole devices.
    pub whole_device: Option<(&'static str, &'static str)>,
    /// An attribute and the value it has on an entry that stands for more than one device
    /// (a whole node, as one allocatable unit), if the driver publishes such entries.
    pub aggregate: Option<(&'static str, &'static str)>,
    /// Where the driver publishes health, if it does.
    pub health: Option<HealthSource>,
    /// An attribute whose value is the same on every device of one scale-up group (one
    /// NeuronLink-connected set), if the driver publishes one.
    pub interconnect_group: Option<&'static str>,
    /// How the driver names a partition's profile and its parent, if a partition of it may be
    /// planned on (a fraction of a device, `plan::search::fraction`).
    pub partition: Option<PartitionSource>,
    /// Attribute names the driver published once and has dropped or replaced, with what a
    /// reader should use instead: a CEL selector written against one matches nothing on
    /// nodes whose driver was upgraded (`hwaccel lint-slices` reports them).
    pub deprecated: &'static [Deprecated],
}

/// Where a driver's partition entries say what they are and what they are part of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionSource {
    /// The DeviceClass a claim for a partition names: the one the driver's chart installs
    /// for its partitions (NVIDIA's `mig.nvidia.com`: its whole-device class selects
    /// `type == 'gpu'`), or the driver's own class where that selects partitions too (AMD's
    /// `gpu.amd.com` selects by driver alone).
    pub class: &'static str,
    /// The attribute naming the partition's profile (`1g.10gb`, `cpx_nps4`).
    pub profile: &'static str,
    /// How a partition names the device it is part of.
    pub parent: PartitionParent,
}

/// How a partition entry names the device it is part of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionParent {
    /// An attribute holding the parent's UUID (NVIDIA's `parentUUID`).
    Uuid(&'static str),
    /// The standard PCI bus id, which a partition carries with its parent's value (AMD).
    PciBusId,
}

/// An attribute name a driver no longer publishes (or publishes only for compatibility).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deprecated {
    /// The name as the driver wrote it (unqualified: in the driver's own domain).
    pub name: &'static str,
    /// What to read instead, in words.
    pub instead: &'static str,
}

/// Every driver we know, by name.
///
/// Not here, for want of a public driver source to take attribute names from (none found
/// when this table was checked, 2026-11): Google TPU. A slice of it is ignored with a note
/// rather than read with guessed names.
pub const KNOWN_DRIVERS: &[KnownDriver] = &[
    // kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/deviceinfo.go
    // (GpuInfo.Attributes: `type`=gpu, `uuid`, `productName`, the standard pciBusID; the
    // `memory` capacity in bytes). MIG devices carry `type`=mig and their own `MIG-` uuid.
    KnownDriver {
        name: "gpu.nvidia.com",
        vendor: Vendor::Nvidia,
        family: Family::Gpu,
        product: ProductSource::Attribute("productName"),
        uuid: Some("uuid"),
        pci_address: None,
        memory: Some("memory"),
        whole_device: Some(("type", "gpu")),
        aggregate: None,
        health: None,
        interconnect_group: None,
        // Dynamic MIG (cmd/gpu-kubelet-plugin/partitions.go, mig.go): `profile` (`1g.10gb`)
        // and `parentUUID` on every MIG device; the chart's DeviceClass `mig.nvidia.com`
        // (deployments/helm, `device.attributes['gpu.nvidia.com'].type == 'mig'`).
        partition: Some(PartitionSource {
            class: "mig.nvidia.com",
            profile: "profile",
            parent: PartitionParent::Uuid("parentUUID"),
        }),
        deprecated: &[],
    },
    // ROCm/k8s-gpu-dra-driver docs/driver-attributes.md (2026 layout) and
    // cmd/gpu-kubeletplugin/deviceinfo.go: `type` is `amdgpu` on a whole GPU (and on an
    // AutoPartition SPX device), `amdgpu-partition` on a partition, `vfio` on a VFIO
    // passthrough entry; the standard pciBusID is on all of them, a partition and a VFIO
    // sibling carrying their parent's value, so only a whole GPU may be matched by it.
    // `family`, `cardIndex` and the whole GPU's `pciAddr` are gone (`pciAddr` stays on VFIO
    // and AutoPartition entries); no uuid attribute; `memory` is `0` when unreadable.
    KnownDriver {
        name: "gpu.amd.com",
        vendor: Vendor::Amd,
        family: Family::Gpu,
        product: ProductSource::Attribute("productName"),
        uuid: None,
        pci_address: Some("pciAddr"),
        memory: Some("memory"),
        whole_device: Some(("type", "amdgpu")),
        aggregate: None,
        health: None,
        interconnect_group: None,
        // A GPU partitioned on the node (`amd-smi set --compute-partition`; the driver does
        // not partition dynamically) is published only as its partitions: `type`
        // `amdgpu-partition`, `partitionProfile` (`cpx_nps4`, `<compute>_<memory>`), its own
        // `memory` capacity and the parent's pciBusID; each one exclusive, allocated through
        // the driver's own class (`helm-charts-k8s/templates/deviceclass.yaml`: `device.driver
        // == 'gpu.amd.com'`; `example/example-partitions-*.yaml` claim them so).
        // AutoPartition layouts carry no `partitionProfile` and are shared devices, never
        // partitions to plan on.
        partition: Some(PartitionSource {
            class: "gpu.amd.com",
            profile: "partitionProfile",
            parent: PartitionParent::PciBusId,
        }),
        deprecated: &[
            Deprecated {
                name: "family",
                instead: "productName (or deviceID)",
            },
            Deprecated {
                name: "cardIndex",
                instead: "the device name or resource.kubernetes.io/pciBusID",
            },
        ],
    },
    // intel/intel-resource-drivers-for-kubernetes cmd/kubelet-gpu-plugin/node_state.go
    // (`GetResources`: `model`, `type` (`gpu`, or `vf` for an SR-IOV virtual function),
    // `health` (`Healthy`/`Unhealthy`/`Unknown`, from pkg/gpu/device/device.go `Health`),
    // the standard pciBusID, deprecated `pciAddress`; `memory` capacity in MiB) and
    // doc/gpu/USAGE.md.
    KnownDriver {
        name: "gpu.intel.com",
        vendor: Vendor::Intel,
        family: Family::Gpu,
        product: ProductSource::Attribute("model"),
        uuid: None,
        pci_address: Some("pciAddress"),
        memory: Some("memory"),
        whole_device: Some(("type", "gpu")),
        aggregate: None,
        health: Some(HealthSource::Text("health")),
        interconnect_group: None,
        // node_state.go marks both deprecated in favour of DRA's standard names.
        partition: None,
        deprecated: &[
            Deprecated {
                name: "pciAddress",
                instead: STANDARD_PCI_BUS_ID,
            },
            Deprecated {
                name: "pciRoot",
                instead: STANDARD_PCIE_ROOT,
            },
        ],
    },
    // intel/intel-resource-drivers-for-kubernetes cmd/kubelet-gaudi-plugin/node_state.go
    // (`model` is the SKU name such as `Gaudi2`, `serial`, `healthy`, `pciRoot`; no
    // memory capacity) and doc/gaudi/USAGE.md.
    KnownDriver {
        name: "gaudi.intel.com",
        vendor: Vendor::Intel,
        family: Family::Asic,
        product: ProductSource::Attribute("model"),
        uuid: Some("serial"),
        pci_address: None,
        memory: None,
        whole_device: None,
        aggregate: None,
        health: Some(HealthSource::Bool("healthy")),
        interconnect_group: None,
        partition: None,
        deprecated: &[],
    },
    // aws-neuron/aws-neuron-sdk containers/neuron-dra.rst: devices `neurondevice<N>` in one
    // pool named after the node; `instanceType` (`trn2.48xlarge`), `neuronDriverVersion`,
    // `resourceType` (`neuron_node` on the entry that stands for a whole UltraServer node),
    // and the cross-driver `resource.aws.com/devicegroup{1,4,8,16}_id` connected sets. No
    // product name, memory capacity, PCI address or serial is documented: the product comes
    // from the instance type and the memory from the planner's product table.
    KnownDriver {
        name: "neuron.aws.com",
        vendor: Vendor::Aws,
        family: Family::Asic,
        product: ProductSource::AwsInstanceType("instanceType"),
        uuid: None,
        pci_address: None,
        memory: None,
        whole_device: None,
        aggregate: Some(("resourceType", "neuron_node")),
        health: None,
        interconnect_group: Some("resource.aws.com/devicegroup16_id"),
        partition: None,
        deprecated: &[],
    },
];

/// The known driver called `name`.
pub fn known(name: &str) -> Option<&'static KnownDriver> {
    KNOWN_DRIVERS.iter().find(|driver| driver.name == name)
}

/// The accelerator an EC2 instance type carries (`trn2.48xlarge` → `AWS Trainium2`), for the
/// instance families AWS documents; `None` for any other text.
pub fn aws_accelerator(instance_type: &str) -> Option<&'static str> {
    let family = instance_type.trim().split('.').next()?.to_ascii_lowercase();
    // The size after the dot must be there: `trn2` alone is not an instance type.
    instance_type
        .split_once('.')
        .filter(|(_, size)| !size.is_empty())?;
    Some(match family.as_str() {
        "trn2" | "trn2u" => "AWS Trainium2",
        "trn1" | "trn1n" => "AWS Trainium",
        "inf2" => "AWS Inferentia2",
        "inf1" => "AWS Inferentia",
        _ => return None,
    })
}
