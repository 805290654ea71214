//! Detection parsers on arbitrary input: vendor tool output, host files, device ids, and
//! whole host trees of arbitrary bytes through every backend.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;

use super::{cases, text};
use crate::detect::backends;
use crate::detect::backends::accelerators::{
    amd, apple, gaudi, generic_pci, intel_gpu, intel_npu, neuron, nvidia, qualcomm, tpu, vulkan,
    xdna,
};
use crate::detect::backends::node::{cpu, runtime, topology};
use crate::detect::{BackendSelection, CommandRunner, Detector, HostRoot};

/// Every parser of a vendor tool's output on `s`, as one debug string.
fn vendor_tools(s: &str) -> String {
    format!(
        "{} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
        nvidia::fuzz_parsers(s),
        amd::amd_smi::parse_amd_smi_static(s),
        amd::amd_smi::parse_rocm_smi(s),
        intel_gpu::xpu_smi::parse_discovery_dump(s),
        intel_gpu::xpu_smi::parse_topology_matrix(s),
        gaudi::hl_smi::parse_query(s),
        gaudi::hl_smi::parse_firmware_version(s),
        gaudi::hl_smi::status_health(s),
        neuron::parse_neuron_ls_json(s),
        neuron::parse_neuron_ls_table(s),
        qualcomm::parse_qaic_util(s),
        vulkan::parse_vulkaninfo_summary(s),
        tpu::parse_tpu_env(s),
    )
}

/// Every parser of a host file (procfs, sysfs, cgroupfs, /etc) on `s`, as one debug string.
fn host_files(s: &str) -> String {
    let cpu_facts = format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
        cpu::parse_cpuinfo(s),
        cpu::ai_flags(s),
        cpu::cpulist_len(s),
        cpu::parse_meminfo_total(s),
        cpu::parse_kib_value(s),
        cpu::parse_proc_cgroup(s),
        cpu::parse_memory_max(s),
        cpu::parse_cpu_max(s),
        cpu::parse_v1_memory_limit(s),
        cpu::parse_v1_cpu_quota(s, s),
        cpu::parse_v1_cpu_quota(s, "100000"),
    );
    let dmi = runtime::Dmi {
        sys_vendor: Some(s.to_string()),
        product_name: Some(s.to_string()),
        board_vendor: None,
        bios_vendor: Some(s.to_string()),
        bios_version: Some(s.to_string()),
        chassis_asset_tag: Some(s.to_string()),
    };
    let node_facts = format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?}",
        runtime::parse_cgroup_markers(s),
        runtime::root_is_overlay(s),
        runtime::parse_os_release(s),
        runtime::cloud_from_dmi(&dmi),
        apple::parse_compatible(s),
        apple::parse_mem_total(s),
        topology::node_id(s),
    );
    let sysfs = format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
        topology::parse_node_meminfo_total(s),
        topology::uevent_value(s, "DRIVER"),
        topology::nic_kind(s, Some(s), Some(s)),
        topology::parse_rate(s),
        topology::parse_port_state(s),
        topology::subnet_prefix(s),
        amd::kfd::parse_properties(s),
        amd::kfd::parse_io_link(s),
        amd::kfd::parse_mem_bank(s),
        amd::amdgpu_sysfs::parse_mode_list(s),
        amd::amdgpu_sysfs::parse_error_count(s),
        amd::amdgpu_sysfs::parse_bad_pages(s),
        amd::amdgpu_sysfs::parse_feature_mask(s),
        amd::gfx_catalog::generation(s),
        amd::gfx_catalog::is_integrated(s),
        neuron::parse_connected_devices(s),
    );
    let ids = format!(
        "{:?} {:?} {:?} {:?} {:?} {:?}",
        xdna::is_version(s),
        crate::detect::pci::canonical_bus_id(s),
        crate::detect::parse_u64(s),
        backends::slot_name_from_uevent(s),
        s.parse::<BackendSelection>(),
        gaudi::generation(None, Some(s)),
    );
    format!("{cpu_facts} {node_facts} {sysfs} {ids}")
}

/// Every id-keyed lookup on the given numbers, as one debug string.
fn device_ids(vendor: u16, device: u16, sub: u16, class: u32, rev: u8, big: u64) -> String {
    let props: BTreeMap<String, u64> = [
        "gpu_id",
        "simd_count",
        "domain",
        "location_id",
        "gfx_target_version",
        "device_id",
        "vendor_id",
        "array_count",
        "cu_per_simd_array",
        "simd_per_cu",
        "max_engine_clk_fclk",
        "local_mem_size",
        "num_xcc",
        "hive_id",
        "unique_id",
    ]
    .iter()
    .enumerate()
    .map(|(i, key)| {
        (
            (*key).to_string(),
            big.rotate_left(u32::try_from(i).unwrap_or(0)),
        )
    })
    .collect();
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
        generic_pci::classify(vendor, class, || Some(device)),
        generic_pci::model_name(vendor, Some(device), Some(sub)),
        amd::gfx_catalog::gfx_name(big),
        amd::gfx_catalog::known_part(device).map(|p| format!("{p:?}")),
        amd::kfd::bus_id(big, big.rotate_left(17)),
        amd::kfd::gpu_from_properties(u32::from(rev), &props),
        intel_gpu::part_catalog::architecture(device),
        intel_gpu::part_catalog::part_for(device).map(|p| format!("{p:?}")),
        intel_gpu::part_catalog::fallback_name(Some(device)),
        gaudi::generation(Some(device), None),
        tpu::TpuGeneration::from_pci_ids(device, Some(sub))
            // Chip counts come from the PCI bus: a few hundred at most.
            .map(|g| tpu::derive_topology(g, usize::from(sub % 4096))),
        neuron::NeuronChip::from_device_id(device),
        intel_npu::NpuGeneration::from_device_id(device),
        xdna::XdnaNpu::from_ids(device, Some(rev)),
        crate::detect::pci::canonical_bus_id(&format!("{big:x}:{vendor:x}:{device:x}.{rev}")),
        topology::node_id(&format!("node{big}")),
    )
}

proptest! {
    #![proptest_config(cases(1))]

    #[test]
    fn vendor_tool_output(s in text()) {
        prop_assert_eq!(vendor_tools(&s), vendor_tools(&s));
    }

    #[test]
    fn host_file_text(s in text()) {
        prop_assert_eq!(host_files(&s), host_files(&s));
    }

    #[test]
    fn device_ids_never_panic(
        vendor in prop_oneof![Just(0x10de_u16), Just(0x1002), Just(0x8086), Just(0x1ae0),
                              Just(0x1d0f), Just(0x17cb), Just(0x1da3), any::<u16>()],
        device in any::<u16>(), sub in any::<u16>(), class in any::<u32>(),
        rev in any::<u8>(), big in any::<u64>(),
    ) {
        let once = device_ids(vendor, device, sub, class, rev, big);
        prop_assert_eq!(once, device_ids(vendor, device, sub, class, rev, big));
    }
}

/// A fixture tree with sysfs, procfs and DMI files for most backends, and its regular files.
fn source_tree() -> &'static (PathBuf, Vec<PathBuf>) {
    static TREE: OnceLock<(PathBuf, Vec<PathBuf>)> = OnceLock::new();
    TREE.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hosts");
        let mut files = Vec::new();
        for scenario in ["mi300x-8x", "cpu-only-vm"] {
            collect_files(&root, &root.join(scenario), &mut files);
        }
        files.retain(|f| !f.starts_with("mi300x-8x/commands") && !f.ends_with("expected.json"));
        (root, files)
    })
}

fn collect_files(root: &Path, dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => collect_files(root, &path, files),
            Ok(kind) if kind.is_file() => {
                if let Ok(relative) = path.strip_prefix(root) {
                    files.push(relative.to_path_buf());
                }
            }
            _ => {}
        }
    }
}

thread_local! {
    /// One copy of each scenario per test thread: copying a tree costs more than detecting on
    /// it, so cases mutate the copy and put the original files back afterwards.
    static COPIES: std::cell::RefCell<BTreeMap<&'static str, tempfile::TempDir>> =
        const { std::cell::RefCell::new(BTreeMap::new()) };
}

/// Runs every backend, twice, over the scenario with `replaced` files' contents swapped for
/// the given bytes (file chosen by index modulo the scenario's file count).
fn detect_on_mutated(
    scenario: &'static str,
    replaced: &BTreeMap<usize, Vec<u8>>,
) -> (String, String) {
    let (root, files) = source_tree();
    COPIES.with_borrow_mut(|copies| {
        let dir = copies.entry(scenario).or_insert_with(|| {
            let dir = tempfile::tempdir().expect("temp dir");
            copy_with_links(&root.join(scenario), dir.path());
            dir
        });
        let in_scenario: Vec<&PathBuf> = files.iter().filter(|f| f.starts_with(scenario)).collect();
        let mut touched = Vec::new();
        for (index, bytes) in replaced {
            if let Some(file) = in_scenario.get(index % in_scenario.len().max(1))
                && let Ok(relative) = file.strip_prefix(scenario)
            {
                std::fs::write(dir.path().join(relative), bytes).expect("write mutated file");
                touched.push((root.join(file), dir.path().join(relative)));
            }
        }
        // No tools: this is about files; tool output is fuzzed as text above.
        let detector = Detector::new(
            HostRoot::new(dir.path()),
            CommandRunner::new(Vec::new()),
            &BackendSelection::all(),
        );
        let first = crate::output::to_json(&detector.run(false).0).expect("serialise");
        let second = crate::output::to_json(&detector.run(false).0).expect("serialise");
        for (original, copy) in touched {
            std::fs::copy(original, copy).expect("restore file");
        }
        (first, second)
    })
}

fn copy_with_links(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    let Ok(entries) = std::fs::read_dir(from) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        match entry.file_type() {
            Ok(kind) if kind.is_symlink() => {
                if let Ok(link) = std::fs::read_link(&source) {
                    let _ = std::os::unix::fs::symlink(link, &target);
                }
            }
            Ok(kind) if kind.is_dir() => copy_with_links(&source, &target),
            Ok(_) => {
                let _ = std::fs::copy(&source, &target);
            }
            Err(_) => {}
        }
    }
}

proptest! {
    #![proptest_config(cases(8))]

    #[test]
    fn mutated_host_tree(
        scenario in prop::sample::select(vec!["mi300x-8x", "cpu-only-vm"]),
        replaced in prop::collection::btree_map(
            any::<usize>(),
            prop_oneof![
                text().prop_map(String::into_bytes),
                prop::collection::vec(any::<u8>(), 0..64),
            ],
            1..24,
        ),
    ) {
        let (first, second) = detect_on_mutated(scenario, &replaced);
        prop_assert!(!first.contains("backend failed unexpectedly"), "{}", first);
        prop_assert_eq!(first, second);
    }
}
