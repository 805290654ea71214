//! Events (`events.k8s.io/v1`) on the objects the controller reconciles, with names that are
//! valid for every object name.
//!
//! kube-runtime's `Recorder` names an Event `<object name>.<nanoseconds in hex>`, so the
//! Event of an object whose name is near the 253-character limit (a ModelPlacement may be
//! named so) has an invalid name and every Event about it failed (issue 35). This recorder
//! names it the same way when that fits, and otherwise shortens the object's name with the
//! project's hashing shortener ([`crate::names::shorten_with_hash`]) before the suffix.
//!
//! Everything else is kube-runtime's behaviour (1.19+ Events): the same Event published again
//! within [`SERIES_WINDOW`] becomes a series on the first one (a merge patch raising
//! `series.count`) instead of a new object. The cache behind that is bounded
//! ([`MAX_CACHED`]), so a flood of distinct Events cannot grow the controller's memory.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Client, ResourceExt};

use crate::names::shorten_with_hash;

/// An Event published again within this long joins the first one's series (kube-runtime's
/// `CACHE_TTL`).
pub const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// Events remembered for their series at most; past it the oldest are forgotten (a repeat of
/// one of them then starts a new Event, as after the window).
pub const MAX_CACHED: usize = 4096;

/// The longest object name (a DNS subdomain), and so the longest Event name.
pub const MAX_EVENT_NAME: usize = 253;

/// What makes two Events the same, for their series: type, action, reason, the regarding and
/// related objects (the reporter is one per recorder).
type EventKey = (
    &'static str,
    String,
    String,
    [Option<String>; 5],
    Option<[Option<String>; 5]>,
);

fn reference_key(reference: &ObjectReference) -> [Option<String>; 5] {
    [
        reference.api_version.clone(),
        reference.kind.clone(),
        reference.namespace.clone(),
        reference.name.clone(),
        reference.uid.clone(),
    ]
}

fn type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// The name of an Event about the object `regarding` published at `nanos` (nanoseconds since
/// the epoch): `<regarding>.<nanos in hex>` as kube-runtime names it, with `regarding`
/// shortened (head, `-`, hash of the whole name) when that would be longer than
/// [`MAX_EVENT_NAME`]. Two objects whose long names share a head still get distinct names.
pub fn event_name(regarding: &str, nanos: i128) -> String {
    let suffix = format!(".{nanos:x}");
    let room = MAX_EVENT_NAME.saturating_sub(suffix.len());
    if regarding.len() <= room {
        return format!("{regarding}{suffix}");
    }
    format!("{}{suffix}", shorten_with_hash(regarding, regarding, room))
}

/// When an Event was last seen: its series' last observation, else its time.
fn last_observed(event: &K8sEvent) -> Option<Timestamp> {
    event
        .series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
}

/// Publishes Events for one controller (see the module docs).
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    reporter: Reporter,
    cache: Arc<Mutex<BTreeMap<EventKey, K8sEvent>>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("reporter", &self.reporter)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder publishing as `reporter`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            cache: Arc::default(),
        }
    }

    /// Publishes `event` about `regarding`: a new Event, or the next in the series of the
    /// same Event published within [`SERIES_WINDOW`]. Cluster-scoped objects' Events go to
    /// the `default` namespace.
    ///
    /// # Errors
    /// When the apiserver refuses the Event.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key: EventKey = (
            type_name(event.type_),
            event.action.clone(),
            event.reason.clone(),
            reference_key(regarding),
            event.secondary.as_ref().map(reference_key),
        );
        let previous = {
            let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            cache.retain(|_, e| last_observed(e).is_some_and(|t| t + SERIES_WINDOW > now));
            cache.get(&key).cloned()
        };
        let object = match previous {
            Some(mut object) => {
                let count = object
                    .series
                    .as_ref()
                    .map_or(2, |s| s.count.saturating_add(1));
                object.series = Some(EventSeries {
                    count,
                    last_observed_time: MicroTime(now),
                });
                object
            }
            None => self.new_event(event, regarding, now),
        };
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        if object.series.is_some() {
            events
                .patch(
                    &object.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&object),
                )
                .await?;
        } else {
            events.create(&PostParams::default(), &object).await?;
        }
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= MAX_CACHED && !cache.contains_key(&key) {
            let oldest = cache
                .iter()
                .min_by_key(|(_, e)| last_observed(e))
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                cache.remove(&oldest);
            }
        }
        cache.insert(key, object);
        Ok(())
    }

    fn new_event(&self, event: &Event, regarding: &ObjectReference, now: Timestamp) -> K8sEvent {
        let about = regarding
            .name
            .as_deref()
            .unwrap_or(&self.reporter.controller);
        K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(event_name(about, now.as_nanosecond())),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            type_: Some(type_name(event.type_).to_string()),
            ..K8sEvent::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_dns_subdomain(name: &str) -> bool {
        name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    #[test]
    fn short_names_are_named_as_kube_runtime_names_them() {
        assert_eq!(event_name("llama", 0x1234), "llama.1234");
    }

    /// Issue 35: a placement named near the limit got an Event name past it.
    #[test]
    fn names_near_the_limit_are_shortened_and_stay_valid_and_distinct() {
        let nanos = 1_790_000_000_123_456_789_i128;
        let long = |tail: &str| format!("{}{tail}", "a.b-c".repeat(50));
        let (first, second) = (long("x"), long("y"));
        assert_eq!(first.len(), 251);
        for regarding in [&first, &second] {
            let name = event_name(regarding, nanos);
            assert!(is_dns_subdomain(&name), "{name} ({} bytes)", name.len());
            assert!(name.ends_with(&format!(".{nanos:x}")), "{name}");
        }
        assert_ne!(event_name(&first, nanos), event_name(&second, nanos));
        // The largest name that still fits is kept whole.
        let fits = "n".repeat(253 - format!(".{nanos:x}").len());
        assert_eq!(event_name(&fits, nanos), format!("{fits}.{nanos:x}"));
        let over = format!("{fits}n");
        assert_ne!(event_name(&over, nanos), format!("{over}.{nanos:x}"));
        assert!(is_dns_subdomain(&event_name(&over, nanos)));
    }
}
