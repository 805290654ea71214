//! `hwaccel cleanup`: remove the labels our agent and controller set (the chart's uninstall
//! hook), after stopping the writers, and print what was released.

use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["node", "all_nodes"])))]
pub(super) struct CleanupArgs {
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
    /// Before removing labels, delete this agent DaemonSet (the uninstall hook; repeatable:
    /// the chart's NVML agents run in a second one).
    #[arg(long, value_name = "DAEMONSET", requires = "namespace")]
    stop_agent: Vec<String>,
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

/// Runs `hwaccel cleanup`.
pub(super) fn run(args: CleanupArgs) -> anyhow::Result<ExitCode> {
    use crate::cleanup::{self, stop};
    crate::telemetry::init(crate::telemetry::LogFormat::Text, "warn");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let summary = runtime.block_on(async {
        let client =
            crate::kube_client::client(crate::kube_client::DEFAULT_API_TIMEOUT, "cleanup").await?;
        if let Some(namespace) = args.namespace.clone().filter(|_| !args.dry_run) {
            let writers = stop::Writers {
                namespace,
                controller_deployment: args.stop_controller.clone(),
                agent_daemonsets: args.stop_agent.clone(),
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
