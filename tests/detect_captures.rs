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

use hwaccel::detect::backends::accelerators::amd::amd_smi::parse_rocm_smi;
use hwaccel::detect::backends::accelerators::neuron::parse_neuron_ls_table;
use hwaccel::detect::backends::accelerators::nvidia::nvidia_smi::parse_gpu_list;
use hwaccel::detect::backends::accelerators::nvidia::nvlink::parse_topo_matrix;
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
