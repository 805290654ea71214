//! The operational HTTP endpoints of the agent and the controller, on two listeners:
//!
//! - the **health** port: `/healthz` (the process is alive: every loop registered in
//!   [`Liveness`] is making progress, otherwise 503 naming the loops that are not) and `/readyz`
//!   (it has done its first useful work and can still reach what it needs; a request that comes
//!   before that is held, see `readiness`). Only the kubelet needs it: the chart puts it
//!   behind no Service and its NetworkPolicy admits no peer to it (the node is always admitted);
//! - the **metrics** port: `/metrics` (Prometheus/OpenMetrics text), behind the Services.
//!
//! Both ports are reachable by peers that should not be there, so each bounds what a client can
//! hold: a fixed number of connections (more are closed at once, not queued), a deadline for
//! the request head, a small header buffer and a longest connection life. 5,000 idle half-sent
//! requests once took the agent from 14 to 99 MB; see `docs/benchmarks.md` for the figures now.
//! Each port has its own budget: one client holding the metrics port's 128 connections used to
//! fail every probe, since `/healthz` shared them (issue 27 item 3).

mod readiness;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

use crate::health::Liveness;

pub use readiness::{READY_HOLD, Readiness};

#[derive(Clone)]
struct HealthState {
    readiness: Arc<Readiness>,
    liveness: Liveness,
}

/// The health port's router: `/healthz` and `/readyz`.
pub fn health_router(readiness: Arc<Readiness>, liveness: Liveness) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(HealthState {
            readiness,
            liveness,
        })
}

/// The metrics port's router: `/metrics`.
pub fn metrics_router(registry: Arc<Registry>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(registry)
}

/// Both routers on one, for tests and tools that want the three endpoints together.
pub fn router(registry: Arc<Registry>, readiness: Arc<Readiness>, liveness: Liveness) -> Router {
    health_router(readiness, liveness).merge(metrics_router(registry))
}

async fn healthz(State(state): State<HealthState>) -> impl IntoResponse {
    let problems = state.liveness.problems();
    if problems.is_empty() {
        return (StatusCode::OK, "ok".to_string());
    }
    let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
    tracing::warn!(problems = ?lines, "not live");
    (StatusCode::SERVICE_UNAVAILABLE, lines.join("\n"))
}

async fn readyz(State(state): State<HealthState>) -> impl IntoResponse {
    if state.readiness.ready_within(READY_HOLD).await {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn metrics(State(registry): State<Arc<Registry>>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "metrics encoding failed".to_string(),
        ),
    }
}

/// What one client may hold of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Time a client has to send its whole request head.
    pub header_timeout: Duration,
    /// Largest request head (request line plus headers), and the connection's read buffer.
    pub max_header_bytes: usize,
    /// Longest life of one connection, keep-alive included.
    pub max_connection_life: Duration,
}

impl Default for Limits {
    /// The limits the metrics port serves with.
    fn default() -> Self {
        Self::metrics()
    }
}

impl Limits {
    /// The metrics port's limits.
    pub fn metrics() -> Self {
        Self {
            // The legitimate clients are one or two Prometheus scrapers and a person with curl:
            // a handful at once. 128 is far above that, and at a few tens of KiB per connection
            // (task, buffers, socket) keeps the server's share of memory to a few MiB whatever
            // a peer does.
            max_connections: 128,
            // An honest scraper sends its request head at once.
            header_timeout: Duration::from_secs(5),
            // hyper's smallest buffer; a GET for these paths needs a few hundred bytes.
            max_header_bytes: 8 * 1024,
            // A scrape takes milliseconds; a scraper that keeps its connection alive between
            // scrapes simply reconnects after this.
            max_connection_life: Duration::from_secs(60),
        }
    }

    /// The health port's limits: its only client is the kubelet, with two probes of which a
    /// held `/readyz` lasts at most [`READY_HOLD`].
    pub fn health() -> Self {
        Self {
            max_connections: 32,
            // The kubelet gives a probe its timeoutSeconds (3 s for liveness) in all, so an
            // honest client has sent its request head long before this.
            header_timeout: Duration::from_secs(5),
            max_header_bytes: 8 * 1024,
            // Longer than a held readiness answer, so that one is never cut off.
            max_connection_life: READY_HOLD + Duration::from_secs(10),
        }
    }
}

/// Where the two ports listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses {
    /// `/healthz` and `/readyz`.
    pub health: SocketAddr,
    /// `/metrics`.
    pub metrics: SocketAddr,
}

/// Binds both ports and serves until `shutdown` completes, each with its own [`Limits`]. An
/// error is a port that could not be bound (the same address for both included).
pub async fn serve(
    addrs: Addresses,
    registry: Arc<Registry>,
    readiness: Arc<Readiness>,
    liveness: Liveness,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Port 0 asks the system for a free port, which differs for each.
    if addrs.health == addrs.metrics && addrs.health.port() != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "the health and metrics addresses must differ (both {}): the probes need a \
                 port of their own",
                addrs.health
            ),
        ));
    }
    let health = tokio::net::TcpListener::bind(addrs.health).await?;
    let metrics = tokio::net::TcpListener::bind(addrs.metrics).await?;
    tracing::info!(health = %addrs.health, metrics = %addrs.metrics, "serving /healthz and /readyz, and /metrics");
    serve_both(
        health,
        metrics,
        health_router(readiness, liveness),
        metrics_router(registry),
        shutdown,
    )
    .await;
    Ok(())
}

/// Serves `health` and `metrics` on their listeners, each within its own [`Limits`], until
/// `shutdown` completes.
pub async fn serve_both(
    health_listener: tokio::net::TcpListener,
    metrics_listener: tokio::net::TcpListener,
    health: Router,
    metrics: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let wait = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    let health = serve_on(
        health_listener,
        health,
        Limits::health(),
        wait(stopped.clone()),
    );
    let metrics = serve_on(metrics_listener, metrics, Limits::metrics(), wait(stopped));
    let signal = async move {
        shutdown.await;
        let _ = stop.send(true);
    };
    tokio::join!(health, metrics, signal);
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes; open connections are
/// then dropped (they are probes and scrapes, which simply retry).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes.max(MIN_BUF_SIZE))
        .max_header_size(limits.max_header_bytes);
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    // Owning the connection tasks here means they all end when this function returns.
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of file descriptors, or a connection reset before it was accepted:
                // pause briefly instead of spinning, and keep serving.
                tracing::debug!(error = %err, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            // Full: close it now. Queueing would let a peer hold memory and file descriptors
            // without limit; a closed connection costs it nothing to retry.
            tracing::debug!(%peer, "connection limit reached; closing");
            drop(stream);
            continue;
        };
        let io = hyper_util::rt::TokioIo::new(stream);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let connection = http.serve_connection(io, service);
        let life = limits.max_connection_life;
        connections.spawn(async move {
            if let Ok(Err(err)) = tokio::time::timeout(life, connection).await {
                tracing::debug!(%peer, error = %err, "connection ended with an error");
            }
            drop(slot);
        });
    }
}

/// hyper refuses a smaller read buffer.
const MIN_BUF_SIZE: usize = 8192;

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    async fn get_text(app: Router, path: &str) -> (StatusCode, String) {
        use tower::ServiceExt as _;
        let request = axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .unwrap();
        let response = app.oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    // Paused time: the not-ready `/readyz` below is held for READY_HOLD first.
    #[tokio::test(start_paused = true)]
    async fn endpoints_report_health_readiness_and_metrics() {
        let mut registry = Registry::default();
        let writes = Counter::<u64>::default();
        registry.register("hwaccel_api_writes", "API writes", writes.clone());
        writes.inc();
        let readiness = Arc::new(Readiness::default());
        let app = router(Arc::new(registry), readiness.clone(), Liveness::default());

        assert_eq!(
            get_text(app.clone(), "/healthz").await,
            (StatusCode::OK, "ok".into())
        );
        assert_eq!(
            get_text(app.clone(), "/readyz").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        readiness.set(true);
        assert_eq!(get_text(app.clone(), "/readyz").await.0, StatusCode::OK);
        let (status, body) = get_text(app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("hwaccel_api_writes_total 1"), "{body}");
    }

    #[tokio::test(start_paused = true)]
    async fn healthz_fails_naming_a_stalled_or_ended_loop_while_readyz_is_unaffected() {
        let liveness = Liveness::default();
        let readiness = Arc::new(Readiness::default());
        readiness.set(true);
        let app = router(Arc::new(Registry::default()), readiness, liveness.clone());
        let detection = liveness.heartbeat("agent loop", Duration::from_secs(10));
        let reconciles = liveness.work("reconcile", Duration::from_secs(10));
        let _running = reconciles.start();
        assert_eq!(
            get_text(app.clone(), "/healthz").await,
            (StatusCode::OK, "ok".into())
        );

        tokio::time::advance(Duration::from_secs(11)).await;
        let (status, body) = get_text(app.clone(), "/healthz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body,
            "agent loop: no completed iteration for 11s (bound 10s)\n\
             reconcile: running for 11s (bound 10s)"
        );
        assert_eq!(get_text(app.clone(), "/readyz").await.0, StatusCode::OK);

        detection.beat();
        drop(_running);
        assert_eq!(get_text(app.clone(), "/healthz").await.0, StatusCode::OK);

        drop(detection);
        assert_eq!(
            get_text(app, "/healthz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "agent loop: the task has ended".into()
            )
        );
    }

    mod limits {
        //! The accept loop against hostile clients, over real sockets on 127.0.0.1.

        use super::*;
        use std::time::Instant;
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        use tokio::net::TcpStream;

        const HALF_SENT: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: a\r\n";

        /// Serves the real router with `limits` on a free port until the test ends.
        async fn start(limits: Limits) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind 127.0.0.1");
            let addr = listener.local_addr().expect("local address");
            let app = router(
                Arc::new(Registry::default()),
                Arc::new(Readiness::default()),
                Liveness::default(),
            );
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(serve_on(listener, app, limits, async move {
                let _ = stopped.await;
            }));
            (addr, stop)
        }

        async fn half_sent(addr: SocketAddr) -> TcpStream {
            let mut stream = TcpStream::connect(addr).await.expect("connect");
            stream.write_all(HALF_SENT).await.expect("write");
            stream
        }

        /// Reads until the server closes the connection; how long that took, or `None` if it
        /// stayed open for `patience`.
        async fn closed_within(stream: &mut TcpStream, patience: Duration) -> Option<Duration> {
            let started = Instant::now();
            let mut buf = [0u8; 1024];
            loop {
                match tokio::time::timeout(patience, stream.read(&mut buf)).await {
                    Err(_) => return None,
                    Ok(Ok(0) | Err(_)) => return Some(started.elapsed()),
                    Ok(Ok(_)) => {}
                }
            }
        }

        /// The response to a probe; empty when the server refused the connection (a reset).
        async fn healthz(addr: SocketAddr) -> String {
            let mut stream = TcpStream::connect(addr).await.expect("connect");
            let mut response = String::new();
            if stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                .await
                .is_err()
            {
                return response;
            }
            let read =
                tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
                    .await
                    .expect("response in time");
            if read.is_err() {
                response.clear();
            }
            response
        }

        fn small(header_timeout: Duration, life: Duration) -> Limits {
            Limits {
                max_connections: 4,
                header_timeout,
                max_header_bytes: 8192,
                max_connection_life: life,
            }
        }

        #[tokio::test]
        async fn connections_over_the_cap_are_closed_at_once_and_idle_ones_after_the_header_timeout()
         {
            let limits = small(Duration::from_millis(400), Duration::from_secs(30));
            let (addr, _stop) = start(limits).await;
            let mut holding = Vec::new();
            for _ in 0..limits.max_connections {
                holding.push(half_sent(addr).await);
            }
            // Give the accept loop time to take the first ones before the next arrive.
            tokio::time::sleep(Duration::from_millis(100)).await;
            for _ in 0..8 {
                let mut extra = half_sent(addr).await;
                let closed = closed_within(&mut extra, Duration::from_secs(2)).await;
                assert!(closed.is_some(), "a connection over the cap was kept open");
            }
            for stream in &mut holding {
                let closed = closed_within(stream, Duration::from_secs(5))
                    .await
                    .expect("a half-sent request outlived the header timeout");
                assert!(closed < Duration::from_secs(3), "closed after {closed:?}");
            }
            // The slots are free again.
            let response = healthz(addr).await;
            assert!(response.starts_with("HTTP/1.1 200"), "{response}");
            assert!(response.ends_with("ok"), "{response}");
        }

        #[tokio::test]
        async fn health_answers_while_the_cap_is_full_once_a_slot_frees() {
            let limits = small(Duration::from_millis(300), Duration::from_secs(30));
            let (addr, _stop) = start(limits).await;
            let mut holding = Vec::new();
            for _ in 0..limits.max_connections * 3 {
                holding.push(half_sent(addr).await);
            }
            // Within a bounded time the idle ones are gone and a probe gets through.
            let started = Instant::now();
            loop {
                let response = healthz(addr).await;
                if response.starts_with("HTTP/1.1 200") {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "no answer while idle connections hold the server: {response:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            drop(holding);
        }

        /// A GET with `Connection: close` on `addr`; the response, empty on a refusal.
        async fn probe(addr: SocketAddr, path: &str) -> String {
            let mut stream = TcpStream::connect(addr).await.expect("connect");
            let mut response = String::new();
            let request = format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
            if stream.write_all(request.as_bytes()).await.is_err() {
                return response;
            }
            let read =
                tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
                    .await
                    .expect("response in time");
            if read.is_err() {
                response.clear();
            }
            response
        }

        #[tokio::test]
        async fn a_peer_holding_the_whole_metrics_budget_fails_no_probe() {
            // Issue 27 item 3: 128 half-sent requests on the shared port failed 20/20 probes.
            let health = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let metrics = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let (health_addr, metrics_addr) = (
                health.local_addr().expect("address"),
                metrics.local_addr().expect("address"),
            );
            let readiness = Arc::new(Readiness::default());
            readiness.set(true);
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(serve_both(
                health,
                metrics,
                health_router(readiness, Liveness::default()),
                metrics_router(Arc::new(Registry::default())),
                async move {
                    let _ = stopped.await;
                },
            ));
            // The whole budget, and more: the extra ones are closed at once.
            let budget = Limits::metrics().max_connections;
            let mut holding = Vec::new();
            for _ in 0..budget + 16 {
                let mut stream = TcpStream::connect(metrics_addr).await.expect("connect");
                let _ = stream
                    .write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\n")
                    .await;
                holding.push(stream);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            // The metrics port is full: a scrape now is refused.
            let scrape = probe(metrics_addr, "/metrics").await;
            assert!(!scrape.starts_with("HTTP/1.1 200"), "{scrape}");
            // Every probe still answers, for as long as the peer holds the port.
            for _ in 0..20 {
                for path in ["/healthz", "/readyz"] {
                    let response = probe(health_addr, path).await;
                    assert!(response.starts_with("HTTP/1.1 200"), "{path}: {response:?}");
                }
            }
            // The health port serves no metrics, and the metrics port no probes.
            assert!(
                probe(health_addr, "/metrics")
                    .await
                    .starts_with("HTTP/1.1 404")
            );
            drop(holding);
            let _ = stop.send(());
        }

        #[tokio::test]
        async fn serve_refuses_one_address_for_both_ports() {
            let addr: SocketAddr = "127.0.0.1:18081".parse().expect("address");
            let err = serve(
                Addresses {
                    health: addr,
                    metrics: addr,
                },
                Arc::new(Registry::default()),
                Arc::new(Readiness::default()),
                Liveness::default(),
                async {},
            )
            .await
            .expect_err("one address for both");
            assert!(err.to_string().contains("must differ"), "{err}");
        }

        #[tokio::test]
        async fn a_silent_connection_is_closed_at_the_end_of_its_life() {
            let limits = small(Duration::from_secs(30), Duration::from_millis(300));
            let (addr, _stop) = start(limits).await;
            let mut silent = TcpStream::connect(addr).await.expect("connect");
            let closed = closed_within(&mut silent, Duration::from_secs(5))
                .await
                .expect("a silent connection outlived its life");
            assert!(
                closed >= Duration::from_millis(250),
                "closed after {closed:?}"
            );
        }

        #[tokio::test]
        async fn an_oversized_request_head_is_refused() {
            let (addr, _stop) = start(Limits::default()).await;
            let mut stream = TcpStream::connect(addr).await.expect("connect");
            let filler = "a".repeat(16 * 1024);
            let request = format!("GET /healthz HTTP/1.1\r\nHost: a\r\nX-Filler: {filler}\r\n\r\n");
            // The server may close while we still write; that is a refusal too.
            let _ = stream.write_all(request.as_bytes()).await;
            let mut response = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response))
                .await
                .expect("the server closed the connection");
            let response = String::from_utf8_lossy(&response);
            assert!(!response.contains(" 200 "), "{response}");
        }
    }
}
