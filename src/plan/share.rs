//! Fractions of a device as plain data: a published partition, and a share of a shareable
//! device (KEP-5075, consumable capacity): the device's
//! `memory` capacity, its request policy, and how the scheduler rounds a request to it. The
//! planner sizes a fraction of a device with this ([`super::search`]'s fraction step,
//! docs/decisions/0011); [`crate::dra::share`] reads it from a ResourceSlice.
//!
//! The rules are the API's (`resource.k8s.io/v1` `CapacityRequestPolicy`,
//! `CapacityRequestPolicyRange`, `CapacityRequirements`): a request is rounded up to the
//! smallest valid value at or above it, or within a range to `min + n * step`; above the
//! largest valid value or `max` it cannot be allocated; a request that names no amount takes
//! the policy's `default`, or the whole capacity without a policy. A policy comes from a
//! driver, so [`SharePolicy::checked`] refuses what the apiserver would (ascending values, a
//! range inside the capacity, a positive step, a default the policy allows), never trusting it.

use serde::{Deserialize, Serialize};

use super::units::Bytes;

/// A shareable memory capacity: its total and how requests consume it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SharePolicy {
    /// The capacity's total, bytes.
    pub capacity: u64,
    /// What a request that names no amount consumes.
    pub default: u64,
    /// Which amounts a request may consume.
    pub rule: ShareRule,
}

/// Which amounts a request may consume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ShareRule {
    /// Any amount up to what is left of the capacity.
    Any,
    /// One of these, ascending.
    Values(Vec<u64>),
    /// From `min` to `max` (the capacity when unset), in steps of `step` from `min` when set.
    Range {
        /// The least a request consumes.
        min: u64,
        /// The most a request may consume.
        max: Option<u64>,
        /// The step between valid amounts, counted from `min`.
        step: Option<u64>,
    },
}

/// A shareable device as the planner sees it: its policy and what claims already consume of
/// it (zero where nothing says; the controller sums its claims' `consumedCapacity`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Shareable {
    /// The memory capacity's policy.
    pub policy: SharePolicy,
    /// Bytes of it that allocations already consume.
    #[serde(default)]
    pub consumed: u64,
}

/// A published partition of a device (an NVIDIA MIG device) that a replica may take instead
/// of the whole device: the planner's id of the partition entry (its DRA name is found by
/// it), its profile and its memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Partition {
    /// The planner's id of the partition entry, on the same node.
    pub id: String,
    /// The profile as the driver names it (`3g.40gb`).
    pub profile: String,
    /// Its memory.
    pub memory: Bytes,
}

impl Shareable {
    /// What is left for another share.
    pub fn headroom(&self) -> u64 {
        self.policy.capacity.saturating_sub(self.consumed)
    }

    /// What a share holding `amount` consumes, when one fits in what is left; the error says
    /// why not.
    pub fn fit(&self, amount: u64) -> Result<u64, String> {
        let rounded = self.policy.round(amount)?;
        if rounded > self.headroom() {
            return Err(format!(
                "a share of {} is more than the {} left",
                Bytes(rounded),
                Bytes(self.headroom())
            ));
        }
        Ok(rounded)
    }
}

impl SharePolicy {
    /// A policy as a driver published it, checked as the apiserver would; `default` is
    /// `None` when the driver gave none. The error says what is wrong with it.
    pub fn checked(capacity: u64, default: Option<u64>, rule: ShareRule) -> Result<Self, String> {
        match &rule {
            ShareRule::Any => {}
            ShareRule::Values(values) => {
                if values.is_empty() {
                    return Err("validValues lists no value".to_string());
                }
                if !values.windows(2).all(|pair| pair[0] < pair[1]) {
                    return Err("validValues are not strictly ascending".to_string());
                }
            }
            ShareRule::Range { min, max, step } => {
                if *step == Some(0) {
                    return Err("validRange step is 0".to_string());
                }
                if max.is_some_and(|max| max < *min) {
                    return Err("validRange max is below its min".to_string());
                }
            }
        }
        let largest = match &rule {
            ShareRule::Any => capacity,
            ShareRule::Values(values) => values.last().copied().unwrap_or(0),
            ShareRule::Range { min, max, .. } => max.unwrap_or(capacity).max(*min),
        };
        if largest > capacity {
            return Err(format!(
                "the policy allows {largest}, more than the capacity {capacity}"
            ));
        }
        let policy = Self {
            capacity,
            default: default.unwrap_or(capacity),
            rule,
        };
        // A default the policy itself would not give is a policy the apiserver refuses.
        match (default, &policy.rule) {
            (None, ShareRule::Values(_) | ShareRule::Range { .. }) => {
                Err("requestPolicy has valid amounts but no default".to_string())
            }
            (Some(default), _) if policy.round(default) != Ok(default) => Err(format!(
                "requestPolicy default {default} is not a valid amount"
            )),
            _ => Ok(policy),
        }
    }

    /// What a request for `amount` consumes, as the scheduler rounds it; the error says why
    /// no share of this device can hold it.
    pub fn round(&self, amount: u64) -> Result<u64, String> {
        let rounded = match &self.rule {
            ShareRule::Any => amount,
            ShareRule::Values(values) => {
                *values.iter().find(|v| **v >= amount).ok_or_else(|| {
                    format!(
                        "{amount} is above the largest valid value {}",
                        values.last().copied().unwrap_or(0)
                    )
                })?
            }
            ShareRule::Range { min, max, step } => {
                let at_least = amount.max(*min);
                let stepped = match step {
                    Some(step) => (at_least - min)
                        .div_ceil(*step)
                        .checked_mul(*step)
                        .and_then(|steps| steps.checked_add(*min))
                        .ok_or_else(|| format!("{amount} overflows the policy's steps"))?,
                    None => at_least,
                };
                if let Some(max) = max
                    && stepped > *max
                {
                    return Err(format!("{amount} rounds to {stepped}, above the max {max}"));
                }
                stepped
            }
        };
        if rounded > self.capacity {
            return Err(format!(
                "{amount} is more than the capacity {}",
                self.capacity
            ));
        }
        Ok(rounded)
    }

    /// The policy in a few words, for a plan's reasons (`8 GiB to 80 GiB in steps of 8 GiB`).
    pub fn describe(&self) -> String {
        match &self.rule {
            ShareRule::Any => format!("any amount up to {}", Bytes(self.capacity)),
            ShareRule::Values(values) => {
                let shown: Vec<String> = values.iter().map(|v| Bytes(*v).to_string()).collect();
                format!("one of {}", shown.join(", "))
            }
            ShareRule::Range { min, max, step } => {
                let mut text =
                    format!("{} to {}", Bytes(*min), Bytes(max.unwrap_or(self.capacity)));
                if let Some(step) = step {
                    text.push_str(&format!(" in steps of {}", Bytes(*step)));
                }
                text
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    fn range(min: u64, max: Option<u64>, step: Option<u64>) -> ShareRule {
        ShareRule::Range { min, max, step }
    }

    /// The GPU profile of kubernetes-sigs/dra-example-driver PR 236: `memory: 80Gi`, a range
    /// of 8Gi to 80Gi in 8Gi steps; a 16Gi request consumes 16Gi (its claim's
    /// `consumedCapacity`), anything between two steps the next step.
    #[test]
    fn a_range_with_a_step_rounds_up_to_the_next_step_from_min() {
        let policy = SharePolicy::checked(
            80 * GI,
            Some(80 * GI),
            range(8 * GI, Some(80 * GI), Some(8 * GI)),
        )
        .unwrap();
        assert_eq!(policy.round(16 * GI), Ok(16 * GI));
        assert_eq!(policy.round(16 * GI + 1), Ok(24 * GI));
        assert_eq!(policy.round(1), Ok(8 * GI), "below min rounds up to min");
        assert_eq!(policy.round(80 * GI), Ok(80 * GI));
        assert!(
            policy
                .round(80 * GI + 1)
                .unwrap_err()
                .contains("above the max")
        );
        assert_eq!(policy.describe(), "8.0 GiB to 80.0 GiB in steps of 8.0 GiB");
    }

    #[test]
    fn a_range_without_a_step_takes_the_request_as_it_is_within_its_bounds() {
        let policy =
            SharePolicy::checked(80 * GI, Some(10 * GI), range(4 * GI, None, None)).unwrap();
        assert_eq!(policy.round(5 * GI + 7), Ok(5 * GI + 7));
        assert_eq!(policy.round(GI), Ok(4 * GI));
        // No max: the capacity bounds it.
        assert!(policy.round(81 * GI).unwrap_err().contains("capacity"));
    }

    #[test]
    fn valid_values_take_the_smallest_one_at_or_above_the_request() {
        let values = ShareRule::Values(vec![10 * GI, 20 * GI, 40 * GI, 80 * GI]);
        let policy = SharePolicy::checked(80 * GI, Some(20 * GI), values).unwrap();
        assert_eq!(policy.round(GI), Ok(10 * GI));
        assert_eq!(policy.round(20 * GI), Ok(20 * GI));
        assert_eq!(policy.round(21 * GI), Ok(40 * GI));
        assert!(
            policy
                .round(81 * GI)
                .unwrap_err()
                .contains("largest valid value")
        );
    }

    #[test]
    fn without_a_policy_any_amount_up_to_the_capacity_and_the_default_is_all_of_it() {
        let policy = SharePolicy::checked(80 * GI, None, ShareRule::Any).unwrap();
        assert_eq!(policy.default, 80 * GI);
        assert_eq!(policy.round(3), Ok(3));
        assert!(policy.round(80 * GI + 1).is_err());
    }

    #[test]
    fn a_share_fits_only_in_what_other_shares_left() {
        let policy = SharePolicy::checked(
            80 * GI,
            Some(80 * GI),
            range(8 * GI, Some(80 * GI), Some(8 * GI)),
        )
        .unwrap();
        let device = Shareable {
            policy,
            consumed: 64 * GI,
        };
        assert_eq!(device.headroom(), 16 * GI);
        assert_eq!(device.fit(9 * GI), Ok(16 * GI));
        assert!(
            device
                .fit(17 * GI)
                .unwrap_err()
                .contains("more than the 16.0 GiB left")
        );
        let full = Shareable {
            consumed: u64::MAX,
            ..device
        };
        assert_eq!(full.headroom(), 0);
        assert!(full.fit(1).is_err());
    }

    /// A driver's policy is input: each thing the apiserver refuses is refused here, with
    /// the reason, and nothing in it can overflow the rounding.
    #[test]
    fn policies_the_api_would_refuse_are_refused_with_the_reason() {
        let cases = [
            (Some(10 * GI), ShareRule::Values(vec![]), "lists no value"),
            (
                Some(20 * GI),
                ShareRule::Values(vec![20 * GI, 10 * GI]),
                "not strictly ascending",
            ),
            (
                Some(30 * GI),
                ShareRule::Values(vec![10 * GI, 20 * GI]),
                "default",
            ),
            (
                Some(10 * GI),
                ShareRule::Values(vec![10 * GI, 100 * GI]),
                "more than the capacity",
            ),
            (
                Some(8 * GI),
                range(8 * GI, Some(80 * GI), Some(0)),
                "step is 0",
            ),
            (
                Some(8 * GI),
                range(16 * GI, Some(8 * GI), None),
                "max is below its min",
            ),
            (
                Some(9 * GI),
                range(8 * GI, Some(80 * GI), Some(8 * GI)),
                "default",
            ),
            (
                Some(8 * GI),
                range(8 * GI, Some(81 * GI), None),
                "more than the capacity",
            ),
            (None, range(8 * GI, None, None), "no default"),
        ];
        for (default, rule, why) in cases {
            let err = SharePolicy::checked(80 * GI, default, rule).unwrap_err();
            assert!(err.contains(why), "{err} (wanted {why})");
        }
        let huge = SharePolicy {
            capacity: u64::MAX,
            default: 1,
            rule: range(2, None, Some(u64::MAX / 2)),
        };
        assert!(huge.round(u64::MAX).unwrap_err().contains("overflows"));
    }
}
