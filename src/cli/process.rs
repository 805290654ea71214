//! What the two long-running commands (`agent`, `controller`) share around their loops: the
//! flags for API deadlines and shutdown, the runtime, and the health and metrics server that
//! runs beside the loop until told to stop.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::health::Liveness;
use crate::server::Readiness;

/// Flags every long-running command shares.
#[derive(Debug, clap::Args)]
pub(super) struct ProcessArgs {
    /// Deadline for each Kubernetes API call (watches excepted: the server ends those).
    #[arg(long, default_value = "30s", value_parser = crate::duration::parse_api_timeout)]
    pub(super) api_timeout: Duration,
    /// After SIGTERM, how long the graceful stop may take before the process exits anyway.
    /// Keep it below the pod's terminationGracePeriodSeconds (30 s unless set).
    #[arg(long, default_value = "25s", value_parser = crate::duration::parse_shutdown_timeout)]
    pub(super) shutdown_timeout: Duration,
}

/// The runtime of a long-running command: two worker threads carry one loop and the server.
pub(super) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// What a long-running command starts with: a client, the metrics registry, the health
/// state the server reports, and the stop signal (`stop` sends it, `stopped` sees it).
pub(super) struct Start {
    /// The health and metrics ports, bound first; served by [`Start::spawn_server`].
    bound: Option<crate::server::Bound>,
    pub(super) client: kube::Client,
    pub(super) registry: Registry,
    pub(super) readiness: Arc<Readiness>,
    pub(super) liveness: Liveness,
    pub(super) stop: watch::Sender<bool>,
    pub(super) stopped: watch::Receiver<bool>,
}

/// Binds the health and metrics ports at `addrs` first (the kubelet probes them 1 s after
/// the container starts), then connects to the apiserver as `component` (its User-Agent; every
/// call bounded by `api_timeout`) and sets up the rest.
pub(super) async fn start(
    api_timeout: Duration,
    component: &str,
    addrs: crate::server::Addresses,
) -> anyhow::Result<Start> {
    let bound = crate::server::Bound::bind(addrs).await?;
    let client = crate::kube_client::client(api_timeout, component).await?;
    let (stop, stopped) = watch::channel(false);
    Ok(Start {
        bound: Some(bound),
        client,
        registry: Registry::default(),
        readiness: Arc::new(Readiness::default()),
        liveness: Liveness::default(),
        stop,
        stopped,
    })
}

impl Start {
    /// Serves /healthz and /readyz on the health port and /metrics on the metrics one, bound
    /// by [`start`], with the metrics registered so far (register before calling this); the
    /// server stops once `stop` sends `true`. A second call serves nothing.
    pub(super) fn spawn_server(&mut self) -> JoinHandle<std::io::Result<()>> {
        let registry = std::mem::take(&mut self.registry);
        let mut stopped = self.stopped.clone();
        let bound = self.bound.take();
        let (readiness, liveness) = (self.readiness.clone(), self.liveness.clone());
        tokio::spawn(async move {
            if let Some(bound) = bound {
                let shutdown = async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                };
                bound
                    .serve(Arc::new(registry), readiness, liveness, shutdown)
                    .await;
            }
            Ok(())
        })
    }
}

/// Waits for the server to end, logging a failure (the process is stopping either way).
pub(super) async fn join_server(server: JoinHandle<std::io::Result<()>>) {
    if let Ok(Err(err)) = server.await {
        tracing::warn!(error = %err, "metrics server failed");
    }
}
