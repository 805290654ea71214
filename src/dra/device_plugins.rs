//! The extended resources accelerator vendors' device plugins advertise on a Node
//! (`status.allocatable`): the other way besides DRA that a node offers its accelerators to
//! pods, and the one the publication audit ([`super::audit`]) compares DRA with.
//!
//! Names come from each plugin's public source (see `docs/dra.md`, "Publication audit"): a
//! GPU offered by a device plugin and by a DRA driver at once can be given to two pods, one
//! through each; and a GPU offered by neither is in the machine and nowhere in Kubernetes.
//!
//! The agent reads its Node's allocatable and keeps only these names
//! ([`advertised`]), so what it writes into the inventory is bounded by this table however
//! many extended resources other plugins add.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::hardware::{Family, Vendor};

/// What one unit of a plugin's resource is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A whole device (a GPU, a Gaudi card, a Neuron device, a TPU chip).
    Device,
    /// A partition of a device (an NVIDIA MIG instance of the mixed strategy).
    Partition,
    /// A core of a device (an AWS NeuronCore): several per device.
    Core,
}

/// One extended resource a vendor's device plugin advertises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginResource {
    /// The resource name, or its prefix when `prefix` is set.
    pub name: &'static str,
    /// `name` is a prefix (`nvidia.com/mig-` for `nvidia.com/mig-1g.10gb`).
    pub prefix: bool,
    /// Maker of its devices.
    pub vendor: Vendor,
    /// Kind of its devices.
    pub family: Family,
    /// What one unit is.
    pub unit: Unit,
}

const fn exact(name: &'static str, vendor: Vendor, family: Family, unit: Unit) -> PluginResource {
    PluginResource {
        name,
        prefix: false,
        vendor,
        family,
        unit,
    }
}

/// Every plugin resource we know. Intel's GPU plugin also advertises `millicores`,
/// `memory.max` and `tiles` under `gpu.intel.com/`: they are not devices and are left out.
pub const PLUGIN_RESOURCES: &[PluginResource] = &[
    // NVIDIA/k8s-device-plugin: `nvidia.com/gpu`; `nvidia.com/gpu.shared` when time-slicing
    // renames shared GPUs; `nvidia.com/mig-<profile>` with the mixed MIG strategy.
    exact("nvidia.com/gpu", Vendor::Nvidia, Family::Gpu, Unit::Device),
    exact(
        "nvidia.com/gpu.shared",
        Vendor::Nvidia,
        Family::Gpu,
        Unit::Device,
    ),
    PluginResource {
        name: "nvidia.com/mig-",
        prefix: true,
        vendor: Vendor::Nvidia,
        family: Family::Gpu,
        unit: Unit::Partition,
    },
    // ROCm/k8s-device-plugin.
    exact("amd.com/gpu", Vendor::Amd, Family::Gpu, Unit::Device),
    // intel/intel-device-plugins-for-kubernetes, the GPU plugin (i915 and xe kernel drivers).
    exact(
        "gpu.intel.com/i915",
        Vendor::Intel,
        Family::Gpu,
        Unit::Device,
    ),
    exact("gpu.intel.com/xe", Vendor::Intel, Family::Gpu, Unit::Device),
    // HabanaAI's device plugin for Gaudi.
    exact("habana.ai/gaudi", Vendor::Intel, Family::Asic, Unit::Device),
    // aws-neuron's device plugin: devices under two names, and cores.
    exact(
        "aws.amazon.com/neuron",
        Vendor::Aws,
        Family::Asic,
        Unit::Device,
    ),
    exact(
        "aws.amazon.com/neurondevice",
        Vendor::Aws,
        Family::Asic,
        Unit::Device,
    ),
    exact(
        "aws.amazon.com/neuroncore",
        Vendor::Aws,
        Family::Asic,
        Unit::Core,
    ),
    // GKE's TPU device plugin: chips.
    exact("google.com/tpu", Vendor::Google, Family::Tpu, Unit::Device),
    // Qualcomm's Cloud AI 100 plugin.
    exact(
        "qualcomm.com/qaic",
        Vendor::Qualcomm,
        Family::Asic,
        Unit::Device,
    ),
];

/// At most this many plugin resources are kept per node: the table above names eleven and a
/// prefix, and a Node with more has a runaway plugin.
pub const MAX_ADVERTISED: usize = 16;

/// The largest count taken from an allocatable quantity; more is a publisher's error.
const MAX_COUNT: u32 = 4096;

/// The plugin resource `name` is, if any.
pub fn known(name: &str) -> Option<&'static PluginResource> {
    PLUGIN_RESOURCES.iter().find(|resource| {
        if resource.prefix {
            name.len() > resource.name.len() && name.starts_with(resource.name)
        } else {
            name == resource.name
        }
    })
}

/// The known plugin resources in a Node's `status.allocatable`, with their counts: at most
/// [`MAX_ADVERTISED`], in name order, names at most 253 bytes (an extended resource name is a
/// qualified name). A value that is not a whole number of units is left out: an extended
/// resource is counted in whole units, so it is not one of these.
pub fn advertised(allocatable: &BTreeMap<String, Quantity>) -> BTreeMap<String, u32> {
    allocatable
        .iter()
        .filter(|(name, _)| name.len() <= 253 && known(name).is_some())
        .filter_map(|(name, quantity)| {
            let count: u32 = quantity.0.trim().parse().ok()?;
            Some((name.clone(), count.min(MAX_COUNT)))
        })
        .take(MAX_ADVERTISED)
        .collect()
}

/// The devices of `vendor`'s `family` a node's plugins advertise, in whole devices: the
/// largest count among its `Device` resources, or, when it advertises only partitions or
/// cores, `None` with `true` (present, devices not countable). `(None, false)` when no plugin
/// of it advertises anything.
pub fn devices_of(
    advertised: &BTreeMap<String, u32>,
    vendor: Vendor,
    family: Family,
) -> (Option<u32>, bool) {
    let mut devices: Option<u32> = None;
    let mut any = false;
    for (name, count) in advertised {
        let Some(resource) = known(name) else {
            continue;
        };
        if resource.vendor != vendor || resource.family != family || *count == 0 {
            continue;
        }
        any = true;
        if resource.unit == Unit::Device {
            devices = Some(devices.map_or(*count, |d| d.max(*count)));
        }
    }
    (devices, any)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocatable(entries: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        entries
            .iter()
            .map(|(name, value)| (name.to_string(), Quantity(value.to_string())))
            .collect()
    }

    #[test]
    fn only_known_accelerator_resources_with_whole_counts_are_kept() {
        let node = allocatable(&[
            ("cpu", "64"),
            ("memory", "1Ti"),
            ("nvidia.com/gpu", "8"),
            ("nvidia.com/mig-1g.10gb", "14"),
            ("nvidia.com/mig-", "3"),
            ("gpu.intel.com/millicores", "8000"),
            ("amd.com/gpu", "1500m"),
            ("example.com/foo", "2"),
        ]);
        let kept = advertised(&node);
        assert_eq!(
            kept,
            BTreeMap::from([
                ("nvidia.com/gpu".to_string(), 8),
                ("nvidia.com/mig-1g.10gb".to_string(), 14),
            ])
        );
    }

    #[test]
    fn counts_are_capped_and_entries_bounded() {
        let mut node = allocatable(&[("nvidia.com/gpu", "99999999999")]);
        for i in 0..40 {
            node.insert(format!("nvidia.com/mig-{i}g.10gb"), Quantity("1".into()));
        }
        let kept = advertised(&node);
        assert_eq!(kept.len(), MAX_ADVERTISED);
        // Past u32: not a count at all.
        assert!(!kept.contains_key("nvidia.com/gpu"));
        let capped = advertised(&allocatable(&[("amd.com/gpu", "100000")]));
        assert_eq!(capped["amd.com/gpu"], MAX_COUNT);
    }

    #[test]
    fn devices_of_a_vendor_are_the_largest_device_count_and_cores_only_say_present() {
        let kept = BTreeMap::from([
            ("aws.amazon.com/neuroncore".to_string(), 32),
            ("nvidia.com/gpu".to_string(), 8),
            ("nvidia.com/gpu.shared".to_string(), 0),
        ]);
        assert_eq!(
            devices_of(&kept, Vendor::Nvidia, Family::Gpu),
            (Some(8), true)
        );
        assert_eq!(devices_of(&kept, Vendor::Aws, Family::Asic), (None, true));
        assert_eq!(devices_of(&kept, Vendor::Amd, Family::Gpu), (None, false));
        let zero = BTreeMap::from([("amd.com/gpu".to_string(), 0)]);
        assert_eq!(devices_of(&zero, Vendor::Amd, Family::Gpu), (None, false));
    }
}
