//! `hwaccel lint-slices FILE…`: what is wrong with DRA ResourceSlices, on a laptop, before a
//! driver ships them or after `kubectl get resourceslices -o yaml` shows devices missing.
//!
//! Reads the same files as `hwaccel plan --resource-slices` (a `List`, a
//! `ResourceSliceList`, several YAML documents, or one slice, as YAML or JSON) and prints the
//! findings of [`crate::dra::lint`]: slices the apiserver refuses, empty slices, and per
//! known driver unknown values, missing facts, deprecated and driver-scoped names.
//!
//! Exit codes: 0 when nothing is an error (warnings and information are printed), 2 when a
//! slice would be refused or publishes nothing (with `--strict`, also on warnings), 1 when a
//! file cannot be read.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use serde::Serialize;

use super::plan_dra::load_resource_slices;
use super::write_stdout;
use crate::dra::lint::{Finding, Severity, lint};
use crate::output::{self, Format, Table};

#[derive(Debug, clap::Args)]
pub(super) struct LintSlicesArgs {
    /// ResourceSlice files (`kubectl get resourceslices -o yaml`, one slice, or several YAML
    /// documents; JSON too).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Also exit 2 when there are warnings (values that stand for "unknown", missing facts).
    #[arg(long)]
    strict: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    output: Format,
}

/// The whole answer, as `-o json|yaml` prints it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct LintReport {
    /// Slices read over all files.
    slices: usize,
    /// Findings by severity.
    errors: usize,
    warnings: usize,
    infos: usize,
    findings: Vec<Finding>,
}

/// Runs `hwaccel lint-slices`.
pub(super) fn run(args: LintSlicesArgs) -> anyhow::Result<ExitCode> {
    let slices = load_resource_slices(&args.files).context("reading ResourceSlices")?;
    let findings = lint(&slices);
    // A row standing for several devices counts each of them.
    let count = |severity| {
        findings
            .iter()
            .filter(|f| f.severity == severity)
            .map(|f| 1 + f.repeats)
            .sum()
    };
    let report = LintReport {
        slices: slices.len(),
        errors: count(Severity::Error),
        warnings: count(Severity::Warning),
        infos: count(Severity::Info),
        findings,
    };
    let text = match args.output {
        Format::Table => render(&report),
        Format::Json => output::to_json(&report)?,
        Format::Yaml => output::to_yaml(&report)?,
    };
    write_stdout(&text)?;
    let failed = report.errors > 0 || (args.strict && report.warnings > 0);
    Ok(if failed {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// Findings as a table, then one line per driver and a total.
fn render(report: &LintReport) -> String {
    let mut out = String::new();
    if !report.findings.is_empty() {
        let mut table = Table::new(["SEVERITY", "CLASS", "SLICE", "DEVICE", "FINDING"]);
        for finding in &report.findings {
            table.row([
                finding.severity.to_string(),
                finding.class.to_string(),
                finding.slice.clone(),
                match (&finding.device, finding.repeats) {
                    (None, _) => "-".to_string(),
                    (Some(device), 0) => device.clone(),
                    (Some(device), more) => format!("{device} (+{more})"),
                },
                finding.message.clone(),
            ]);
        }
        out.push_str(&table.render());
        out.push('\n');
        let mut by_driver: BTreeMap<&str, [usize; 3]> = BTreeMap::new();
        for finding in &report.findings {
            let counts = by_driver.entry(finding.driver.as_str()).or_default();
            counts[finding.severity as usize] += 1 + finding.repeats;
        }
        for (driver, [errors, warnings, infos]) in by_driver {
            out.push_str(&format!(
                "{driver}: {errors} errors, {warnings} warnings, {infos} information\n"
            ));
        }
    }
    out.push_str(&format!(
        "{} slices: {} errors, {} warnings, {} information\n",
        report.slices, report.errors, report.warnings, report.infos
    ));
    out
}
