//! Typed suggestions: one change to the request (or to the fleet) that the planner has checked
//! makes the goal fit, rendered to the `--flag value: why` lines `hwaccel plan` prints (the
//! controller rewrites the flags to spec fields). Every suggestion is found by re-running the
//! search with the change applied, so applying it and planning again fits (a property test,
//! `tests/plan_properties.rs`, holds the planner to that).
//!
//! A suggested context is never a trivial edit of the asked one: it is a multiple of
//! [`CONTEXT_STEP`] tokens at least one step shorter, or below two steps a power of two at
//! most half the asked context ([`context_steps`]).

use serde::Serialize;

use crate::hardware::Precision;
use crate::plan::kv::{BLOCK_TOKENS, KvDtype};
use crate::plan::report::Plan;

/// The granularity of a suggested context, in tokens.
pub const CONTEXT_STEP: u64 = 1024;

/// What a suggestion changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum Change {
    /// Serve shorter requests (`--context`).
    Context {
        /// Tokens per request.
        context: u64,
    },
    /// Hold fewer requests at once (`--concurrency`).
    Concurrency {
        /// Concurrent full-context requests.
        concurrency: u64,
    },
    /// Pin another weight precision (`--precision`).
    Precision {
        /// The precision.
        precision: Precision,
    },
    /// Another KV-cache type (`--kv-dtype`).
    KvDtype {
        /// The KV-cache type.
        kv_dtype: KvDtype,
    },
    /// Allow more nodes (`--max-nodes`).
    MaxNodes {
        /// The node cap.
        max_nodes: u32,
    },
    /// Place another number of replicas (`--replicas`).
    Replicas {
        /// Replicas.
        replicas: u32,
    },
    /// Add nodes to the fleet: `count` copies of node `like` holding its `devices` devices of
    /// `product` (its other devices are not needed), all free; with `max_nodes`, raise the
    /// node cap to it as well (rendered `with --max-nodes M`, which the controller rewrites to
    /// `spec.constraints.maxNodes=M`).
    AddNodes {
        /// The node to copy.
        like: String,
        /// The device product the copies carry.
        product: String,
        /// Devices of `product` on each copy.
        devices: u32,
        /// Copies to add.
        count: u32,
        /// The node cap the enlarged fleet needs, when the asked one is too low.
        max_nodes: Option<u32>,
    },
}

/// A change that makes the goal fit, and the line that explains it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Suggestion {
    /// The change.
    #[serde(flatten)]
    pub change: Change,
    /// What users read (also in the plan's `suggestions`).
    pub text: String,
}

impl Suggestion {
    /// A suggestion whose line is the change's flag followed by `why`.
    pub fn new(change: Change, why: impl std::fmt::Display) -> Self {
        let text = match &change {
            Change::Context { context } => format!("--context {context}: {why}"),
            Change::Concurrency { concurrency } => format!("--concurrency {concurrency}: {why}"),
            Change::Precision { precision } => format!("--precision {precision}: {why}"),
            Change::KvDtype { kv_dtype } => {
                format!("--kv-dtype {}: {why}", kv_dtype.resolved_name())
            }
            Change::MaxNodes { max_nodes } => format!("--max-nodes {max_nodes}: {why}"),
            Change::Replicas { replicas } => format!("--replicas {replicas}: {why}"),
            Change::AddNodes {
                like,
                product,
                devices,
                count,
                max_nodes,
            } => format!(
                "add {count} more node(s) like {like} ({devices} x {product}){}: {why}",
                max_nodes.map_or(String::new(), |m| format!(" with --max-nodes {m}"))
            ),
        };
        Self { change, text }
    }
}

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
