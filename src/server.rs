//! The operational HTTP endpoints of the agent and the controller: `/healthz` (the process is
//! alive), `/readyz` (it has done its first useful work and can still reach what it needs), and
//! `/metrics` (Prometheus/OpenMetrics text).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

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
}

/// The router serving the three endpoints; exposed for tests.
pub fn router(registry: Arc<Registry>, readiness: Arc<Readiness>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AppState {
            registry,
            readiness,
        })
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

/// Binds `addr` and serves until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Arc<Readiness>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
    axum::serve(listener, router(registry, readiness))
        .with_graceful_shutdown(shutdown)
        .await
}

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
        let app = router(Arc::new(registry), readiness.clone());

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
}
