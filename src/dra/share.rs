//! A share of a shareable device (KEP-5075, consumable capacity): the device's `memory`
//! capacity with its `requestPolicy`, and how the scheduler rounds a request to it. The
//! planner sizes a fraction of a device with this (docs/decisions/0011); until that is built,
//! a shareable device stays unplannable (`slices::SHARED`) and nothing calls in here but tests.
//!
//! The rules are the API's (`resource.k8s.io/v1` `CapacityRequestPolicy`,
//! `CapacityRequestPolicyRange`, `CapacityRequirements`): a request is rounded up to the
//! smallest valid value at or above it, or within a range to `min + n * step`; above the
//! largest valid value or `max` it cannot be allocated; a request that names no amount takes
//! the policy's `default`, or the whole capacity without a policy. A policy comes from a
//! driver, so it is checked here as the apiserver would (at most 10 ascending values, a range
//! inside the capacity, a positive step, a default the policy allows) and refused with the
//! reason, never trusted.

use k8s_openapi::api::resource::v1::DeviceCapacity;

use crate::api::quantity::parse_whole;

/// The most valid values a policy may list (the API's bound).
pub const MAX_VALID_VALUES: usize = 10;

/// A shareable capacity: its total and how requests consume it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharePolicy {
    /// The capacity's total (bytes, for `memory`).
    pub capacity: u64,
    /// What a request that names no amount consumes.
    pub default: u64,
    /// Which amounts a request may consume.
    pub rule: ShareRule,
}

/// Which amounts a request may consume.
#[derive(Debug, Clone, PartialEq, Eq)]
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

impl SharePolicy {
    /// The policy of one published capacity, checked; the error says what is wrong with it.
    pub fn of(capacity: &DeviceCapacity) -> Result<Self, String> {
        let amount = |what: &str, q| {
            parse_whole(q).ok_or_else(|| format!("{what} {:?} is not a whole amount", q.0))
        };
        let total = amount("capacity", &capacity.value)?;
        let Some(policy) = &capacity.request_policy else {
            return Ok(Self {
                capacity: total,
                default: total,
                rule: ShareRule::Any,
            });
        };
        if policy.valid_values.is_some() && policy.valid_range.is_some() {
            return Err("requestPolicy sets both validValues and validRange".to_string());
        }
        let default = policy
            .default
            .as_ref()
            .map(|q| amount("default", q))
            .transpose()?;
        let rule = match (&policy.valid_values, &policy.valid_range) {
            (Some(values), _) => {
                if values.is_empty() || values.len() > MAX_VALID_VALUES {
                    return Err(format!(
                        "validValues lists {} values (1 to {MAX_VALID_VALUES})",
                        values.len()
                    ));
                }
                let values = values
                    .iter()
                    .map(|q| amount("valid value", q))
                    .collect::<Result<Vec<u64>, String>>()?;
                if !values.windows(2).all(|pair| pair[0] < pair[1]) {
                    return Err("validValues are not strictly ascending".to_string());
                }
                ShareRule::Values(values)
            }
            (None, Some(range)) => {
                let min = amount("min", &range.min)?;
                let max = range.max.as_ref().map(|q| amount("max", q)).transpose()?;
                let step = range.step.as_ref().map(|q| amount("step", q)).transpose()?;
                if step == Some(0) {
                    return Err("validRange step is 0".to_string());
                }
                if max.is_some_and(|max| max < min) {
                    return Err("validRange max is below its min".to_string());
                }
                ShareRule::Range { min, max, step }
            }
            (None, None) => ShareRule::Any,
        };
        let largest = match &rule {
            ShareRule::Any => total,
            ShareRule::Values(values) => values.last().copied().unwrap_or(0),
            ShareRule::Range { min, max, .. } => max.unwrap_or(total).max(*min),
        };
        if largest > total {
            return Err(format!(
                "the policy allows {largest}, more than the capacity {total}"
            ));
        }
        let checked = Self {
            capacity: total,
            default: default.unwrap_or(total),
            rule,
        };
        // A default the policy itself would not give is a policy the apiserver refuses.
        match (default, &checked.rule) {
            (None, ShareRule::Values(_) | ShareRule::Range { .. }) => {
                Err("requestPolicy has valid amounts but no default".to_string())
            }
            (Some(default), _) if checked.round(default) != Ok(default) => Err(format!(
                "requestPolicy default {default} is not a valid amount"
            )),
            _ => Ok(checked),
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
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{CapacityRequestPolicy, CapacityRequestPolicyRange};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    const GI: u64 = 1 << 30;

    fn q(text: &str) -> Quantity {
        Quantity(text.to_string())
    }

    fn capacity(value: &str, policy: Option<CapacityRequestPolicy>) -> DeviceCapacity {
        DeviceCapacity {
            value: q(value),
            request_policy: policy,
        }
    }

    fn range(default: &str, min: &str, max: Option<&str>, step: Option<&str>) -> DeviceCapacity {
        capacity(
            "80Gi",
            Some(CapacityRequestPolicy {
                default: Some(q(default)),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: q(min),
                    max: max.map(q),
                    step: step.map(q),
                }),
                valid_values: None,
            }),
        )
    }

    fn values(default: &str, list: &[&str]) -> DeviceCapacity {
        capacity(
            "80Gi",
            Some(CapacityRequestPolicy {
                default: Some(q(default)),
                valid_range: None,
                valid_values: Some(list.iter().map(|v| q(v)).collect()),
            }),
        )
    }

    /// The GPU profile of kubernetes-sigs/dra-example-driver PR 236: `memory: 80Gi`, a range
    /// of 8Gi to 80Gi in 8Gi steps; a 16Gi request consumes 16Gi (its claim's
    /// `consumedCapacity`), anything between two steps the next step.
    #[test]
    fn a_range_with_a_step_rounds_up_to_the_next_step_from_min() {
        let policy = SharePolicy::of(&range("80Gi", "8Gi", Some("80Gi"), Some("8Gi"))).unwrap();
        assert_eq!(policy.default, 80 * GI);
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
    }

    #[test]
    fn a_range_without_a_step_takes_the_request_as_it_is_within_its_bounds() {
        let policy = SharePolicy::of(&range("10Gi", "4Gi", None, None)).unwrap();
        assert_eq!(policy.round(5 * GI + 7), Ok(5 * GI + 7));
        assert_eq!(policy.round(GI), Ok(4 * GI));
        // No max: the capacity bounds it.
        assert!(policy.round(81 * GI).unwrap_err().contains("capacity"));
    }

    #[test]
    fn valid_values_take_the_smallest_one_at_or_above_the_request() {
        let policy = SharePolicy::of(&values("20Gi", &["10Gi", "20Gi", "40Gi", "80Gi"])).unwrap();
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
        let policy = SharePolicy::of(&capacity("80Gi", None)).unwrap();
        assert_eq!(policy.default, 80 * GI);
        assert_eq!(policy.round(3), Ok(3));
        assert!(policy.round(80 * GI + 1).is_err());
    }

    /// A driver's policy is input: each thing the apiserver refuses is refused here, with
    /// the reason, and nothing in it can overflow the rounding.
    #[test]
    fn policies_the_api_would_refuse_are_refused_with_the_reason() {
        let cases = [
            (values("10Gi", &[]), "validValues lists 0"),
            (
                values(
                    "1",
                    &["1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11"],
                ),
                "validValues lists 11",
            ),
            (values("20Gi", &["20Gi", "10Gi"]), "not strictly ascending"),
            (values("30Gi", &["10Gi", "20Gi"]), "default"),
            (values("10Gi", &["10Gi", "100Gi"]), "more than the capacity"),
            (range("8Gi", "8Gi", Some("80Gi"), Some("0")), "step is 0"),
            (
                range("8Gi", "16Gi", Some("8Gi"), None),
                "max is below its min",
            ),
            (range("9Gi", "8Gi", Some("80Gi"), Some("8Gi")), "default"),
            (
                range("8Gi", "8Gi", Some("81Gi"), None),
                "more than the capacity",
            ),
            (range("8Gi", "one", None, None), "not a whole amount"),
            (capacity("-1", None), "not a whole amount"),
        ];
        for (capacity, why) in cases {
            let err = SharePolicy::of(&capacity).unwrap_err();
            assert!(err.contains(why), "{err} (wanted {why})");
        }
        let both = capacity(
            "80Gi",
            Some(CapacityRequestPolicy {
                default: Some(q("8Gi")),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: q("8Gi"),
                    max: None,
                    step: None,
                }),
                valid_values: Some(vec![q("8Gi")]),
            }),
        );
        assert!(SharePolicy::of(&both).unwrap_err().contains("both"));
        let huge = SharePolicy {
            capacity: u64::MAX,
            default: 1,
            rule: ShareRule::Range {
                min: 2,
                max: None,
                step: Some(u64::MAX / 2),
            },
        };
        assert!(huge.round(u64::MAX).unwrap_err().contains("overflows"));
    }
}
