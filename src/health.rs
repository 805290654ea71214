//! Liveness: whether the process's long-running loops are still making progress, for
//! `/healthz`.
//!
//! A process that answers HTTP is not necessarily alive: an agent stuck on a blocking read, a
//! hung API call or a worker task that died used to report "ok" for ever. Each loop registers
//! here with a bound, and `/healthz` fails, naming the loop, when one is overdue:
//!
//! - a [`Heartbeat`] belongs to a loop that must complete an iteration at least every `bound`
//!   (the agent's detect-and-publish loop). Registering counts as the first beat. Dropping the
//!   heartbeat (its task returned, panicked or was aborted) marks the loop ended, which is
//!   unhealthy too: a dead worker is not a live process.
//! - [`Work`] tracks work that runs on demand (the controller's reconciles): idle is healthy,
//!   but one piece of work still running after `bound` is stuck.
//!
//! The bounds are derived from the loops' own intervals and timeouts ([`agent_loop_bound`],
//! [`reconcile_bound`]) so that a slow but working loop is never reported, and a stuck one is
//! reported within a few minutes (plus the kubelet's probe period × failure threshold).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The registry of loops; cheap to clone (all clones share it).
#[derive(Debug, Clone, Default)]
pub struct Liveness {
    entries: Arc<Mutex<Vec<Entry>>>,
}

#[derive(Debug)]
struct Entry {
    name: String,
    bound: Duration,
    state: State,
}

#[derive(Debug)]
enum State {
    Beating {
        last: Instant,
    },
    Ended,
    Working {
        next: u64,
        running: BTreeMap<u64, Instant>,
    },
}

/// Why the process is not live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// A loop has not completed an iteration within its bound.
    Overdue {
        /// The loop's name.
        name: String,
        /// Time since its last completed iteration.
        since: Duration,
        /// Its bound.
        bound: Duration,
    },
    /// A loop's task has ended (returned, panicked or was cancelled).
    Ended {
        /// The loop's name.
        name: String,
    },
    /// A piece of work has been running longer than its bound.
    Stuck {
        /// The work's name.
        name: String,
        /// How long the oldest piece has been running.
        running: Duration,
        /// Its bound.
        bound: Duration,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Overdue { name, since, bound } => write!(
                f,
                "{name}: no completed iteration for {}s (bound {}s)",
                since.as_secs(),
                bound.as_secs()
            ),
            Self::Ended { name } => write!(f, "{name}: the task has ended"),
            Self::Stuck {
                name,
                running,
                bound,
            } => write!(
                f,
                "{name}: running for {}s (bound {}s)",
                running.as_secs(),
                bound.as_secs()
            ),
        }
    }
}

impl Liveness {
    /// Registers a loop that must complete an iteration every `bound`; registering counts as
    /// its first beat.
    pub fn heartbeat(&self, name: &str, bound: Duration) -> Heartbeat {
        let index = self.push(
            name,
            bound,
            State::Beating {
                last: Instant::now(),
            },
        );
        Heartbeat {
            liveness: self.clone(),
            index,
        }
    }

    /// Registers on-demand work, each piece of which must finish within `bound`.
    pub fn work(&self, name: &str, bound: Duration) -> Work {
        let index = self.push(
            name,
            bound,
            State::Working {
                next: 0,
                running: BTreeMap::new(),
            },
        );
        Work {
            liveness: self.clone(),
            index,
        }
    }

    /// What is wrong now; empty when every loop is live.
    pub fn problems(&self) -> Vec<Problem> {
        let now = Instant::now();
        let entries = self.lock();
        entries
            .iter()
            .filter_map(|entry| match &entry.state {
                State::Beating { last } => {
                    let since = now.saturating_duration_since(*last);
                    (since > entry.bound).then(|| Problem::Overdue {
                        name: entry.name.clone(),
                        since,
                        bound: entry.bound,
                    })
                }
                State::Ended => Some(Problem::Ended {
                    name: entry.name.clone(),
                }),
                State::Working { running, .. } => {
                    let oldest = running.values().min()?;
                    let running = now.saturating_duration_since(*oldest);
                    (running > entry.bound).then(|| Problem::Stuck {
                        name: entry.name.clone(),
                        running,
                        bound: entry.bound,
                    })
                }
            })
            .collect()
    }

    fn push(&self, name: &str, bound: Duration, state: State) -> usize {
        let mut entries = self.lock();
        entries.push(Entry {
            name: name.to_string(),
            bound,
            state,
        });
        entries.len() - 1
    }

    fn update(&self, index: usize, change: impl FnOnce(&mut State)) {
        if let Some(entry) = self.lock().get_mut(index) {
            change(&mut entry.state);
        }
    }

    /// The data stays consistent whatever a panicking holder was doing (each update is one
    /// assignment), so a poisoned lock is used as is.
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A loop's proof of life; dropping it marks the loop ended.
#[derive(Debug)]
pub struct Heartbeat {
    liveness: Liveness,
    index: usize,
}

impl Default for Heartbeat {
    /// A heartbeat nobody watches (a registry of its own), for callers without `/healthz`.
    fn default() -> Self {
        Liveness::default().heartbeat("unwatched", Duration::MAX)
    }
}

impl Heartbeat {
    /// The loop completed an iteration.
    pub fn beat(&self) {
        self.liveness.update(self.index, |state| {
            *state = State::Beating {
                last: Instant::now(),
            };
        });
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.liveness
            .update(self.index, |state| *state = State::Ended);
    }
}

/// On-demand work whose pieces must each finish within a bound; clones share it.
#[derive(Debug, Clone)]
pub struct Work {
    liveness: Liveness,
    index: usize,
}

impl Default for Work {
    /// Work nobody watches (a registry of its own), for callers without `/healthz`.
    fn default() -> Self {
        Liveness::default().work("unwatched", Duration::MAX)
    }
}

impl Work {
    /// A piece of work starts now; it is finished when the guard is dropped.
    pub fn start(&self) -> WorkGuard {
        let mut id = 0;
        self.liveness.update(self.index, |state| {
            if let State::Working { next, running } = state {
                id = *next;
                *next += 1;
                running.insert(id, Instant::now());
            }
        });
        WorkGuard {
            work: self.clone(),
            id,
        }
    }

    /// Runs `future` as one piece of this work, counted from now (not from its first poll).
    /// Inside it, [`progress`] restarts the count of every piece of this work.
    pub fn track<F: Future>(&self, future: F) -> impl Future<Output = F::Output> + use<F> {
        let running = self.start();
        let work = self.clone();
        async move {
            let output = CURRENT_WORK.scope(work, future).await;
            drop(running);
            output
        }
    }

    /// Counts every running piece from now: the work as a whole is moving.
    fn touch(&self) {
        let now = Instant::now();
        self.liveness.update(self.index, |state| {
            if let State::Working { running, .. } = state {
                running.values_mut().for_each(|started| *started = now);
            }
        });
    }
}

tokio::task_local! {
    /// The work the current task's future runs as, set by [`Work::track`].
    static CURRENT_WORK: Work;
}

/// Says that the work the current task runs as (see [`Work::track`]) made progress: one of
/// many steps finished (an API call answered). Every running piece of that work is counted
/// from now, so a long piece that keeps moving (a reconcile writing hundreds of claims, each
/// call bounded by the API timeout, and the reconciles queued behind it) is never reported
/// stuck, while one that stops moving still is, one bound after its last step. Outside
/// tracked work it does nothing.
pub fn progress() {
    let _ = CURRENT_WORK.try_with(Work::touch);
}

/// One piece of [`Work`] in progress.
#[derive(Debug)]
pub struct WorkGuard {
    work: Work,
    id: u64,
}

impl Drop for WorkGuard {
    fn drop(&mut self) {
        let id = self.id;
        self.work.liveness.update(self.work.index, |state| {
            if let State::Working { running, .. } = state {
                running.remove(&id);
            }
        });
    }
}

/// Largest number of API calls in one agent cycle: the seed read, up to four for the Node's
/// labels (read, apply, and once more after a conflict), the Node's uid, the inventory and its
/// status.
pub const AGENT_API_CALLS_PER_CYCLE: u32 = 8;

/// How many tool timeouts one detection may take: the slowest backend (NVIDIA without NVML)
/// runs `nvidia-smi` up to five times in a row, and backends share a few threads, so one
/// thread can run two tool-heavy backends back to back; file reads take milliseconds.
pub const DETECTION_TOOL_ROUNDS: u32 = 12;

/// Bound for the agent's loop: the longest wait between cycles (the interval, or the longest
/// backoff after an error), plus the longest detection, plus the longest publish (every API
/// call running into the API timeout). 6 minutes on the defaults (60 s, 60 s, 5 s, 30 s).
pub fn agent_loop_bound(
    interval: Duration,
    max_backoff: Duration,
    tool_timeout: Duration,
    api_timeout: Duration,
) -> Duration {
    interval
        .max(max_backoff)
        .saturating_add(tool_timeout.saturating_mul(DETECTION_TOOL_ROUNDS))
        .saturating_add(api_timeout.saturating_mul(AGENT_API_CALLS_PER_CYCLE))
}

/// Bound for one reconcile, counted from when it is scheduled: it may wait for the ledger lock
/// behind the other reconciles in flight, then makes a handful of API calls (status, finalizer,
/// Events, labels of the placement's nodes) each bounded by the API timeout, and one plan
/// (milliseconds). Ten API timeouts (5 minutes on the default 30 s) covers that with room.
/// A reconcile that writes many claims (two calls each, up to 1,024 replicas) would not fit:
/// each claim call answered counts as [`progress`], so the bound holds between steps.
pub fn reconcile_bound(api_timeout: Duration) -> Duration {
    api_timeout.saturating_mul(10)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn a_loop_that_beats_is_live_and_one_that_stops_is_overdue_by_name() {
        let liveness = Liveness::default();
        let agent = liveness.heartbeat("agent loop", BOUND);
        assert_eq!(liveness.problems(), []);
        tokio::time::advance(Duration::from_secs(8)).await;
        agent.beat();
        tokio::time::advance(Duration::from_secs(8)).await;
        assert_eq!(liveness.problems(), [], "beaten 8 s ago, bound 10 s");
        tokio::time::advance(Duration::from_secs(3)).await;
        let problems = liveness.problems();
        assert_eq!(problems.len(), 1);
        assert_eq!(
            problems[0].to_string(),
            "agent loop: no completed iteration for 11s (bound 10s)"
        );
        agent.beat();
        assert_eq!(liveness.problems(), [], "a beat makes it live again");
    }

    #[tokio::test]
    async fn a_dead_worker_is_reported_even_when_it_panicked() {
        let liveness = Liveness::default();
        let heartbeat = liveness.heartbeat("agent loop", BOUND);
        let task = tokio::spawn(async move {
            heartbeat.beat();
            panic!("worker dies");
        });
        assert!(task.await.is_err(), "the task panicked");
        assert_eq!(
            liveness.problems(),
            [Problem::Ended {
                name: "agent loop".into()
            }]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn idle_work_is_live_and_a_piece_running_past_its_bound_is_stuck() {
        let liveness = Liveness::default();
        let reconciles = liveness.work("reconcile", BOUND);
        tokio::time::advance(BOUND * 100).await;
        assert_eq!(liveness.problems(), [], "no work is not stuck work");

        let quick = reconciles.start();
        let slow = reconciles.start();
        tokio::time::advance(Duration::from_secs(5)).await;
        drop(quick);
        let again = reconciles.start();
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(
            liveness.problems(),
            [Problem::Stuck {
                name: "reconcile".into(),
                running: Duration::from_secs(11),
                bound: BOUND
            }],
            "the oldest piece counts"
        );
        drop(slow);
        assert_eq!(liveness.problems(), [], "the newer piece is 6 s old");
        drop(again);
        tokio::time::advance(BOUND * 2).await;
        assert_eq!(liveness.problems(), []);
    }

    #[tokio::test(start_paused = true)]
    async fn tracked_futures_count_as_running_until_they_finish() {
        let liveness = Liveness::default();
        let work = liveness.work("reconcile", BOUND);
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let tracked = tokio::spawn(work.clone().track(async move {
            let _ = released.await;
        }));
        tokio::time::advance(BOUND + Duration::from_secs(1)).await;
        assert_eq!(liveness.problems().len(), 1);
        let _ = release.send(());
        tracked.await.expect("tracked future finishes");
        assert_eq!(liveness.problems(), []);
    }

    #[tokio::test(start_paused = true)]
    async fn tracked_work_that_keeps_making_progress_is_never_stuck_and_stops_being_so() {
        // A reconcile writing many claims: each step takes most of the bound, the whole takes
        // many bounds. Before, it was reported stuck one bound after it started.
        let liveness = Liveness::default();
        let work = liveness.work("reconcile", BOUND);
        let (steps_tx, mut steps) = tokio::sync::mpsc::channel::<()>(1);
        let tracked = tokio::spawn(work.clone().track(async move {
            while steps.recv().await.is_some() {
                progress();
            }
        }));
        // A second reconcile queued behind it (waiting for the lock) counts as moving too.
        let queued = work.start();
        for _ in 0..20 {
            tokio::time::advance(BOUND - Duration::from_secs(1)).await;
            steps_tx.send(()).await.expect("the step is taken");
            tokio::task::yield_now().await;
            assert_eq!(liveness.problems(), []);
        }
        // No more steps: stuck again one bound after the last.
        tokio::time::advance(BOUND + Duration::from_secs(1)).await;
        assert_eq!(liveness.problems().len(), 1);
        drop(steps_tx);
        tracked.await.expect("tracked future finishes");
        drop(queued);
        assert_eq!(liveness.problems(), []);
        // Outside tracked work, progress does nothing (and does not panic).
        progress();
    }

    #[test]
    fn bounds_on_the_defaults() {
        let s = Duration::from_secs;
        assert_eq!(agent_loop_bound(s(60), s(60), s(5), s(30)), s(360));
        assert_eq!(
            agent_loop_bound(s(1), s(60), s(5), s(30)),
            s(360),
            "the longest backoff counts when it exceeds the interval"
        );
        assert_eq!(reconcile_bound(s(30)), s(300));
        assert_eq!(
            agent_loop_bound(Duration::MAX, s(1), s(1), s(1)),
            Duration::MAX,
            "saturates"
        );
    }
}
