//! The built-in backends, in priority order: when two backends report the same device id, the
//! earlier one wins. Vendor backends know their devices best, Vulkan knows less, and the
//! generic PCI backend only names what nobody else claimed.

use super::Backend;

mod accel_node;
pub mod amd;
pub mod apple;
pub mod cpu;
pub mod gaudi;
pub mod intel_gpu;
pub mod intel_npu;
pub mod neuron;
pub mod nvidia;
pub mod pci;
pub mod qualcomm;
pub mod runtime;
pub mod topology;
pub mod tpu;
pub mod vulkan;
pub mod xdna;

/// For the crate's fuzz harness (`src/fuzz_tests`); the module is private.
#[cfg(test)]
pub(crate) use accel_node::slot_name_from_uevent;

/// Backend names, in priority order.
pub const NAMES: [&str; 15] = [
    "nvidia",
    "amd",
    "tpu",
    "neuron",
    "gaudi",
    "intel-gpu",
    "intel-npu",
    "xdna",
    "qualcomm",
    "apple",
    "vulkan",
    "pci",
    "cpu",
    "topology",
    "runtime",
];

/// Every built-in backend, in priority order.
pub fn all() -> Vec<Box<dyn Backend>> {
    vec![
        Box::new(nvidia::Nvidia),
        Box::new(amd::Amd),
        Box::new(tpu::Tpu),
        Box::new(neuron::Neuron),
        Box::new(gaudi::Gaudi),
        Box::new(intel_gpu::IntelGpu),
        Box::new(intel_npu::IntelNpu),
        Box::new(xdna::Xdna),
        Box::new(qualcomm::Qualcomm),
        Box::new(apple::Apple),
        Box::new(vulkan::Vulkan),
        Box::new(pci::Pci),
        Box::new(cpu::Cpu),
        Box::new(topology::Topology),
        Box::new(runtime::Runtime),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_backends() {
        let names: Vec<_> = all().iter().map(|b| b.name()).collect();
        assert_eq!(names, NAMES);
    }
}
