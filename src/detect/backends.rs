//! The backend registry: every built-in backend, in priority order, in one table.
//!
//! When two backends report the same device id, the earlier one wins: vendor backends know
//! their devices best, Vulkan knows less, and the generic PCI backend only names what nobody
//! else claimed. The node-fact collectors come last; they report no devices.
//!
//! [`REGISTRY`] is the only list of backends: their names ([`names`]), the detector's set
//! ([`all`], [`selected`]) and `--backends` parsing ([`BackendSelection`]) derive from it, and
//! this file also declares every backend module. Adding a backend is one module here, one
//! registry entry, and the backend's own file (docs/detection.md, "Add a backend").
//!
//! Layout:
//! - `accelerators/<family>`: one backend per accelerator family;
//! - `node/`: the node-fact collectors (`cpu`, `topology`, `runtime`);
//! - `shared/`: helpers several backends use (accel device nodes, running and parsing a tool).
//!   The PCI bus scan every backend shares belongs to the [`Context`](super::Context) and
//!   lives in [`crate::detect::pci`].

use super::{Backend, BackendSelection};

/// One backend per accelerator family.
pub mod accelerators {
    pub mod amd;
    pub mod apple;
    pub mod gaudi;
    pub mod generic_pci;
    pub mod intel_gpu;
    pub mod intel_npu;
    pub mod neuron;
    pub mod nvidia;
    pub mod qualcomm;
    pub mod tpu;
    pub mod vulkan;
    pub mod xdna;
}

/// Node-wide facts: CPU and memory, NUMA and RDMA topology, the runtime environment.
pub mod node {
    pub mod cpu;
    pub mod runtime;
    pub mod topology;
}

/// Helpers shared by backends.
mod shared {
    pub(crate) mod accel_node;
    pub(crate) mod tool_output;
}

/// For the crate's fuzz harness (`src/fuzz_tests`); the module is private.
#[cfg(test)]
pub(crate) use shared::accel_node::slot_name_from_uevent;

/// A built-in backend: the name it answers to and how to make one.
#[derive(Debug, Clone, Copy)]
pub struct Registered {
    /// The backend's [`Backend::name`], as `--backends` spells it.
    pub name: &'static str,
    /// Makes the backend.
    pub make: fn() -> Box<dyn Backend>,
}

/// Every built-in backend, in priority order: the one list to edit when adding a backend.
pub const REGISTRY: &[Registered] = &[
    entry("nvidia", || Box::new(accelerators::nvidia::Nvidia)),
    entry("amd", || Box::new(accelerators::amd::Amd)),
    entry("tpu", || Box::new(accelerators::tpu::Tpu)),
    entry("neuron", || Box::new(accelerators::neuron::Neuron)),
    entry("gaudi", || Box::new(accelerators::gaudi::Gaudi)),
    entry("intel-gpu", || Box::new(accelerators::intel_gpu::IntelGpu)),
    entry("intel-npu", || Box::new(accelerators::intel_npu::IntelNpu)),
    entry("xdna", || Box::new(accelerators::xdna::Xdna)),
    entry("qualcomm", || Box::new(accelerators::qualcomm::Qualcomm)),
    entry("apple", || Box::new(accelerators::apple::Apple)),
    entry("vulkan", || Box::new(accelerators::vulkan::Vulkan)),
    entry("pci", || Box::new(accelerators::generic_pci::Pci)),
    entry("cpu", || Box::new(node::cpu::Cpu)),
    entry("topology", || Box::new(node::topology::Topology)),
    entry("runtime", || Box::new(node::runtime::Runtime)),
];

const fn entry(name: &'static str, make: fn() -> Box<dyn Backend>) -> Registered {
    Registered { name, make }
}

/// Backend names, in priority order.
pub fn names() -> impl Iterator<Item = &'static str> {
    REGISTRY.iter().map(|registered| registered.name)
}

/// The registered name equal to `name`, if any.
pub fn lookup(name: &str) -> Option<&'static str> {
    names().find(|known| *known == name)
}

/// Every built-in backend, in priority order.
pub fn all() -> Vec<Box<dyn Backend>> {
    REGISTRY
        .iter()
        .map(|registered| (registered.make)())
        .collect()
}

/// The selected built-in backends, in priority order.
pub fn selected(selection: &BackendSelection) -> Vec<Box<dyn Backend>> {
    REGISTRY
        .iter()
        .filter(|registered| selection.includes(registered.name))
        .map(|registered| (registered.make)())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    use super::*;

    #[test]
    fn registered_names_are_unique_and_each_backends_own() {
        let mut seen = BTreeSet::new();
        for registered in REGISTRY {
            assert!(
                seen.insert(registered.name),
                "{} is registered twice",
                registered.name
            );
            assert_eq!((registered.make)().name(), registered.name);
        }
        let built: Vec<_> = all().iter().map(|backend| backend.name()).collect();
        assert_eq!(built, names().collect::<Vec<_>>());
        assert_eq!(lookup("intel-gpu"), Some("intel-gpu"));
        assert_eq!(lookup("intel_gpu"), None);
    }

    #[test]
    fn a_selection_keeps_the_priority_order() {
        let selection: BackendSelection = "cpu,nvidia,vulkan".parse().unwrap();
        let names: Vec<_> = selected(&selection).iter().map(|b| b.name()).collect();
        assert_eq!(names, ["nvidia", "vulkan", "cpu"]);
    }

    /// File names that may repeat under `src/detect`: a backend's whole-backend tests sit in
    /// `tests.rs` beside its parsers, as in the rest of the crate.
    const REPEATABLE_FILE_NAMES: &[&str] = &["tests.rs"];

    fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|err| panic!("{dir:?}: {err}"));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, found);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                found.push(path);
            }
        }
    }

    #[test]
    fn no_two_files_under_detect_share_a_name() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/detect");
        let mut files = Vec::new();
        rust_files(&root, &mut files);
        let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for path in &files {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let relative = path.strip_prefix(&root).unwrap().display().to_string();
            by_name.entry(name).or_default().push(relative);
        }
        assert!(by_name.contains_key("backends.rs") && by_name.len() > 20);
        let shared: Vec<_> = by_name
            .iter()
            .filter(|(name, paths)| {
                paths.len() > 1 && !REPEATABLE_FILE_NAMES.contains(&name.as_str())
            })
            .collect();
        assert!(shared.is_empty(), "files sharing a name: {shared:?}");
    }
}
