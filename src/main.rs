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
    /// Plan how a model runs on an inventory: precision, TP/PP/replicas, nodes and devices.
    Plan(Box<hwaccel::plan::cli::PlanArgs>),
    /// Run the node agent: publish this node's labels and AcceleratorInventory.
    Agent(AgentArgs),
    /// Run the ModelPlacement controller (leader-elected).
    Controller(ControllerArgs),
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
struct AgentArgs {
    /// The Node this agent runs on (set from the downward API in the DaemonSet).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Root of the host's filesystem.
    #[arg(long, default_value = "/", env = "HWACCEL_HOST_ROOT")]
    host_root: PathBuf,
    /// Backends to run: `all`, a list (`nvidia,amd`), or exclusions (`all,-vulkan`).
    #[arg(long, default_value = "all")]
    backends: BackendSelection,
    /// Directory searched for vendor tools before `$PATH` (repeatable).
    #[arg(long)]
    tool_path: Vec<PathBuf>,
    /// Per-tool deadline, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    tool_timeout_ms: u64,
    /// Time between detections on a quiet node: a whole number and one unit (s, m, h),
    /// from 1s to 24h.
    #[arg(long, default_value = "60s", value_parser = hwaccel::duration::parse_interval)]
    interval: Duration,
    /// How often the device directories are checked for hot-plug (1s to 1h).
    #[arg(long, default_value = "5s", value_parser = hwaccel::duration::parse_hotplug_poll)]
    hotplug_poll: Duration,
    /// Longest wait between retries while publishing fails (the API is away).
    #[arg(long, default_value = "60s", value_parser = hwaccel::duration::parse_max_backoff)]
    max_backoff: Duration,
    /// Consecutive clean detections a device must be missing from before it is removed.
    #[arg(long, default_value_t = 3)]
    misses_to_remove: u32,
    /// Address for /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: std::net::SocketAddr,
    #[command(flatten)]
    process: ProcessArgs,
    /// Log format.
    #[arg(long, value_enum, default_value_t = hwaccel::telemetry::LogFormat::Json)]
    log_format: hwaccel::telemetry::LogFormat,
}

/// Flags every long-running command shares.
#[derive(Debug, clap::Args)]
struct ProcessArgs {
    /// Deadline for each Kubernetes API call (watches excepted: the server ends those).
    #[arg(long, default_value = "30s", value_parser = hwaccel::duration::parse_api_timeout)]
    api_timeout: Duration,
    /// After SIGTERM, how long the graceful stop may take before the process exits anyway.
    /// Keep it below the pod's terminationGracePeriodSeconds (30 s unless set).
    #[arg(long, default_value = "25s", value_parser = hwaccel::duration::parse_shutdown_timeout)]
    shutdown_timeout: Duration,
}

#[derive(Debug, clap::Args)]
struct ControllerArgs {
    /// Address for /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: std::net::SocketAddr,
    /// Namespace of the leader-election Lease (the controller's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    leader_election_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "hwaccel-controller")]
    lease_name: String,
    /// This replica's identity in the Lease and in Events (default: $POD_NAME, else the
    /// host name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Only watch ModelPlacements in this namespace (default: all namespaces).
    #[arg(long)]
    namespace: Option<String>,
    /// Only consider Nodes and AcceleratorInventories with these labels (`pool=a`; default:
    /// all). Used by the scale harness and for canaries.
    #[arg(long)]
    selector: Option<String>,
    /// How long plans on a Node whose AcceleratorInventory disappeared (while the Node
    /// stayed) are kept, Degraded, before they are planned elsewhere (1s to 24h). Longer
    /// than the agents' `--interval`: a running agent writes a deleted inventory again on
    /// its next cycle.
    #[arg(long, default_value = "5m", value_parser = hwaccel::duration::parse_inventory_grace)]
    inventory_grace: Duration,
    #[command(flatten)]
    process: ProcessArgs,
    /// Log format.
    #[arg(long, value_enum, default_value_t = hwaccel::telemetry::LogFormat::Json)]
    log_format: hwaccel::telemetry::LogFormat,
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
    /// Before removing labels, scale this controller Deployment to 0 (the uninstall hook).
    #[arg(long, value_name = "DEPLOYMENT", requires = "namespace")]
    stop_controller: Option<String>,
    /// Before removing labels, delete this agent DaemonSet (the uninstall hook).
    #[arg(long, value_name = "DAEMONSET", requires = "namespace")]
    stop_agent: Option<String>,
    /// Wait until no pod matching this label selector is left (terminating ones included).
    #[arg(long, value_name = "SELECTOR", requires = "namespace")]
    writer_pods: Option<String>,
    /// Wait until this leader Lease is free or stale.
    #[arg(long, value_name = "LEASE", requires = "namespace")]
    lease: Option<String>,
    /// Namespace of the Deployment, DaemonSet, pods and Lease above.
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: Option<String>,
    /// How long to wait for the writers to stop, in seconds.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3600))]
    stop_timeout_seconds: u64,
    /// Nodes per list request.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=5000))]
    page_size: u32,
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
        Command::Agent(args) => agent(args),
        Command::Controller(args) => controller(args),
        Command::Cleanup(args) => cleanup(args),
        Command::Crds(args) => crds(args),
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

fn agent(args: AgentArgs) -> anyhow::Result<ExitCode> {
    use std::sync::Arc;
    hwaccel::telemetry::init(args.log_format, "info");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let process = args.process;
    let outcome = runtime.block_on(async move {
        let client = hwaccel::kube_client::client(process.api_timeout).await?;
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = hwaccel::agent::metrics::AgentMetrics::register(&mut registry);
        let readiness = Arc::new(hwaccel::server::Readiness::default());
        let liveness = hwaccel::health::Liveness::default();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let config = hwaccel::agent::AgentConfig {
            node_name: args.node_name,
            host_root: args.host_root,
            backends: args.backends,
            tool_paths: args.tool_path,
            tool_timeout: Duration::from_millis(args.tool_timeout_ms),
            interval: args.interval,
            hotplug_poll: args.hotplug_poll,
            misses_to_remove: args.misses_to_remove,
            max_backoff: args.max_backoff,
        };
        let bound = hwaccel::health::agent_loop_bound(
            config.interval,
            config.max_backoff,
            config.tool_timeout,
            process.api_timeout,
        );
        tracing::info!(node = %config.node_name, liveness_bound_secs = bound.as_secs(), "agent starting");
        let agent = hwaccel::agent::Agent::new(config, client, metrics)
            .with_heartbeat(liveness.heartbeat("agent detect-and-publish loop", bound));
        let mut server_stop = stopped.clone();
        let server = tokio::spawn(hwaccel::server::serve(
            args.metrics_addr,
            Arc::new(registry),
            readiness.clone(),
            liveness,
            async move {
                let _ = server_stop.wait_for(|stop| *stop).await;
            },
        ));
        let mut worker = tokio::spawn(hwaccel::agent::run::run(agent, readiness, stopped));
        tokio::select! {
            () = hwaccel::signals::terminated() => {}
            ended = &mut worker => {
                // The loop only returns when told to stop: this is a panic or a bug. Exit, so
                // that the kubelet restarts the agent, rather than serve a dead process.
                let _ = stop.send(true);
                anyhow::bail!("the agent loop ended unexpectedly: {ended:?}");
            }
        }
        tracing::info!("termination signal received");
        let _ = stop.send(true);
        let stopping = async move {
            let _ = worker.await;
            if let Ok(Err(err)) = server.await {
                tracing::warn!(error = %err, "metrics server failed");
            }
        };
        anyhow::Ok(hwaccel::shutdown::finish_within(process.shutdown_timeout, stopping).await)
    });
    // Never wait here for a detection thread stuck on a read: it ends with the process.
    hwaccel::shutdown::close_runtime(runtime);
    Ok(match outcome? {
        Some(()) => ExitCode::SUCCESS,
        None => ExitCode::from(1),
    })
}

fn controller(args: ControllerArgs) -> anyhow::Result<ExitCode> {
    use std::sync::Arc;
    hwaccel::telemetry::init(args.log_format, "info");
    let identity = args
        .identity
        .filter(|i| !i.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|i| i.trim().to_string())
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| format!("hwaccel-controller-{}", std::process::id()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let process = args.process;
    let outcome = runtime.block_on(async move {
        let client = hwaccel::kube_client::client(process.api_timeout).await?;
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = hwaccel::controller::metrics::ControllerMetrics::register(&mut registry);
        // Ready means "alive and talking to the apiserver", never "leader": a standby that is
        // never Ready would block rollouts.
        let readiness = Arc::new(hwaccel::server::Readiness::default());
        let liveness = hwaccel::health::Liveness::default();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut server_stop = stopped.clone();
        let mut config = hwaccel::controller::Config::cluster_wide(&identity);
        config.namespace = args.namespace;
        config.selector = args.selector;
        config.inventory_grace = args.inventory_grace;
        config.reconciles = liveness.work(
            "controller reconcile",
            hwaccel::health::reconcile_bound(process.api_timeout),
        );
        let server = tokio::spawn(hwaccel::server::serve(
            args.metrics_addr,
            Arc::new(registry),
            readiness.clone(),
            liveness,
            async move {
                let _ = server_stop.wait_for(|stop| *stop).await;
            },
        ));
        let lease = hwaccel::controller::leader::LeaseConfig::new(
            &args.leader_election_namespace,
            &args.lease_name,
            &identity,
        );
        tracing::info!(%identity, "controller starting");
        let mut worker_stop = stopped.clone();
        let contact = readiness.clone();
        let result = hwaccel::controller::run_elected(
            client,
            config,
            lease,
            metrics,
            move || contact.set(true),
            async move {
                let _ = worker_stop.wait_for(|stop| *stop).await;
            },
        );
        tokio::pin!(result);
        let outcome = tokio::select! {
            outcome = &mut result => outcome,
            () = hwaccel::signals::terminated() => {
                tracing::info!("termination signal received");
                let _ = stop.send(true);
                let stopping = async move {
                    let outcome = result.await;
                    if let Ok(Err(err)) = server.await {
                        tracing::warn!(error = %err, "metrics server failed");
                    }
                    outcome
                };
                return match hwaccel::shutdown::finish_within(process.shutdown_timeout, stopping).await {
                    Some(outcome) => outcome.map(|()| true),
                    None => Ok(false),
                };
            }
        };
        let _ = stop.send(true);
        if let Ok(Err(err)) = server.await {
            tracing::warn!(error = %err, "metrics server failed");
        }
        outcome.map(|()| true)
    });
    hwaccel::shutdown::close_runtime(runtime);
    Ok(if outcome? {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn cleanup(args: CleanupArgs) -> anyhow::Result<ExitCode> {
    use hwaccel::cleanup::{self, stop};
    hwaccel::telemetry::init(hwaccel::telemetry::LogFormat::Text, "warn");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let summary = runtime.block_on(async {
        let client =
            hwaccel::kube_client::client(hwaccel::kube_client::DEFAULT_API_TIMEOUT).await?;
        if let Some(namespace) = args.namespace.clone().filter(|_| !args.dry_run) {
            let writers = stop::Writers {
                namespace,
                controller_deployment: args.stop_controller.clone(),
                agent_daemonset: args.stop_agent.clone(),
                pod_selector: args.writer_pods.clone(),
                lease: args.lease.clone(),
                timeout: Duration::from_secs(args.stop_timeout_seconds),
                poll: Duration::from_secs(1),
            };
            stop::stop_writers(client.clone(), &writers).await?;
        }
        let nodes = if args.all_nodes {
            Vec::new()
        } else {
            args.node.clone()
        };
        let options = cleanup::Options {
            dry_run: args.dry_run,
            page_size: args.page_size,
            ..cleanup::Options::default()
        };
        let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
        anyhow::Ok(cleanup::release_labels(&api, &nodes, &options).await?)
    })?;
    let verb = if args.dry_run {
        "would release"
    } else {
        "released"
    };
    for node in &summary.released {
        println!(
            "{}: {verb} labels of {}",
            node.node,
            node.released.join(", ")
        );
    }
    for (node, err) in &summary.failed {
        eprintln!("{node}: failed: {err}");
    }
    for node in &summary.remaining {
        eprintln!("{node}: still carries labels of ours");
    }
    println!(
        "summary: {} nodes scanned, {} released, {} failed, {} still labelled",
        summary.scanned,
        summary.released.len(),
        summary.failed.len(),
        summary.remaining.len()
    );
    Ok(if summary.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
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
