//! What planning a placement concluded, as plain data: the status it leads to, and whether it
//! is a plan, a "not now" or a "never". Shared because the ledger remembers refusals
//! ([`super::ledger::Ledger::known_unfit`]); the placement loop makes them.

use crate::api::placement::ModelPlacementStatus;

/// What planning concluded.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// It fits: the status describes the plan and its assignments.
    Planned(ModelPlacementStatus),
    /// Valid, but it does not fit on the free devices now.
    Unschedulable(ModelPlacementStatus),
    /// The spec cannot be planned whatever the hardware.
    Invalid(ModelPlacementStatus),
}

impl Outcome {
    /// The status part of the outcome (without conditions).
    pub fn status(&self) -> &ModelPlacementStatus {
        match self {
            Self::Planned(s) | Self::Unschedulable(s) | Self::Invalid(s) => s,
        }
    }
}
