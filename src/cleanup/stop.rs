//! Stopping our own writers before the labels are removed.
//!
//! The controller repairs placement labels and the agents re-apply theirs, so a cleanup that
//! runs beside them can lose: a label removed a moment ago comes back, and `helm uninstall`
//! then deletes the writers with the label in place. This module scales the controller's
//! Deployment to zero (through its `scale` subresource), deletes the agents' DaemonSets, and
//! waits, bounded, until none of their pods is left (terminating ones included: a pod in its
//! grace period still writes) and the controller's leader Lease is free or has gone stale.
//! The chart's hook Role allows exactly these calls, each limited to the object's name.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::time::Instant;

/// What to stop, and how long to wait for it.
#[derive(Debug, Clone)]
pub struct Writers {
    /// Namespace of the release (Deployment, DaemonSet, pods, Lease).
    pub namespace: String,
    /// The controller's Deployment, scaled to zero.
    pub controller_deployment: Option<String>,
    /// The agents' DaemonSets (the default one and the NVML one), deleted.
    pub agent_daemonsets: Vec<String>,
    /// Label selector of the writers' pods; waited for until none is left.
    pub pod_selector: Option<String>,
    /// The controller's leader Lease; waited for until free or stale.
    pub lease: Option<String>,
    /// Give up after this long.
    pub timeout: Duration,
    /// Pause between checks.
    pub poll: Duration,
}

/// Stops the writers and waits until they are gone. An error says what is still running.
pub async fn stop_writers(client: Client, writers: &Writers) -> anyhow::Result<()> {
    let namespace = writers.namespace.as_str();
    if let Some(name) = &writers.controller_deployment {
        let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        let scale = json!({ "spec": { "replicas": 0 } });
        match api
            .patch_scale(name, &PatchParams::default(), &Patch::Merge(&scale))
            .await
        {
            Ok(_) => tracing::info!(deployment = %name, "controller scaled to 0"),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => {
                return Err(anyhow::anyhow!(
                    "cannot scale the controller Deployment {namespace}/{name} to 0: {err}"
                ));
            }
        }
    }
    for name in &writers.agent_daemonsets {
        let api: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => tracing::info!(daemonset = %name, "agent DaemonSet deleted"),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => {
                return Err(anyhow::anyhow!(
                    "cannot delete the agent DaemonSet {namespace}/{name}: {err}"
                ));
            }
        }
    }
    let deadline = Instant::now() + writers.timeout;
    let mut lease_watch = LeaseWatch::default();
    loop {
        let pods = match &writers.pod_selector {
            Some(selector) => running_pods(&client, namespace, selector).await?,
            None => Vec::new(),
        };
        let holder = match &writers.lease {
            Some(name) => lease_watch.holder(&client, namespace, name).await?,
            None => None,
        };
        if pods.is_empty() && holder.is_none() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let mut still = Vec::new();
            if !pods.is_empty() {
                still.push(format!("pods {}", pods.join(", ")));
            }
            if let Some(holder) = holder {
                still.push(format!("the leader Lease held by {holder}"));
            }
            anyhow::bail!(
                "our writers did not stop within {:?}: {} (labels were left untouched; \
                 retry the uninstall, or stop them and run `hwaccel cleanup --all-nodes`)",
                writers.timeout,
                still.join("; ")
            );
        }
        tokio::time::sleep(writers.poll).await;
    }
}

/// Names of the pods the selector matches, terminating ones included.
async fn running_pods(
    client: &Client,
    namespace: &str,
    selector: &str,
) -> anyhow::Result<Vec<String>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pods = api
        .list(&ListParams::default().labels(selector).limit(500))
        .await
        .map_err(|err| anyhow::anyhow!("cannot list pods {selector} in {namespace}: {err}"))?;
    Ok(pods.items.iter().map(ResourceExt::name_any).collect())
}

/// Follows the Lease the way a candidate does (`controller::leader`): it is free when it
/// names no holder, or when it has not changed for a whole lease duration as timed on this
/// side (so clock skew does not matter).
#[derive(Debug, Default)]
struct LeaseWatch {
    last: Option<(String, Instant)>,
}

impl LeaseWatch {
    /// The holder, or `None` when the Lease is free, stale or absent.
    async fn holder(
        &mut self,
        client: &Client,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<Option<String>> {
        let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let lease = match api.get_opt(name).await {
            Ok(Some(lease)) => lease,
            Ok(None) => return Ok(None),
            Err(err) => anyhow::bail!("cannot read the Lease {namespace}/{name}: {err}"),
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let Some(holder) = spec.holder_identity.filter(|h| !h.is_empty()) else {
            return Ok(None);
        };
        let duration = Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(15).max(1)).unwrap_or(15),
        );
        let version = lease.resource_version().unwrap_or_default();
        let now = Instant::now();
        let since = match &self.last {
            Some((seen, since)) if *seen == version => *since,
            _ => {
                self.last = Some((version, now));
                now
            }
        };
        Ok((now.duration_since(since) < duration).then_some(holder))
    }
}
