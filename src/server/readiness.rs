//! Readiness shared between a worker loop and `/readyz`, and the held answer that keeps a
//! normal start free of probe failures (issue 28).
//!
//! The kubelet's first readiness probe comes before the agent's first detection cycle (or the
//! controller's first contact with the apiserver) has finished. Answering it 503 at once puts
//! a `Readiness probe failed ... 503` Warning Event on every pod start and leaves the pod
//! unready until the next probe, up to `periodSeconds` later. So a probe that arrives while
//! the process is not ready waits, up to [`READY_HOLD`], and answers 200 the moment it
//! becomes ready. [`READY_HOLD`] stays below the chart's readiness `timeoutSeconds`, so the
//! kubelet reads a held answer instead of timing out (a test of the chart checks it).

use std::time::Duration;

use tokio::sync::watch;

/// Longest time `/readyz` holds a request while the process is not ready. Below the chart's
/// readiness probe `timeoutSeconds` (10 s); long enough for a first cycle whose vendor tools
/// run to their 5 s default deadline.
pub const READY_HOLD: Duration = Duration::from_secs(8);

/// Whether the process is ready, shared between the worker loop and the HTTP server.
#[derive(Debug)]
pub struct Readiness {
    state: watch::Sender<bool>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self {
            state: watch::Sender::new(false),
        }
    }
}

impl Readiness {
    /// Marks the process ready (or not), waking the requests held while it was not.
    pub fn set(&self, ready: bool) {
        self.state.send_if_modified(|current| {
            let changed = *current != ready;
            *current = ready;
            changed
        });
    }

    /// Whether the process is ready.
    pub fn is_ready(&self) -> bool {
        *self.state.borrow()
    }

    /// Whether the process is ready now or becomes ready within `bound`; returns as soon as it
    /// is.
    pub async fn ready_within(&self, bound: Duration) -> bool {
        let mut changes = self.state.subscribe();
        // `wait_for` looks at the current value first, so a `set` between `subscribe` and
        // here is not missed.
        matches!(
            tokio::time::timeout(bound, changes.wait_for(|ready| *ready)).await,
            Ok(Ok(_))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn a_held_request_answers_as_soon_as_the_process_is_ready() {
        let readiness = Arc::new(Readiness::default());
        let waiting = tokio::spawn({
            let readiness = readiness.clone();
            async move {
                let started = tokio::time::Instant::now();
                (readiness.ready_within(READY_HOLD).await, started.elapsed())
            }
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        readiness.set(true);
        let (ready, waited) = waiting.await.expect("the held request ends");
        assert!(ready);
        assert_eq!(waited, Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_process_never_ready_answers_not_ready_at_the_bound() {
        let readiness = Readiness::default();
        let started = tokio::time::Instant::now();
        assert!(!readiness.ready_within(READY_HOLD).await);
        assert_eq!(started.elapsed(), READY_HOLD);
        // Ready already: no wait at all.
        readiness.set(true);
        let started = tokio::time::Instant::now();
        assert!(readiness.ready_within(READY_HOLD).await);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
