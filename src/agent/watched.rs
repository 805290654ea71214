//! A long-lived watch of a few of the agent's own objects (its Node, its node's
//! ResourceSlices), kept by a small task so that a cycle reads the cache instead of
//! the API. See `docs/decisions/0010-the-agent-watches-its-own-objects.md` for why.
//!
//! The task lists the objects that match a field selector, then watches from the list's
//! resourceVersion with bookmarks on, re-watching from the last version it saw when the server
//! ends a watch (after a timeout drawn from 5 to 10 minutes, as client-go's reflector does, so
//! a fleet of agents does not reconnect in step) and re-listing only when that version is gone
//! (410). It is bounded everywhere:
//!
//! - the list and the start of each watch are ordinary calls under the client's API timeout;
//! - a stream that stays quiet for longer than the trust window (the apiserver bookmarks each
//!   watcher about once a minute) is dropped as dead, so a half-open connection cannot hold a
//!   stale cache;
//! - a failed list or watch, or a watch that ends within [`Timing::healthy_watch`] of its
//!   start, waits a jittered exponential backoff before the next try, so a refusing or
//!   flapping apiserver is never hammered;
//! - a list refused with 403 or 404 (no DRA API, no RBAC for it) is tried again only after
//!   [`Timing::refused_retry`].
//!
//! Whether the cache may be used is [`state::CacheState`]'s rule: only while the watch was
//! heard within the trust window. Otherwise the caller reads the API as before.

pub mod state;

use std::fmt::Debug;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use futures::stream::BoxStream;
use kube::api::{ListParams, ObjectList, WatchEvent, WatchParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

use crate::backoff::{Backoff, Retries, equal_jitter};
pub use state::{CacheState, Cached, WatchStats};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Events<T> = BoxStream<'static, kube::Result<WatchEvent<T>>>;
type ListFn<T> = Box<dyn Fn(ListParams) -> BoxFuture<kube::Result<ObjectList<T>>> + Send + Sync>;
type WatchFn<T> =
    Box<dyn Fn(WatchParams, String) -> BoxFuture<kube::Result<Events<T>>> + Send + Sync>;

/// How a watch paces itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long past its last sign of life the cache is trusted, and how long a stream may stay
    /// quiet before it is dropped as dead. The apiserver bookmarks a watcher about once a
    /// minute, so two bookmark periods and some slack.
    pub window: Duration,
    /// The longest watch asked for; each asks for a random time in its upper half.
    pub watch_timeout: Duration,
    /// Retries after a failure.
    pub retry: Backoff,
    /// The wait before listing again after a 403 or 404.
    pub refused_retry: Duration,
    /// A watch that lasted this long was healthy: the backoff starts over.
    pub healthy_watch: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(130),
            watch_timeout: Duration::from_secs(600),
            retry: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            refused_retry: Duration::from_secs(300),
            healthy_watch: Duration::from_secs(30),
        }
    }
}

/// Where a watch gets its objects: a list and a watch with one field selector.
pub struct Source<T: Clone> {
    what: &'static str,
    selector: String,
    list: ListFn<T>,
    watch: WatchFn<T>,
}

impl<T: Clone> Debug for Source<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("what", &self.what)
            .field("selector", &self.selector)
            .finish_non_exhaustive()
    }
}

impl<K> Source<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Whole objects of `api` matching `selector`.
    pub fn objects(what: &'static str, api: Api<K>, selector: String) -> Self {
        let lister = api.clone();
        Self {
            what,
            selector,
            list: Box::new(move |params| {
                let api = lister.clone();
                Box::pin(async move { api.list(&params).await })
            }),
            watch: Box::new(move |params, version| {
                let api = api.clone();
                Box::pin(async move {
                    let events = api.watch(&params, &version).await?;
                    Ok(events.boxed())
                })
            }),
        }
    }
}

type Shared<T> = Arc<Mutex<CacheState<T>>>;

fn lock<T>(shared: &Shared<T>) -> MutexGuard<'_, CacheState<T>> {
    // The lock is held for a map update; a panic there leaves a usable map.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running watch and its cache; dropping it stops the task.
#[derive(Debug)]
pub struct Watched<T> {
    state: Shared<T>,
    window: Duration,
    task: tokio::task::JoinHandle<()>,
}

impl<T> Drop for Watched<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<T> Watched<T>
where
    T: Resource + Clone + Send + 'static,
{
    /// Starts watching `source` on the current tokio runtime.
    pub fn start(source: Source<T>, timing: Timing) -> Self {
        let state: Shared<T> = Arc::default();
        let task = tokio::spawn(keep(source, Arc::clone(&state), timing));
        Self {
            state,
            window: timing.window,
            task,
        }
    }

    /// What the agent may use now.
    pub fn view(&self) -> Cached<T> {
        lock(&self.state).view(Instant::now(), self.window)
    }

    /// What the watch did so far.
    pub fn stats(&self) -> WatchStats {
        lock(&self.state).stats
    }
}

/// How one watch request ended.
enum End {
    /// The server closed it (its timeout): watch again from the last version.
    Closed,
    /// The version watched from is no longer in the server's history: list again.
    Gone,
    /// The request or the stream failed.
    Failed(String),
    /// Nothing, not even a bookmark, within the trust window: the connection is presumed dead.
    Quiet,
}

/// The task: list, then watch until the history is gone, for ever (until aborted).
async fn keep<T>(source: Source<T>, state: Shared<T>, timing: Timing)
where
    T: Resource + Clone + Send + 'static,
{
    let mut retries = Retries::new(timing.retry);
    loop {
        let params = ListParams::default().fields(&source.selector);
        let mut version = match (source.list)(params).await {
            Ok(list) => {
                let items = list
                    .items
                    .into_iter()
                    .filter_map(|o| Some((o.meta().name.clone()?, o)));
                lock(&state).listed(items, Instant::now());
                list.metadata.resource_version.unwrap_or_default()
            }
            Err(kube::Error::Api(status)) if matches!(status.code, 403 | 404) => {
                let wait = timing.refused_retry;
                lock(&state).refused(status.code, Instant::now() + wait + timing.window);
                tracing::debug!(what = source.what, code = status.code, retry_in = ?wait,
                    "watch: the list was refused");
                tokio::time::sleep(wait).await;
                continue;
            }
            Err(err) => {
                lock(&state).lost();
                let wait = retries.next_wait();
                log_failure(&source, &retries, &err.to_string(), wait);
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        loop {
            let started = Instant::now();
            let end = watch_once(&source, &state, &mut version, timing).await;
            let relist = matches!(end, End::Gone);
            let failure = match end {
                End::Closed => None,
                End::Gone => Some("the watched version is gone (410); listing again".to_string()),
                End::Failed(err) => Some(err),
                End::Quiet => Some(format!(
                    "no event or bookmark for {:?}; the stream is presumed dead",
                    timing.window
                )),
            };
            if failure.is_some() {
                lock(&state).lost();
            }
            if started.elapsed() >= timing.healthy_watch {
                retries.reset();
                if let Some(why) = failure {
                    tracing::debug!(what = source.what, why, "watch: starting again");
                }
            } else {
                // Ended soon after it began: never reconnect in a tight loop.
                let wait = retries.next_wait();
                log_failure(
                    &source,
                    &retries,
                    failure
                        .as_deref()
                        .unwrap_or("the server ended the watch early"),
                    wait,
                );
                tokio::time::sleep(wait).await;
            }
            if relist {
                break;
            }
        }
    }
}

/// Logs a failure: quietly while it may be a blip, as a warning once it repeats.
fn log_failure<T: Clone>(source: &Source<T>, retries: &Retries, why: &str, wait: Duration) {
    if retries.failures() >= 3 {
        tracing::warn!(what = source.what, why, failures = retries.failures(), retry_in = ?wait,
            "watch of the agent's own objects failing; cycles read the API meanwhile");
    } else {
        tracing::debug!(what = source.what, why, retry_in = ?wait, "watch failed");
    }
}

/// One watch request from `version`, applying its events until it ends.
async fn watch_once<T>(
    source: &Source<T>,
    state: &Shared<T>,
    version: &mut String,
    timing: Timing,
) -> End
where
    T: Resource + Clone + Send + 'static,
{
    let timeout = equal_jitter(timing.watch_timeout, fastrand::f64());
    let params = WatchParams::default()
        .fields(&source.selector)
        .timeout(u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX));
    lock(state).watch_started();
    let mut events = match (source.watch)(params, version.clone()).await {
        Ok(events) => events,
        Err(kube::Error::Api(status)) if status.code == 410 => return End::Gone,
        Err(err) => return End::Failed(err.to_string()),
    };
    loop {
        let next = match tokio::time::timeout(timing.window, events.next()).await {
            Err(_) => return End::Quiet,
            Ok(None) => return End::Closed,
            Ok(Some(Err(err))) => return End::Failed(err.to_string()),
            Ok(Some(Ok(event))) => event,
        };
        let now = Instant::now();
        match next {
            WatchEvent::Added(object) | WatchEvent::Modified(object) => {
                remember_version(version, &object);
                if let Some(name) = object.meta().name.clone() {
                    lock(state).applied(name, object, now);
                }
            }
            WatchEvent::Deleted(object) => {
                remember_version(version, &object);
                if let Some(name) = object.meta().name.as_deref() {
                    lock(state).deleted(name, now);
                }
            }
            WatchEvent::Bookmark(bookmark) => {
                *version = bookmark.metadata.resource_version;
                lock(state).bookmark(now);
            }
            WatchEvent::Error(error) if error.code == 410 => return End::Gone,
            WatchEvent::Error(error) => {
                return End::Failed(format!("error event {}: {}", error.code, error.message));
            }
        }
    }
}

#[cfg(test)]
mod tests;

fn remember_version<T: Resource>(version: &mut String, object: &T) {
    if let Some(seen) = &object.meta().resource_version {
        version.clone_from(seen);
    }
}
