//! `hwaccel agent`: the node agent's flags, and the process around its loop: the Kubernetes
//! client, the metrics and health server, and a graceful stop on SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::detect::BackendSelection;

use super::process::{self, ProcessArgs};

#[derive(Debug, clap::Args)]
pub(super) struct AgentArgs {
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
    #[arg(long, default_value = "60s", value_parser = crate::duration::parse_interval)]
    interval: Duration,
    /// How often the device directories are checked for hot-plug (1s to 1h).
    #[arg(long, default_value = "5s", value_parser = crate::duration::parse_hotplug_poll)]
    hotplug_poll: Duration,
    /// Longest wait between retries while publishing fails (the API is away).
    #[arg(long, default_value = "60s", value_parser = crate::duration::parse_max_backoff)]
    max_backoff: Duration,
    /// Consecutive clean detections a device must be missing from before it is removed.
    #[arg(long, default_value_t = 3)]
    misses_to_remove: u32,
    /// Driverless device families to publish in an own `hwaccel.io` ResourceSlice
    /// (`qualcomm-ai100`, `xdna`, `vulkan`; comma-separated). Empty: off, and an old slice
    /// of this node is deleted.
    #[arg(long, value_delimiter = ',')]
    own_slice_families: Vec<crate::dra::own_slices::OwnFamily>,
    /// Also write the vendor labels other tools read (`nvidia.com/gpu.product`, `.count`,
    /// `.memory`, `.family`, `amd.com/gpu.product-name`) on nodes where no other labeler holds
    /// them, as field manager `hwaccel-compat-labels`. Off releases labels an earlier run wrote.
    #[arg(long)]
    compat_labels: bool,
    /// Address for /metrics (what the chart's Service exposes).
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: std::net::SocketAddr,
    /// Address for /healthz and /readyz (the kubelet's probes), a port apart from the metrics
    /// one so that no scraper or peer can use up the probes' connections.
    #[arg(long, default_value = "0.0.0.0:8081")]
    health_addr: std::net::SocketAddr,
    #[command(flatten)]
    process: ProcessArgs,
    /// Log format.
    #[arg(long, value_enum, default_value_t = crate::telemetry::LogFormat::Json)]
    log_format: crate::telemetry::LogFormat,
}

/// Runs `hwaccel agent`.
pub(super) fn run(args: AgentArgs) -> anyhow::Result<ExitCode> {
    crate::telemetry::init(args.log_format, "info");
    let runtime = process::runtime()?;
    let flags = args.process;
    let outcome = runtime.block_on(async move {
        let addrs = crate::server::Addresses {
            health: args.health_addr,
            metrics: args.metrics_addr,
        };
        let mut start = process::start(flags.api_timeout, "agent", addrs).await?;
        let metrics = crate::agent::metrics::AgentMetrics::register(&mut start.registry);
        let config = crate::agent::AgentConfig {
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
        let bound = crate::health::agent_loop_bound(
            config.interval,
            config.max_backoff,
            config.tool_timeout,
            flags.api_timeout,
        );
        tracing::info!(node = %config.node_name, liveness_bound_secs = bound.as_secs(), "agent starting");
        let heartbeat = start
            .liveness
            .heartbeat("agent detect-and-publish loop", bound);
        let agent = crate::agent::Agent::new(config, start.client.clone(), metrics)
            .with_heartbeat(heartbeat)
            .with_own_slices(args.own_slice_families.into_iter().collect())
            .with_compat_labels(args.compat_labels);
        let server = start.spawn_server();
        let worker = crate::agent::run::run(agent, start.readiness.clone(), start.stopped.clone());
        let mut worker = tokio::spawn(worker);
        let stop = start.stop;
        tokio::select! {
            () = crate::signals::terminated() => {}
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
            server.stop().await;
        };
        anyhow::Ok(crate::shutdown::finish_within(flags.shutdown_timeout, stopping).await)
    });
    // Never wait here for a detection thread stuck on a read: it ends with the process.
    crate::shutdown::close_runtime(runtime);
    Ok(match outcome? {
        Some(()) => ExitCode::SUCCESS,
        None => ExitCode::from(1),
    })
}
