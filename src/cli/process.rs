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
/// state the server reports, and the loops' stop signal (`stop` sends it, `stopped` sees it).
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
    /// by [`start`], with the metrics registered so far (register before calling this). The
    /// server has a stop of its own, [`Server::stop`], and does not end with the loops'
    /// `stop`: see [`Server`]. A second call serves nothing.
    pub(super) fn spawn_server(&mut self) -> Server {
        let registry = std::mem::take(&mut self.registry);
        let (stop, mut stopped) = watch::channel(false);
        let (readiness, liveness) = (self.readiness.clone(), self.liveness.clone());
        let task = self.bound.take().map(|bound| {
            tokio::spawn(async move {
                let shutdown = async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                };
                bound
                    .serve(Arc::new(registry), readiness, liveness, shutdown)
                    .await;
            })
        });
        Server { stop, task }
    }
}

/// The running health and metrics server. It answers until [`Server::stop`], which a command
/// calls only once its loops have ended: the kubelet keeps probing /readyz while a pod
/// terminates, and a loop finishing its last cycle (a detection, API calls) can take seconds;
/// a port closed at SIGTERM would refuse the probes in that drain, each a failed probe and a
/// `Warning Unhealthy` Event. (A probe after the process has exited is the kubelet's race, which
/// no process can close: docs/health-and-shutdown.md.)
#[derive(Debug)]
pub(super) struct Server {
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl Server {
    /// Stops serving and waits for the server to end, logging a task that failed (the
    /// process is stopping either way).
    pub(super) async fn stop(self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task
            && let Err(err) = task.await
        {
            tracing::warn!(error = %err, "health and metrics server failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        Ok(answer)
    }

    /// The loops' stop leaves the probes answered; only the server's own stop closes the port.
    #[tokio::test]
    async fn the_server_answers_probes_until_its_own_stop() {
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let bound = crate::server::Bound::bind(crate::server::Addresses {
            health: loopback,
            metrics: loopback,
        })
        .await
        .unwrap();
        let health = bound.health_addr().unwrap();
        let (stop, stopped) = watch::channel(false);
        let readiness = Arc::new(Readiness::default());
        readiness.set(true);
        let mut start = Start {
            bound: Some(bound),
            client: test_client(),
            registry: Registry::default(),
            readiness,
            liveness: Liveness::default(),
            stop,
            stopped,
        };
        let server = start.spawn_server();
        start.stop.send(true).unwrap();
        // A loop draining its last cycle: the kubelet's probes still get their answer.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let answer = get(health, "/readyz").await.unwrap();
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        }
        server.stop().await;
        assert!(
            get(health, "/readyz").await.is_err(),
            "the port is closed after the stop"
        );
    }

    /// A client that is never called: these tests need the struct, not the API.
    fn test_client() -> kube::Client {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }
}
