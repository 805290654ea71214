//! The operational HTTP endpoints of the agent and the controller: `/healthz` (the process is
//! alive: every loop registered in [`Liveness`] is making progress, otherwise 503 naming the
//! loops that are not), `/readyz` (it has done its first useful work and can still reach what
//! it needs), and `/metrics` (Prometheus/OpenMetrics text).
//!
//! The port is reachable by any peer of the pod, so the server bounds what a client can hold:
//! a fixed number of connections (more are closed at once, not queued), a deadline for the
//! request head, a small header buffer and a longest connection life. 5,000 idle half-sent
//! requests once took the agent from 14 to 99 MB; see `docs/benchmarks.md` for the figures now.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

use crate::health::Liveness;

/// Readiness shared between the worker loop and the HTTP server.
#[derive(Debug, Default)]
pub struct Readiness {
    ready: AtomicBool,
}

impl Readiness {
    /// Marks the process ready (or not).
    pub fn set(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether the process is ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

#[derive(Clone)]
struct AppState {
    registry: Arc<Registry>,
    readiness: Arc<Readiness>,
    liveness: Liveness,
}

/// The router serving the three endpoints; exposed for tests.
pub fn router(registry: Arc<Registry>, readiness: Arc<Readiness>, liveness: Liveness) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AppState {
            registry,
            readiness,
            liveness,
        })
}

async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    let problems = state.liveness.problems();
    if problems.is_empty() {
        return (StatusCode::OK, "ok".to_string());
    }
    let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
    tracing::warn!(problems = ?lines, "not live");
    (StatusCode::SERVICE_UNAVAILABLE, lines.join("\n"))
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
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
    /// The limits the agent and the controller serve with.
    fn default() -> Self {
        Self {
            // The legitimate clients are the kubelet's two probes, one or two Prometheus
            // scrapers and a person with curl: a handful at once. 128 is far above that, and
            // at a few tens of KiB per connection (task, buffers, socket) keeps the server's
            // share of memory to a few MiB whatever a peer does.
            max_connections: 128,
            // The kubelet gives a probe 3 s (timeoutSeconds) in all, so an honest client has
            // sent its request head long before this.
            header_timeout: Duration::from_secs(5),
            // hyper's smallest buffer; a GET for these paths needs a few hundred bytes.
            max_header_bytes: 8 * 1024,
            // A scrape or probe takes milliseconds; a scraper that keeps its connection alive
            // between scrapes simply reconnects after this.
            max_connection_life: Duration::from_secs(60),
        }
    }
}

/// Binds `addr` and serves until `shutdown` completes, with the default [`Limits`].
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Arc<Readiness>,
    liveness: Liveness,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
    serve_on(
        listener,
        router(registry, readiness, liveness),
        Limits::default(),
        shutdown,
    )
    .await;
    Ok(())
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

    #[tokio::test]
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
