//! Tests of the whole backend: the fixture hosts, the fake NVML library through the same
//! assembly code, and hosts built in a temporary directory for failing tools.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::*;
use crate::detect::testing::{detect_on, fixture_context};
use crate::detect::{CommandRunner, HostRoot};
use crate::hardware::{GIB, InterconnectKind, MIB};

/// A host in a temporary directory: PCI functions `(address, vendor, device, class)` and,
/// optionally, an `nvidia-smi` script body.
fn temp_host(
    functions: &[(&str, u16, u16, u32)],
    smi_script: Option<&str>,
    timeout: Duration,
) -> (tempfile::TempDir, Context) {
    let dir = tempfile::tempdir().unwrap();
    for (address, vendor, device, class) in functions {
        let function = dir.path().join("sys/bus/pci/devices").join(address);
        fs::create_dir_all(&function).unwrap();
        fs::write(function.join("vendor"), format!("0x{vendor:04x}\n")).unwrap();
        fs::write(function.join("device"), format!("0x{device:04x}\n")).unwrap();
        fs::write(function.join("class"), format!("0x{class:06x}\n")).unwrap();
    }
    let commands = dir.path().join("commands");
    fs::create_dir_all(&commands).unwrap();
    if let Some(body) = smi_script {
        let script = commands.join("nvidia-smi");
        fs::write(&script, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let runner = CommandRunner::new(vec![commands]).with_timeout(timeout);
    let ctx = Context::new(HostRoot::new(dir.path()), runner);
    (dir, ctx)
}

const H100_FUNCTION: (&str, u16, u16, u32) = ("0000:18:00.0", 0x10de, 0x2330, 0x030200);

#[test]
fn h100_fixture_gives_eight_hoppers_in_one_nvswitch_domain() {
    let findings = detect_on(&Nvidia, "h100-8x-nvswitch");
    assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
    let ids: Vec<&str> = findings.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "0000:1b:00.0",
            "0000:43:00.0",
            "0000:52:00.0",
            "0000:61:00.0",
            "0000:9d:00.0",
            "0000:c3:00.0",
            "0000:d1:00.0",
            "0000:df:00.0"
        ],
        "sorted GPUs only: no NVSwitch bridges, no NICs"
    );
    for (index, gpu) in findings.devices.iter().enumerate() {
        assert_eq!(gpu.index, Some(u32::try_from(index).unwrap()));
        assert_eq!(gpu.model, "NVIDIA H100 80GB HBM3");
        assert_eq!(gpu.memory_bytes, Some(81559 * MIB));
        assert!(gpu.memory_bytes.unwrap() > 79 * GIB);
        assert_eq!(gpu.compute_capability.as_deref(), Some("9.0"));
        assert_eq!(gpu.architecture.as_deref(), Some("hopper"));
        assert!(gpu.precisions.contains(&Precision::Fp8));
        assert!(!gpu.precisions.contains(&Precision::Nvfp4));
        assert_eq!(gpu.driver_version.as_deref(), Some("550.90.07"));
        assert_eq!(gpu.firmware_version.as_deref(), Some("96.00.99.00.01"));
        assert!(gpu.uuid.as_deref().is_some_and(|u| u.starts_with("GPU-")));
        assert_eq!(gpu.numa_node, Some(u32::from(index >= 4)));
        let link = gpu.pcie.unwrap();
        assert_eq!((link.generation, link.width), (Some(5), Some(16)));
        assert_eq!(gpu.attributes["source"], "nvidia-smi");
        assert_eq!(gpu.attributes["mig.mode"], "disabled");
        assert!(gpu.partitions.is_empty());
    }
    // GPU 6 has one remapped row; GPU 5's twelve corrected errors are below the threshold.
    let statuses: Vec<HealthStatus> = findings.devices.iter().map(|d| d.health.status).collect();
    let mut expected = vec![HealthStatus::Healthy; 8];
    expected[6] = HealthStatus::Degraded;
    assert_eq!(statuses, expected);
    assert_eq!(findings.devices[5].health.ecc_corrected, Some(12));
    assert_eq!(findings.devices[6].health.retired_pages, Some(1));

    assert_eq!(findings.interconnects.len(), 1);
    let domain = &findings.interconnects[0];
    assert_eq!(domain.kind, InterconnectKind::Nvswitch);
    assert_eq!(domain.devices, ids);
    assert_eq!(domain.links_per_device, Some(18));
    assert_eq!(domain.bandwidth_gbps, Some(478.116));
}

#[test]
fn a100_mig_fixture_gives_partitions_with_profiles() {
    let findings = detect_on(&Nvidia, "a100-mig");
    assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
    assert_eq!(findings.devices.len(), 2);
    let (first, second) = (&findings.devices[0], &findings.devices[1]);
    assert_eq!(first.id, "0000:00:05.0");
    assert_eq!(first.model, "NVIDIA A100-SXM4-80GB");
    assert_eq!(first.memory_bytes, Some(81920 * MIB));
    assert_eq!(first.architecture.as_deref(), Some("ampere"));
    assert!(first.precisions.contains(&Precision::Bf16));
    assert!(!first.precisions.contains(&Precision::Fp8));
    assert_eq!(first.attributes["mig.mode"], "enabled");
    // sysfs says -1 on this VM, which has one NUMA node: that node (`pci::numa_node`).
    assert_eq!(first.numa_node, Some(0));
    let mut profiles: Vec<&str> = first
        .partitions
        .iter()
        .map(|p| p.profile.as_str())
        .collect();
    profiles.sort_unstable();
    assert_eq!(profiles, ["2g.20gb", "2g.20gb", "3g.40gb"]);
    assert!(first.partitions.iter().all(|p| p.kind == "mig"));
    assert!(
        first
            .partitions
            .iter()
            .all(|p| p.id.as_deref().is_some_and(|id| id.starts_with("MIG-")))
    );
    assert_eq!(second.partitions.len(), 7);
    assert!(second.partitions.iter().all(|p| p.profile == "1g.10gb"));
    // Row remapping reads [N/A] under MIG; ECC is readable, so the first GPU is healthy. The
    // second carries the infoROM warning nvidia-smi printed before the CSV.
    assert_eq!(first.health.status, HealthStatus::Healthy);
    assert_eq!(first.health.retired_pages, None);
    assert_eq!(second.health.status, HealthStatus::Degraded);
    assert!(second.health.reasons[0].contains("infoROM"));
    assert_eq!(findings.interconnects.len(), 1);
    assert_eq!(findings.interconnects[0].kind, InterconnectKind::Nvlink);
    assert_eq!(findings.interconnects[0].links_per_device, Some(12));
    assert_eq!(findings.interconnects[0].bandwidth_gbps, Some(300.0));
}

#[test]
fn detection_is_deterministic() {
    let first = detect_on(&Nvidia, "h100-8x-nvswitch");
    let second = detect_on(&Nvidia, "h100-8x-nvswitch");
    assert_eq!(first, second);
}

#[test]
fn garbage_output_is_a_warning_and_the_bus_still_reports_the_gpu() {
    let (_dir, ctx) = temp_host(
        &[H100_FUNCTION],
        Some("printf '\\001\\377 this is not csv\\n<html>oops</html>\\n'"),
        Duration::from_secs(10),
    );
    let findings = Nvidia.detect(&ctx);
    assert_eq!(findings.warnings.len(), 1, "{:?}", findings.warnings);
    assert!(findings.warnings[0].contains("could not be parsed"));
    assert_eq!(findings.devices.len(), 1);
    assert_eq!(findings.devices[0].model, "NVIDIA H100 80GB HBM3");
    assert_eq!(findings.devices[0].attributes["source"], "sysfs");
}

#[test]
fn a_hanging_nvidia_smi_is_a_warning() {
    let (_dir, ctx) = temp_host(
        &[H100_FUNCTION],
        Some("sleep 30"),
        Duration::from_millis(300),
    );
    let findings = Nvidia.detect(&ctx);
    assert_eq!(findings.warnings.len(), 1, "{:?}", findings.warnings);
    assert!(
        findings.warnings[0].contains("did not finish"),
        "{:?}",
        findings.warnings
    );
    assert_eq!(findings.devices.len(), 1);
}

#[test]
fn a_failing_nvidia_smi_is_a_warning() {
    let (_dir, ctx) = temp_host(
        &[H100_FUNCTION],
        Some(
            "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\"; exit 9",
        ),
        Duration::from_secs(10),
    );
    let findings = Nvidia.detect(&ctx);
    assert_eq!(findings.warnings.len(), 1);
    assert!(
        findings.warnings[0].contains("exit code 9"),
        "{:?}",
        findings.warnings
    );
    assert_eq!(findings.devices[0].id, "0000:18:00.0");
}

#[test]
fn without_tools_the_bus_names_what_it_can_and_stays_quiet() {
    let (_dir, ctx) = temp_host(
        &[
            ("0000:0a:00.0", 0x10de, 0x2335, 0x030200),
            ("0000:0a:00.1", 0x10de, 0x22ba, 0x040300),
            ("0000:0b:00.0", 0x10de, 0x22a3, 0x068000),
            ("0000:0c:00.0", 0x10de, 0x1234, 0x030000),
            ("0000:0d:00.0", 0x15b3, 0x1021, 0x020700),
        ],
        None,
        Duration::from_secs(10),
    );
    let findings = Nvidia.detect(&ctx);
    assert!(findings.warnings.is_empty());
    let names: Vec<(&str, &str)> = findings
        .devices
        .iter()
        .map(|d| (d.id.as_str(), d.model.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("0000:0a:00.0", "NVIDIA H200"),
            ("0000:0c:00.0", "NVIDIA GPU (0x1234)")
        ],
        "no audio function, no NVSwitch bridge, no NIC"
    );
    let h200 = &findings.devices[0];
    assert_eq!(h200.architecture.as_deref(), Some("hopper"));
    assert_eq!(h200.health.status, HealthStatus::Unknown);
    assert_eq!(findings.devices[1].architecture, None);
}

#[test]
fn a_gpu_the_driver_owns_but_the_tool_does_not_list_is_unhealthy() {
    let script = "case \"$1\" in --query-gpu=*) echo '0, 00000000:18:00.0, NVIDIA H100 80GB HBM3, GPU-1, 81559, 550.90.07, 96.00.99.00.01, 9.0, Disabled, Enabled, 0, 0, [N/A], [N/A], [N/A], 5, 16, 5, 16' ;; *) exit 2 ;; esac";
    let (dir, ctx) = temp_host(
        &[
            H100_FUNCTION,
            ("0000:2a:00.0", 0x10de, 0x2330, 0x030200),
            ("0000:3a:00.0", 0x10de, 0x2330, 0x030200),
        ],
        Some(script),
        Duration::from_secs(10),
    );
    let drivers = dir.path().join("sys/bus/pci/drivers");
    fs::create_dir_all(drivers.join("nvidia")).unwrap();
    fs::create_dir_all(drivers.join("vfio-pci")).unwrap();
    let devices = dir.path().join("sys/bus/pci/devices");
    std::os::unix::fs::symlink(
        "../../../../bus/pci/drivers/nvidia",
        devices.join("0000:2a:00.0/driver"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        "../../../../bus/pci/drivers/vfio-pci",
        devices.join("0000:3a:00.0/driver"),
    )
    .unwrap();
    let findings = Nvidia.detect(&ctx);
    assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
    let health: Vec<(&str, HealthStatus)> = findings
        .devices
        .iter()
        .map(|d| (d.id.as_str(), d.health.status))
        .collect();
    assert_eq!(
        health,
        [
            ("0000:18:00.0", HealthStatus::Healthy),
            ("0000:2a:00.0", HealthStatus::Unhealthy),
            ("0000:3a:00.0", HealthStatus::Unknown)
        ]
    );
    assert!(findings.devices[1].health.reasons[0].contains("not listed by nvidia-smi"));
    assert_eq!(findings.devices[2].attributes["driver"], "vfio-pci");
}

#[test]
fn a_host_without_nvidia_gpus_runs_no_tool() {
    let (_dir, ctx) = temp_host(
        &[("0000:0d:00.0", 0x15b3, 0x1021, 0x020700)],
        Some("echo 'NVIDIA-SMI has failed'; exit 9"),
        Duration::from_secs(10),
    );
    assert_eq!(Nvidia.detect(&ctx), Findings::default());
}

#[test]
fn no_devices_is_not_a_warning() {
    let (_dir, ctx) = temp_host(
        &[],
        Some("echo 'No devices were found'; exit 6"),
        Duration::from_secs(10),
    );
    assert_eq!(Nvidia.detect(&ctx), Findings::default());
}

#[test]
fn a_refused_field_is_dropped_and_the_query_retried() {
    // An R470-era driver: no compute_cap field. Any other query prints the two-GPU CSV for the
    // fields it was given, so the retry must leave compute_cap out.
    let script = r#"case "$1" in
  *compute_cap*) echo 'Field "compute_cap" is not a valid field to query.'; exit 2 ;;
  --query-gpu=*) echo '0, 00000000:3B:00.0, Tesla V100-SXM2-32GB, GPU-11111111-2222-3333-4444-555555555555, 32768, 470.256.02, 88.00.80.00.01, [N/A], Enabled, 0, 0, 0, 2, No, 3, 16, 3, 16' ;;
  *) exit 2 ;;
esac"#;
    let (_dir, ctx) = temp_host(&[], Some(script), Duration::from_secs(10));
    let findings = Nvidia.detect(&ctx);
    assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
    assert_eq!(findings.devices.len(), 1);
    let v100 = &findings.devices[0];
    assert_eq!(v100.model, "Tesla V100-SXM2-32GB");
    assert_eq!(v100.compute_capability, None);
    assert_eq!(v100.memory_bytes, Some(32 * GIB));
    assert_eq!(v100.health.retired_pages, Some(2));
    assert_eq!(v100.health.status, HealthStatus::Degraded);
}

#[test]
fn nvml_feeds_the_same_devices_and_groups() {
    let dir = tempfile::tempdir().unwrap();
    let library = nvml::tests::build_fake(dir.path(), &[]);
    // nvidia-smi here would only print garbage: a warning would show it was asked.
    let (_host, ctx) = temp_host(&[], Some("echo garbage"), Duration::from_secs(10));
    let findings = detect_with(
        &ctx,
        move || nvml::Nvml::load_from(&library).ok(),
        &AtomicBool::new(false),
    );
    assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
    assert_eq!(findings.devices.len(), 2);
    let (first, second) = (&findings.devices[0], &findings.devices[1]);
    assert_eq!(first.id, "0000:07:00.0");
    assert_eq!(first.attributes["source"], "nvml");
    assert_eq!(first.architecture.as_deref(), Some("ampere"));
    assert_eq!(first.partitions.len(), 2);
    assert_eq!(first.health.status, HealthStatus::Healthy);
    assert_eq!(second.health.status, HealthStatus::Unhealthy);
    assert_eq!(second.health.ecc_uncorrected, Some(2));
    assert_eq!(findings.interconnects.len(), 1);
    assert_eq!(findings.interconnects[0].kind, InterconnectKind::Nvswitch);
    assert_eq!(findings.interconnects[0].links_per_device, Some(12));
}

#[test]
fn a_failing_nvml_falls_back_to_nvidia_smi_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let library = nvml::tests::build_fake(dir.path(), &["-DFAKE_NVML_NO_DRIVER"]);
    let ctx = fixture_context("a100-mig");
    let findings = detect_with(
        &ctx,
        move || nvml::Nvml::load_from(&library).ok(),
        &AtomicBool::new(false),
    );
    assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
    assert_eq!(findings.devices.len(), 2);
    assert!(
        findings
            .devices
            .iter()
            .all(|d| d.attributes["source"] == "nvidia-smi")
    );
}

#[test]
fn a_hanging_nvml_is_abandoned_with_a_warning_and_not_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let library = nvml::tests::build_fake(dir.path(), &["-DFAKE_NVML_HANG"]);
    let fixture = crate::detect::testing::fixture_dir("a100-mig");
    let runner =
        CommandRunner::new(vec![fixture.join("commands")]).with_timeout(Duration::from_secs(2));
    let ctx = Context::new(HostRoot::new(&fixture), runner);
    let hung = AtomicBool::new(false);
    let load = move || nvml::Nvml::load_from(&library).ok();
    let findings = detect_with(&ctx, load.clone(), &hung);
    assert_eq!(findings.warnings.len(), 1, "{:?}", findings.warnings);
    assert!(findings.warnings[0].contains("NVML did not answer"));
    assert_eq!(findings.devices.len(), 2, "nvidia-smi stood in");
    assert!(hung.load(Ordering::Relaxed));
    let started = std::time::Instant::now();
    let again = detect_with(&ctx, load, &hung);
    assert!(again.warnings.is_empty(), "{:?}", again.warnings);
    assert_eq!(again.devices, findings.devices);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "NVML was waited for again"
    );
}

#[test]
fn nvml_is_never_loaded_under_another_root() {
    // The fixture's root is not `/`, so detection must come from nvidia-smi even where a real
    // libnvidia-ml.so.1 could be loaded.
    let findings = detect_on(&Nvidia, "a100-mig");
    assert!(
        findings
            .devices
            .iter()
            .all(|d| d.attributes["source"] == "nvidia-smi")
    );
    assert_ne!(fixture_context("a100-mig").host().root(), Path::new("/"));
}

#[test]
fn nvml_is_loaded_under_another_root_only_where_the_pod_vouches_for_it() {
    use std::ffi::OsStr;
    assert!(may_load_nvml(Path::new("/"), None));
    assert!(!may_load_nvml(Path::new("/host"), None));
    assert!(may_load_nvml(
        Path::new("/host"),
        Some(OsStr::new("container"))
    ));
    for other in ["", "1", "true", "Container", "host"] {
        assert!(
            !may_load_nvml(Path::new("/host"), Some(OsStr::new(other))),
            "{other:?}"
        );
    }
}

#[test]
fn verdicts() {
    let healthy = HealthFacts {
        ecc_corrected: Some(3),
        ecc_uncorrected: Some(0),
        ..HealthFacts::default()
    };
    assert_eq!(verdict(&healthy).status, HealthStatus::Healthy);
    assert_eq!(
        verdict(&HealthFacts::default()).status,
        HealthStatus::Unknown
    );
    let storm = HealthFacts {
        ecc_corrected: Some(CORRECTED_ECC_DEGRADED + 1),
        ..healthy.clone()
    };
    assert_eq!(verdict(&storm).status, HealthStatus::Degraded);
    let pending = HealthFacts {
        retirement_pending: Some(true),
        retired_pages: Some(4),
        ..healthy.clone()
    };
    let health = verdict(&pending);
    assert_eq!(health.status, HealthStatus::Unhealthy);
    assert_eq!(health.reasons.len(), 2);
    assert_eq!(health.retired_pages, Some(4));
    let failed_remap = HealthFacts {
        remap_failed: Some(true),
        ..HealthFacts::default()
    };
    assert_eq!(verdict(&failed_remap).status, HealthStatus::Unhealthy);
}

#[test]
fn architectures_and_precisions() {
    assert_eq!(architecture(7, 0), Some("volta"));
    assert_eq!(architecture(7, 5), Some("turing"));
    assert_eq!(architecture(8, 6), Some("ampere"));
    assert_eq!(architecture(8, 9), Some("ada"));
    assert_eq!(architecture(9, 0), Some("hopper"));
    assert_eq!(architecture(10, 0), Some("blackwell"));
    assert_eq!(architecture(12, 0), Some("blackwell"));
    assert_eq!(architecture(3, 5), None);
    assert!(precisions(8, 9).contains(&Precision::Fp8));
    assert!(!precisions(8, 0).contains(&Precision::Fp8));
    assert!(precisions(10, 0).contains(&Precision::Nvfp4));
    assert!(precisions(12, 0).contains(&Precision::Mxfp4));
    assert!(!precisions(9, 0).contains(&Precision::Mxfp4));
    assert!(!precisions(7, 0).contains(&Precision::Bf16));
}

#[test]
fn without_tools_blackwell_ids_name_their_products() {
    // Names and ids from open-gpu-kernel-modules' 595.45.04 README, capabilities from the
    // CUDA GPUs page: B300 and GB300 are 10.3, RTX PRO 6000 Blackwell 12.0.
    let (_dir, ctx) = temp_host(
        &[
            ("0000:1a:00.0", 0x10de, 0x3182, 0x030200),
            ("0000:1b:00.0", 0x10de, 0x31c2, 0x030200),
            ("0000:1c:00.0", 0x10de, 0x2bb5, 0x030000),
        ],
        None,
        Duration::from_secs(10),
    );
    let findings = Nvidia.detect(&ctx);
    assert!(findings.warnings.is_empty(), "{:?}", findings.warnings);
    let seen: Vec<(&str, Option<&str>)> = findings
        .devices
        .iter()
        .map(|d| (d.model.as_str(), d.architecture.as_deref()))
        .collect();
    assert_eq!(
        seen,
        [
            ("NVIDIA B300 SXM6 AC", Some("blackwell")),
            ("NVIDIA GB300", Some("blackwell")),
            (
                "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                Some("blackwell")
            ),
        ]
    );
}
