//! The Kubernetes client of every command that talks to the API, with a deadline on every call.
//!
//! kube's defaults bound only connecting (30 s) and writing (295 s): a request to an apiserver
//! that accepts the connection and never answers waits for ever, and so does whatever waits on
//! it (an agent cycle, a reconcile, a Lease renewal). A tower layer puts the deadline on top of
//! kube's own stack (so it covers connecting, TLS, kube's retries, writing and the server's
//! work):
//!
//! - every request must get its response head within the API timeout;
//! - the body of a normal response must also be complete within that same deadline;
//! - a watch's body is exempt. Watches are long polls that the server ends after their
//!   `timeoutSeconds` (290 s by default), and kube-runtime's watcher already treats a stream
//!   idle for longer than that plus 5 s as dead and reconnects. One client thus serves both
//!   kinds of call, with no read timeout on the connection that a quiet watch would trip.
//!
//! Every client names its component in the `User-Agent` header (`hwaccel-agent/0.1.0`,
//! `hwaccel-controller/0.1.0`, ...): kube-rs sends none of its own, and the apiserver's audit
//! log and priority-and-fairness debugging tell callers apart by it (the scale harness counts
//! each component's requests that way).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt as _;
use hyper::body::{Body, Bytes, Frame, SizeHint};
use hyper::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{ClientBuilder, DynBody};
use tokio::time::{Instant, Sleep};
use tower::retry::RetryLayer;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt as _};

/// Default deadline for one API call. The apiserver gives up on a normal request itself after
/// 60 s (`--request-timeout`); a healthy one answers our calls (single objects, paged lists)
/// in milliseconds, so 30 s only ever cuts a call that is not coming back.
pub const DEFAULT_API_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest time to open a connection; never more than the API timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A client from the environment (in-cluster service account, else `$KUBECONFIG` or
/// `~/.kube/config`) whose every call ends within `api_timeout`, sent as `component`
/// ([`user_agent`]).
pub async fn client(api_timeout: Duration, component: &str) -> anyhow::Result<kube::Client> {
    let config = named(kube::Config::infer().await?, component)?;
    Ok(client_from(config, api_timeout)?)
}

/// `config` with every request sent as `component` ([`user_agent`]).
fn named(
    mut config: kube::Config,
    component: &str,
) -> Result<kube::Config, hyper::header::InvalidHeaderValue> {
    let value = hyper::header::HeaderValue::from_str(&user_agent(component))?;
    config
        .headers
        .retain(|(name, _)| name != hyper::header::USER_AGENT);
    config.headers.push((hyper::header::USER_AGENT, value));
    Ok(config)
}

/// The `User-Agent` of a component's requests: `hwaccel-<component>/<version>`.
pub fn user_agent(component: &str) -> String {
    format!("hwaccel-{component}/{}", env!("CARGO_PKG_VERSION"))
}

/// A client for `config` whose every call ends within `api_timeout`; over HTTP/2 where the
/// apiserver offers it (ADR 0013), unless `HWACCEL_API_HTTP1` is `true` (an escape
/// hatch for a proxy in front of the apiserver that mishandles HTTP/2).
pub fn client_from(
    config: kube::Config,
    api_timeout: Duration,
) -> Result<kube::Client, kube::Error> {
    let versions = match std::env::var(HTTP1_ONLY_ENV).as_deref() {
        Ok("true" | "1") => HttpVersions::Http1Only,
        _ => HttpVersions::Http2Preferred,
    };
    client_over(config, api_timeout, versions)
}

/// Names the environment variable that keeps every client on HTTP/1.1.
pub const HTTP1_ONLY_ENV: &str = "HWACCEL_API_HTTP1";

/// Which HTTP versions a client may speak to the apiserver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpVersions {
    /// HTTP/2 when the apiserver offers it (ALPN), else HTTP/1.1: one connection per process.
    Http2Preferred,
    /// HTTP/1.1 only (kube's own stack): one connection per concurrent call or watch.
    Http1Only,
}

/// [`client_from`] with the HTTP versions chosen by the caller.
pub fn client_over(
    mut config: kube::Config,
    api_timeout: Duration,
    versions: HttpVersions,
) -> Result<kube::Client, kube::Error> {
    config.connect_timeout = Some(api_timeout.min(CONNECT_TIMEOUT));
    config.write_timeout = Some(api_timeout);
    let deadline = DeadlineLayer {
        timeout: api_timeout,
    };
    let service = match versions {
        HttpVersions::Http2Preferred => multiplexed(&config)?,
        HttpVersions::Http1Only => None,
    };
    Ok(match service {
        Some(service) => ClientBuilder::new(service, config.default_namespace.clone())
            .with_layer(&deadline)
            .build(),
        None => ClientBuilder::try_from(config)?
            .with_layer(&deadline)
            .build(),
    })
}

/// How often an idle HTTP/2 connection is pinged, and how long a ping may go unanswered before
/// the connection counts as dead (its watches then fail and are made again): a connection
/// that carries every watch of the process must not sit on a dead peer.
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

/// kube's request stack as [`ClientBuilder::new`] takes it.
type HttpService =
    tower::util::BoxService<Request<kube::client::Body>, Response<Box<DynBody>>, BoxError>;

/// The HTTP stack under kube's client for the common case (an `https` apiserver reached
/// directly, credentials that are not an exec plugin's): kube's own layers (base URI, retries
/// of server errors, authentication, extra headers) around a hyper client that offers HTTP/2
/// by ALPN and falls back to HTTP/1.1. `None` for anything else, which keeps kube's stack.
///
/// Why (issue 41, ADR 0013): kube's stack speaks HTTP/1.1 only, so every watch holds a TLS
/// connection of its own; an agent's three watches were three connections, about 86 KiB of
/// apiserver memory each (it now holds two, ADR 0010). Over HTTP/2 a process holds one connection, its watches and calls
/// multiplexed on it as streams.
fn multiplexed(config: &kube::Config) -> Result<Option<HttpService>, kube::Error> {
    use kube::client::ConfigExt as _;
    if config.proxy_url.is_some()
        || config.auth_info.exec.is_some()
        || config.cluster_url.scheme_str() != Some("https")
    {
        return Ok(None);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_only();
    let tls = match &config.tls_server_name {
        Some(name) => tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
            name.clone().try_into().map_err(|err| {
                kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(err))
            })?,
        )),
        None => tls,
    };
    let mut connector = hyper_timeout::TimeoutConnector::new(
        tls.enable_http1().enable_http2().wrap_connector(http),
    );
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(H2_PING_INTERVAL)
            .http2_keep_alive_timeout(H2_PING_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(client)
        .map_response(|response: Response<hyper::body::Incoming>| {
            response.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>)
        })
        .boxed();
    Ok(Some(service))
}

/// The error of a call that ran out of time.
#[derive(Debug, thiserror::Error)]
#[error("no complete answer from the Kubernetes API within {}s (the API timeout)", .0.as_secs_f64())]
pub struct ApiTimeout(pub Duration);

/// Puts [`Deadline`] around a service.
#[derive(Debug, Clone, Copy)]
struct DeadlineLayer {
    timeout: Duration,
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Deadline {
            inner,
            timeout: self.timeout,
        }
    }
}

/// A service whose calls end within a deadline (see the module docs).
#[derive(Debug, Clone)]
struct Deadline<S> {
    inner: S,
    timeout: Duration,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, RequestBody, B> Service<Request<RequestBody>> for Deadline<S>
where
    S: Service<Request<RequestBody>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Response = Response<DeadlineBody<B>>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<RequestBody>) -> Self::Future {
        let watch = is_watch(request.uri());
        let timeout = self.timeout;
        let deadline = Instant::now() + timeout;
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = tokio::time::timeout_at(deadline, response)
                .await
                .map_err(|_| ApiTimeout(timeout))?
                .map_err(Into::into)?;
            Ok(response.map(|inner| DeadlineBody {
                inner,
                deadline: (!watch).then(|| Box::pin(tokio::time::sleep_until(deadline))),
                timeout,
            }))
        })
    }
}

/// True for a watch request (`watch=true` or `watch=1` in the query).
fn is_watch(uri: &hyper::Uri) -> bool {
    uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    })
}

/// A response body that fails once its deadline has passed (none for a watch).
#[derive(Debug)]
pub struct DeadlineBody<B> {
    inner: B,
    deadline: Option<Pin<Box<Sleep>>>,
    timeout: Duration,
}

impl<B> Body for DeadlineBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        match &mut this.deadline {
            Some(deadline) => match deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(ApiTimeout(this.timeout).into()))),
                Poll::Pending => Poll::Pending,
            },
            None => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// True for a failure worth another try: a conflict, throttling, a server error or a
/// transport failure (a timeout of this client's deadline included). A refusal (400, 401, 403,
/// 404, 410, 422) is not: asking again gets the same answer.
pub fn is_transient(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => status.code == 409 || status.code == 429 || status.code >= 500,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt as _;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use kube::api::WatchParams;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    const TIMEOUT: Duration = Duration::from_millis(500);

    /// A fake apiserver on 127.0.0.1: accepts connections, reads each request, and answers
    /// with `head` (nothing at all when empty), then never sends anything more.
    async fn fake_apiserver(head: &'static str) -> kube::Client {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                if !head.is_empty() {
                    let _ = stream.write_all(head.as_bytes()).await;
                }
                held.push(stream);
            }
        });
        let url = format!("http://{addr}").parse().expect("url");
        client_from(kube::Config::new(url), TIMEOUT).expect("client")
    }

    async fn within<T>(bound: Duration, future: impl Future<Output = T>) -> T {
        tokio::time::timeout(bound, future)
            .await
            .expect("the call ended within its bound")
    }

    #[tokio::test]
    async fn a_call_to_an_apiserver_that_never_answers_fails_within_the_timeout() {
        let client = fake_apiserver("").await;
        let started = std::time::Instant::now();
        let result = within(TIMEOUT * 6, client.apiserver_version()).await;
        let err = result.expect_err("no answer is an error");
        assert!(err.to_string().contains("API timeout"), "{err}");
        assert!(started.elapsed() >= TIMEOUT, "{:?}", started.elapsed());

        let maps: Api<ConfigMap> = Api::namespaced(client, "default");
        let err = within(TIMEOUT * 6, maps.get("x"))
            .await
            .expect_err("no answer is an error");
        assert!(err.to_string().contains("API timeout"), "{err}");
    }

    #[tokio::test]
    async fn a_body_that_stops_half_way_fails_within_the_timeout() {
        let client = fake_apiserver(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"ma",
        )
        .await;
        let err = within(TIMEOUT * 6, client.apiserver_version())
            .await
            .expect_err("half a body is an error");
        assert!(err.to_string().contains("API timeout"), "{err}");
    }

    #[tokio::test]
    async fn a_quiet_watch_is_not_cut_but_its_missing_head_is() {
        let client = fake_apiserver(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .await;
        let maps: Api<ConfigMap> = Api::namespaced(client, "default");
        let events = within(TIMEOUT * 6, maps.watch(&WatchParams::default(), "0"))
            .await
            .expect("the watch starts");
        let mut events = Box::pin(events);
        let quiet = tokio::time::timeout(TIMEOUT * 3, events.next()).await;
        assert!(quiet.is_err(), "a quiet watch ended early: {quiet:?}");

        let silent: Api<ConfigMap> = Api::namespaced(fake_apiserver("").await, "default");
        let err = within(TIMEOUT * 6, silent.watch(&WatchParams::default(), "0"))
            .await
            .err()
            .expect("a watch without a response head is an error");
        assert!(err.to_string().contains("API timeout"), "{err}");
    }

    #[tokio::test]
    async fn every_request_names_its_component() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let request = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut buf = vec![0u8; 4096];
            let n = stream.read(&mut buf).await.expect("read");
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                .await;
            String::from_utf8_lossy(&buf[..n]).to_lowercase()
        });
        let url = format!("http://{addr}").parse().expect("url");
        let config = named(kube::Config::new(url), "controller").expect("a valid header");
        let client = client_from(config, TIMEOUT).expect("client");
        let _ = within(TIMEOUT * 6, client.apiserver_version()).await;
        let head = within(TIMEOUT * 6, request).await.expect("the server task");
        let agents: Vec<&str> = head
            .lines()
            .filter(|l| l.starts_with("user-agent:"))
            .collect();
        assert_eq!(
            agents,
            [format!(
                "user-agent: hwaccel-controller/{}",
                env!("CARGO_PKG_VERSION")
            )
            .trim_end()],
            "{head}"
        );
    }

    #[test]
    fn watches_are_told_apart_by_their_query() {
        let watch = |uri: &str| is_watch(&uri.parse().expect("uri"));
        assert!(watch("/api/v1/pods?&watch=true&timeoutSeconds=290"));
        assert!(watch("/api/v1/pods?watch=1"));
        assert!(!watch("/api/v1/pods?labelSelector=watch%3Dtrue"));
        assert!(!watch("/api/v1/namespaces/watch/pods"));
    }

    /// What a busy or absent apiserver answers is worth another try (the controller's first
    /// list retries on it); what a refusal answers is not.
    #[test]
    fn timeouts_throttling_and_server_errors_are_transient_refusals_are_not() {
        let api = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("test", "Test")
                    .with_code(code)
                    .boxed(),
            )
        };
        for code in [409, 429, 500, 503, 504] {
            assert!(is_transient(&api(code)), "{code}");
        }
        for code in [400, 401, 403, 404, 410, 422] {
            assert!(!is_transient(&api(code)), "{code}");
        }
    }
}
