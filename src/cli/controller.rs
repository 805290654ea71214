//! `hwaccel controller`: the ModelPlacement controller's flags, and the process around it:
//! the Kubernetes client, leader election, the metrics and health server, and a graceful stop
//! on SIGTERM.

use std::process::ExitCode;
use std::time::Duration;

use super::process::{self, ProcessArgs};

#[derive(Debug, clap::Args)]
pub(super) struct ControllerArgs {
    /// Address for /metrics (what the chart's Service exposes).
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: std::net::SocketAddr,
    /// Address for /healthz and /readyz (the kubelet's probes), a port apart from the metrics
    /// one so that no scraper or peer can use up the probes' connections.
    #[arg(long, default_value = "0.0.0.0:8081")]
    health_addr: std::net::SocketAddr,
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
    #[arg(long, default_value = "5m", value_parser = crate::duration::parse_inventory_grace)]
    inventory_grace: Duration,
    /// How often a placement whose ResourceClaims are reserved for pods reads those pods
    /// again for the device health their kubelets report (`allocatedResourcesStatus`; 1s to
    /// 10m). A pod's status change is no event the controller watches.
    #[arg(long, default_value = "60s", value_parser = crate::duration::parse_device_health_interval)]
    device_health_interval: Duration,
    /// Plan conformance reads the pods labelled `hwaccel.io/placement=<name>` in a Planned
    /// placement's namespace (a `list` the chart grants with `controller.conformance.listPods`);
    /// `false` judges only the pods its ResourceClaims are reserved for.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    conformance_list_pods: bool,
    /// What to do about nodes with missing or unhealthy accelerators: `none` (conditions,
    /// Events and metrics only), `dryRun` (DeviceTaintRules with effect None, or an Event
    /// listing the affected pods; scheduling unchanged) or `enforce` (DeviceTaintRules with
    /// effect NoSchedule, or the Node taint hwaccel.io/devices-unhealthy:NoSchedule).
    #[arg(long, default_value = "none", value_parser = parse_health_taints)]
    health_taints: crate::controller::HealthTaints,
    /// A model to count in units of replicas for `hwaccel_fleet_model_replicas`: a preset key,
    /// at its maximum context or `@CONTEXT` tokens (`llama-3.1-70b@32768`). Repeatable, or
    /// comma-separated; at most 16.
    #[arg(long = "capacity-model", value_delimiter = ',')]
    capacity_models: Vec<String>,
    /// Least time between two counts of the `--capacity-model`s (10s to 24h).
    #[arg(long, default_value = "60s", value_parser = crate::duration::parse_capacity_interval)]
    capacity_interval: Duration,
    /// ModelPlacements reconciled at once (1 to 64): they plan in parallel and serialise only
    /// the commitment of devices in the ledger.
    #[arg(long, default_value_t = crate::controller::DEFAULT_PLACEMENT_WORKERS, value_parser = parse_placement_workers)]
    placement_workers: u16,
    #[command(flatten)]
    process: ProcessArgs,
    /// Log format.
    #[arg(long, value_enum, default_value_t = crate::telemetry::LogFormat::Json)]
    log_format: crate::telemetry::LogFormat,
}

fn parse_health_taints(text: &str) -> Result<crate::controller::HealthTaints, String> {
    text.parse()
        .map_err(|err: crate::controller::UnknownMode| err.to_string())
}

fn parse_placement_workers(text: &str) -> Result<u16, String> {
    let max = crate::controller::MAX_PLACEMENT_WORKERS;
    text.parse::<u16>()
        .ok()
        .filter(|workers| (1..=max).contains(workers))
        .ok_or_else(|| format!("'{text}' is not a number of placement workers from 1 to {max}"))
}

/// Runs `hwaccel controller`.
pub(super) fn run(args: ControllerArgs) -> anyhow::Result<ExitCode> {
    crate::telemetry::init(args.log_format, "info");
    let identity = args
        .identity
        .filter(|i| !i.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|i| i.trim().to_string())
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| format!("hwaccel-controller-{}", std::process::id()));
    // Resolved before anything starts: a typo in a preset key fails here, with a hint.
    let capacity_models = crate::controller::CountedModel::parse_all(&args.capacity_models)?;
    let runtime = process::runtime()?;
    let flags = args.process;
    let outcome = runtime.block_on(async move {
        // Ready means "alive and talking to the apiserver", never "leader": a standby that is
        // never Ready would block rollouts.
        let addrs = crate::server::Addresses {
            health: args.health_addr,
            metrics: args.metrics_addr,
        };
        let mut start = process::start(flags.api_timeout, "controller", addrs).await?;
        let metrics = crate::controller::metrics::ControllerMetrics::register(&mut start.registry);
        let mut config = crate::controller::Config::cluster_wide(&identity);
        config.namespace = args.namespace;
        config.selector = args.selector;
        config.inventory_grace = args.inventory_grace;
        config.device_health_interval = args.device_health_interval;
        config.conformance_list_pods = args.conformance_list_pods;
        config.health_taints = args.health_taints;
        config.placement_workers = args.placement_workers;
        config.capacity = crate::controller::CapacityCounting {
            models: std::sync::Arc::new(capacity_models),
            interval: args.capacity_interval,
        };
        config.reconciles = start.liveness.work(
            "controller reconcile",
            crate::health::reconcile_bound(flags.api_timeout),
        );
        let server = start.spawn_server();
        let lease = crate::controller::leader::LeaseConfig::new(
            &args.leader_election_namespace,
            &args.lease_name,
            &identity,
        );
        tracing::info!(%identity, "controller starting");
        let mut worker_stop = start.stopped.clone();
        let contact = start.readiness.clone();
        let stop = start.stop;
        let result = crate::controller::run_elected(
            start.client,
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
            () = crate::signals::terminated() => {
                tracing::info!("termination signal received");
                let _ = stop.send(true);
                let stopping = async move {
                    let outcome = result.await;
                    server.stop().await;
                    outcome
                };
                return match crate::shutdown::finish_within(flags.shutdown_timeout, stopping).await {
                    Some(outcome) => outcome.map(|()| true),
                    None => Ok(false),
                };
            }
        };
        let _ = stop.send(true);
        server.stop().await;
        outcome.map(|()| true)
    });
    crate::shutdown::close_runtime(runtime);
    Ok(if outcome? {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
