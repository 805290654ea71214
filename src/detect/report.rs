//! What detection returns: each backend's `Findings`, merged into one deterministic
//! [`Report`] (defined in [`crate::hardware`], where every reader of a report finds it).
//!
//! Determinism is a contract (the agent compares reports to decide whether to write): devices
//! are sorted by id, duplicates found by two backends are resolved by a fixed priority, every
//! list is sorted, and timings, the one thing that varies between identical runs, live outside
//! the report unless asked for.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::hardware::{
    BackendTiming, CpuInfo, Device, InterconnectGroup, NetworkAdapter, NumaNode, Report,
    RuntimeEnv, Warning,
};

/// What one backend found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Findings {
    /// Devices.
    pub devices: Vec<Device>,
    /// Interconnect groups among the devices.
    pub interconnects: Vec<InterconnectGroup>,
    /// RDMA network adapters.
    pub nics: Vec<NetworkAdapter>,
    /// CPU facts (the CPU backend).
    pub cpu: Option<CpuInfo>,
    /// NUMA nodes (the topology backend).
    pub numa: Vec<NumaNode>,
    /// Runtime environment (the runtime backend).
    pub runtime: Option<RuntimeEnv>,
    /// Problems worth a person's attention: a tool that failed or printed garbage.
    pub warnings: Vec<String>,
}

impl Findings {
    /// Findings holding only a warning.
    pub fn warning(message: impl Into<String>) -> Self {
        Self {
            warnings: vec![message.into()],
            ..Self::default()
        }
    }
}

/// One backend's output, as the orchestrator collected it.
#[derive(Debug, Clone)]
pub struct BackendRun {
    /// The backend name.
    pub backend: &'static str,
    /// Its findings.
    pub findings: Findings,
    /// How long it took.
    pub elapsed: Duration,
}

/// Merges backend runs (given in priority order: earlier wins a duplicate device id) into a
/// report. Timings are kept only when `with_timings`.
pub fn merge(runs: Vec<BackendRun>, with_timings: bool) -> Report {
    let mut report = Report::empty();
    let mut seen = BTreeSet::new();
    for run in runs {
        report.backends.push(run.backend.to_string());
        if with_timings {
            let micros = u64::try_from(run.elapsed.as_micros()).unwrap_or(u64::MAX);
            report.timings.push(BackendTiming {
                backend: run.backend.to_string(),
                micros,
            });
        }
        let findings = run.findings;
        for mut device in findings.devices {
            if seen.insert(device.id.clone()) {
                device.partitions.sort_by(|a, b| {
                    (&a.kind, &a.id, &a.profile).cmp(&(&b.kind, &b.id, &b.profile))
                });
                device.health.reasons.sort();
                report.devices.push(device);
            }
        }
        report
            .interconnects
            .extend(findings.interconnects.into_iter().map(|mut group| {
                group.devices.sort();
                group.devices.dedup();
                group
            }));
        report.nics.extend(findings.nics);
        if let Some(cpu) = findings.cpu {
            report.node.cpu = cpu;
        }
        report.node.numa.extend(findings.numa);
        if let Some(runtime) = findings.runtime {
            report.node.runtime = runtime;
        }
        report
            .warnings
            .extend(findings.warnings.into_iter().map(|message| Warning {
                backend: run.backend.to_string(),
                message,
            }));
    }
    report.devices.sort_by(|a, b| a.id.cmp(&b.id));
    report
        .interconnects
        .sort_by(|a, b| (a.kind, &a.id).cmp(&(b.kind, &b.id)));
    report
        .interconnects
        .dedup_by(|a, b| a.kind == b.kind && a.id == b.id);
    report.nics.sort_by(|a, b| a.name.cmp(&b.name));
    report.nics.dedup_by(|a, b| a.name == b.name);
    report.node.numa.sort_by_key(|n| n.id);
    report.node.numa.dedup_by_key(|n| n.id);
    report.node.cpu.ai_flags.sort();
    report.node.cpu.ai_flags.dedup();
    report.warnings.sort();
    report.warnings.dedup();
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{Family, Vendor};

    fn run(backend: &'static str, ids: &[&str]) -> BackendRun {
        let devices = ids
            .iter()
            .map(|id| Device::new(*id, Vendor::Nvidia, Family::Gpu, backend, backend))
            .collect();
        BackendRun {
            backend,
            findings: Findings {
                devices,
                ..Findings::default()
            },
            elapsed: Duration::from_millis(1),
        }
    }

    #[test]
    fn earlier_backend_wins_duplicates_and_output_is_sorted() {
        let report = merge(
            vec![
                run("nvidia", &["0000:b1:00.0", "0000:18:00.0"]),
                run("pci", &["0000:18:00.0"]),
            ],
            false,
        );
        let ids: Vec<_> = report
            .devices
            .iter()
            .map(|d| (d.id.as_str(), d.backend.as_str()))
            .collect();
        assert_eq!(
            ids,
            [("0000:18:00.0", "nvidia"), ("0000:b1:00.0", "nvidia")]
        );
        assert!(report.timings.is_empty());
        assert!(!merge(vec![run("pci", &[])], true).timings.is_empty());
    }
}
