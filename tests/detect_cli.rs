//! End-to-end detection through the built `hwaccel` binary, over every fixture host.
//!
//! Each directory under `fixtures/hosts/` is a scenario; new ones are picked up without
//! touching this file. For each, `hwaccel detect --host-root <scenario> -o json` must exit 0,
//! print a valid report, print the same bytes twice, match `expected.json` when the scenario
//! has one, and render as YAML and as a table too.
//!
//! The binary runs with a cleared environment and a `PATH` of the scenario's `commands/`
//! followed by a directory of links to a few POSIX utilities (`cat`, `sleep`, `head`...), which
//! the stand-in scripts need to print their captures. No vendor tool of the machine running
//! the tests can be found that way, so the host's own hardware never leaks into a report.
//!
//! `UPDATE_EXPECT=1 cargo test --test fast_tier detect_cli::` rewrites every scenario's `expected.json`
//! from the current output; review the diff before committing it.

#![allow(
    clippy::expect_used,
    reason = "helpers of a test binary: a failed setup step should fail the test loudly"
)]

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use hwaccel::hardware::Report;

/// Utilities the stand-in scripts may call; none of them knows about accelerators.
const SCRIPT_UTILITIES: &[&str] = &[
    "basename", "cat", "cut", "dirname", "echo", "env", "false", "grep", "head", "printf", "sed",
    "sh", "sleep", "tail", "test", "touch", "tr", "true", "yes",
];

fn hosts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hosts")
}

/// Every scenario directory, sorted, so failures are reported in a stable order.
fn scenarios() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(hosts_dir())
        .expect("fixtures/hosts exists")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// A directory of links to the utilities in [`SCRIPT_UTILITIES`] that this machine has.
fn utilities_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for name in SCRIPT_UTILITIES {
        let found = ["/usr/bin", "/bin"]
            .iter()
            .map(|bin| Path::new(bin).join(name))
            .find(|path| path.is_file());
        if let Some(target) = found {
            symlink(target, dir.path().join(name)).expect("link utility");
        }
    }
    dir
}

/// `hwaccel detect` on `host_root` with only the scenario's tools (plus basic utilities) on
/// `PATH`.
fn detect_command(host_root: &Path, utilities: &Path, args: &[&str]) -> Command {
    let path = format!(
        "{}:{}",
        host_root.join("commands").display(),
        utilities.display()
    );
    let mut command = Command::new(env!("CARGO_BIN_EXE_hwaccel"));
    command
        .arg("detect")
        .arg("--host-root")
        .arg(host_root)
        .args(args)
        .env_clear()
        .env("PATH", path);
    command
}

/// Runs [`detect_command`] to the end.
fn hwaccel(host_root: &Path, utilities: &Path, args: &[&str]) -> Output {
    detect_command(host_root, utilities, args)
        .output()
        .expect("run hwaccel")
}

fn stdout_of(output: &Output, what: &str) -> Result<String, String> {
    if !output.status.success() {
        return Err(format!(
            "{what}: exit {:?}; stderr: {}",
            output.status.code(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    String::from_utf8(output.stdout.clone()).map_err(|err| format!("{what}: not UTF-8: {err}"))
}

/// Checks one scenario and returns what is wrong with it.
fn check_scenario(dir: &Path, utilities: &Path) -> Result<(), String> {
    let json = stdout_of(&hwaccel(dir, utilities, &["-o", "json"]), "json run")?;
    let again = stdout_of(&hwaccel(dir, utilities, &["-o", "json"]), "second json run")?;
    if json != again {
        return Err("two runs printed different JSON".into());
    }
    let report: Report =
        serde_json::from_str(&json).map_err(|err| format!("JSON is not a report: {err}"))?;

    let expected_path = dir.join("expected.json");
    if std::env::var_os("UPDATE_EXPECT").is_some_and(|v| v == "1") {
        fs::write(&expected_path, &json).map_err(|err| format!("writing expected: {err}"))?;
    } else if let Ok(expected) = fs::read_to_string(&expected_path)
        && expected != json
    {
        return Err(format!(
            "output differs from {}; run `UPDATE_EXPECT=1 cargo test --test fast_tier detect_cli::` \
             and review the diff\n--- got ---\n{json}",
            expected_path.display()
        ));
    }

    let yaml = stdout_of(&hwaccel(dir, utilities, &["-o", "yaml"]), "yaml run")?;
    let from_yaml: Report =
        serde_saphyr::from_str(&yaml).map_err(|err| format!("YAML is not a report: {err}"))?;
    if from_yaml.devices.len() != report.devices.len() {
        return Err("YAML and JSON list different devices".into());
    }

    let table = stdout_of(&hwaccel(dir, utilities, &["-o", "table"]), "table run")?;
    let has_device_header = table
        .lines()
        .any(|line| line.starts_with("ID") && line.contains("VENDOR") && line.contains("MODEL"));
    if report.devices.is_empty() {
        if !table.contains("No accelerators found.") {
            return Err(format!(
                "table of a host without devices says otherwise:\n{table}"
            ));
        }
    } else if !has_device_header {
        return Err(format!("table has no device header:\n{table}"));
    }
    Ok(())
}

#[test]
fn every_fixture_host_gives_a_stable_valid_report() {
    let utilities = utilities_dir();
    let scenarios = scenarios();
    assert!(!scenarios.is_empty(), "no fixture hosts found");
    let failures: Vec<String> = scenarios
        .iter()
        .filter_map(|dir| {
            check_scenario(dir, utilities.path())
                .err()
                .map(|why| format!("{}: {why}", dir.display()))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_vm_without_accelerators_reports_its_node_facts() {
    let utilities = utilities_dir();
    let output = hwaccel(
        &hosts_dir().join("cpu-only-vm"),
        utilities.path(),
        &["-o", "json"],
    );
    let report: Report = serde_json::from_slice(&output.stdout).expect("a report");
    assert_eq!(report.accelerators().count(), 0);
    let cpu = &report.node.cpu;
    assert_eq!(
        cpu.model.as_deref(),
        Some("Intel(R) Xeon(R) Platinum 8488C")
    );
    assert!(cpu.ai_flags.iter().any(|f| f == "amx_tile"));
    assert_eq!(
        report.node.runtime.instance_type.as_deref(),
        Some("m7i.2xlarge")
    );
    assert_eq!(report.node.numa.len(), 1);
}

#[test]
fn a_host_root_that_does_not_exist_reports_no_devices() {
    let utilities = utilities_dir();
    let missing = Path::new("/nonexistent/hwaccel-host-root");
    let output = hwaccel(missing, utilities.path(), &["-o", "json"]);
    assert!(output.status.success(), "{output:?}");
    let report: Report = serde_json::from_slice(&output.stdout).expect("a report");
    assert!(report.devices.is_empty());
    assert!(report.nics.is_empty());
    assert_eq!(report.node.cpu.model, None);
}

/// Copies a tree, keeping symlinks as symlinks (fixture sysfs links are relative).
fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("create dir");
    for entry in fs::read_dir(from).expect("read dir").filter_map(Result::ok) {
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().expect("file type");
        if kind.is_symlink() {
            symlink(fs::read_link(&source).expect("read link"), &target).expect("link");
        } else if kind.is_dir() {
            copy_tree(&source, &target);
        } else {
            fs::copy(&source, &target).expect("copy file");
        }
    }
}

/// A copy of the VM fixture under `dir` with an H100 (sysfs only) on its PCI bus.
fn vm_with_h100(dir: &Path) -> PathBuf {
    let root = dir.join("host");
    copy_tree(&hosts_dir().join("cpu-only-vm"), &root);
    let _ = fs::remove_file(root.join("expected.json"));
    let gpu = root.join("sys/devices/pci0000:16/0000:16:02.0/0000:18:00.0");
    fs::create_dir_all(&gpu).expect("gpu dir");
    for (name, value) in [
        ("vendor", "0x10de"),
        ("device", "0x2330"),
        ("class", "0x030200"),
        ("numa_node", "0"),
    ] {
        fs::write(gpu.join(name), format!("{value}\n")).expect("gpu attribute");
    }
    symlink(
        "../../../devices/pci0000:16/0000:16:02.0/0000:18:00.0",
        root.join("sys/bus/pci/devices/0000:18:00.0"),
    )
    .expect("pci link");
    root
}

/// The VM fixture plus an H100 on the bus and an `nvidia-smi` that misbehaves after leaving a
/// mark, so the test knows whether any backend ran it.
fn host_with_broken_nvidia_smi(misbehaviour: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = vm_with_h100(dir.path());
    let marker = dir.path().join("nvidia-smi-ran");
    let commands = root.join("commands");
    fs::create_dir_all(&commands).expect("commands dir");
    let script = commands.join("nvidia-smi");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$@\" >> '{}'\n{misbehaviour}\n",
            marker.display()
        ),
    )
    .expect("script");
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).expect("chmod");
    (dir, root)
}

#[test]
fn a_misbehaving_tool_is_a_warning_and_the_rest_of_the_report_survives() {
    const TIMEOUT_MS: u64 = 500;
    let utilities = utilities_dir();
    let cases = [
        ("hangs", "sleep 30"),
        (
            "floods",
            "yes '| 0  NVIDIA H100 80GB HBM3  On | 00000000:18:00.0 Off |' | head -c 104857600",
        ),
        (
            "fails",
            "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA \
             driver. Make sure that the latest NVIDIA driver is installed and running.\"\nexit 9",
        ),
    ];
    for (name, misbehaviour) in cases {
        let (dir, root) = host_with_broken_nvidia_smi(misbehaviour);
        let started = Instant::now();
        let output = hwaccel(
            &root,
            utilities.path(),
            &["-o", "json", "--tool-timeout-ms", &TIMEOUT_MS.to_string()],
        );
        let elapsed = started.elapsed();
        assert!(output.status.success(), "{name}: {output:?}");
        assert!(
            elapsed < Duration::from_millis(TIMEOUT_MS * 3),
            "{name}: took {elapsed:?}"
        );
        let report: Report = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|err| panic!("{name}: not a report: {err}"));
        assert_eq!(
            report.node.cpu.model.as_deref(),
            Some("Intel(R) Xeon(R) Platinum 8488C"),
            "{name}"
        );
        assert_eq!(report.node.runtime.cloud.as_deref(), Some("aws"), "{name}");
        if dir.path().join("nvidia-smi-ran").exists() {
            assert!(
                report
                    .warnings
                    .iter()
                    .any(|w| w.message.contains("nvidia-smi")),
                "{name}: nvidia-smi ran but no warning names it: {:?}",
                report.warnings
            );
        }
    }
}

/// Runs `hwaccel` like [`hwaccel`] but gives up (and fails) after `limit` instead of waiting for
/// ever, so a regression that blocks fails the test rather than hanging it.
fn hwaccel_within(host_root: &Path, utilities: &Path, args: &[&str], limit: Duration) -> Output {
    let mut child = detect_command(host_root, utilities, args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run hwaccel");
    let started = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("hwaccel detect {args:?} still ran after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn mkfifo(path: &Path) {
    let _ = fs::remove_file(path);
    let status = Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("run mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

#[test]
fn a_fifo_in_the_host_tree_is_a_warning_not_a_hang() {
    let utilities = utilities_dir();
    let dir = tempfile::tempdir().expect("temp dir");
    let root = vm_with_h100(dir.path());
    // Where /proc/cpuinfo and a sysfs attribute should be; opening either for reading used to
    // block until a writer appeared, that is for ever.
    mkfifo(&root.join("proc/cpuinfo"));
    mkfifo(&root.join("sys/devices/pci0000:16/0000:16:02.0/0000:18:00.0/numa_node"));

    let started = Instant::now();
    let output = hwaccel_within(
        &root,
        utilities.path(),
        &["-o", "json"],
        Duration::from_secs(30),
    );
    let elapsed = started.elapsed();
    assert!(output.status.success(), "{output:?}");
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    let report: Report = serde_json::from_slice(&output.stdout).expect("a report");
    let warnings: Vec<String> = report
        .warnings
        .iter()
        .filter(|w| w.backend == "host")
        .map(|w| w.message.clone())
        .collect();
    assert_eq!(
        warnings,
        [
            "/proc/cpuinfo is not a regular file and was not read",
            "/sys/bus/pci/devices/0000:18:00.0/numa_node is not a regular file and was not read",
        ]
    );
    // The rest of the report is there: the GPU, the memory, the cloud.
    assert!(
        report.devices.iter().any(|d| d.id == "0000:18:00.0"),
        "{:?}",
        report.devices
    );
    assert!(report.node.cpu.memory_bytes.is_some());
    assert_eq!(report.node.runtime.cloud.as_deref(), Some("aws"));
    assert!(report.node.cpu.model.is_none());

    let table = hwaccel_within(
        &root,
        utilities.path(),
        &["-o", "table"],
        Duration::from_secs(30),
    );
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("warning: [host] /proc/cpuinfo is not a regular file"),
        "{text}"
    );
}

fn run_plain(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hwaccel"))
        .args(args)
        .output()
        .expect("the hwaccel binary runs")
}

/// `detect` parses its flags with a parser of its own (so it never builds the other
/// subcommands' flag trees); to a user it must be the same command as `hwaccel help detect`.
#[test]
fn detect_parsed_alone_reads_like_the_full_command_line() {
    let alone = run_plain(&["detect", "--help"]);
    let through_help = run_plain(&["help", "detect"]);
    assert!(alone.status.success() && through_help.status.success());
    let alone = String::from_utf8_lossy(&alone.stdout).into_owned();
    assert_eq!(alone, String::from_utf8_lossy(&through_help.stdout));
    for flag in ["--host-root", "--backends", "--output", "--as-inventory"] {
        assert!(alone.contains(flag), "{flag} missing from:\n{alone}");
    }

    let bad = run_plain(&["detect", "--no-such-flag"]);
    assert_eq!(bad.status.code(), Some(1), "usage errors exit 1");
    let message = String::from_utf8_lossy(&bad.stderr);
    assert!(
        message.contains("--no-such-flag") && message.contains("Usage: hwaccel detect"),
        "{message}"
    );
    let version = run_plain(&["detect", "--version"]);
    assert!(String::from_utf8_lossy(&version.stdout).contains(env!("CARGO_PKG_VERSION")));
}

/// The whole run has a deadline: a backend stuck past it (here on a tool allowed 30 s; in the
/// field a read of a file on a hung NFS or FUSE mount, which no per-tool timeout covers) is a
/// warning, and what the other backends found is reported. Before, the command waited for
/// ever on such a read.
#[test]
fn a_backend_stuck_past_the_overall_deadline_is_a_warning_and_the_rest_is_reported() {
    let utilities = utilities_dir();
    let (_dir, root) = host_with_broken_nvidia_smi("sleep 30");
    let started = Instant::now();
    let output = hwaccel_within(
        &root,
        utilities.path(),
        &[
            "-o",
            "json",
            "--tool-timeout-ms",
            "30000",
            "--deadline-ms",
            "1000",
        ],
        Duration::from_secs(20),
    );
    let elapsed = started.elapsed();
    assert!(output.status.success(), "{output:?}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    let report: Report = serde_json::from_slice(&output.stdout).expect("a report");
    let stuck: Vec<&str> = report
        .warnings
        .iter()
        .filter(|w| w.message.contains("deadline"))
        .map(|w| w.backend.as_str())
        .collect();
    assert!(stuck.contains(&"nvidia"), "{:?}", report.warnings);
    // The CPU backend finished: its facts are there.
    assert_eq!(
        report.node.cpu.model.as_deref(),
        Some("Intel(R) Xeon(R) Platinum 8488C")
    );
}

/// Issue 35: past the deadline the report was printed but the process did not end while a
/// backend's thread was stuck on a pipe that never reaches end of file, and the tool holding
/// it lived on. Now the process exits right after the report, and the tool (here one that
/// keeps its stdout open through a background child and never exits) is killed with it.
#[test]
fn past_the_deadline_the_process_exits_and_leaves_no_tool_running() {
    let utilities = utilities_dir();
    let dir = tempfile::tempdir().expect("temp dir");
    let pidfile = dir.path().join("holder.pid");
    let (_host, root) = host_with_broken_nvidia_smi(&format!(
        "sleep 120 &\necho $! > '{}'\nwait",
        pidfile.display()
    ));
    let started = Instant::now();
    let output = hwaccel_within(
        &root,
        utilities.path(),
        &[
            "-o",
            "json",
            "--tool-timeout-ms",
            "120000",
            "--deadline-ms",
            "1500",
        ],
        Duration::from_secs(20),
    );
    let elapsed = started.elapsed();
    assert!(output.status.success(), "{output:?}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    let report: Report = serde_json::from_slice(&output.stdout).expect("a whole report");
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.backend == "nvidia" && w.message.contains("deadline")),
        "{:?}",
        report.warnings
    );
    let holder: u32 = fs::read_to_string(&pidfile)
        .expect("the tool started its child")
        .trim()
        .parse()
        .expect("a process id");
    let gone_by = Instant::now() + Duration::from_secs(5);
    let alive = || {
        fs::read_to_string(format!("/proc/{holder}/stat")).is_ok_and(|stat| {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        })
    };
    while alive() && Instant::now() < gone_by {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !alive(),
        "the tool's child {holder} outlived hwaccel detect"
    );
}

/// The `devices` of a report printed as JSON, with each device's `attributes.source` removed
/// when `drop_source` (NVML and nvidia-smi describe the same GPU, and name themselves).
fn devices_of(json: &str, drop_source: bool) -> serde_json::Value {
    let mut report: serde_json::Value = serde_json::from_str(json).expect("a JSON report");
    let mut devices = report["devices"].take();
    if drop_source {
        for device in devices.as_array_mut().expect("devices is a list") {
            if let Some(attributes) = device["attributes"].as_object_mut() {
                attributes.remove("source");
            }
        }
    }
    devices
}

#[test]
fn replaying_a_real_gpu_vm_prints_what_hwaccel_printed_on_it() {
    // fixtures/real/<host>/ holds what scripts/capture-gpu-host.sh recorded on a lent GPU
    // machine, fixtures/hosts/<host>/ the same machine's files and nvidia-smi answers as a
    // fixture tree (PROVENANCE.md beside them). Replayed, the tree must describe the devices
    // exactly as the static binary did on the machine itself.
    let utilities = utilities_dir();
    for host in ["h100-1x-vm", "h200-1x-vm"] {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        let real = fixtures.join("real").join(host).join("detect");
        let on_the_machine = fs::read_to_string(real.join("musl.json")).expect("real capture");
        let output = hwaccel(
            &fixtures.join("hosts").join(host),
            utilities.path(),
            &["-o", "json"],
        );
        let replayed = stdout_of(&output, host).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(
            devices_of(&replayed, false),
            devices_of(&on_the_machine, false),
            "{host}: the replayed fixture differs from the machine's own report"
        );

        // The glibc build read the same GPU through NVML: every fact but the source agrees.
        // Its run predates the single-node NUMA rule (`detect::pci::numa_node`: sysfs says -1,
        // nvidia-smi's matrix says node 0), so NVML's device lacks the node the rule now adds.
        let mut nvml = devices_of(
            &fs::read_to_string(real.join("glibc.json")).expect("real NVML capture"),
            true,
        );
        let mut smi = devices_of(&on_the_machine, true);
        assert_eq!(smi[0]["numaNode"], 0, "{host}: nvidia-smi's NUMA affinity");
        assert!(nvml[0].get("numaNode").is_none(), "{host}: {}", nvml[0]);
        let with_node = smi.clone();
        smi[0].as_object_mut().expect("device").remove("numaNode");
        nvml[0].as_object_mut().expect("device").remove("numaNode");
        assert_eq!(nvml, smi, "{host}: NVML and nvidia-smi disagree");

        // On an H100 (another lent machine, so another GPU: its UUID aside), the glibc build
        // of the fix ran again: NVML now gives the node too, and the sources agree on the rest.
        if let Ok(fixed) = fs::read_to_string(real.join("glibc-numa-fix.json")) {
            let without_uuid = |mut devices: serde_json::Value| {
                devices[0].as_object_mut().expect("device").remove("uuid");
                devices
            };
            assert_eq!(
                without_uuid(devices_of(&fixed, true)),
                without_uuid(with_node.clone()),
                "{host}: after the fix"
            );
        }
    }
    assert!(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/real/h100-1x-vm/detect/glibc-numa-fix.json")
            .is_file(),
        "the H100's run after the fix is kept"
    );
}
