//! A shareable device's `memory` capacity, read from its ResourceSlice entry (KEP-5075,
//! consumable capacity): the quantities parsed and the list bounded here, the policy's rules
//! checked and applied by [`crate::plan::share`], so the planner and this reader agree on
//! one rounding. A driver's policy is input: anything the apiserver would refuse makes the
//! device unusable with the reason (`slices`), never a share that overflows.

use k8s_openapi::api::resource::v1::DeviceCapacity;

use crate::api::quantity::parse_whole;
use crate::plan::share::{SharePolicy, ShareRule};

/// The most valid values a policy may list (the API's bound).
pub const MAX_VALID_VALUES: usize = 10;

/// The policy of one published capacity, checked; the error says what is wrong with it.
pub fn share_policy(capacity: &DeviceCapacity) -> Result<SharePolicy, String> {
    let amount = |what: &str, q| {
        parse_whole(q).ok_or_else(|| format!("{what} {:?} is not a whole amount", q.0))
    };
    let total = amount("capacity", &capacity.value)?;
    let Some(policy) = &capacity.request_policy else {
        return SharePolicy::checked(total, None, ShareRule::Any);
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
            if values.len() > MAX_VALID_VALUES {
                return Err(format!(
                    "validValues lists {} values (at most {MAX_VALID_VALUES})",
                    values.len()
                ));
            }
            ShareRule::Values(
                values
                    .iter()
                    .map(|q| amount("valid value", q))
                    .collect::<Result<Vec<u64>, String>>()?,
            )
        }
        (None, Some(range)) => ShareRule::Range {
            min: amount("min", &range.min)?,
            max: range.max.as_ref().map(|q| amount("max", q)).transpose()?,
            step: range.step.as_ref().map(|q| amount("step", q)).transpose()?,
        },
        (None, None) => ShareRule::Any,
    };
    SharePolicy::checked(total, default, rule)
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

    /// The GPU profile of kubernetes-sigs/dra-example-driver PR 236, as its slice writes it:
    /// `memory: 80Gi` with a range of 8Gi to 80Gi in 8Gi steps.
    #[test]
    fn the_example_drivers_profile_reads_as_a_stepped_range() {
        let policy = share_policy(&range("80Gi", "8Gi", Some("80Gi"), Some("8Gi"))).unwrap();
        assert_eq!(policy.capacity, 80 * GI);
        assert_eq!(policy.default, 80 * GI);
        assert_eq!(
            policy.rule,
            ShareRule::Range {
                min: 8 * GI,
                max: Some(80 * GI),
                step: Some(8 * GI)
            }
        );
        assert_eq!(policy.round(16 * GI + 1), Ok(24 * GI));
    }

    #[test]
    fn values_and_no_policy_read_as_written() {
        let policy = share_policy(&values("20Gi", &["10Gi", "20Gi", "40Gi", "80Gi"])).unwrap();
        assert_eq!(policy.round(21 * GI), Ok(40 * GI));
        let open = share_policy(&capacity("80Gi", None)).unwrap();
        assert_eq!((open.default, open.rule), (80 * GI, ShareRule::Any));
    }

    /// What only the reader can see (a list longer than the API allows, a quantity that is not
    /// one, both rules at once) is refused here; the rules' own checks come through as well.
    #[test]
    fn policies_the_api_would_refuse_are_refused_with_the_reason() {
        let eleven = ["1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11"];
        let cases = [
            (values("1", &eleven), "validValues lists 11"),
            (values("20Gi", &["20Gi", "10Gi"]), "not strictly ascending"),
            (range("8Gi", "8Gi", Some("80Gi"), Some("0")), "step is 0"),
            (range("9Gi", "8Gi", Some("80Gi"), Some("8Gi")), "default"),
            (range("8Gi", "one", None, None), "not a whole amount"),
            (capacity("-1", None), "not a whole amount"),
        ];
        for (capacity, why) in cases {
            let err = share_policy(&capacity).unwrap_err();
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
        assert!(share_policy(&both).unwrap_err().contains("both"));
    }
}
