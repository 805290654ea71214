//! Detection on real tool output: every capture under `fixtures/captures/<tool>/` goes through
//! the parser the backend uses for it (or the whole backend, for `/proc/cpuinfo`), and the
//! expected values below were read off the capture by eye, never copied from a parser's output.
//!
//! Where each capture comes from (repository or page, commit or date, hardware, command) is in
//! the `PROVENANCE.md` next to it; `docs/detection.md` lists which captures back each backend.

#![allow(
    clippy::expect_used,
    reason = "helpers of a test binary: a failed setup step should fail the test loudly"
)]

use std::path::{Path, PathBuf};

use hwaccel::detect::backends::accelerators::amd::amd_smi::{parse_amd_smi_static, parse_rocm_smi};
use hwaccel::detect::backends::accelerators::intel_gpu::xpu_smi::{
    parse_discovery_dump, parse_topology_matrix as parse_xpu_topology,
};
use hwaccel::detect::backends::accelerators::neuron::{
    parse_neuron_ls_json, parse_neuron_ls_table,
};
use hwaccel::detect::backends::accelerators::nvidia::nvidia_smi::{
    QueriedGpu, parse_gpu_list, parse_query_gpus,
};
use hwaccel::detect::backends::accelerators::nvidia::nvlink::{
    parse_nvlink_status, parse_topo_matrix,
};
use hwaccel::detect::backends::accelerators::vulkan::parse_vulkaninfo_summary;
use hwaccel::detect::backends::node::cpu::Cpu;
use hwaccel::detect::{Backend, CommandRunner, Context, HostRoot};
use hwaccel::hardware::CpuInfo;

fn captures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/captures")
}

/// The text of `fixtures/captures/<tool>/<name>`.
fn capture(tool: &str, name: &str) -> String {
    let path = captures_dir().join(tool).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// Every capture file of a tool directory must be named in its PROVENANCE.md, and every
/// directory must have one.
#[test]
fn every_capture_has_a_provenance_row() {
    let mut checked = 0;
    for dir in std::fs::read_dir(captures_dir()).expect("fixtures/captures") {
        let dir = dir.expect("entry").path();
        if !dir.is_dir() {
            continue;
        }
        let provenance = std::fs::read_to_string(dir.join("PROVENANCE.md"))
            .unwrap_or_else(|_| panic!("{} has no PROVENANCE.md", dir.display()));
        for file in std::fs::read_dir(&dir).expect("capture dir") {
            let name = file
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .to_string();
            if name == "PROVENANCE.md" {
                continue;
            }
            assert!(
                provenance.contains(&format!("`{name}`")),
                "{}/{name} has no row in PROVENANCE.md",
                dir.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} captures found");
}

// ---- nvidia-smi topo -m ----

#[test]
fn topo_single_tesla_p4_with_na_numa_and_gpu_numa_id_column() {
    // Driver with the `GPU NUMA ID` column, one GPU, NUMA affinity `N/A`, cells padded with
    // double tabs.
    let rows = parse_topo_matrix(&capture("nvidia-smi-topo-m", "hami-99-tesla-p4-1x.txt"));
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].index, 0);
    assert_eq!(rows[0].numa, None, "N/A is no NUMA node");
    assert!(rows[0].nvlinks.is_empty());
}

#[test]
fn topo_eight_rtx_4090_with_nic_columns() {
    let rows = parse_topo_matrix(&capture(
        "nvidia-smi-topo-m",
        "go-gpuallocator-17-rtx4090-8x.txt",
    ));
    assert_eq!(rows.len(), 8, "NIC rows are not GPUs");
    let numa: Vec<Option<u32>> = rows.iter().map(|row| row.numa).collect();
    assert_eq!(
        numa,
        [0, 0, 0, 0, 1, 1, 1, 1].map(Some),
        "GPU0-3 on node 0, GPU4-7 on node 1"
    );
    assert!(rows.iter().all(|row| row.nvlinks.is_empty()), "all SYS");
}

#[test]
fn topo_five_rtx_4090_driver_580_as_pasted_with_spaces() {
    let rows = parse_topo_matrix(&capture("nvidia-smi-topo-m", "club-3090-46-rtx4090-5x.txt"));
    assert_eq!(rows.len(), 5);
    let numa: Vec<Option<u32>> = rows.iter().map(|row| row.numa).collect();
    assert_eq!(numa, [1, 0, 0, 0, 0].map(Some));
    assert!(rows.iter().all(|row| row.nvlinks.is_empty()));
}

#[test]
fn topo_eight_a100_pcie_where_slurm_left_cpu_affinity_empty() {
    // Under a Slurm CPU allocation the CPU Affinity cell of GPU4-7 is empty; their NUMA
    // Affinity is 1 and must not be taken from the `GPU NUMA ID` column (`N/A`).
    let rows = parse_topo_matrix(&capture(
        "nvidia-smi-topo-m",
        "dask-cuda-1381-a100-pcie-8x-empty-cpu-affinity.txt",
    ));
    assert_eq!(rows.len(), 8);
    let numa: Vec<Option<u32>> = rows.iter().map(|row| row.numa).collect();
    assert_eq!(numa, [0, 0, 0, 0, 1, 1, 1, 1].map(Some));
    // NV12 pairs: 0-1, 2-3, 4-5, 6-7.
    for (gpu, peer) in [
        (0, 1),
        (1, 0),
        (2, 3),
        (3, 2),
        (4, 5),
        (5, 4),
        (6, 7),
        (7, 6),
    ] {
        let row = &rows[gpu];
        assert_eq!(row.nvlinks.len(), 1, "GPU{gpu}");
        assert_eq!(row.nvlinks.get(&peer), Some(&12), "GPU{gpu}");
    }
}

#[test]
fn topo_two_a100_with_nv12_and_ten_nics() {
    let rows = parse_topo_matrix(&capture(
        "nvidia-smi-topo-m",
        "dask-cuda-1358-a100-2x-nv12-10nic.txt",
    ));
    assert_eq!(rows.len(), 2, "NIC rows are not GPUs");
    assert_eq!(rows[0].nvlinks.get(&1), Some(&12));
    assert_eq!(rows[1].nvlinks.get(&0), Some(&12));
    assert_eq!(rows[0].numa, Some(3));
    assert_eq!(rows[1].numa, Some(3));
}

// ---- nvidia-smi -L ----

#[test]
fn listing_a100_sxm4_with_four_mig_devices_on_gpu0() {
    let gpus = parse_gpu_list(&capture(
        "nvidia-smi-L",
        "telegraf-5812-a100-sxm4-4x-mig.txt",
    ));
    assert_eq!(gpus.len(), 4);
    assert!(gpus.iter().all(|gpu| gpu.name == "NVIDIA A100-SXM4-80GB"));
    assert_eq!(
        gpus[0].uuid.as_deref(),
        Some("GPU-513536b6-7d19-9063-b049-1e69664bb298")
    );
    assert_eq!(gpus[0].partitions.len(), 4);
    assert!(gpus[0].partitions.iter().all(|p| p.profile == "1g.20gb"));
    assert_eq!(
        gpus[0].partitions[3].id.as_deref(),
        Some("MIG-930574a9-d43a-5d2b-95da-3e68384c8d6b")
    );
    assert!(gpus[1..].iter().all(|gpu| gpu.partitions.is_empty()));
    assert_eq!(gpus[3].index, 3);
}

#[test]
fn listing_a100_pcie_with_one_mig_device() {
    let gpus = parse_gpu_list(&capture("nvidia-smi-L", "go-dcgm-30-a100-pcie-1x-mig.txt"));
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0].name, "NVIDIA A100 80GB PCIe");
    assert_eq!(gpus[0].partitions.len(), 1);
    assert_eq!(gpus[0].partitions[0].profile, "2g.20gb");
    assert_eq!(gpus[0].partitions[0].kind, "mig");
}

#[test]
fn listing_a100_sxm4_with_seven_mig_devices() {
    let gpus = parse_gpu_list(&capture(
        "nvidia-smi-L",
        "datadog-33120-a100-sxm4-1x-mig7.txt",
    ));
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0].partitions.len(), 7);
    assert!(gpus[0].partitions.iter().all(|p| p.profile == "1g.10gb"));
}

#[test]
fn listing_a100_pcie_with_two_3g_devices() {
    let gpus = parse_gpu_list(&capture(
        "nvidia-smi-L",
        "nvidia-container-toolkit-203-a100-pcie-mig2.txt",
    ));
    assert_eq!(gpus.len(), 1);
    let profiles: Vec<&str> = gpus[0]
        .partitions
        .iter()
        .map(|p| p.profile.as_str())
        .collect();
    assert_eq!(profiles, ["3g.40gb", "3g.40gb"]);
}

#[test]
fn listing_pasted_without_its_closing_parenthesis_keeps_the_uuid() {
    let gpus = parse_gpu_list(&capture(
        "nvidia-smi-L",
        "cpu-x-115-gtx1660ti-cut-paren.txt",
    ));
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0].name, "GeForce GTX 1660 Ti");
    assert_eq!(
        gpus[0].uuid.as_deref(),
        Some("GPU-e18afb8d-1627-f8ff-2ba3-c05c5a8e9e67")
    );
}

// ---- rocm-smi --showproductname --showmeminfo vram --showbus --json ----

#[test]
fn rocm_smi_mi250x_decimal_gfx_version_is_gfx90a() {
    let gpus =
        parse_rocm_smi(&capture("rocm-smi", "rocm-smi-lib-159-mi250x-excerpt.json")).expect("JSON");
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0].index, Some(0));
    assert_eq!(
        gpus[0].market_name.as_deref(),
        Some("AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2")
    );
    // ROCm 6 prints `gfx9010`: 9, 0 and stepping 10 in decimal, which is gfx90a.
    assert_eq!(gpus[0].gfx.as_deref(), Some("gfx90a"));
    assert_eq!(gpus[0].vram_bytes, None, "no VRAM field in this capture");
}

#[test]
fn rocm_smi_rx_7900_xt_with_vram() {
    let gpus = parse_rocm_smi(&capture("rocm-smi", "marimo-9237-rx7900xt.json")).expect("JSON");
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0].market_name.as_deref(), Some("Radeon RX 7900 XT"));
    assert_eq!(gpus[0].gfx.as_deref(), Some("gfx1100"));
    assert_eq!(gpus[0].vram_bytes, Some(21_458_059_264));
    assert_eq!(gpus[0].bus_id, None, "not asked for with --showbus");
}

// ---- /proc/cpuinfo, through the cpu backend ----

/// The `cpu` backend on a host root holding only `proc/cpuinfo`.
fn cpu_from(name: &str) -> CpuInfo {
    let root = tempfile::tempdir().expect("temp dir");
    let proc_dir = root.path().join("proc");
    std::fs::create_dir_all(&proc_dir).expect("proc");
    std::fs::write(proc_dir.join("cpuinfo"), capture("cpuinfo", name)).expect("cpuinfo");
    let ctx = Context::new(HostRoot::new(root.path()), CommandRunner::new(Vec::new()));
    Cpu.detect(&ctx).cpu.expect("cpu facts")
}

#[test]
fn cpuinfo_s390x_z13() {
    let cpu = cpu_from("procfs-s390x-z13-4cpu.txt");
    assert_eq!(cpu.vendor.as_deref(), Some("IBM/S390"));
    assert_eq!(cpu.model.as_deref(), Some("IBM z13 (2964)"));
    assert_eq!(cpu.arch.as_deref(), Some("s390x"));
    assert_eq!(cpu.threads, Some(4));
    assert_eq!(cpu.cores, Some(4), "max thread id 0: one thread per core");
}

#[test]
fn cpuinfo_s390x_header_only_excerpt_counts_declared_processors() {
    let cpu = cpu_from("kata-s390x-z13-excerpt.txt");
    assert_eq!(cpu.model.as_deref(), Some("IBM z13 (2964)"));
    assert_eq!(
        cpu.threads,
        Some(4),
        "`# processors : 4`, one processor line"
    );
}

#[test]
fn cpuinfo_power7_pseries() {
    let cpu = cpu_from("procfs-ppc64-power7-6cpu.txt");
    assert_eq!(cpu.vendor.as_deref(), Some("IBM"));
    assert_eq!(cpu.model.as_deref(), Some("POWER7"));
    assert_eq!(cpu.arch.as_deref(), Some("ppc64"));
    assert_eq!(cpu.threads, Some(6));
}

#[test]
fn cpuinfo_power8e_powernv() {
    let cpu = cpu_from("kata-ppc64le-power8e-powernv.txt");
    assert_eq!(cpu.vendor.as_deref(), Some("IBM"));
    assert_eq!(cpu.model.as_deref(), Some("POWER8E"));
    assert_eq!(cpu.arch.as_deref(), Some("ppc64le"));
    assert_eq!(cpu.threads, Some(20), "processors 0, 8, ... 152");
    assert!(cpu.ai_flags.is_empty());
}

#[test]
fn cpuinfo_armv7_board() {
    let cpu = cpu_from("procfs-armv7-sun8i-2cpu.txt");
    assert_eq!(cpu.vendor.as_deref(), Some("ARM"));
    assert_eq!(cpu.model.as_deref(), Some("Cortex-A7"));
    assert_eq!(cpu.arch.as_deref(), Some("arm"));
    assert_eq!(cpu.threads, Some(2));
}

// ---- neuron-ls (the plain-table fallback) ----

#[test]
fn neuron_ls_v1_16_table_after_its_banner() {
    let listing =
        parse_neuron_ls_table(&capture("neuron-ls", "aws-neuron-sdk-359-inf1-banner.txt"))
            .expect("a device table");
    assert_eq!(listing.devices.len(), 1);
    let device = &listing.devices[0];
    assert_eq!(device.index, 0);
    assert_eq!(device.neuroncores, Some(4));
    assert_eq!(
        device.memory_bytes,
        Some(8 << 30),
        "8 GB, as the tool means it: GiB"
    );
    assert_eq!(device.bus_id.as_deref(), Some("0000:00:1f.0"));
    assert_eq!(listing.instance_type, None);
}

// ---- nvidia-smi --query-gpu=... --format=csv (header line, units) ----
//
// The exporter's captures query about 200 fields with `--format=csv`; the backend asks for 19
// with `--format=csv,nounits`. Both print a header line, and the parser maps columns by its
// names, so these rows read as the backend's own query would.

/// The one GPU row of a query-gpu capture, with nothing left unread.
fn queried_gpu(name: &str) -> QueriedGpu {
    let (gpus, unparsed) = parse_query_gpus(&capture("nvidia-smi-query-gpu", name));
    assert_eq!(unparsed, 0, "{name}: every line is the header or a GPU row");
    assert_eq!(gpus.len(), 1, "{name}: one GPU");
    gpus.into_iter().next().expect("one GPU")
}

/// The PCIe link as (generation, width, max generation, max width).
fn link(gpu: &QueriedGpu) -> (Option<u8>, Option<u8>, Option<u8>, Option<u8>) {
    let link = gpu.pcie.expect("a PCIe link");
    (
        link.generation,
        link.width,
        link.max_generation,
        link.max_width,
    )
}

#[test]
fn query_gpu_h200_on_driver_580_with_units() {
    let gpu = queried_gpu("gpu-exporter-h200-580.173.02.csv");
    assert_eq!(gpu.index, Some(0));
    assert_eq!(gpu.bus_id, "0000:83:00.0");
    assert_eq!(gpu.name.as_deref(), Some("NVIDIA H200"));
    assert_eq!(gpu.memory_bytes, Some(143_771 << 20), "`143771 MiB`");
    assert_eq!(gpu.driver_version.as_deref(), Some("580.173.02"));
    assert_eq!(gpu.vbios.as_deref(), Some("96.00.A5.00.03"));
    assert_eq!(gpu.compute_capability, Some((9, 0)));
    assert_eq!(gpu.mig_enabled, Some(false));
    assert_eq!(gpu.ecc_enabled, Some(true));
    assert_eq!(link(&gpu), (Some(5), Some(16), Some(5), Some(16)));
}

#[test]
fn query_gpu_h100_in_mig_mode_on_driver_590() {
    let gpu = queried_gpu("gpu-exporter-h100-mig-590.48.01.csv");
    assert_eq!(gpu.bus_id, "0000:00:09.0");
    assert_eq!(gpu.name.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(gpu.memory_bytes, Some(81_559 << 20));
    assert_eq!(gpu.driver_version.as_deref(), Some("590.48.01"));
    assert_eq!(gpu.compute_capability, Some((9, 0)));
    assert_eq!(
        gpu.mig_enabled,
        Some(true),
        "MIG on: the backend asks -L next"
    );
    assert_eq!(
        gpu.uuid.as_deref(),
        Some("GPU-00000000-0000-0000-0000-000000000000"),
        "masked by the exporter's collector"
    );
}

#[test]
fn query_gpu_l40s_on_driver_595_without_mig() {
    let gpu = queried_gpu("gpu-exporter-l40s-595.80.csv");
    assert_eq!(gpu.bus_id, "0000:01:00.0");
    assert_eq!(gpu.name.as_deref(), Some("NVIDIA L40S"));
    assert_eq!(gpu.memory_bytes, Some(46_068 << 20));
    assert_eq!(gpu.driver_version.as_deref(), Some("595.80"));
    assert_eq!(gpu.compute_capability, Some((8, 9)));
    assert_eq!(gpu.mig_enabled, None, "`[N/A]` on a GPU without MIG");
    assert_eq!(gpu.ecc_enabled, Some(true));
    assert_eq!(link(&gpu), (Some(4), Some(16), Some(4), Some(16)));
}

#[test]
fn query_gpu_geforce_on_driver_610_with_the_kmd_version_column() {
    // Newer drivers add columns (`kmd_version`); they must be ignored, not shift the others.
    let gpu = queried_gpu("gpu-exporter-rtx2080super-610.57.04.csv");
    assert_eq!(gpu.bus_id, "0000:0c:00.0");
    assert_eq!(gpu.name.as_deref(), Some("NVIDIA GeForce RTX 2080 SUPER"));
    assert_eq!(gpu.memory_bytes, Some(8_192 << 20));
    assert_eq!(gpu.driver_version.as_deref(), Some("610.57.04"));
    assert_eq!(gpu.compute_capability, Some((7, 5)));
    assert_eq!(gpu.ecc_enabled, None, "no ECC on GeForce: `[N/A]`");
    assert_eq!(
        link(&gpu),
        (Some(1), Some(16), Some(3), Some(16)),
        "idle: gen 1 now, gen 3 at most"
    );
}

#[test]
fn query_gpu_geforce_on_windows_driver_591() {
    // The Windows driver has no pci.baseClass/subClass columns: a different column set again.
    let gpu = queried_gpu("gpu-exporter-windows-rtx2080super-591.86.csv");
    assert_eq!(gpu.bus_id, "0000:0c:00.0");
    assert_eq!(gpu.driver_version.as_deref(), Some("591.86"));
    assert_eq!(gpu.vbios.as_deref(), Some("90.04.7a.40.73"));
    assert_eq!(gpu.memory_bytes, Some(8_192 << 20));
}

// ---- nvidia-smi -L (more) and topo -m (more), from the same collector ----

#[test]
fn listing_h200_with_compute_instance_profiles() {
    let gpus = parse_gpu_list(&capture(
        "nvidia-smi-L",
        "gpu-exporter-h200-mig-590.48.01.txt",
    ));
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0].name, "NVIDIA H200");
    let profiles: Vec<&str> = gpus[0]
        .partitions
        .iter()
        .map(|p| p.profile.as_str())
        .collect();
    assert_eq!(
        profiles,
        ["1c.3g.71gb", "2c.3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"],
        "compute-instance profiles (`1c.3g.71gb`) are MIG devices too"
    );
}

#[test]
fn topo_header_underlined_with_ansi_escapes() {
    // The driver underlines the header row with `ESC[4m ... ESC[0m`.
    let rows = parse_topo_matrix(&capture(
        "nvidia-smi-topo-m",
        "gpu-exporter-h100-590.48.01-ansi-header.txt",
    ));
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].index, 0);
    assert_eq!(rows[0].numa, Some(0));
}

#[test]
fn topo_on_windows_with_empty_affinity_cells() {
    // Windows prints no CPU or NUMA affinity: both cells empty, then `N/A` for GPU NUMA ID.
    let rows = parse_topo_matrix(&capture(
        "nvidia-smi-topo-m",
        "gpu-exporter-windows-rtx2080super-610.62-empty-affinity.txt",
    ));
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].numa, None, "no NUMA node is known");
}

// ---- nvidia-smi nvlink -s ----

#[test]
fn nvlink_status_h100_with_eighteen_links() {
    let status = parse_nvlink_status(&capture(
        "nvidia-smi-nvlink-s",
        "gpu-exporter-h100-590.48.01-18-links.txt",
    ));
    assert_eq!(status.len(), 1);
    let gpu0 = status.get(&0).expect("GPU 0");
    assert_eq!(gpu0.active, 18);
    assert!((gpu0.gbps - 18.0 * 26.562).abs() < 1e-6, "{}", gpu0.gbps);
}

#[test]
fn nvlink_status_without_links_is_empty() {
    for name in [
        "gpu-exporter-h100-mig-590.48.01-not-supported.txt",
        "gpu-exporter-l40s-595.80-no-nvlink.txt",
    ] {
        let status = parse_nvlink_status(&capture("nvidia-smi-nvlink-s", name));
        assert!(status.is_empty(), "{name}: {status:?}");
    }
}

// ---- vulkaninfo --summary ----

/// What a `GPU<n>:` block says: vendor id, device id, device type, device name.
type VulkanSummary = (Option<u32>, Option<u32>, Option<String>, String);

/// The summary of every block of a capture.
fn vulkan_devices(name: &str) -> Vec<VulkanSummary> {
    parse_vulkaninfo_summary(&capture("vulkaninfo-summary", name))
        .expect("a summary")
        .iter()
        .map(|gpu| {
            (
                gpu.vendor_id(),
                gpu.device_id(),
                gpu.device_type(),
                gpu.fields.get("deviceName").cloned().unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
fn vulkaninfo_llvmpipe_only_after_a_loader_warning_and_an_error_line() {
    let devices = vulkan_devices("qemu-devel-llvmpipe-after-loader-warning.txt");
    assert_eq!(
        devices,
        [(
            Some(0x10005),
            Some(0),
            Some("cpu".to_string()),
            "llvmpipe (LLVM 15.0.3, 128 bits)".to_string()
        )],
        "the warning lines are not devices; llvmpipe is a CPU device the backend drops"
    );
}

#[test]
fn vulkaninfo_venus_guest_with_debug_lines_around_the_device_list() {
    let devices = vulkan_devices("qemu-devel-venus-virtio-gpu-debug-lines.txt");
    assert_eq!(devices.len(), 3, "{devices:?}");
    assert_eq!(
        devices[0],
        (
            Some(0x8086),
            Some(0xa780),
            Some("integrated_gpu".to_string()),
            "Virtio-GPU Venus (Intel(R) Graphics (RPL-S))".to_string()
        )
    );
    let hardware = devices
        .iter()
        .filter(|d| d.2.as_deref() != Some("cpu"))
        .count();
    assert_eq!(hardware, 1, "two of the three are CPU rasterisers");
    let gpus = parse_vulkaninfo_summary(&capture(
        "vulkaninfo-summary",
        "qemu-devel-venus-virtio-gpu-debug-lines.txt",
    ))
    .expect("a summary");
    assert!(
        gpus.iter()
            .all(|gpu| !gpu.fields.keys().any(|key| key.contains("res_id"))),
        "renderer debug lines are not device fields"
    );
}

#[test]
fn vulkaninfo_windows_excerpt_with_crlf() {
    let devices = vulkan_devices("vulkan-tools-801-windows-rdp-excerpt-crlf.txt");
    assert_eq!(
        devices,
        [
            (
                Some(0x8086),
                Some(0x1912),
                Some("integrated_gpu".to_string()),
                "Intel(R) HD Graphics 530".to_string()
            ),
            (
                Some(0x1002),
                Some(0x6939),
                Some("discrete_gpu".to_string()),
                "AMD Radeon (TM) R9 380 Series".to_string()
            ),
        ],
        "no carriage return left in a value"
    );
}

#[test]
fn vulkaninfo_devices_section_alone() {
    let gpus = parse_vulkaninfo_summary(&capture(
        "vulkaninfo-summary",
        "nixgl-153-rx6600xt-amdgpu-pro-devices.txt",
    ))
    .expect("the Devices: heading makes it a summary");
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0].index, 0);
    assert_eq!(gpus[0].vendor_id(), Some(0x1002));
    assert_eq!(gpus[0].device_id(), Some(0x73ff));
    assert_eq!(
        gpus[0].fields.get("deviceName").map(String::as_str),
        Some("AMD Radeon RX 6600 XT")
    );
    assert_eq!(
        gpus[0].fields.get("driverInfo").map(String::as_str),
        Some("(AMD proprietary shader compiler)")
    );
}

// ---- neuron-ls --json-output, and the plain tables of AWS's documentation ----

#[test]
fn neuron_ls_json_trn1_2xlarge_with_string_numa_and_null_links() {
    let listing = parse_neuron_ls_json(&capture("neuron-ls", "backend-ai-trn1-2xlarge.json"))
        .expect("a JSON listing");
    assert_eq!(listing.devices.len(), 1);
    let device = &listing.devices[0];
    assert_eq!(device.index, 0);
    assert_eq!(device.bus_id.as_deref(), Some("0000:00:1e.0"));
    assert_eq!(device.neuroncores, Some(2));
    assert_eq!(device.memory_bytes, Some(32 << 30), "34359738368 bytes");
    assert_eq!(device.numa_node, None, "`\"-1\"` is no NUMA node");
    assert!(device.connected_to.is_empty(), "`null` on one device");
    assert_eq!(device.cpu_affinity.as_deref(), Some("0-7"));
}

#[test]
fn neuron_ls_table_trn2_48xlarge_from_the_docs() {
    let listing = parse_neuron_ls_table(&capture(
        "neuron-ls",
        "aws-neuron-sdk-docs-trn2-48xlarge.txt",
    ))
    .expect("a device table");
    assert_eq!(listing.devices.len(), 16);
    let first = &listing.devices[0];
    assert_eq!(first.neuroncores, Some(8), "NEURON CORES, not LOGICAL NC");
    assert_eq!(first.memory_bytes, Some(96 << 30));
    assert_eq!(first.bus_id.as_deref(), Some("0000:cc:00.0"), "short BDF");
    assert_eq!(first.connected_to, [12, 3, 4, 1]);
    let last = &listing.devices[15];
    assert_eq!(last.index, 15);
    assert_eq!(last.bus_id.as_deref(), Some("0000:f7:00.0"));
    assert_eq!(last.connected_to, [11, 14, 3, 12]);
}

#[test]
fn neuron_ls_table_of_the_first_tools_with_memory_channels() {
    let listing = parse_neuron_ls_table(&capture(
        "neuron-ls",
        "aws-neuron-sdk-docs-inf1-xlarge-2020.txt",
    ))
    .expect("LOGICAL ID names the device");
    assert_eq!(listing.devices.len(), 1);
    let device = &listing.devices[0];
    assert_eq!(device.index, 0);
    assert_eq!(device.neuroncores, Some(4));
    assert_eq!(
        device.memory_bytes,
        Some(8 << 30),
        "two 4096 MB channels make the 8 GB later tools print"
    );
    assert_eq!(device.bus_id.as_deref(), Some("0000:00:1f.0"));
}

// ---- xpu-smi (Intel's user guide) ----

#[test]
fn xpu_smi_dump_without_the_bus_column_is_refused() {
    // The guide's example asks for fields 1,2,3,6; without the PCI BDF Address column a row
    // cannot be matched to a device, so the parser says so instead of guessing.
    let result = parse_discovery_dump(&capture(
        "xpu-smi",
        "xpumanager-guide-flex170-dump-1-2-3-6.csv",
    ));
    assert!(result.is_err(), "{result:?}");
}

#[test]
fn xpu_smi_topology_two_cards_two_tiles() {
    let pairs = parse_xpu_topology(&capture(
        "xpu-smi",
        "xpumanager-guide-2-cards-2-tiles-topology-m.txt",
    ))
    .expect("a matrix");
    assert_eq!(
        pairs.into_iter().collect::<Vec<_>>(),
        [(0, 1)],
        "XL16 joins card 0 and card 1; MDF is within a card, XL* is indirect"
    );
}

// ---- amd-smi static --json ----

#[test]
fn amd_smi_static_mi210_in_the_gpu_data_form() {
    let gpus = parse_amd_smi_static(&capture("amd-smi-static", "dme-mi210-gpu-data.json"))
        .expect("the gpu_data object form");
    assert_eq!(gpus.len(), 1);
    let gpu = &gpus[0];
    assert_eq!(gpu.index, Some(0));
    assert_eq!(gpu.market_name.as_deref(), Some("AMD Instinct MI210"));
    assert_eq!(gpu.gfx.as_deref(), Some("gfx90a"));
    assert_eq!(gpu.compute_units, Some(104));
    assert_eq!(gpu.vram_bytes, Some(65_520 << 20), "65520 MB, binary");
    assert_eq!(gpu.bus_id, None, "no bdf in this capture's bus block");
    assert_eq!(
        gpu.driver_version.as_deref(),
        Some("6.14.0-24-generic"),
        "the kernel release out of the space-less /proc/version string"
    );
    assert_eq!(gpu.board_serial, None, "`0` is no serial");
}

#[test]
fn amd_smi_static_strix_halo_in_the_list_form() {
    let gpus = parse_amd_smi_static(&capture("amd-smi-static", "tkdk-strix-halo-list-form.json"))
        .expect("the list form");
    assert_eq!(gpus.len(), 1);
    let gpu = &gpus[0];
    assert_eq!(gpu.bus_id.as_deref(), Some("0000:c4:00.0"));
    assert_eq!(gpu.gfx.as_deref(), Some("gfx1151"));
    assert_eq!(gpu.compute_units, Some(40));
    assert_eq!(gpu.vram_bytes, Some(32 << 30));
    assert_eq!(gpu.vbios.as_deref(), Some("113-STRXLGEN-001"));
    assert_eq!(
        gpu.driver_version.as_deref(),
        Some("6.17.1-300.fc43.x86_64")
    );
    assert_eq!(gpu.compute_partition, None, "`N/A`");
    assert_eq!(gpu.serial, None, "`N/A`");
}

#[test]
fn cpuinfo_arm64_grace_and_neoverse_n1() {
    // Grace: the mail's own `lscpu` says vendor ARM, model Neoverse-V2; one processor block.
    let grace = cpu_from("lkml-grace-neoverse-v2-excerpt.txt");
    assert_eq!(grace.vendor.as_deref(), Some("ARM"));
    assert_eq!(grace.model.as_deref(), Some("Neoverse-V2"));
    assert_eq!(grace.arch.as_deref(), Some("aarch64"));
    assert_eq!(grace.threads, Some(1), "an excerpt of one processor");
    for flag in ["sve", "sve2", "bf16", "i8mm", "asimddp"] {
        assert!(grace.ai_flags.iter().any(|f| f == flag), "{flag}");
    }
    // Neoverse-N1 (MIDR 0x41/0xd0c, lscpu-arm.c): no SVE, no BF16; five processors.
    let n1 = cpu_from("archspec-ampere-altra-n1-excerpt.txt");
    assert_eq!(n1.vendor.as_deref(), Some("ARM"));
    assert_eq!(n1.model.as_deref(), Some("Neoverse-N1"));
    assert_eq!(n1.arch.as_deref(), Some("aarch64"));
    assert_eq!(n1.threads, Some(5));
    assert_eq!(n1.ai_flags, ["asimddp"]);
}
