//! Which placements have pods: a metadata-only watch of the pods labelled
//! `hwaccel.io/placement` (what `hwaccel plan --emit` stamps on its pod templates), so that
//! plan conformance lists a placement's pods only when it has some.
//!
//! Listing every Planned placement's pods once per `--device-health-interval` was one list
//! per placement per minute whether or not any pod ran it: 10,080 lists in one 10,000-node,
//! 3,000-placement scale run (docs/benchmarks.md). The watch costs the apiserver one
//! connection and sends only the labelled pods' metadata (the `PartialObjectMetadata` form,
//! `managedFields` dropped), about half a kilobyte each, so a tenant's pods cost the
//! controller no more than their names and labels. It runs only with
//! `--conformance-list-pods` (the chart's `controller.conformance.listPods`, which grants
//! `list` and `watch` on pods) and only in the controller's namespace when it has one.
//!
//! Until the watch has listed (or while it is refused, e.g. by an older chart's RBAC without
//! `watch`), [`has_labelled_pods`] says `None` and conformance lists as before.

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use crate::api::projection::drop_managed_fields;
use crate::names::keys::PLACEMENT_LABEL;

/// The labelled pods' metadata, as the watch keeps it.
pub type PodIndex = Store<PartialObjectMeta<Pod>>;

/// The index and the watch that fills it (to be polled for as long as the index is read).
pub fn watch(client: &Client, namespace: Option<&str>) -> (PodIndex, BoxFuture<'static, ()>) {
    // `PartialObjectMeta`: the apiserver sends the metadata-only form.
    let api: Api<PartialObjectMeta<Pod>> = match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let (index, writer) = reflector::store();
    let events = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default().labels(PLACEMENT_LABEL)).modify(drop_managed_fields),
    )
    .default_backoff()
    .for_each(|event| {
        if let Err(err) = event {
            tracing::debug!(error = %err, "the labelled-pod watch failed; conformance lists pods until it recovers");
        }
        async {}
    });
    (index, events.boxed())
}

/// Whether any pod in `namespace` carries `hwaccel.io/placement=<name>`; `None` while the
/// index has not listed yet.
pub fn has_labelled_pods(index: &PodIndex, namespace: &str, name: &str) -> Option<bool> {
    index.wait_until_ready().now_or_never()?.ok()?;
    Some(index.state().iter().any(|pod| {
        pod.namespace().as_deref() == Some(namespace)
            && pod.labels().get(PLACEMENT_LABEL).map(String::as_str) == Some(name)
    }))
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;
    use kube::runtime::watcher::Event;

    use super::*;

    fn pod(namespace: &str, placement: &str) -> PartialObjectMeta<Pod> {
        PartialObjectMeta::<Pod> {
            metadata: ObjectMeta {
                name: Some(format!("{placement}-0")),
                namespace: Some(namespace.into()),
                labels: Some([(PLACEMENT_LABEL.to_string(), placement.to_string())].into()),
                ..ObjectMeta::default()
            },
            ..PartialObjectMeta::default()
        }
    }

    #[test]
    fn a_placement_has_pods_only_in_its_own_namespace_and_only_once_the_index_listed() {
        let (index, mut writer) = reflector::store::<PartialObjectMeta<Pod>>();
        assert_eq!(
            has_labelled_pods(&index, "ml", "llama"),
            None,
            "not listed yet"
        );
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(pod("ml", "llama")));
        writer.apply_watcher_event(&Event::InitDone);
        assert_eq!(has_labelled_pods(&index, "ml", "llama"), Some(true));
        assert_eq!(has_labelled_pods(&index, "other", "llama"), Some(false));
        assert_eq!(has_labelled_pods(&index, "ml", "qwen"), Some(false));
        writer.apply_watcher_event(&Event::Delete(pod("ml", "llama")));
        assert_eq!(has_labelled_pods(&index, "ml", "llama"), Some(false));
    }
}
