//! The `hwaccel` binary: command-line wiring only. Each subcommand parses its flags here and
//! hands them to the library.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use hwaccel::detect::{BackendSelection, CommandRunner, Detector, HostRoot};
use hwaccel::output::{self, Format};

/// Finds AI accelerators and plans where models run on them.
#[derive(Debug, Parser)]
#[command(name = "hwaccel", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Detect the accelerators of this machine (or of a host tree) and print a report.
    Detect(DetectArgs),
    /// Plan how a model runs on an inventory: precision, TP/PP/replicas, nodes and devices.
    Plan(Box<hwaccel::plan::cli::PlanArgs>),
}

#[derive(Debug, clap::Args)]
struct DetectArgs {
    /// Root of the host's filesystem (`/host` inside the agent's pod, a fixture tree in tests).
    #[arg(long, default_value = "/", env = "HWACCEL_HOST_ROOT")]
    host_root: PathBuf,
    /// Backends to run: `all`, a list (`nvidia,amd`), or exclusions (`all,-vulkan`).
    #[arg(long, default_value = "all")]
    backends: BackendSelection,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    output: Format,
    /// Per-tool deadline, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    tool_timeout_ms: u64,
    /// Include per-backend timings (they make otherwise identical reports differ).
    #[arg(long)]
    timings: bool,
}

fn main() -> ExitCode {
    // Usage errors exit 1, not clap's default 2: `hwaccel plan` uses 2 for "does not fit".
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(if err.use_stderr() { 1 } else { 0 });
        }
    };
    let result = match cli.command {
        Command::Detect(args) => detect(args),
        Command::Plan(args) => return hwaccel::plan::cli::run(*args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("hwaccel: {err:#}");
            ExitCode::from(1)
        }
    }
}

fn detect(args: DetectArgs) -> anyhow::Result<ExitCode> {
    let runner =
        CommandRunner::from_env().with_timeout(Duration::from_millis(args.tool_timeout_ms));
    let detector = Detector::new(HostRoot::new(args.host_root), runner, &args.backends);
    let (report, _) = detector.run(args.timings);
    let text = match args.output {
        Format::Table => hwaccel::detect::render::table(&report),
        Format::Json => output::to_json(&report)?,
        Format::Yaml => output::to_yaml(&report)?,
    };
    write_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// Writes to stdout, treating a closed pipe (`hwaccel detect | head`) as success.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
