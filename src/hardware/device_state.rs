//! The one definition of a device's state, which every view of the fleet calls: the agent's
//! inventory summary (`kubectl get accinv`), the controller's `status.freeDevices`, fleet
//! gauges and health taints, `hwaccel fleet`, and the planner's free set.
//!
//! A device has three facets, each with its reason:
//! * **health**: `healthy`, `degraded`, `unhealthy` or `unknown`, as the backend judged it;
//! * **presence**: present, or missing (expected but not seen; counted per node, since a
//!   vanished device cannot say what it was);
//! * **use**: held by one of our placements, held by another claim (a ResourceClaim the
//!   scheduler or a tenant allocated, or a consumed DRA counter), free, or unusable (nobody can
//!   plan on it). *Stranded* is a refinement of free that depends on a model: free devices no
//!   replica of that model can use (`capacity::Stranded`), computed from this free set.
//!
//! **The plannability rule** ([`plannable_health`]), the only place it is written:
//! * `healthy`: plannable;
//! * `degraded` (usable with errors worth attention: corrected-ECC storms, retired pages):
//!   plannable, and shown as degraded in every view (a DEGRADED count, listed under "sick or
//!   missing" with its reasons). It is not tainted: a taint would keep out the very work the
//!   planner counts it free for; a person decides when to drain it;
//! * `unknown` (no health reading: a TPU, a Neuron core, a tool that cannot report it):
//!   plannable. Absence of evidence is not sickness, and a detector that cannot read health
//!   must not empty a fleet; counted as `unknown`, not `healthy`;
//! * `unhealthy`: not plannable, never free, tainted when health taints are on.
//!
//! Besides health, the planner cannot use a device split into MIG instances or one without a
//! memory size ([`unplannable_reason`]). Nor one its DRA driver publishes in a way no placement
//! can hold: shared (`allowMultipleAllocations`: claims take shares of it, so it is neither
//! free nor taken), published only in parts, tainted, or needing counters its pool can never
//! give. The merge of an inventory with its node's published devices (`dra::merge`) says
//! which; every view that reads slices passes that verdict in
//! ([`DeviceFacts::with_published_verdict`]), so such a device is never counted free. A
//! driver's informational taint (`effect: None`) makes a device degraded, still free
//! ([`DeviceFacts::with_published_notice`]). Pure: no
//! Kubernetes types; each caller converts its own input (an inventory, a detection report)
//! into [`DeviceFacts`].

use serde::Serialize;

use crate::hardware::{Device, HealthStatus, Vendor};

/// Whether a device of this health may be planned on: everything but `unhealthy`.
pub fn plannable_health(health: HealthStatus) -> bool {
    health != HealthStatus::Unhealthy
}

/// Whether a device of this health needs a person: `degraded` or `unhealthy` (listed under
/// "sick or missing"). `unknown` is no evidence of sickness.
pub fn needs_attention(health: HealthStatus) -> bool {
    matches!(health, HealthStatus::Degraded | HealthStatus::Unhealthy)
}

/// Whether health taints name a device of this health: exactly the ones the rule makes
/// unplannable, so a taint never keeps out work the planner counts a device free for.
pub fn tainted(health: HealthStatus) -> bool {
    !plannable_health(health)
}

/// The health a text states (an inventory's `health` attribute, a DRA driver's health
/// attribute), in any letter case; absent or unrecognised text is `unknown`. The one parser
/// of health text: the inventory, the DRA merge and the agent's metrics all read through it.
pub fn parse_health(text: Option<&str>) -> HealthStatus {
    let Some(text) = text else {
        return HealthStatus::Unknown;
    };
    [
        HealthStatus::Healthy,
        HealthStatus::Degraded,
        HealthStatus::Unhealthy,
    ]
    .into_iter()
    .find(|health| text.eq_ignore_ascii_case(health_name(*health)))
    .unwrap_or(HealthStatus::Unknown)
}

/// The lowercase name of a health (`degraded`).
pub fn health_name(health: HealthStatus) -> &'static str {
    match health {
        HealthStatus::Unknown => "unknown",
        HealthStatus::Healthy => "healthy",
        HealthStatus::Degraded => "degraded",
        HealthStatus::Unhealthy => "unhealthy",
    }
}

/// Why the planner cannot use a device, or `None` when it can: the health rule first, then
/// a GPU split into MIG instances, then a memory size that is unknown.
pub fn unplannable_reason(
    health: HealthStatus,
    split_into_mig: bool,
    memory_known: bool,
) -> Option<&'static str> {
    if !plannable_health(health) {
        Some("unhealthy")
    } else if split_into_mig {
        Some("split into MIG instances")
    } else if !memory_known {
        Some("memory size unknown")
    } else {
        None
    }
}

/// Why the planner cannot use `device`, or `None` when it can (the rule of
/// [`unplannable_reason`] read off a detected device). The planner's node conversion calls
/// this, so its free set and every count agree.
pub fn unplannable(device: &Device) -> Option<&'static str> {
    let split = device
        .partitions
        .iter()
        .any(|p| p.kind == "mig" && p.id.is_some());
    let memory_known = device.memory_bytes.is_some_and(|bytes| bytes > 0);
    unplannable_reason(device.health.status, split, memory_known)
}

/// What a view knows of one accelerator (never the host CPU), as its caller converts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    /// The device's name in the view (the inventory device name, or the planner id).
    pub name: String,
    /// Product name (`NVIDIA H100 80GB HBM3`).
    pub product: String,
    /// Maker.
    pub vendor: Vendor,
    /// Health as detected.
    pub health: HealthStatus,
    /// Why health is what it is (`1 retired page(s)`, the backend's reasons).
    pub health_reasons: Vec<String>,
    /// Why the planner cannot use it, from [`unplannable_reason`]; `None` when it can.
    pub unplannable: Option<String>,
}

impl DeviceFacts {
    /// The facts of a detected accelerator named `name` in its view. Its health reasons are
    /// the backend's, or, when it gave none, the error counters that explain a verdict.
    pub fn from_device(device: &Device, name: &str) -> Self {
        let health = &device.health;
        let mut reasons = health.reasons.clone();
        if reasons.is_empty() {
            if let Some(n) = health.ecc_uncorrected.filter(|n| *n > 0) {
                reasons.push(format!("{n} uncorrected ECC error(s)"));
            }
            if let Some(n) = health.retired_pages.filter(|n| *n > 0) {
                reasons.push(format!("{n} retired page(s)"));
            }
        }
        Self {
            name: name.to_string(),
            product: device.model.clone(),
            vendor: device.vendor,
            health: health.status,
            health_reasons: reasons,
            unplannable: unplannable(device).map(str::to_string),
        }
    }
}

impl DeviceFacts {
    /// These facts with the verdict of the device's DRA driver, as the planner's merged node
    /// took it (`None`: nothing published against it): the device's own reason comes first,
    /// else the published one makes it not plannable, as the planner leaves it out.
    pub fn with_published_verdict(mut self, verdict: Option<&str>) -> Self {
        if self.unplannable.is_none() {
            self.unplannable = verdict.map(str::to_string);
        }
        self
    }
}

impl DeviceFacts {
    /// These facts with an informational notice its DRA driver published (a taint of effect
    /// `None`, such as NVIDIA's XID events): a healthy or unread device becomes degraded,
    /// still plannable, and the notice is one of its health reasons.
    pub fn with_published_notice(mut self, notice: Option<&str>) -> Self {
        if let Some(notice) = notice {
            if matches!(self.health, HealthStatus::Healthy | HealthStatus::Unknown) {
                self.health = HealthStatus::Degraded;
            }
            self.health_reasons.push(notice.to_string());
        }
        self
    }
}

/// Who holds a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Holder {
    /// One of our ModelPlacements.
    Placement,
    /// Another allocated ResourceClaim, or a consumed DRA counter.
    Claim,
}

/// What a device is used for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Use {
    /// Held, by a placement or a claim (whatever its health: held is held).
    Held {
        /// By whom.
        by: Holder,
    },
    /// Plannable and held by nobody: what the planner and every "free" count plan on.
    Free,
    /// Held by nobody and not plannable.
    Unusable {
        /// Why (`unhealthy`, `split into MIG instances`, `memory size unknown`).
        reason: String,
    },
}

/// One device's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceState {
    /// Its name in the view.
    pub name: String,
    /// Product name.
    pub product: String,
    /// Health.
    pub health: HealthStatus,
    /// Why health is what it is.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub health_reasons: Vec<String>,
    /// What it is used for.
    #[serde(rename = "use")]
    pub usage: Use,
}

impl DeviceState {
    /// The state of `facts` held by `held` (`None`: nobody holds it).
    pub fn of(facts: &DeviceFacts, held: Option<Holder>) -> Self {
        let usage = match (held, &facts.unplannable) {
            (Some(by), _) => Use::Held { by },
            (None, None) => Use::Free,
            (None, Some(reason)) => Use::Unusable {
                reason: reason.clone(),
            },
        };
        Self {
            name: facts.name.clone(),
            product: facts.product.clone(),
            health: facts.health,
            health_reasons: facts.health_reasons.clone(),
            usage,
        }
    }

    /// True when the device is free: plannable and held by nobody.
    pub fn is_free(&self) -> bool {
        self.usage == Use::Free
    }

    /// True when a person should look at it: its health needs attention, or nobody can plan
    /// on it.
    pub fn needs_attention(&self) -> bool {
        needs_attention(self.health) || matches!(self.usage, Use::Unusable { .. })
    }

    /// One phrase for a listing: `degraded (1 retired page(s))`, `unusable: split into MIG
    /// instances`.
    pub fn describe(&self) -> String {
        let mut text = health_name(self.health).to_string();
        if !self.health_reasons.is_empty() {
            text.push_str(&format!(" ({})", self.health_reasons.join(", ")));
        }
        match &self.usage {
            Use::Unusable { reason } if reason != "unhealthy" => {
                text.push_str(&format!(", not plannable: {reason}"));
            }
            Use::Held { by } => text.push_str(match by {
                Holder::Placement => ", held by a placement",
                Holder::Claim => ", held by a claim",
            }),
            _ => {}
        }
        text
    }
}

/// Device counts of a node, a product or the fleet. `devices = healthy + degraded +
/// unhealthy + unknown = reserved + free + unusable`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// Accelerators present.
    pub devices: u32,
    /// Of which healthy.
    pub healthy: u32,
    /// Of which degraded (plannable, worth attention).
    pub degraded: u32,
    /// Of which unhealthy (not plannable).
    pub unhealthy: u32,
    /// Of which without a health reading (plannable).
    pub unknown: u32,
    /// Expected but not present.
    pub missing: u32,
    /// Held by a placement or a claim.
    pub reserved: u32,
    /// Plannable and held by nobody.
    pub free: u32,
    /// Held by nobody and not plannable.
    pub unusable: u32,
}

impl Counts {
    /// Counts one device in.
    pub fn count(&mut self, state: &DeviceState) {
        self.devices += 1;
        match state.health {
            HealthStatus::Healthy => self.healthy += 1,
            HealthStatus::Degraded => self.degraded += 1,
            HealthStatus::Unhealthy => self.unhealthy += 1,
            HealthStatus::Unknown => self.unknown += 1,
        }
        match state.usage {
            Use::Held { .. } => self.reserved += 1,
            Use::Free => self.free += 1,
            Use::Unusable { .. } => self.unusable += 1,
        }
    }

    /// The counts of `states`.
    pub fn of<'a>(states: impl IntoIterator<Item = &'a DeviceState>) -> Self {
        let mut counts = Self::default();
        for state in states {
            counts.count(state);
        }
        counts
    }

    /// Adds `other` in.
    pub fn add(&mut self, other: &Counts) {
        self.devices = self.devices.saturating_add(other.devices);
        self.healthy = self.healthy.saturating_add(other.healthy);
        self.degraded = self.degraded.saturating_add(other.degraded);
        self.unhealthy = self.unhealthy.saturating_add(other.unhealthy);
        self.unknown = self.unknown.saturating_add(other.unknown);
        self.missing = self.missing.saturating_add(other.missing);
        self.reserved = self.reserved.saturating_add(other.reserved);
        self.free = self.free.saturating_add(other.free);
        self.unusable = self.unusable.saturating_add(other.unusable);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(health: HealthStatus, unplannable: Option<&str>) -> DeviceFacts {
        DeviceFacts {
            name: "gpu-0".into(),
            product: "H100".into(),
            vendor: Vendor::Nvidia,
            health,
            health_reasons: Vec::new(),
            unplannable: unplannable.map(str::to_string),
        }
    }

    #[test]
    fn health_text_is_read_in_any_case_and_anything_else_is_unknown() {
        for (text, health) in [
            (Some("healthy"), HealthStatus::Healthy),
            (Some("Healthy"), HealthStatus::Healthy),
            (Some("DEGRADED"), HealthStatus::Degraded),
            (Some("unhealthy"), HealthStatus::Unhealthy),
            (Some("Unhealthy"), HealthStatus::Unhealthy),
            (Some("unknown"), HealthStatus::Unknown),
            (Some("sick"), HealthStatus::Unknown),
            (Some(""), HealthStatus::Unknown),
            (None, HealthStatus::Unknown),
        ] {
            assert_eq!(parse_health(text), health, "{text:?}");
        }
        // Every name the rule writes reads back as itself.
        for health in [
            HealthStatus::Unknown,
            HealthStatus::Healthy,
            HealthStatus::Degraded,
            HealthStatus::Unhealthy,
        ] {
            assert_eq!(parse_health(Some(health_name(health))), health);
        }
    }

    #[test]
    fn only_unhealthy_is_unplannable_for_health_and_only_it_is_tainted() {
        for (health, plannable, attention) in [
            (HealthStatus::Healthy, true, false),
            (HealthStatus::Degraded, true, true),
            (HealthStatus::Unknown, true, false),
            (HealthStatus::Unhealthy, false, true),
        ] {
            assert_eq!(plannable_health(health), plannable, "{health:?}");
            assert_eq!(tainted(health), !plannable, "{health:?}");
            assert_eq!(needs_attention(health), attention, "{health:?}");
            assert_eq!(parse_health(Some(health_name(health))), health);
        }
        assert_eq!(parse_health(Some("on fire")), HealthStatus::Unknown);
        assert_eq!(parse_health(None), HealthStatus::Unknown);
    }

    #[test]
    fn unplannable_reasons_come_health_first() {
        assert_eq!(
            unplannable_reason(HealthStatus::Unhealthy, true, false),
            Some("unhealthy")
        );
        assert_eq!(
            unplannable_reason(HealthStatus::Degraded, true, true),
            Some("split into MIG instances")
        );
        assert_eq!(
            unplannable_reason(HealthStatus::Unknown, false, false),
            Some("memory size unknown")
        );
        assert_eq!(
            unplannable_reason(HealthStatus::Degraded, false, true),
            None
        );
    }

    #[test]
    fn a_device_its_driver_publishes_as_shared_is_neither_free_nor_held() {
        let shared = "shared (allowMultipleAllocations: ...)";
        let facts = facts(HealthStatus::Healthy, None).with_published_verdict(Some(shared));
        let state = DeviceState::of(&facts, None);
        assert_eq!(
            state.usage,
            Use::Unusable {
                reason: shared.to_string()
            }
        );
        assert!(!state.is_free() && state.needs_attention());
        // The device's own reason stays the one shown; no verdict changes nothing.
        let sick = self::facts(HealthStatus::Unhealthy, Some("unhealthy"))
            .with_published_verdict(Some(shared));
        assert_eq!(sick.unplannable.as_deref(), Some("unhealthy"));
        let free = self::facts(HealthStatus::Healthy, None).with_published_verdict(None);
        assert!(DeviceState::of(&free, None).is_free());
        // Held is held: a claim with a share of it holds it.
        let held = DeviceState::of(&facts, Some(Holder::Claim));
        assert_eq!(held.usage, Use::Held { by: Holder::Claim });
    }

    #[test]
    fn use_follows_holder_then_plannability_and_counts_add_up() {
        let degraded = DeviceState::of(&facts(HealthStatus::Degraded, None), None);
        assert!(degraded.is_free() && degraded.needs_attention());
        let held_sick = DeviceState::of(
            &facts(HealthStatus::Unhealthy, Some("unhealthy")),
            Some(Holder::Placement),
        );
        assert_eq!(
            held_sick.usage,
            Use::Held {
                by: Holder::Placement
            }
        );
        let mig = DeviceState::of(
            &facts(HealthStatus::Healthy, Some("split into MIG instances")),
            None,
        );
        assert!(mig.needs_attention());
        assert!(mig.describe().contains("not plannable: split into MIG"));
        let unknown = DeviceState::of(&facts(HealthStatus::Unknown, None), Some(Holder::Claim));
        let counts = Counts::of([&degraded, &held_sick, &mig, &unknown]);
        assert_eq!(
            counts,
            Counts {
                devices: 4,
                healthy: 1,
                degraded: 1,
                unhealthy: 1,
                unknown: 1,
                missing: 0,
                reserved: 2,
                free: 1,
                unusable: 1,
            }
        );
        assert_eq!(
            counts.devices,
            counts.healthy + counts.degraded + counts.unhealthy + counts.unknown
        );
        assert_eq!(
            counts.devices,
            counts.reserved + counts.free + counts.unusable
        );
    }
}
