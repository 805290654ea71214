//! Detection benchmarks: a whole `Detector::run` over fixture hosts (the VM without
//! accelerators, and the 8x H100 host when its fixture is present), and the `/proc/cpuinfo`
//! parser on a 192-thread machine's worth of text.
//!
//! Every iteration builds a fresh detector, because the PCI scan is cached per detector and the
//! agent pays for it on every pass. Fixture tools are shell scripts, so the H100 figure
//! includes their process start-up, much as the real tools' would.

use std::fmt::Write as _;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use hwaccel::detect::BackendSelection;
use hwaccel::detect::backends::node::cpu::parse_cpuinfo;
use hwaccel::testing::fixture::{detector, host_dir};

fn detect_once(scenario: &str) -> usize {
    let (report, _) = detector(scenario, &BackendSelection::all()).run(false);
    report.devices.len()
}

fn detector_runs(c: &mut Criterion) {
    let mut group = c.benchmark_group("detector_run");
    for scenario in ["cpu-only-vm", "h100-8x-nvswitch"] {
        if !host_dir(scenario).is_dir() {
            continue;
        }
        group.bench_function(scenario, |b| b.iter(|| black_box(detect_once(scenario))));
    }
    group.finish();
}

/// A 2-socket, 96-core, 192-thread cpuinfo (about 300 KB) made from the VM fixture's first
/// processor entry, with the topology fields rewritten per processor.
fn cpuinfo_192_threads() -> String {
    let vm =
        std::fs::read_to_string(host_dir("cpu-only-vm").join("proc/cpuinfo")).unwrap_or_default();
    let entry = vm.split("\n\n").next().unwrap_or_default();
    let mut text = String::new();
    for cpu in 0..192u32 {
        let package = u32::from(cpu % 96 >= 48);
        for line in entry.lines() {
            let key = line.split_once(':').map(|(k, _)| k.trim());
            let _ = match key {
                Some("processor") => writeln!(text, "processor\t: {cpu}"),
                Some("physical id") => writeln!(text, "physical id\t: {package}"),
                Some("core id") => writeln!(text, "core id\t\t: {}", cpu % 48),
                Some("siblings") => writeln!(text, "siblings\t: 96"),
                Some("cpu cores") => writeln!(text, "cpu cores\t: 48"),
                _ => writeln!(text, "{line}"),
            };
        }
        text.push('\n');
    }
    text
}

fn cpuinfo_parser(c: &mut Criterion) {
    let text = cpuinfo_192_threads();
    c.bench_function("parse_cpuinfo_192_threads", |b| {
        b.iter(|| black_box(parse_cpuinfo(black_box(&text))))
    });
}

criterion_group!(benches, detector_runs, cpuinfo_parser);
criterion_main!(benches);
