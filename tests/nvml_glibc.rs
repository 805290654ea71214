//! The NVML path of the glibc build, end to end: the real `hwaccel` binary (the build `cargo
//! test` makes for the host's `*-unknown-linux-gnu` target, the same one the Dockerfile's
//! `glibc` stage builds) runs `hwaccel detect -o json` the way the chart's NVML agents run it.
//!
//! A pod of `agent.nvml` reads the host under `/host`, and the NVIDIA container runtime puts
//! the host driver's `libnvidia-ml.so.1` on the container's own library path. Here the host
//! tree is a temporary directory whose PCI bus shows the two GPUs of the fake NVML
//! (`fixtures/nvml/fake_libnvidia-ml.c`), and `LD_LIBRARY_PATH` stands in for the runtime.
//! With `HWACCEL_NVML=container`, as the chart sets it, every GPU must come from NVML, with
//! what only NVML gives (MIG partitions, ECC health); without it, from sysfs. The static musl
//! image cannot load the library at all, so the binary under test must be dynamically linked
//! to glibc: the first test checks that, so the others mean what they say.
//!
//! CI runs this file in `make test` (`.ci/run`): that is the glibc build's CI step.

#![allow(
    clippy::expect_used,
    reason = "helpers of a test binary: a failed setup step should fail the test loudly"
)]

#[path = "support/fake_nvml.rs"]
mod fake_nvml;

use std::fs;
use std::path::Path;
use std::process::Command;

use hwaccel::hardware::Report;
use hwaccel::hardware::{Device, HealthStatus, Vendor};

/// The fake's GPUs as sysfs names them: `(address, vendor, device, class)`. 0x20b2 is the
/// A100-SXM4-80GB's PCI device id, 0x0302 the 3D-controller class NVIDIA data-centre GPUs use.
const FAKE_GPUS: [(&str, u16, u16, u32); 2] = [
    ("0000:07:00.0", 0x10de, 0x20b2, 0x030200),
    ("0000:4e:00.0", 0x10de, 0x20b2, 0x030200),
];

/// A host tree with the fake's GPUs on its PCI bus and nothing else.
fn host_with_fake_gpus() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (address, vendor, device, class) in FAKE_GPUS {
        let function = dir.path().join("sys/bus/pci/devices").join(address);
        fs::create_dir_all(&function).expect("create a PCI function");
        fs::write(function.join("vendor"), format!("0x{vendor:04x}\n")).expect("write vendor");
        fs::write(function.join("device"), format!("0x{device:04x}\n")).expect("write device");
        fs::write(function.join("class"), format!("0x{class:06x}\n")).expect("write class");
    }
    dir
}

/// Runs `hwaccel detect -o json --backends nvidia` over `host` with a cleared environment:
/// `LD_LIBRARY_PATH` at `library_dir`, an empty `PATH` (no `nvidia-smi` of this machine can
/// stand in for NVML), and `HWACCEL_NVML` when given. Returns the report.
fn detect(host: &Path, library_dir: &Path, vouch: Option<&str>) -> Report {
    let empty_path = tempfile::tempdir().expect("temp dir");
    let mut command = Command::new(env!("CARGO_BIN_EXE_hwaccel"));
    command
        .args([
            "detect",
            "-o",
            "json",
            "--backends",
            "nvidia",
            "--host-root",
        ])
        .arg(host)
        .env_clear()
        .env("PATH", empty_path.path())
        .env("LD_LIBRARY_PATH", library_dir);
    if let Some(value) = vouch {
        command.env("HWACCEL_NVML", value);
    }
    let output = command.output().expect("run hwaccel detect");
    assert!(
        output.status.success(),
        "hwaccel detect failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("a JSON report")
}

/// `(id, source)` of every NVIDIA device.
fn sources(report: &Report) -> Vec<(&str, &str)> {
    nvidia(report)
        .map(|device| {
            let source = device.attributes.get("source").map_or("?", String::as_str);
            (device.id.as_str(), source)
        })
        .collect()
}

fn nvidia(report: &Report) -> impl Iterator<Item = &Device> {
    report
        .devices
        .iter()
        .filter(|device| device.vendor == Vendor::Nvidia)
}

#[test]
fn the_binary_under_test_is_dynamically_linked_to_glibc() {
    let binary = env!("CARGO_BIN_EXE_hwaccel");
    let dynamic = Command::new("readelf")
        .args(["--wide", "--dynamic", "--program-headers"])
        .arg(binary)
        .output()
        .expect("readelf (binutils) to inspect the binary");
    assert!(dynamic.status.success(), "readelf failed on {binary}");
    let text = String::from_utf8_lossy(&dynamic.stdout);
    // A static (musl) build has neither: no interpreter and no dynamic section.
    assert!(
        text.contains("Requesting program interpreter: /lib") && text.contains("ld-linux"),
        "{binary} has no glibc program interpreter:\n{text}"
    );
    assert!(
        text.contains("Shared library: [libc.so.6]"),
        "{binary} does not need glibc's libc.so.6:\n{text}"
    );
    // dlopen is glibc's own (libc.so.6 since 2.34, libdl before): the symbol must be undefined
    // in the binary, to be bound at run time, not linked in from a static libc.
    let symbols = Command::new("readelf")
        .args(["--wide", "--dyn-syms"])
        .arg(binary)
        .output()
        .expect("readelf --dyn-syms");
    let symbols = String::from_utf8_lossy(&symbols.stdout);
    assert!(
        symbols
            .lines()
            .any(|line| line.contains(" UND ") && line.contains(" dlopen")),
        "{binary} does not import dlopen"
    );
}

#[test]
fn in_a_vouching_pod_every_gpu_comes_from_nvml() {
    let library = tempfile::tempdir().expect("temp dir");
    fake_nvml::build_fake_nvml(library.path(), &[]);
    let host = host_with_fake_gpus();
    let report = detect(host.path(), library.path(), Some("container"));
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    assert_eq!(
        sources(&report),
        [("0000:07:00.0", "nvml"), ("0000:4e:00.0", "nvml")],
        "{report:#?}"
    );
    // What sysfs cannot tell: the product name, MIG partitions and ECC health.
    let gpus: Vec<&Device> = nvidia(&report).collect();
    assert_eq!(gpus[0].model, "NVIDIA A100-SXM4-80GB");
    assert_eq!(gpus[0].partitions.len(), 2, "{:?}", gpus[0].partitions);
    assert_eq!(gpus[1].health.status, HealthStatus::Unhealthy);
    assert_eq!(gpus[1].health.ecc_uncorrected, Some(2));
}

#[test]
fn without_the_pods_word_nvml_is_not_loaded_under_another_root() {
    let library = tempfile::tempdir().expect("temp dir");
    fake_nvml::build_fake_nvml(library.path(), &[]);
    let host = host_with_fake_gpus();
    for vouch in [None, Some("1")] {
        let report = detect(host.path(), library.path(), vouch);
        assert_eq!(
            sources(&report),
            [("0000:07:00.0", "sysfs"), ("0000:4e:00.0", "sysfs")],
            "HWACCEL_NVML={vouch:?}: {report:#?}"
        );
    }
}
