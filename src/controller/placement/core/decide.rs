//! Deciding for one placement, without any I/O: keep its plan while the devices are still
//! there, otherwise plan it against the fleet minus what the ledger says others hold —
//! giving older waiting placements their turn first — and record the result in the ledger.
//!
//! The driver (`controller/placement/reconcile.rs`) calls [`decide`] on a
//! [`Ledger::snapshot`], without the lock, and commits the changed snapshot with
//! [`Ledger::commit`], which refuses it when another reconcile's commit took any of its
//! devices meanwhile: no device is handed out twice. A plan that is simply kept ([`keeps`])
//! changes nothing and needs no snapshot.

use std::collections::BTreeSet;

use crate::api::placement::{AllocationMode, ModelPlacementSpec, ModelPlacementStatus};
use crate::plan::Reservations;

use super::claims::ClaimsReport;
use super::evaluate::evaluate;
use super::outcome::Outcome;
use crate::controller::core::fleet_view::FleetView;
use crate::controller::core::ledger::{Holding, Ledger, PlacementKey, Precedence, Tried};

/// A placement as [`decide`] sees it.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    /// Order among placements.
    pub precedence: Precedence,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.generation`.
    pub generation: i64,
    /// The spec.
    pub spec: &'a ModelPlacementSpec,
}

/// What [`decide`] concluded for one placement.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The outcome for the placement reconciled.
    pub outcome: Outcome,
    /// True when an existing plan was kept as it was.
    pub kept: bool,
    /// Why an earlier plan was dropped, when its devices are gone.
    pub replanned: Option<String>,
    /// Nodes whose placement labels change.
    pub changed_nodes: BTreeSet<String>,
    /// Older placements that got devices on this turn.
    pub planned_others: Vec<PlacementKey>,
    /// True when devices were released (waiting placements may fit now).
    pub freed: bool,
    /// Assigned devices still present but no longer usable (`node/device (why)`): the plan
    /// is kept — moving a running workload is worse — and marked Degraded.
    pub degraded: Vec<String>,
    /// Held devices that a driver (in a claim's `status.devices`) or a kubelet (in a pod's
    /// `allocatedResourcesStatus`) reports unhealthy, one line each (filled in after the
    /// claims are written): the plan is kept and marked Degraded.
    pub device_health: Vec<String>,
    /// Whether the pods that run the plan run it (filled in after the claims are written,
    /// for a placement already Planned); `None` leaves the `Conformant` condition out.
    pub conformance: Option<super::conformance::Conformance>,
    /// Planned Nodes that could not be labelled because the Node object is gone (filled in
    /// after the labels are written).
    pub unlabeled: Vec<String>,
    /// Why writing the placement labels failed, if it did.
    pub label_error: Option<String>,
    /// The ResourceClaims holding the plan, when it is held by claims (filled in after the
    /// claims are written).
    pub claims: Option<ClaimsReport>,
    /// Why writing the ResourceClaimTemplate failed, if it did (`allocation: claimTemplate`).
    pub template_error: Option<String>,
    /// True when older placements still wait to be tried, so `me` was not decided on this
    /// turn (the outcome means nothing) and must be reconciled again.
    pub deferred: bool,
    /// True when the outcome is a refusal remembered from an earlier try ([`Ledger::known_unfit`]):
    /// nothing was planned on this turn.
    pub remembered: bool,
}

/// Older placements one decision tries before its own: bounds the time one reconcile plans
/// (a few milliseconds each on a 1,000-node fleet) when many placements arrive at once.
pub const OLDER_PER_TURN: usize = 8;

/// True when [`decide`] would keep `me`'s plan as it is, changing nothing: the same object
/// (uid and generation) holds a plan whose devices the fleet still has.
pub fn keeps(ledger: &Ledger, me: &Candidate<'_>, fleet: &FleetView) -> bool {
    me.spec.allocation != Some(AllocationMode::ClaimTemplate)
        && ledger.get(&me.precedence.key).is_some_and(|holding| {
            holding.uid == me.uid
                && holding.generation == me.generation
                && fleet.holds(&holding.assignments()).is_ok()
        })
}

/// Decides for `me`, updating the ledger. `older_pending` are placements that hold nothing,
/// in any order; those older than `me` are tried first, in precedence order, skipping those
/// known not to fit. When more than [`OLDER_PER_TURN`] need trying, the decision tries that
/// many and is deferred: `me` comes only after every older placement had its try.
pub fn decide(
    ledger: &mut Ledger,
    me: &Candidate<'_>,
    older_pending: &[Candidate<'_>],
    fleet: &FleetView,
) -> Decision {
    let key = &me.precedence.key;
    let mut decision = Decision {
        outcome: Outcome::Invalid(ModelPlacementStatus::default()),
        kept: false,
        replanned: None,
        changed_nodes: BTreeSet::new(),
        planned_others: Vec::new(),
        freed: false,
        degraded: Vec::new(),
        device_health: Vec::new(),
        conformance: None,
        unlabeled: Vec::new(),
        label_error: None,
        claims: None,
        template_error: None,
        deferred: false,
        remembered: false,
    };
    if me.spec.allocation == Some(AllocationMode::ClaimTemplate) {
        decide_template(ledger, me, fleet, &mut decision);
        return decision;
    }
    if let Some(holding) = ledger.get(key) {
        let same_object = holding.uid == me.uid && holding.generation == me.generation;
        match fleet.holds(&holding.assignments()) {
            Ok(()) if same_object => {
                decision.degraded = fleet.degraded(&holding.assignments());
                decision.outcome = Outcome::Planned(holding.status.clone());
                decision.kept = true;
                return decision;
            }
            Ok(()) => {}
            Err(why) => decision.replanned = Some(why),
        }
        if let Some(old) = ledger.remove(key) {
            decision.changed_nodes.extend(old.nodes());
            decision.freed = true;
        }
    }
    let mut older: Vec<&Candidate<'_>> = older_pending
        .iter()
        .filter(|c| c.precedence < me.precedence && ledger.get(&c.precedence.key).is_none())
        .filter(|c| {
            ledger
                .known_unfit(&c.precedence.key, &tried(c, fleet))
                .is_none()
        })
        .collect();
    older.sort_by(|a, b| a.precedence.cmp(&b.precedence));
    decision.deferred = older.len() > OLDER_PER_TURN;
    for other in older.into_iter().take(OLDER_PER_TURN) {
        if let Some(nodes) = try_to_plan(ledger, other, fleet).1 {
            decision.changed_nodes.extend(nodes);
            decision.planned_others.push(other.precedence.key.clone());
        }
    }
    if decision.deferred {
        return decision;
    }
    if let Some(refusal) = ledger.known_unfit(key, &tried(me, fleet)) {
        decision.outcome = refusal.clone();
        decision.remembered = true;
        return decision;
    }
    let (outcome, nodes) = try_to_plan(ledger, me, fleet);
    decision.changed_nodes.extend(nodes.into_iter().flatten());
    decision.outcome = outcome;
    decision
}

/// A claim-template placement holds nothing and waits for no one: the scheduler picks its
/// devices. It is planned afresh on every reconcile (the alternatives follow the fleet) and
/// entered in the ledger with no devices, so it does not count as waiting; a plan it held
/// before (another mode) is released.
fn decide_template(
    ledger: &mut Ledger,
    me: &Candidate<'_>,
    fleet: &FleetView,
    decision: &mut Decision,
) {
    let key = &me.precedence.key;
    if ledger.get(key).is_some_and(|h| !h.assignments().is_empty())
        && let Some(old) = ledger.remove(key)
    {
        decision.changed_nodes.extend(old.nodes());
        decision.freed = true;
    }
    let outcome = evaluate(
        me.spec,
        &key.namespace,
        &key.name,
        fleet,
        &Reservations::none(),
    );
    match &outcome {
        Outcome::Planned(status) => {
            decision.kept = ledger.get(key).is_some_and(|h| {
                h.uid == me.uid && h.generation == me.generation && h.status == *status
            });
            // No devices, so no conflict is possible.
            let _ = ledger.insert(key.clone(), holding_for(me, status.clone()));
        }
        _ => {
            ledger.remove(key);
        }
    }
    decision.outcome = outcome;
}

/// Plans `candidate` against the fleet minus what others hold. A plan is entered in the
/// ledger (its Nodes are returned); a refusal is remembered as unfit for this fleet and the
/// ledger's current releases.
fn try_to_plan(
    ledger: &mut Ledger,
    candidate: &Candidate<'_>,
    fleet: &FleetView,
) -> (Outcome, Option<BTreeSet<String>>) {
    let key = &candidate.precedence.key;
    let reserved = ledger.reserved_by_others(key);
    let mut outcome = evaluate(candidate.spec, &key.namespace, &key.name, fleet, &reserved);
    // A whole GPU whose MIG slice the scheduler gave away is reserved without any claim
    // naming it: say so, or the refusal would not explain where it went.
    if let Outcome::Unschedulable(status) = &mut outcome {
        status
            .reasons
            .extend(ledger.blocked_by_counters(super::no_match::MAX_NAMED));
    }
    match &outcome {
        Outcome::Planned(status) => {
            let holding = holding_for(candidate, status.clone());
            let nodes = holding.nodes();
            match ledger.insert(key.clone(), holding) {
                Ok(()) => (outcome, Some(nodes)),
                // The planner was told which devices were taken, so the ledger refusing the
                // plan is a bug; refusing the placement is the safe answer.
                Err(conflict) => {
                    tracing::error!(placement = %key, %conflict, "a plan overlaps the ledger");
                    let refusal = Outcome::Unschedulable(ModelPlacementStatus {
                        reasons: vec![format!("internal: {conflict}")],
                        ..ModelPlacementStatus::default()
                    });
                    (refusal, None)
                }
            }
        }
        Outcome::Unschedulable(_) | Outcome::Invalid(_) => {
            ledger.mark_unfit(key.clone(), tried(candidate, fleet), outcome.clone());
            (outcome, None)
        }
    }
}

/// The placement version and fleet a try is made with.
fn tried(candidate: &Candidate<'_>, fleet: &FleetView) -> Tried {
    Tried {
        uid: candidate.uid.clone(),
        generation: candidate.generation,
        fleet: fleet.id(),
    }
}

fn holding_for(candidate: &Candidate<'_>, status: ModelPlacementStatus) -> Holding {
    Holding {
        created: candidate.precedence.created,
        uid: candidate.uid.clone(),
        generation: candidate.generation,
        status,
    }
}
#[cfg(test)]
pub(crate) mod tests {
    //! Decision tests; the fleet and placement helpers are shared with `desired.rs`'s tests.
    use std::collections::BTreeMap;

    use super::*;
    use crate::api::AcceleratorInventory;
    use crate::api::conditions;
    use crate::api::placement::PrecisionChoice;
    use crate::controller::placement::core::desired::{DEGRADED, PLANNED, READY, desired_status};
    use crate::testing::PlacementBuilder;
    use crate::testing::inventory::fixture_inventory;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn inventories(nodes: &[&str]) -> Vec<AcceleratorInventory> {
        nodes
            .iter()
            .map(|n| fixture_inventory("h100-8x-nvswitch", n))
            .collect()
    }

    pub(crate) fn fleet(nodes: &[&str]) -> FleetView {
        FleetView::new(inventories(nodes).iter(), &BTreeMap::new())
    }

    /// 70B at bf16 for 40 requests: half of an 8 x H100 node.
    pub(crate) fn half_node() -> ModelPlacementSpec {
        PlacementBuilder::serve("llama-3.1-70b")
            .concurrency(40)
            .precision(PrecisionChoice::Bf16)
            .spec()
    }

    pub(crate) fn candidate<'a>(
        name: &str,
        created: i64,
        spec: &'a ModelPlacementSpec,
    ) -> Candidate<'a> {
        Candidate {
            precedence: Precedence {
                created,
                key: PlacementKey::new("ml", name),
            },
            uid: format!("uid-{name}"),
            generation: 1,
            spec,
        }
    }

    fn devices(ledger: &Ledger, name: &str) -> BTreeSet<(String, String)> {
        ledger
            .get(&PlacementKey::new("ml", name))
            .map(|h| {
                h.devices()
                    .map(|(n, d)| (n.to_string(), d.to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn older_waiting_placements_go_first() {
        let spec = half_node();
        let fleet = fleet(&["n1"]);
        let mut ledger = Ledger::new();
        let holder = candidate("holder", 1, &spec);
        decide(&mut ledger, &holder, &[], &fleet);
        // `old` and `young` both wait; `young` is reconciled first, but `old` gets the room.
        let old = candidate("old", 2, &spec);
        let young = candidate("young", 3, &spec);
        let decision = decide(&mut ledger, &young, std::slice::from_ref(&old), &fleet);
        assert_eq!(
            decision.planned_others,
            vec![PlacementKey::new("ml", "old")]
        );
        assert!(
            matches!(decision.outcome, Outcome::Unschedulable(_)),
            "{decision:?}"
        );
        assert_eq!(devices(&ledger, "old").len(), 4);
        assert!(devices(&ledger, "old").is_disjoint(&devices(&ledger, "holder")));
        assert!(devices(&ledger, "young").is_empty());
    }

    #[test]
    fn a_burst_of_older_placements_is_tried_a_few_per_turn_in_order() {
        let spec = half_node();
        let names: Vec<String> = (0..6).map(|i| format!("n{i}")).collect();
        let fleet = fleet(&names.iter().map(String::as_str).collect::<Vec<_>>());
        let mut ledger = Ledger::new();
        let older_names: Vec<String> = (0..OLDER_PER_TURN + 3)
            .map(|i| format!("old{i:02}"))
            .collect();
        let older: Vec<Candidate<'_>> = older_names
            .iter()
            .enumerate()
            .map(|(i, name)| candidate(name, i64::try_from(i).unwrap(), &spec))
            .collect();
        let me = candidate("me", 100, &spec);
        let first = decide(&mut ledger, &me, &older, &fleet);
        assert!(first.deferred, "{first:?}");
        let oldest: Vec<PlacementKey> = older_names[..OLDER_PER_TURN]
            .iter()
            .map(|n| PlacementKey::new("ml", n.as_str()))
            .collect();
        assert_eq!(first.planned_others, oldest);
        assert!(
            devices(&ledger, "me").is_empty(),
            "not decided on this turn"
        );
        let second = decide(&mut ledger, &me, &older, &fleet);
        assert!(!second.deferred);
        assert_eq!(second.planned_others.len(), 3);
        assert!(matches!(second.outcome, Outcome::Planned(_)), "{second:?}");
    }

    #[test]
    fn a_placement_that_did_not_fit_is_tried_again_only_after_a_release() {
        let spec = half_node();
        let fleet = fleet(&["n1"]);
        let mut ledger = Ledger::new();
        for (name, created) in [("a", 1), ("b", 2)] {
            decide(&mut ledger, &candidate(name, created, &spec), &[], &fleet);
        }
        // More waiting placements than one turn tries: they do not fit, and once tried they
        // no longer count against a newer placement's turn.
        let waiting_names: Vec<String> = (0..=OLDER_PER_TURN).map(|i| format!("w{i}")).collect();
        let waiting: Vec<Candidate<'_>> = waiting_names
            .iter()
            .enumerate()
            .map(|(i, name)| candidate(name, 10 + i64::try_from(i).unwrap(), &spec))
            .collect();
        let late = candidate("late", 99, &spec);
        assert!(decide(&mut ledger, &late, &waiting, &fleet).deferred);
        let tried = decide(&mut ledger, &late, &waiting, &fleet);
        assert!(!tried.deferred && tried.planned_others.is_empty());
        let again = decide(&mut ledger, &late, &waiting, &fleet);
        assert!(
            !again.deferred,
            "nothing was released: nobody is tried again"
        );
        assert!(matches!(again.outcome, Outcome::Unschedulable(_)));
        // A release makes everyone worth trying again, oldest first.
        ledger.forget(&PlacementKey::new("ml", "a"));
        let after = decide(&mut ledger, &late, &waiting, &fleet);
        assert!(after.deferred);
        assert_eq!(after.planned_others, vec![PlacementKey::new("ml", "w0")]);
    }

    #[test]
    fn a_valid_plan_is_kept_and_a_lost_device_replans() {
        let spec = half_node();
        let mut ledger = Ledger::new();
        let me = candidate("me", 1, &spec);
        let both = fleet(&["n1", "n2"]);
        let first = decide(&mut ledger, &me, &[], &both);
        assert!(matches!(first.outcome, Outcome::Planned(_)));
        assert!(!first.kept);
        let held = devices(&ledger, "me");
        let again = decide(&mut ledger, &me, &[], &both);
        assert!(again.kept && again.changed_nodes.is_empty());
        assert_eq!(devices(&ledger, "me"), held, "stable: no re-plan");
        let old_node = held.iter().next().map(|(n, _)| n.clone()).unwrap();
        let remaining = if old_node == "n1" { "n2" } else { "n1" };
        let shrunk = fleet(&[remaining]);
        let moved = decide(&mut ledger, &me, &[], &shrunk);
        assert!(moved.replanned.as_deref().unwrap().contains(&old_node));
        assert!(moved.freed && moved.changed_nodes.contains(&old_node));
        assert!(devices(&ledger, "me").iter().all(|(n, _)| n == remaining));
    }

    #[test]
    fn an_unhealthy_assigned_device_keeps_the_plan_and_degrades() {
        let spec = half_node();
        let mut ledger = Ledger::new();
        let me = candidate("me", 1, &spec);
        let first = decide(&mut ledger, &me, &[], &fleet(&["n1"]));
        let at = Time(k8s_openapi::jiff::Timestamp::from_second(1).unwrap());
        let status = desired_status(None, &first, Some(1), &at);
        assert!(!conditions::is_true(&status.conditions, DEGRADED));
        let sick = status.assignments[0].devices[0].clone();
        let mut changed = inventories(&["n1"]);
        let entry = changed[0]
            .spec
            .devices
            .iter_mut()
            .find(|d| d.name == sick)
            .unwrap();
        entry.attributes.insert(
            crate::api::attribute::HEALTH.to_string(),
            crate::api::DeviceAttribute::String("unhealthy".into()),
        );
        let fleet = FleetView::new(changed.iter(), &BTreeMap::new());
        let kept = decide(&mut ledger, &me, &[], &fleet);
        assert!(
            kept.kept,
            "a running workload is not moved for one bad device"
        );
        assert_eq!(kept.degraded.len(), 1, "{:?}", kept.degraded);
        assert!(kept.degraded[0].contains(&sick));
        let degraded = desired_status(Some(&status), &kept, Some(1), &at);
        assert!(conditions::is_true(&degraded.conditions, DEGRADED));
        assert!(conditions::is_true(&degraded.conditions, PLANNED));
        let ready = conditions::find(&degraded.conditions, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "DevicesDegraded")
        );
    }

    #[test]
    fn a_new_generation_is_planned_again() {
        let spec = half_node();
        let mut ledger = Ledger::new();
        let fleet = fleet(&["n1"]);
        decide(&mut ledger, &candidate("me", 1, &spec), &[], &fleet);
        let mut changed = candidate("me", 1, &spec);
        changed.generation = 2;
        let decision = decide(&mut ledger, &changed, &[], &fleet);
        assert!(!decision.kept && decision.replanned.is_none());
        assert_eq!(ledger.get(&changed.precedence.key).unwrap().generation, 2);
    }
}
