//! Issue 39: placements that hold their own claims take shares of GPUs their driver publishes
//! shareable by memory (`fixtures/dra/nvidia-h100-shareable.yaml`: two 80Gi H100s, shares of
//! 8Gi steps). The ledger counts the bytes; the claims request them and record them as the
//! scheduler would, so pods the scheduler places see what is left.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::api::placement::PrecisionChoice;
use crate::controller::core::fleet_view::{FleetView, NodePart};
use crate::controller::core::ledger::{Ledger, PlacementKey, Take};
use crate::controller::placement::core::decide::decide;
use crate::controller::placement::core::decide::tests::candidate;
use crate::controller::placement::core::outcome::Outcome;
use crate::dra::slices::published_devices;
use crate::testing::PlacementBuilder;
use crate::testing::dra::fixture_slices;

const NODE: &str = "h100-2x-shared";
const GIB: u64 = 1 << 30;

fn shared_fleet() -> FleetView {
    let published = published_devices(&fixture_slices(&["nvidia-h100-shareable.yaml"]));
    let part = NodePart::with_published(NODE, None, published.node(NODE));
    FleetView::from_parts([Arc::new(part)], &BTreeMap::new())
}

/// An 8B model at 8k context and bf16, held by its own claims: a 24Gi share of an H100.
fn small() -> crate::api::placement::ModelPlacementSpec {
    let mut spec = PlacementBuilder::serve("llama-3.1-8b")
        .context(8192)
        .precision(PrecisionChoice::Bf16)
        .spec();
    spec.allocation = Some(AllocationMode::Claims);
    spec
}

/// The device a planned placement's share is on, and the share's bytes.
fn share_of(ledger: &Ledger, name: &str) -> (String, u64) {
    let holding = ledger.get(&PlacementKey::new("ml", name)).expect("held");
    let Take::Share { bytes, capacity } = holding.take() else {
        panic!("{name} holds its device whole")
    };
    assert_eq!(capacity, 80 * GIB);
    let devices: Vec<&str> = holding.devices().map(|(_, d)| d).collect();
    assert_eq!(devices.len(), 1, "one replica, one device");
    (devices[0].to_string(), bytes)
}

#[test]
fn claims_placements_fill_one_gpu_with_shares_then_the_next_and_refuse_past_both() {
    let fleet = shared_fleet();
    let spec = small();
    let mut ledger = Ledger::new();
    let mut per_gpu: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in 0..6 {
        let name = format!("p{i}");
        let decision = decide(&mut ledger, &candidate(&name, i, &spec), &[], &fleet);
        assert!(
            matches!(decision.outcome, Outcome::Planned(_)),
            "{name}: {:?}",
            decision.outcome
        );
        let (device, bytes) = share_of(&ledger, &name);
        assert_eq!(bytes, 24 * GIB, "{name}");
        per_gpu.entry(device).or_default().push(name);
    }
    // Best fit: three shares fill the first GPU before any lands on the second (the fourth
    // and later were planned with no whole GPU free).
    let counts: Vec<usize> = per_gpu.values().map(Vec::len).collect();
    assert_eq!(counts, [3, 3], "{per_gpu:?}");
    assert_eq!(ledger.index_mismatch(), None);

    // A seventh would overflow either GPU (72Gi of 80Gi taken on each): refused.
    let seventh = decide(&mut ledger, &candidate("p6", 6, &spec), &[], &fleet);
    assert!(
        matches!(seventh.outcome, Outcome::Unschedulable(_)),
        "{:?}",
        seventh.outcome
    );
    // Nor may anyone hold a GPU whole while shares are on it.
    let mut whole = small();
    whole
        .constraints
        .get_or_insert_with(Default::default)
        .whole_devices = Some(true);
    let refused = decide(&mut ledger, &candidate("whole", 7, &whole), &[], &fleet);
    assert!(
        matches!(refused.outcome, Outcome::Unschedulable(_)),
        "{:?}",
        refused.outcome
    );

    // Deleting one frees its share at once: the seventh fits where it was.
    let (freed_gpu, _) = share_of(&ledger, "p0");
    ledger.forget(&PlacementKey::new("ml", "p0"));
    let again = decide(&mut ledger, &candidate("p6", 6, &spec), &[], &fleet);
    assert!(
        matches!(again.outcome, Outcome::Planned(_)),
        "{:?}",
        again.outcome
    );
    assert_eq!(share_of(&ledger, "p6").0, freed_gpu);
}

#[test]
fn a_share_claim_asks_for_the_share_and_a_whole_one_for_all_of_the_gpu() {
    let fleet = shared_fleet();
    let spec = small();
    let mut ledger = Ledger::new();
    let decision = decide(&mut ledger, &candidate("chat", 1, &spec), &[], &fleet);
    let Outcome::Planned(status) = &decision.outcome else {
        panic!("{:?}", decision.outcome)
    };
    let Holding::Claims(plans) = holding("ml", "chat", AllocationMode::Claims, status, &fleet)
    else {
        panic!("held by claims")
    };
    assert_eq!(
        plans[0].share,
        Some(ClaimShare {
            bytes: 24 * GIB,
            capacity: 80 * GIB
        })
    );

    let mut whole = small();
    whole
        .constraints
        .get_or_insert_with(Default::default)
        .whole_devices = Some(true);
    let decision = decide(&mut ledger, &candidate("big", 2, &whole), &[], &fleet);
    let Outcome::Planned(status) = &decision.outcome else {
        panic!("{:?}", decision.outcome)
    };
    let holding_kind = ledger.get(&PlacementKey::new("ml", "big")).unwrap().take();
    assert_eq!(holding_kind, Take::Whole);
    let Holding::Claims(plans) = holding("ml", "big", AllocationMode::Claims, status, &fleet)
    else {
        panic!("held by claims")
    };
    assert_eq!(
        plans[0].share,
        Some(ClaimShare {
            bytes: 80 * GIB,
            capacity: 80 * GIB
        }),
        "all of its memory, so the scheduler puts no share beside it"
    );
    // The two are on different GPUs: the share's GPU is no whole device any more.
    assert_ne!(
        share_of(&ledger, "chat").0,
        ledger
            .get(&PlacementKey::new("ml", "big"))
            .unwrap()
            .devices()
            .next()
            .unwrap()
            .1
    );
}
