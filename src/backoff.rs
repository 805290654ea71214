//! The one exponential backoff every retry loop uses: the agent's publish loop, the
//! controller's per-placement error requeue and the uninstall cleanup's requests.
//!
//! Each wait is drawn at random from the upper half of its exponential step ("equal jitter"):
//! `[step / 2, step]`, where `step` is `first · 2^(retry - 1)` capped at `max`. A fleet of
//! agents that all lost the apiserver at the same moment then comes back spread over half of
//! each step instead of in one burst, and the cap stays a cap: no wait is ever longer than
//! the loop's `max`, and none shorter than half its first step.

use std::time::Duration;

/// Doubling waits from `first` up to `max`, each jittered into the upper half of its step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The step of the first retry.
    pub first: Duration,
    /// The longest step; every later retry waits at most this long.
    pub max: Duration,
}

impl Backoff {
    /// A backoff whose first step is `first` and whose steps never exceed `max`.
    #[must_use]
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self { first, max }
    }

    /// The step of retry number `retry` (1 for the first): `first · 2^(retry - 1)`, at most
    /// `max`. Retry 0 is treated as the first. Saturates instead of overflowing.
    #[must_use]
    pub fn step(&self, retry: u32) -> Duration {
        // 31 doublings of even a nanosecond exceed two seconds, and of a second 68 years, so
        // the clamp changes no real step; it only keeps the shift inside u32.
        let doublings = retry.saturating_sub(1).min(31);
        self.first.saturating_mul(1u32 << doublings).min(self.max)
    }

    /// The wait before retry number `retry`: uniformly random in `[step / 2, step]`.
    #[must_use]
    pub fn wait(&self, retry: u32) -> Duration {
        equal_jitter(self.step(retry), fastrand::f64())
    }
}

/// `step / 2 + fraction · step / 2`, for `fraction` in `[0, 1]` (clamped): the upper half of
/// `step`, picked by `fraction`. Kept apart from the random source so tests can pin it.
#[must_use]
pub fn equal_jitter(step: Duration, fraction: f64) -> Duration {
    let half = step / 2;
    let spread = (step - half).mul_f64(fraction.clamp(0.0, 1.0));
    half + spread
}

/// A retry counter over a [`Backoff`]: [`Self::next_wait`] after each failure,
/// [`Self::reset`] after a success.
#[derive(Debug, Clone)]
pub struct Retries {
    backoff: Backoff,
    failures: u32,
}

impl Retries {
    /// No failure yet.
    #[must_use]
    pub const fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            failures: 0,
        }
    }

    /// Counts one more failure and returns the jittered wait before the next try.
    pub fn next_wait(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.backoff.wait(self.failures)
    }

    /// Forgets the failures: the next failure waits the first step again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Failures counted since the last reset.
    #[must_use]
    pub const fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn steps_double_from_the_first_and_stop_at_the_max() {
        let backoff = Backoff::new(SECOND, Duration::from_secs(60));
        let steps: Vec<u64> = (1..=9).map(|retry| backoff.step(retry).as_secs()).collect();
        assert_eq!(steps, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff.step(0), SECOND, "retry 0 is the first");
        assert_eq!(
            backoff.step(u32::MAX),
            Duration::from_secs(60),
            "no overflow"
        );
    }

    #[test]
    fn a_huge_first_step_saturates_at_the_max() {
        let backoff = Backoff::new(Duration::MAX, Duration::from_secs(300));
        assert_eq!(backoff.step(40), Duration::from_secs(300));
    }

    #[test]
    fn jitter_spans_exactly_the_upper_half_of_the_step() {
        let step = Duration::from_secs(8);
        assert_eq!(equal_jitter(step, 0.0), Duration::from_secs(4));
        assert_eq!(equal_jitter(step, 1.0), step);
        assert_eq!(equal_jitter(step, 0.5), Duration::from_secs(6));
        assert_eq!(equal_jitter(step, -3.0), Duration::from_secs(4), "clamped");
        assert_eq!(equal_jitter(step, 7.0), step, "clamped");
        assert_eq!(equal_jitter(Duration::ZERO, 0.7), Duration::ZERO);
    }

    #[test]
    fn every_wait_stays_within_the_loop_bounds_and_the_waits_are_spread() {
        let backoff = Backoff::new(SECOND, Duration::from_secs(60));
        for retry in 1..=12 {
            let step = backoff.step(retry);
            let waits: Vec<Duration> = (0..200).map(|_| backoff.wait(retry)).collect();
            assert!(
                waits.iter().all(|wait| *wait >= step / 2 && *wait <= step),
                "retry {retry}: a wait outside [{:?}, {step:?}]",
                step / 2
            );
            // 200 draws from a continuous range: all equal would mean no jitter at all.
            let first = waits[0];
            assert!(
                waits.iter().any(|wait| *wait != first),
                "retry {retry}: no spread"
            );
        }
    }

    #[test]
    fn retries_grow_until_reset_then_start_over() {
        let mut retries = Retries::new(Backoff::new(SECOND, Duration::from_secs(4)));
        let waits: Vec<Duration> = (0..4).map(|_| retries.next_wait()).collect();
        assert_eq!(retries.failures(), 4);
        let ceilings = [1, 2, 4, 4].map(Duration::from_secs);
        for (wait, ceiling) in waits.iter().zip(ceilings) {
            assert!(
                *wait <= ceiling && *wait >= ceiling / 2,
                "{wait:?} vs {ceiling:?}"
            );
        }
        retries.reset();
        assert_eq!(retries.failures(), 0);
        assert!(retries.next_wait() <= SECOND);
    }
}
