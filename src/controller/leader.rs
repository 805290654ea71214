//! Leader election with a `coordination.k8s.io/v1` Lease, so only one controller replica
//! writes.
//!
//! The protocol is client-go's: a candidate takes the Lease when it is free, already its own,
//! or has not changed for a whole lease duration; the holder renews it well within that
//! duration. Every write is a `replace` carrying the `resourceVersion` just read, so two
//! candidates can never both win. Expiry is judged by when *this* process last saw the Lease
//! change, not by the timestamps inside it, so clock skew between nodes does not matter.
//!
//! A holder that cannot renew before the renew deadline reports the loss; the caller stops
//! writing at once (the binary exits and the Deployment restarts it as a candidate). Every
//! call is bounded: a renewal may take only the time left before the renew deadline, so a
//! request that hangs (a half-open connection, an overloaded apiserver) cannot keep this
//! replica acting as leader after a standby, seeing the Lease unchanged for a whole lease
//! duration, has taken over.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;

/// Where the Lease lives and how it is timed.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (its Pod name).
    pub identity: String,
    /// How long a Lease that stopped changing stays with its holder.
    pub lease_duration: Duration,
    /// How long the holder keeps trying to renew before it gives up leadership.
    pub renew_deadline: Duration,
    /// Pause between attempts (candidates) and between renewals (the holder).
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Held leadership: `lost` flips to true when it is gone.
#[derive(Debug)]
pub struct Leadership {
    /// Becomes true when the Lease could not be renewed or someone else holds it.
    pub lost: watch::Receiver<bool>,
    renewer: tokio::task::JoinHandle<()>,
    api: Api<Lease>,
    config: LeaseConfig,
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

impl Leadership {
    /// Resolves when leadership is lost.
    pub async fn lost(&mut self) {
        let _ = self.lost.wait_for(|lost| *lost).await;
    }

    /// Gives the Lease up (graceful shutdown), so a standby takes over at once.
    pub async fn release(self) {
        self.renewer.abort();
        // Bounded: shutdown must not wait on a hung apiserver; an unreleased Lease only
        // makes the standby wait one lease duration.
        let released = tokio::time::timeout(self.config.renew_deadline, self.give_up());
        if released.await.is_err() {
            tracing::warn!("releasing the leader Lease did not answer in time");
        }
    }

    async fn give_up(&self) {
        if let Ok(mut lease) = self.api.get(&self.config.name).await
            && holder(&lease) == Some(self.config.identity.as_str())
        {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = None;
            spec.renew_time = None;
            spec.acquire_time = None;
            let _ = self
                .api
                .replace(&self.config.name, &PostParams::default(), &lease)
                .await;
        }
    }
}

fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// Waits until this replica holds the Lease; `on_contact` runs after the first successful
/// API call (the process is healthy even while it waits).
pub async fn acquire(
    client: Client,
    config: LeaseConfig,
    on_contact: impl Fn(),
) -> Result<Leadership, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let mut observed: Option<(String, Instant)> = None;
    loop {
        let attempt = try_acquire(&api, &config, &mut observed);
        match tokio::time::timeout(config.renew_deadline, attempt).await {
            Ok(Ok(true)) => break,
            Ok(Ok(false)) => on_contact(),
            Ok(Err(err)) => tracing::warn!(error = %err, "reading the leader Lease failed"),
            Err(_) => tracing::warn!("the leader Lease request did not answer in time"),
        }
        tokio::time::sleep(config.retry_period).await;
    }
    on_contact();
    tracing::info!(identity = %config.identity, lease = %config.name, "became the leader");
    let (tell, lost) = watch::channel(false);
    let renewer = tokio::spawn(renew(api.clone(), config.clone(), tell));
    Ok(Leadership {
        lost,
        renewer,
        api,
        config,
    })
}

/// One attempt; true when this replica now holds the Lease.
async fn try_acquire(
    api: &Api<Lease>,
    config: &LeaseConfig,
    observed: &mut Option<(String, Instant)>,
) -> Result<bool, kube::Error> {
    let Some(lease) = api.get_opt(&config.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(taken_spec(config, None)),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(false),
            Err(err) => Err(err),
        };
    };
    let version = lease.resource_version().unwrap_or_default();
    let mine_or_free = holder(&lease).is_none_or(|h| h == config.identity);
    let expired = match observed {
        Some((seen, since)) if *seen == version => since.elapsed() >= config.lease_duration,
        _ => {
            *observed = Some((version, Instant::now()));
            false
        }
    };
    if !mine_or_free && !expired {
        return Ok(false);
    }
    let mut taken = lease.clone();
    taken.spec = Some(taken_spec(config, lease.spec.as_ref()));
    match api
        .replace(&config.name, &PostParams::default(), &taken)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.is_conflict() => Ok(false),
        Err(err) => Err(err),
    }
}

/// The spec of a Lease this replica takes over from `previous`.
fn taken_spec(config: &LeaseConfig, previous: Option<&LeaseSpec>) -> LeaseSpec {
    let same_holder = previous
        .and_then(|s| s.holder_identity.as_deref())
        .is_some_and(|h| h == config.identity);
    let transitions = previous.and_then(|s| s.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(config.identity.clone()),
        lease_duration_seconds: Some(
            i32::try_from(config.lease_duration.as_secs()).unwrap_or(i32::MAX),
        ),
        acquire_time: if same_holder {
            previous.and_then(|s| s.acquire_time.clone())
        } else {
            Some(now())
        },
        renew_time: Some(now()),
        lease_transitions: Some(if same_holder || previous.is_none() {
            transitions
        } else {
            transitions.saturating_add(1)
        }),
        ..LeaseSpec::default()
    }
}

/// Renews until it cannot; then reports the loss.
async fn renew(api: Api<Lease>, config: LeaseConfig, lost: watch::Sender<bool>) {
    let mut last_renewal = Instant::now();
    loop {
        tokio::time::sleep(config.retry_period).await;
        let left = config.renew_deadline.saturating_sub(last_renewal.elapsed());
        match tokio::time::timeout(left, renew_once(&api, &config)).await {
            Ok(Ok(true)) => last_renewal = Instant::now(),
            Ok(Ok(false)) => {
                tracing::error!(identity = %config.identity, "another replica holds the Lease");
                break;
            }
            Ok(Err(err)) => tracing::warn!(error = %err, "renewing the Lease failed"),
            Err(_) => tracing::warn!("renewing the Lease did not answer before the renew deadline"),
        }
        if last_renewal.elapsed() >= config.renew_deadline {
            tracing::error!(identity = %config.identity, "could not renew the Lease in time");
            break;
        }
    }
    let _ = lost.send(true);
}

/// True when renewed; false when someone else holds the Lease.
async fn renew_once(api: &Api<Lease>, config: &LeaseConfig) -> Result<bool, kube::Error> {
    let mut lease = api.get(&config.name).await?;
    if holder(&lease) != Some(config.identity.as_str()) {
        return Ok(false);
    }
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.renew_time = Some(now());
    // A conflict (someone wrote in between) is an error like any other: the next round
    // re-reads, and the renew deadline still applies.
    api.replace(&config.name, &PostParams::default(), &lease)
        .await
        .map(|_| true)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// An apiserver that lets this replica create the Lease (GET 404, POST 201) and then never
    /// answers again, as a half-open connection does.
    fn hangs_after_acquiring() -> (Client, Arc<AtomicUsize>) {
        let requests = Arc::new(AtomicUsize::new(0));
        let seen = requests.clone();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            let method = request.method().clone();
            async move {
                let (code, body) = match (n, method) {
                    (0, http::Method::GET) => (
                        404,
                        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#,
                    ),
                    (1, http::Method::POST) => (
                        201,
                        r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"lease","namespace":"default","resourceVersion":"1"},"spec":{"holderIdentity":"me"}}"#,
                    ),
                    _ => std::future::pending().await,
                };
                http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(body.as_bytes().to_vec()))
            }
        });
        (Client::new(service, "default"), requests)
    }

    #[tokio::test]
    async fn a_renewal_that_hangs_gives_up_leadership_by_the_renew_deadline() {
        let (client, requests) = hangs_after_acquiring();
        let config = LeaseConfig {
            lease_duration: Duration::from_millis(1500),
            renew_deadline: Duration::from_millis(600),
            retry_period: Duration::from_millis(100),
            ..LeaseConfig::new("default", "lease", "me")
        };
        let mut leadership = acquire(client, config, || {}).await.expect("acquired");
        let acquired = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), leadership.lost())
            .await
            .expect("leadership is given up although the renewal never answers");
        // Well before a standby could take over (one lease duration after the last change).
        assert!(
            acquired.elapsed() < Duration::from_millis(1500),
            "{:?}",
            acquired.elapsed()
        );
        assert!(
            requests.load(Ordering::SeqCst) >= 3,
            "a renewal was attempted"
        );
        // Releasing on shutdown does not hang either.
        tokio::time::timeout(Duration::from_secs(5), leadership.release())
            .await
            .expect("release is bounded");
    }
}
