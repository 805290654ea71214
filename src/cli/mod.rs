//! The command line: every subcommand's flags (clap) and output, one file per subcommand.
//! `main.rs` only calls [`main`].
//!
//! | file | subcommand |
//! |---|---|
//! | `detect.rs` | `hwaccel detect`: report this machine's accelerators |
//! | [`plan`] | `hwaccel plan`: plan a model on an inventory or a hardware shorthand |
//! | [`plan_emit`] | `hwaccel plan --emit`: the plan as a Deployment or LeaderWorkerSet |
//! | [`fleet`], `fleet_input.rs` | `hwaccel fleet`: sick or missing, what fits, what to add |
//! | `agent.rs` | `hwaccel agent`: the node agent |
//! | `controller.rs` | `hwaccel controller`: the ModelPlacement controller |
//! | `cleanup.rs` | `hwaccel cleanup`: remove our labels (uninstall) |
//! | `crds.rs` | `hwaccel crds`: print the CRDs |
//! | `deviceclasses.rs` | `hwaccel deviceclasses`: print the DRA DeviceClasses |
//! | `lint_slices.rs` | `hwaccel lint-slices`: what is wrong with DRA ResourceSlices |
//! | `process.rs` | what `agent` and `controller` share: flags, runtime, health server |
//! | `values.rs` | the core's enums as flag values |
//!
//! Exit codes: 0 on success, 1 on bad usage or failure (clap's usual 2 is taken: `hwaccel
//! plan` exits 2 when the model does not fit).

mod agent;
mod cleanup;
mod controller;
mod crds;
mod detect;
mod deviceclasses;
pub mod fleet;
pub mod fleet_input;
mod lint_slices;
pub mod plan;
pub mod plan_dra;
pub mod plan_emit;
mod process;
mod values;

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use agent::AgentArgs;
use cleanup::CleanupArgs;
use controller::ControllerArgs;
use crds::CrdsArgs;
use detect::DetectArgs;

/// Finds AI accelerators and plans where models run on them.
#[derive(Debug, Parser)]
#[command(name = "hwaccel", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(about = DETECT_ABOUT)]
    Detect(DetectArgs),
    /// Plan how a model runs on an inventory: precision, TP/PP/replicas, nodes and devices.
    Plan(Box<plan::PlanArgs>),
    /// The fleet's accelerators: which are sick or missing, how many more replicas of a
    /// model fit, which free devices are stranded, and which nodes to add.
    Fleet(Box<fleet::FleetArgs>),
    /// Run the node agent: publish this node's labels and AcceleratorInventory.
    Agent(AgentArgs),
    /// Run the ModelPlacement controller (leader-elected).
    Controller(ControllerArgs),
    /// Remove the labels our agent and controller set (the uninstall path).
    Cleanup(CleanupArgs),
    /// Print every CustomResourceDefinition as multi-document YAML, or write one file per CRD.
    Crds(CrdsArgs),
    /// Print the cross-vendor DRA DeviceClasses as YAML (`--chart`: as the chart's template).
    Deviceclasses(deviceclasses::DeviceClassesArgs),
    /// Check DRA ResourceSlice files: slices the apiserver refuses, empty slices, and per
    /// known driver unknown values, missing facts, deprecated and driver-scoped names.
    LintSlices(lint_slices::LintSlicesArgs),
}

/// `hwaccel detect` with only its own flags.
///
/// Building the whole command line (every subcommand's flag tree, with their parsers and
/// defaults) touches about 4.5 MiB of code pages before detection starts, more than detection
/// itself; `detect` runs on laptops and in init containers where that is the bulk of its
/// footprint, so its arguments are parsed by this parser alone (see docs/benchmarks.md).
#[derive(Debug, Parser)]
#[command(name = "hwaccel detect", version, about = DETECT_ABOUT, long_about = None)]
struct DetectOnly {
    #[command(flatten)]
    args: DetectArgs,
}

/// The one-line help of `hwaccel detect`, shared by both parsers.
const DETECT_ABOUT: &str =
    "Detect the accelerators of this machine (or of a host tree) and print a report";

/// Parses the command line and runs the subcommand; the process exits with the code returned.
pub fn main() -> ExitCode {
    let mut argv = std::env::args_os();
    let program = argv.next();
    let first = argv.next();
    if first.as_deref() == Some(std::ffi::OsStr::new("detect")) {
        let name = std::ffi::OsString::from("hwaccel detect");
        return match parse_or_exit(DetectOnly::try_parse_from(
            std::iter::once(name).chain(argv),
        )) {
            Ok(only) => finish(detect::run(only.args)),
            Err(code) => code,
        };
    }
    let all = program.into_iter().chain(first).chain(argv);
    let cli = match parse_or_exit(Cli::try_parse_from(all)) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let result = match cli.command {
        Command::Detect(args) => detect::run(args),
        Command::Agent(args) => agent::run(args),
        Command::Controller(args) => controller::run(args),
        Command::Cleanup(args) => cleanup::run(args),
        Command::Crds(args) => crds::run(args),
        Command::Fleet(args) => fleet::run(*args),
        Command::Deviceclasses(args) => deviceclasses::run(args),
        Command::LintSlices(args) => lint_slices::run(args),
        Command::Plan(args) => return plan::run(*args),
    };
    finish(result)
}

/// The parsed command line, or the exit code after clap printed help, a version or an error.
/// Usage errors exit 1, not clap's default 2: `hwaccel plan` uses 2 for "does not fit".
fn parse_or_exit<T>(parsed: Result<T, clap::Error>) -> Result<T, ExitCode> {
    parsed.map_err(|err| {
        let _ = err.print();
        ExitCode::from(if err.use_stderr() { 1 } else { 0 })
    })
}

/// A subcommand's exit code, or 1 with its error on stderr.
fn finish(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("hwaccel: {err:#}");
            ExitCode::from(1)
        }
    }
}

/// Writes to stdout, treating a closed pipe (`hwaccel detect | head`) as success.
fn write_stdout(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}
