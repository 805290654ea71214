//! The steps of a reconcile that can fail, named once: the `step` label of
//! `hwaccel_controller_reconcile_failures_total` and the reason of a failed reconcile's
//! Warning Event both come from [`Step::as_label`], so a metric, an Event and a log line
//! never disagree on which step failed.
//!
//! Validate and build are pure: a spec that cannot be planned becomes `Invalid` in the
//! status, not a failed reconcile, so they have no step here.

/// A step of a reconcile that talks to the apiserver, in the order a reconcile runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Reading the placement's identity and order from its metadata.
    Dereference,
    /// Writing or deleting the placement's ResourceClaims.
    Claims,
    /// Writing or deleting the placement's ResourceClaimTemplate.
    Template,
    /// Writing placement labels onto Nodes.
    Apply,
    /// Writing the status subresource.
    Status,
    /// Adding or removing the finalizer.
    Finalizer,
}

impl Step {
    /// Every step, in reconcile order (the metric's series are created up front).
    pub const ALL: [Self; 6] = [
        Self::Dereference,
        Self::Claims,
        Self::Template,
        Self::Apply,
        Self::Status,
        Self::Finalizer,
    ];

    /// The step's name: the metric label value, the log field.
    pub fn as_label(self) -> &'static str {
        match self {
            Self::Dereference => "dereference",
            Self::Claims => "claims",
            Self::Template => "template",
            Self::Apply => "apply",
            Self::Status => "status",
            Self::Finalizer => "finalizer",
        }
    }

    /// The reason of the Warning Event a failure of this step gets: `ApplyFailed`,
    /// `StatusFailed`... (Event reasons are UpperCamelCase).
    pub fn event_reason(self) -> String {
        let label = self.as_label();
        let mut chars = label.chars();
        let first = chars.next().map(|c| c.to_ascii_uppercase());
        first
            .into_iter()
            .chain(chars)
            .chain("Failed".chars())
            .collect()
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_label())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_step_has_its_own_label_and_event_reason() {
        let labels: BTreeSet<_> = Step::ALL.iter().map(|s| s.as_label()).collect();
        let reasons: BTreeSet<_> = Step::ALL.iter().map(|s| s.event_reason()).collect();
        assert_eq!(labels.len(), Step::ALL.len());
        assert_eq!(reasons.len(), Step::ALL.len());
        for step in Step::ALL {
            let label = step.as_label();
            assert!(
                label.chars().all(|c| c.is_ascii_lowercase()),
                "{label} is not a plain label value"
            );
        }
    }

    #[test]
    fn event_reasons_are_upper_camel_case() {
        assert_eq!(Step::Apply.event_reason(), "ApplyFailed");
        assert_eq!(Step::Dereference.event_reason(), "DereferenceFailed");
        assert_eq!(Step::Status.to_string(), "status");
    }
}
