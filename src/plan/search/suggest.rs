//! Typed suggestions: one change to the request (or to the fleet) that the planner has checked
//! makes the goal fit, rendered to the `--flag value: why` lines `hwaccel plan` prints (the
//! controller rewrites the flags to spec fields). Every suggestion is found by re-running the
//! search with the change applied, so applying it and planning again fits (a property test,
//! `tests/plan_properties.rs`, holds the planner to that).
//!
//! A suggested context is never a trivial edit of the asked one: it is a multiple of
//! [`CONTEXT_STEP`] tokens at least one step shorter, or below two steps a power of two at
//! most half the asked context ([`context_steps`]).

use crate::plan::kv::BLOCK_TOKENS;
use crate::plan::report::Plan;

/// The granularity of a suggested context, in tokens.
pub const CONTEXT_STEP: u64 = 1024;

pub use crate::plan::report::{Change, Suggestion};

/// Records `suggestion` in both the typed list and the lines people read.
pub(super) fn push(plan: &mut Plan, suggestion: Suggestion) {
    plan.suggestions.push(suggestion.text.clone());
    plan.suggested_changes.push(suggestion);
}

/// The contexts worth suggesting instead of `asked`, shortest first: multiples of
/// [`CONTEXT_STEP`] at least one step below `asked`, then (below two steps, or when none of
/// those fits) powers of two from one KV block up to half of `asked`.
pub fn context_steps(asked: u64) -> Vec<u64> {
    let mut steps: Vec<u64> = std::iter::successors(Some(BLOCK_TOKENS), |p| p.checked_mul(2))
        .take_while(|&p| p < CONTEXT_STEP && p.saturating_mul(2) <= asked)
        .collect();
    let blocks = asked.saturating_sub(CONTEXT_STEP) / CONTEXT_STEP;
    steps.extend((1..=blocks).map(|k| k * CONTEXT_STEP));
    steps
}

/// Whether `suggested` is a meaningful step down from `asked` (see [`context_steps`]).
pub fn is_meaningful_context(asked: u64, suggested: u64) -> bool {
    if suggested >= CONTEXT_STEP {
        suggested.is_multiple_of(CONTEXT_STEP) && suggested + CONTEXT_STEP <= asked
    } else {
        suggested.is_power_of_two() && suggested >= BLOCK_TOKENS && suggested * 2 <= asked
    }
}

/// The largest of `steps` (ascending) for which `fits` holds, assuming it holds for a prefix.
pub(super) fn largest_fitting<T>(
    steps: &[u64],
    fits: impl Fn(u64) -> Option<T>,
) -> Option<(u64, T)> {
    let (mut low, mut high) = (0usize, steps.len());
    let mut found = None;
    // Invariant: every step before `low` fits (as far as tried), none from `high` on.
    while low < high {
        let mid = low + (high - low) / 2;
        match fits(steps[mid]) {
            Some(hit) => {
                found = Some((steps[mid], hit));
                low = mid + 1;
            }
            None => high = mid,
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_steps_are_round_and_at_least_a_step_below() {
        let steps = context_steps(131_072);
        assert_eq!(steps.last(), Some(&130_048));
        assert!(steps.iter().all(|&s| is_meaningful_context(131_072, s)));
        assert!(!steps.contains(&131_071));
        assert!(!is_meaningful_context(131_072, 131_071));
        assert!(!is_meaningful_context(130_049, 130_048));
        assert!(context_steps(130_049).iter().all(|&s| s <= 129_024));
        assert_eq!(context_steps(1500), vec![16, 32, 64, 128, 256, 512]);
        assert!(context_steps(16).is_empty());
        assert!(steps.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn largest_fitting_finds_the_edge() {
        let steps: Vec<u64> = (1..=100).collect();
        assert_eq!(
            largest_fitting(&steps, |s| (s <= 37).then_some(s)),
            Some((37, 37))
        );
        assert_eq!(largest_fitting(&steps, |_| None::<()>), None);
        assert_eq!(largest_fitting(&steps, Some).map(|f| f.0), Some(100));
    }

    #[test]
    fn lines_keep_the_flag_first() {
        let s = Suggestion::new(Change::Context { context: 65_536 }, "why");
        assert_eq!(s.text, "--context 65536: why");
        let s = Suggestion::new(
            Change::AddNodes {
                like: "n".into(),
                product: "H100".into(),
                devices: 8,
                count: 1,
                max_nodes: Some(2),
            },
            "fits",
        );
        assert_eq!(
            s.text,
            "add 1 more node(s) like n (8 x H100) with --max-nodes 2: fits"
        );
    }
}
