//! What a watch of a few objects knows and whether it may be trusted, kept apart from the
//! watch's I/O so the trust rule is tested without an apiserver.
//!
//! The rule: the objects are current while the watch was *heard* within the trust window. It
//! is heard when a list succeeds and on every event or bookmark (the apiserver sends each
//! watcher a bookmark about once a minute and 2 s before it ends the watch), so a healthy
//! watch of a quiet object is heard at least once a minute. A failed list or watch, a stream
//! that went quiet for longer than the window, or a window that simply ran out makes the
//! cache untrusted until the watch is heard again: the agent then reads the API as it did
//! before it had a watch. A cache is never trusted for longer than the window past its last
//! sign of life, whatever the task that feeds it is doing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What the agent may use from a watch right now.
#[derive(Debug, Clone, PartialEq)]
pub enum Cached<T> {
    /// The objects that match the watch's selector, by name, as of at most the trust window
    /// ago (none: the watch knows there is no such object).
    Current(BTreeMap<String, T>),
    /// The API refused the list: 404 (the resource does not exist on this cluster, as the DRA
    /// API on an old one) or 403 (the agent may not list it), until the next list is due.
    Refused(u16),
    /// Nothing the agent may rely on: not listed yet, failing, or not heard from lately.
    Unknown,
}

/// Counts of what a watch did, for logs and the cost test.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchStats {
    /// Successful lists (the first and every re-list after a 410 or a failure).
    pub lists: u64,
    /// Watch requests started.
    pub watches: u64,
    /// Added, modified and deleted events received.
    pub events: u64,
    /// Bookmarks received.
    pub bookmarks: u64,
    /// Lists and watches that failed, and streams dropped for going quiet.
    pub failures: u64,
}

/// The objects one watch keeps and when it was last heard.
#[derive(Debug, Clone)]
pub struct CacheState<T> {
    objects: BTreeMap<String, T>,
    heard_at: Option<Instant>,
    /// The refusal's code and until when it stands (when the next list is due, plus slack).
    refused: Option<(u16, Instant)>,
    /// What the watch did so far.
    pub stats: WatchStats,
}

impl<T> Default for CacheState<T> {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            heard_at: None,
            refused: None,
            stats: WatchStats::default(),
        }
    }
}

impl<T: Clone> CacheState<T> {
    /// A list succeeded at `now`: its items replace whatever was kept.
    pub fn listed(&mut self, items: impl IntoIterator<Item = (String, T)>, now: Instant) {
        self.objects = items.into_iter().collect();
        self.refused = None;
        self.heard_at = Some(now);
        self.stats.lists += 1;
    }

    /// An added or modified object arrived at `now`.
    pub fn applied(&mut self, name: String, object: T, now: Instant) {
        self.objects.insert(name, object);
        self.heard(now);
        self.stats.events += 1;
    }

    /// A deleted object's event arrived at `now`.
    pub fn deleted(&mut self, name: &str, now: Instant) {
        self.objects.remove(name);
        self.heard(now);
        self.stats.events += 1;
    }

    /// A bookmark arrived at `now`: nothing changed up to its resourceVersion.
    pub fn bookmark(&mut self, now: Instant) {
        self.heard(now);
        self.stats.bookmarks += 1;
    }

    /// A watch request was started.
    pub fn watch_started(&mut self) {
        self.stats.watches += 1;
    }

    /// A list or watch failed or went quiet: nothing is trusted until the watch is heard again
    /// (the objects are kept: a re-watch from where the stream stopped brings them up to date).
    pub fn lost(&mut self) {
        self.heard_at = None;
        self.refused = None;
        self.stats.failures += 1;
    }

    /// The list was refused with `code` (403 or 404); it stands `until` the next list is due.
    pub fn refused(&mut self, code: u16, until: Instant) {
        self.objects.clear();
        self.refused = Some((code, until));
        self.heard_at = None;
        self.stats.failures += 1;
    }

    /// What may be used at `now` when the cache is trusted for `window` past its last sign of
    /// life.
    #[must_use]
    pub fn view(&self, now: Instant, window: Duration) -> Cached<T> {
        if let Some((code, until)) = self.refused {
            return if now <= until {
                Cached::Refused(code)
            } else {
                Cached::Unknown
            };
        }
        match self.heard_at {
            Some(heard) if now.saturating_duration_since(heard) <= window => {
                Cached::Current(self.objects.clone())
            }
            _ => Cached::Unknown,
        }
    }

    /// Marks the watch as heard at `now`; a refusal stands until a list succeeds (no watch
    /// runs while it does).
    fn heard(&mut self, now: Instant) {
        if self.refused.is_none() {
            self.heard_at = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(130);

    fn names(cached: Cached<u32>) -> Vec<String> {
        match cached {
            Cached::Current(objects) => objects.into_keys().collect(),
            other => panic!("not current: {other:?}"),
        }
    }

    #[test]
    fn nothing_is_trusted_before_the_first_list() {
        let state = CacheState::<u32>::default();
        assert_eq!(state.view(Instant::now(), WINDOW), Cached::Unknown);
    }

    #[test]
    fn a_list_then_events_keep_the_objects_by_name() {
        let start = Instant::now();
        let mut state = CacheState::default();
        state.listed([("a".to_string(), 1), ("b".to_string(), 2)], start);
        state.applied("c".into(), 3, start);
        state.applied("a".into(), 4, start);
        state.deleted("b", start);
        match state.view(start, WINDOW) {
            Cached::Current(objects) => {
                assert_eq!(objects, BTreeMap::from([("a".into(), 4), ("c".into(), 3)]));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(state.stats.lists, 1);
        assert_eq!(state.stats.events, 3);
    }

    #[test]
    fn a_cache_not_heard_from_within_the_window_is_not_trusted() {
        let start = Instant::now();
        let mut state = CacheState::default();
        state.listed([("n".to_string(), 1)], start);
        assert_eq!(names(state.view(start + WINDOW, WINDOW)), ["n"]);
        assert_eq!(
            state.view(start + WINDOW + Duration::from_secs(1), WINDOW),
            Cached::Unknown
        );
        // A bookmark is a sign of life: trusted again for a window from it.
        state.bookmark(start + Duration::from_secs(100));
        assert_eq!(
            names(state.view(start + Duration::from_secs(200), WINDOW)),
            ["n"]
        );
        assert_eq!(state.stats.bookmarks, 1);
    }

    #[test]
    fn a_failure_untrusts_at_once_until_the_watch_is_heard_again() {
        let start = Instant::now();
        let mut state = CacheState::default();
        state.listed([("n".to_string(), 1)], start);
        state.lost();
        assert_eq!(state.view(start, WINDOW), Cached::Unknown);
        // A re-watch from where the stream stopped: its first event or bookmark trusts it.
        state.applied("n".into(), 2, start);
        assert_eq!(names(state.view(start, WINDOW)), ["n"]);
        assert_eq!(state.stats.failures, 1);
    }

    #[test]
    fn a_refusal_stands_until_the_next_list_is_due_and_only_a_list_lifts_it() {
        let start = Instant::now();
        let until = start + Duration::from_secs(400);
        let mut state = CacheState::default();
        state.listed([("s".to_string(), 1)], start);
        state.refused(404, until);
        assert_eq!(state.view(start, WINDOW), Cached::Refused(404));
        assert_eq!(state.view(until, WINDOW), Cached::Refused(404));
        state.bookmark(start + Duration::from_secs(10));
        assert_eq!(
            state.view(until + Duration::from_secs(1), WINDOW),
            Cached::Unknown,
            "a refusal past its due list is not trusted, nor renewed by anything but a list"
        );
        state.listed(std::iter::empty(), until);
        assert_eq!(state.view(until, WINDOW), Cached::Current(BTreeMap::new()));
    }
}
