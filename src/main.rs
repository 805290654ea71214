//! The `hwaccel` binary: command-line wiring only. Each subcommand parses its flags here and
//! hands them to the library.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use hwaccel::api::AcceleratorInventory;
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
    /// Remove the labels our agent and controller set (the uninstall path).
    Cleanup(CleanupArgs),
    /// Print every CustomResourceDefinition as multi-document YAML, or write one file per CRD.
    Crds(CrdsArgs),
}

#[derive(Debug, clap::Args)]
struct CrdsArgs {
    /// Write `<plural>.<group>.yaml` files into this directory instead of printing.
    #[arg(long)]
    out_dir: Option<PathBuf>,
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
    /// Directory searched for vendor tools before `$PATH` (repeatable).
    #[arg(long)]
    tool_path: Vec<PathBuf>,
    /// Per-tool deadline, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    tool_timeout_ms: u64,
    /// Include per-backend timings (they make otherwise identical reports differ).
    #[arg(long)]
    timings: bool,
    /// Print the AcceleratorInventory object for this node name instead of the report
    /// (YAML unless `-o json`).
    #[arg(long, value_name = "NODE")]
    as_inventory: Option<String>,
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["node", "all_nodes"])))]
struct CleanupArgs {
    /// A Node to clean (repeatable).
    #[arg(long)]
    node: Vec<String>,
    /// Clean every Node.
    #[arg(long)]
    all_nodes: bool,
    /// Ask the apiserver to validate the changes without making them.
    #[arg(long)]
    dry_run: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Detect(args) => detect(args),
        Command::Cleanup(args) => cleanup(args),
        Command::Crds(args) => crds(args),
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
    let runner = CommandRunner::with_extra_paths(&args.tool_path)
        .with_timeout(Duration::from_millis(args.tool_timeout_ms));
    let detector = Detector::new(HostRoot::new(args.host_root), runner, &args.backends);
    let (report, _) = detector.run(args.timings);
    if let Some(node) = &args.as_inventory {
        let inventory = AcceleratorInventory::from_report(node, &report);
        let text = match args.output {
            Format::Json => output::to_json(&inventory)?,
            Format::Table | Format::Yaml => output::to_yaml(&inventory)?,
        };
        write_stdout(&text)?;
        return Ok(ExitCode::SUCCESS);
    }
    let text = match args.output {
        Format::Table => hwaccel::detect::render::table(&report),
        Format::Json => output::to_json(&report)?,
        Format::Yaml => output::to_yaml(&report)?,
    };
    write_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn cleanup(args: CleanupArgs) -> anyhow::Result<ExitCode> {
    hwaccel::telemetry::init(hwaccel::telemetry::LogFormat::Text, "warn");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let cleaned = runtime.block_on(async {
        let client = kube::Client::try_default().await?;
        let nodes = if args.all_nodes {
            Vec::new()
        } else {
            args.node
        };
        anyhow::Ok(hwaccel::cleanup::release_labels(client, &nodes, args.dry_run).await?)
    })?;
    let verb = if args.dry_run {
        "would release"
    } else {
        "released"
    };
    for node in &cleaned {
        println!(
            "{}: {verb} labels of {}",
            node.node,
            node.released.join(", ")
        );
    }
    if cleaned.is_empty() {
        println!("no labels of ours found");
    }
    Ok(ExitCode::SUCCESS)
}

fn crds(args: CrdsArgs) -> anyhow::Result<ExitCode> {
    match args.out_dir {
        Some(dir) => {
            for path in hwaccel::api::crds::write_dir(&dir)? {
                eprintln!("wrote {}", path.display());
            }
        }
        None => write_stdout(&hwaccel::api::crds::all_yaml()?)?,
    }
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
