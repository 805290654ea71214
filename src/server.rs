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
//! hold: a fixed number of connections (a newcomer over the budget closes the connection that
//! has waited longest for a request, or is closed itself when every connection is answering
//! one; nothing is queued), a deadline for the request head, a small header buffer, a longest
//! connection life, and a few held `/readyz` answers at a time. 5,000 idle half-sent
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
    /// Permits to hold a `/readyz` answer; see [`HELD_READYZ`].
    holds: Arc<tokio::sync::Semaphore>,
}

/// `/readyz` answers held at once while the process is not ready. The kubelet holds one; a
/// held answer is a busy connection the port will not close for a newcomer, so a peer sending
/// whole `/readyz` requests could otherwise fill the connection budget for [`READY_HOLD`] at a
/// time. Past this many, a not-ready `/readyz` answers 503 at once.
pub const HELD_READYZ: usize = 4;

/// The health port's router: `/healthz` and `/readyz`.
pub fn health_router(readiness: Arc<Readiness>, liveness: Liveness) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(HealthState {
            readiness,
            liveness,
            holds: Arc::new(tokio::sync::Semaphore::new(HELD_READYZ)),
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
    let ready = state.readiness.is_ready()
        || match state.holds.try_acquire() {
            Ok(_hold) => state.readiness.ready_within(READY_HOLD).await,
            Err(_) => false,
        };
    if ready {
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

/// Both ports, bound.
#[derive(Debug)]
pub struct Bound {
    health: tokio::net::TcpListener,
    metrics: tokio::net::TcpListener,
}

impl Bound {
    /// Binds both ports. A process binds them first thing, before it reaches the apiserver,
    /// so the kubelet's first readiness probe (1 s after the container starts) finds the port
    /// open however slow the rest of the start is: a refused connection is a failed probe and
    /// a Warning Event, where a held /readyz answer is neither. An error is a port that could
    /// not be bound (the same address for both included).
    pub async fn bind(addrs: Addresses) -> std::io::Result<Self> {
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
        Ok(Self {
            health: tokio::net::TcpListener::bind(addrs.health).await?,
            metrics: tokio::net::TcpListener::bind(addrs.metrics).await?,
        })
    }

    /// The address the health port is bound to (its real port when asked for port 0).
    pub fn health_addr(&self) -> std::io::Result<SocketAddr> {
        self.health.local_addr()
    }

    /// Serves on the bound ports until `shutdown` completes, each with its own [`Limits`].
    pub async fn serve(
        self,
        registry: Arc<Registry>,
        readiness: Arc<Readiness>,
        liveness: Liveness,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) {
        let (health, metrics) = (
            self.health.local_addr().ok(),
            self.metrics.local_addr().ok(),
        );
        tracing::info!(
            ?health,
            ?metrics,
            "serving /healthz and /readyz, and /metrics"
        );
        serve_both(
            self.health,
            self.metrics,
            health_router(readiness, liveness),
            metrics_router(registry),
            shutdown,
        )
        .await;
    }
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
    Bound::bind(addrs)
        .await?
        .serve(registry, readiness, liveness, shutdown)
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
///
/// A full budget does not turn a newcomer away while some connection sits idle: the connection
/// that has been waiting longest for a request head (half-sent, or kept alive between requests)
/// is closed to make room (issue 35: 32 half-open connections failed 15/15 probes when the
/// newcomer was the one closed). A request that arrives whole is answered at once, so a peer
/// flooding the port with half-sent requests only evicts its own connections; only when every
/// slot is busy answering is a newcomer closed, and answers are short (a held `/readyz` at
/// most [`READY_HOLD`], and few of those, see `readyz`).
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
    let open = Arc::new(OpenConnections::default());
    let mut next_id: u64 = 0;
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
        if !open.make_room(limits.max_connections) {
            // Every slot is answering a request. Queueing would let a peer hold memory and
            // file descriptors without limit; a closed connection costs it nothing to retry.
            tracing::debug!(%peer, "connection limit reached, every connection busy; closing");
            drop(stream);
            continue;
        }
        next_id += 1;
        let id = next_id;
        let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let io = hyper_util::rt::TokioIo::new(stream);
        let service = hyper_util::service::TowerToHyperService::new(CountInFlight {
            inner: app.clone(),
            in_flight: Arc::clone(&in_flight),
        });
        let connection = http.serve_connection(io, service);
        let life = limits.max_connection_life;
        let registration = Registration {
            open: Arc::clone(&open),
            id,
        };
        // Registered under the lock it is spawned in, so a task that ends at once cannot
        // remove its entry before the entry is there.
        let mut by_id = open.lock();
        let close = connections.spawn(async move {
            let _registration = registration;
            if let Ok(Err(err)) = tokio::time::timeout(life, connection).await {
                tracing::debug!(%peer, error = %err, "connection ended with an error");
            }
        });
        by_id.insert(id, OpenConnection { in_flight, close });
    }
}

/// The connections a port is serving, oldest first (ids grow with each accept), each with the
/// number of requests it is answering now and the handle that closes it.
#[derive(Default)]
struct OpenConnections {
    by_id: std::sync::Mutex<std::collections::BTreeMap<u64, OpenConnection>>,
}

struct OpenConnection {
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    close: tokio::task::AbortHandle,
}

impl OpenConnections {
    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Whether one more connection fits within `max`, closing the connection idle the longest
    /// if that makes room.
    fn make_room(&self, max: usize) -> bool {
        let evicted = {
            let mut by_id = self.lock();
            if by_id.len() < max {
                return true;
            }
            let idle = by_id.iter().find_map(|(id, connection)| {
                (connection
                    .in_flight
                    .load(std::sync::atomic::Ordering::Acquire)
                    == 0)
                    .then_some(*id)
            });
            match idle.and_then(|id| by_id.remove(&id)) {
                Some(connection) => connection,
                None => return false,
            }
        };
        // Outside the lock: the aborted task's registration takes it when dropped.
        evicted.close.abort();
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u64, OpenConnection>> {
        // No code panics while holding the lock; a poisoned map is still consistent.
        self.by_id
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Removes a connection from [`OpenConnections`] when its task ends, however it ends.
struct Registration {
    open: Arc<OpenConnections>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.open.remove(self.id);
    }
}

/// The router, counting the requests a connection is answering: a connection answering none
/// is waiting for a request head and may be closed for a newcomer.
#[derive(Clone)]
struct CountInFlight {
    inner: Router,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
}

impl tower::Service<axum::http::Request<hyper::body::Incoming>> for CountInFlight {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>,
    >;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        // A Router is always ready.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<hyper::body::Incoming>) -> Self::Future {
        let answering = InFlight::start(Arc::clone(&self.in_flight));
        // A Router is always ready (its `poll_ready` returns at once), so calling it without
        // polling first is within its contract.
        let mut router = self.inner.clone();
        let response = tower::Service::call(&mut router, request.map(axum::body::Body::new));
        Box::pin(async move {
            let response = response.await;
            drop(answering);
            response
        })
    }
}

/// One request being answered on a connection, for as long as it lives.
struct InFlight(Arc<std::sync::atomic::AtomicUsize>);

impl InFlight {
    fn start(count: Arc<std::sync::atomic::AtomicUsize>) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Self(count)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
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
        async fn a_newcomer_over_the_cap_closes_the_connection_that_waited_longest() {
            let limits = small(Duration::from_secs(30), Duration::from_secs(30));
            let (addr, _stop) = start(limits).await;
            let mut holding = Vec::new();
            for _ in 0..limits.max_connections {
                holding.push(half_sent(addr).await);
                // Accepted in this order, so the first is the one waiting longest.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _newcomer = half_sent(addr).await;
            assert!(
                closed_within(&mut holding[0], Duration::from_secs(2))
                    .await
                    .is_some(),
                "the connection waiting longest was kept open"
            );
            for stream in &mut holding[1..] {
                assert_eq!(
                    closed_within(stream, Duration::from_millis(200)).await,
                    None,
                    "a younger connection was closed"
                );
            }
            // A whole request gets its answer in the full budget, at the next one's expense.
            let response = healthz(addr).await;
            assert!(response.starts_with("HTTP/1.1 200"), "{response}");
            assert!(
                closed_within(&mut holding[1], Duration::from_secs(2))
                    .await
                    .is_some()
            );
        }

        #[tokio::test]
        async fn idle_connections_are_closed_after_the_header_timeout() {
            let limits = small(Duration::from_millis(400), Duration::from_secs(30));
            let (addr, _stop) = start(limits).await;
            let mut holding = Vec::new();
            for _ in 0..limits.max_connections {
                holding.push(half_sent(addr).await);
            }
            for stream in &mut holding {
                let closed = closed_within(stream, Duration::from_secs(5))
                    .await
                    .expect("a half-sent request outlived the header timeout");
                assert!(closed < Duration::from_secs(3), "closed after {closed:?}");
            }
            let response = healthz(addr).await;
            assert!(response.starts_with("HTTP/1.1 200"), "{response}");
            assert!(response.ends_with("ok"), "{response}");
        }

        #[tokio::test]
        async fn a_newcomer_is_closed_while_every_connection_is_answering() {
            let limits = small(Duration::from_secs(30), Duration::from_secs(30));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind 127.0.0.1");
            let addr = listener.local_addr().expect("local address");
            let app = Router::new()
                .route(
                    "/slow",
                    get(|| async {
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                        "slow"
                    }),
                )
                .route("/healthz", get(|| async { "ok" }));
            let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(serve_on(listener, app, limits, async move {
                let _ = stopped.await;
            }));
            let busy: Vec<_> = (0..limits.max_connections)
                .map(|_| tokio::spawn(async move { probe(addr, "/slow").await }))
                .collect();
            tokio::time::sleep(Duration::from_millis(300)).await;
            // Nothing idle to close: the newcomer is refused, and no answer is cut off.
            let refused = probe(addr, "/healthz").await;
            assert!(!refused.starts_with("HTTP/1.1 200"), "{refused}");
            for answer in busy {
                let answer = answer.await.expect("the slow request ends");
                assert!(answer.ends_with("slow"), "{answer}");
            }
            let response = probe(addr, "/healthz").await;
            assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        }

        /// Serves the health router with the health port's real limits; the readiness it
        /// reports.
        async fn start_health(
            ready: bool,
        ) -> (SocketAddr, Arc<Readiness>, tokio::sync::oneshot::Sender<()>) {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind 127.0.0.1");
            let addr = listener.local_addr().expect("local address");
            let readiness = Arc::new(Readiness::default());
            readiness.set(ready);
            let app = health_router(readiness.clone(), Liveness::default());
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(serve_on(listener, app, Limits::health(), async move {
                let _ = stopped.await;
            }));
            (addr, readiness, stop)
        }

        /// Issue 35: 32 half-open connections on the health port failed 15/15 liveness probes.
        #[tokio::test]
        async fn half_open_connections_fail_no_probe() {
            for flood in [Limits::health().max_connections, 300] {
                let (addr, _readiness, _stop) = start_health(true).await;
                let mut holding = Vec::new();
                for _ in 0..flood {
                    holding.push(half_sent(addr).await);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                for attempt in 0..15 {
                    for path in ["/healthz", "/readyz"] {
                        let response = probe(addr, path).await;
                        assert!(
                            response.starts_with("HTTP/1.1 200"),
                            "{flood} half-open, probe {attempt} of {path}: {response:?}"
                        );
                    }
                    // The flood renews itself between probes.
                    for _ in 0..4 {
                        holding.push(half_sent(addr).await);
                    }
                }
            }
        }

        #[tokio::test]
        async fn probes_are_answered_during_a_running_half_open_flood() {
            let (addr, _readiness, _stop) = start_health(true).await;
            let flood = tokio::spawn(async move {
                // Bounded: 2,000 connections, 300 held at a time.
                let mut holding = std::collections::VecDeque::new();
                for _ in 0..2_000 {
                    let Ok(mut stream) = TcpStream::connect(addr).await else {
                        continue;
                    };
                    let _ = stream.write_all(HALF_SENT).await;
                    holding.push_back(stream);
                    if holding.len() > 300 {
                        holding.pop_front();
                    }
                    tokio::task::yield_now().await;
                }
            });
            for attempt in 0..15 {
                let response = probe(addr, "/healthz").await;
                assert!(
                    response.starts_with("HTTP/1.1 200"),
                    "probe {attempt}: {response:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            flood.abort();
        }

        #[tokio::test]
        async fn only_a_few_not_ready_answers_are_held_at_once() {
            let (addr, readiness, _stop) = start_health(false).await;
            let held: Vec<_> = (0..HELD_READYZ)
                .map(|_| tokio::spawn(async move { probe(addr, "/readyz").await }))
                .collect();
            tokio::time::sleep(Duration::from_millis(300)).await;
            // Past the holds, an answer comes at once: 503, long before READY_HOLD.
            let started = Instant::now();
            let response = probe(addr, "/readyz").await;
            assert!(response.starts_with("HTTP/1.1 503"), "{response}");
            assert!(started.elapsed() < Duration::from_secs(2));
            // Liveness is never held.
            let response = probe(addr, "/healthz").await;
            assert!(response.starts_with("HTTP/1.1 200"), "{response}");
            readiness.set(true);
            for answer in held {
                let answer = answer.await.expect("the held request ends");
                assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            }
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
            // The metrics port is full of half-sent requests: a whole scrape still gets its
            // answer, in place of the one that waited longest.
            let scrape = probe(metrics_addr, "/metrics").await;
            assert!(scrape.starts_with("HTTP/1.1 200"), "{scrape}");
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

        /// The real-node tier scrapes with busybox `nc`, which may shut its write side as soon
        /// as the request is sent.
        #[tokio::test]
        async fn a_client_that_shuts_its_write_side_after_the_request_gets_the_answer() {
            let (addr, _stop) = start(Limits::metrics()).await;
            for _ in 0..50 {
                let mut stream = TcpStream::connect(addr).await.expect("connect");
                stream
                    .write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n")
                    .await
                    .expect("write");
                stream.shutdown().await.expect("shut the write side");
                let mut response = String::new();
                tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
                    .await
                    .expect("an answer in time")
                    .expect("read");
                assert!(response.starts_with("HTTP/1.1 200"), "{response:?}");
            }
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
