//! `hwaccel detect`: run the detection backends on this machine (or a host tree) and print
//! the report, or the AcceleratorInventory object made from it. The whole run has a deadline
//! (`--deadline-ms`): what finished is reported, what did not is a warning, and the process
//! then exits at once ([`exit_now`]) rather than through the usual exit, which could wait on
//! what the threads left behind hold (issue 35: the report was printed, the process stayed).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::api::AcceleratorInventory;
use crate::detect::{BackendSelection, CommandRunner, Detector, HostRoot};
use crate::output::{self, Format};

use super::write_stdout;

#[derive(Debug, clap::Args)]
pub(super) struct DetectArgs {
    /// Root of the host's filesystem (`/host` inside the agent's pod, a fixture tree in tests).
    #[arg(long, default_value = "/", env = "HWACCEL_HOST_ROOT")]
    host_root: PathBuf,
    /// Backends to run: `all`, a list (`nvidia,amd`), or exclusions (`all,-vulkan`).
    #[arg(long, default_value = "all")]
    backends: BackendSelection,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    output: Format,
    /// Directory searched for vendor tools before `$PATH` (repeatable).
    #[arg(long)]
    tool_path: Vec<PathBuf>,
    /// Per-tool deadline, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    tool_timeout_ms: u64,
    /// Deadline for the whole detection, in milliseconds: past it, the report holds what the
    /// backends that finished found, and each other one is a warning (a file whose read
    /// never returns, on a hung NFS or FUSE mount, would otherwise hang the command for ever).
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..))]
    deadline_ms: u64,
    /// Include per-backend timings (they make otherwise identical reports differ).
    #[arg(long)]
    timings: bool,
    /// Print the AcceleratorInventory object for this node name instead of the report
    /// (YAML unless `-o json`).
    #[arg(long, value_name = "NODE")]
    as_inventory: Option<String>,
}

/// Runs `hwaccel detect`.
pub(super) fn run(args: DetectArgs) -> anyhow::Result<ExitCode> {
    let runner = CommandRunner::with_extra_paths(&args.tool_path)
        .with_timeout(Duration::from_millis(args.tool_timeout_ms));
    let detector = Detector::new(HostRoot::new(args.host_root), runner, &args.backends);
    let (report, _, in_time) =
        detector.run_within(args.timings, Duration::from_millis(args.deadline_ms));
    let text = if let Some(node) = &args.as_inventory {
        let inventory = AcceleratorInventory::from_report(node, &report);
        match args.output {
            Format::Json => output::to_json(&inventory)?,
            Format::Table | Format::Yaml => output::to_yaml(&inventory)?,
        }
    } else {
        match args.output {
            Format::Table => crate::detect::render::table(&report),
            Format::Json => output::to_json(&report)?,
            Format::Yaml => output::to_yaml(&report)?,
        }
    };
    write_stdout(&text)?;
    if !in_time {
        exit_now();
    }
    Ok(ExitCode::SUCCESS)
}

/// Ends the process after a run that left threads behind (stuck in a read, or waiting on a
/// tool that holds a pipe open): the report is written and flushed, the tools still running
/// are killed (their groups; they would outlive the process otherwise), and the process exits
/// with `_exit`, which runs no exit handlers and flushes no C stdio, so nothing can wait on a
/// lock or a library a stuck thread holds.
#[allow(unsafe_code)]
fn exit_now() -> ! {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    crate::detect::kill_running_tools();
    // SAFETY: `_exit` takes a plain integer and does not return; the output is flushed above
    // and nothing else in this process needs to run before it ends.
    unsafe { libc::_exit(0) }
}
