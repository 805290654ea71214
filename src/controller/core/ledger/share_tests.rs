//! Shares of devices in the ledger (issue 39): a device its DRA driver publishes shareable by
//! memory may be held by several placements, each a share, while their shares fit in its
//! capacity, or by one placement whole; never both, and never past its capacity, whichever
//! order snapshots are taken and committed in.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::api::placement::{Assignment, FractionStatus, PlanStatus};

const GIB: u64 = 1 << 30;
const CAPACITY: u64 = 80 * GIB;

fn key(name: &str) -> PlacementKey {
    PlacementKey::new("ml", name)
}

/// A holding of `devices` on node `n1`, one replica each: shares of `share` bytes of each, or
/// the devices whole (`None`).
fn holding(created: i64, devices: &[&str], share: Option<u64>) -> Holding {
    let assignments = devices
        .iter()
        .enumerate()
        .map(|(replica, device)| Assignment {
            node: "n1".to_string(),
            devices: vec![device.to_string()],
            replica: u32::try_from(replica).unwrap(),
            stage: 0,
        })
        .collect();
    let fraction = FractionStatus {
        kind: if share.is_some() { "share" } else { "device" }.to_string(),
        bytes: share.unwrap_or(CAPACITY),
        device_bytes: CAPACITY,
        profile: None,
    };
    Holding {
        created,
        uid: format!("uid-{created}"),
        generation: 1,
        status: ModelPlacementStatus {
            assignments,
            plan: Some(PlanStatus {
                fraction: Some(fraction),
                ..PlanStatus::default()
            }),
            ..ModelPlacementStatus::default()
        },
    }
}

#[test]
fn shares_of_a_device_fit_in_its_capacity_and_never_beside_a_whole_holding() {
    let mut ledger = Ledger::new();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        ledger
            .insert(key(name), holding(i as i64, &["gpu-0"], Some(24 * GIB)))
            .unwrap();
    }
    assert_eq!(
        ledger
            .shares_of("n1", "gpu-0")
            .unwrap()
            .used_except(|_| false),
        72 * GIB
    );
    // 72Gi + 16Gi > 80Gi.
    let over = ledger
        .insert(key("d"), holding(4, &["gpu-0"], Some(16 * GIB)))
        .unwrap_err();
    assert_eq!(over.device, "gpu-0");
    // 72Gi + 8Gi fits exactly.
    ledger
        .insert(key("e"), holding(5, &["gpu-0"], Some(8 * GIB)))
        .unwrap();
    // A whole holding of a shared device, and a share of a whole one, are refused.
    assert!(
        ledger
            .insert(key("f"), holding(6, &["gpu-0"], None))
            .is_err()
    );
    ledger
        .insert(key("g"), holding(7, &["gpu-1"], None))
        .unwrap();
    assert!(
        ledger
            .insert(key("h"), holding(8, &["gpu-1"], Some(8 * GIB)))
            .is_err()
    );
    // Two replicas of one placement on one device take two shares.
    let two = ledger.insert(key("i"), holding(9, &["gpu-2", "gpu-2"], Some(40 * GIB)));
    assert!(two.is_ok());
    assert_eq!(
        ledger.shares_of("n1", "gpu-2").unwrap().by[&key("i")],
        80 * GIB
    );
    assert_eq!(ledger.index_mismatch(), None);

    // Others see what is consumed; the whole device is reserved.
    let reserved = ledger.reserved_by_others(&key("a"));
    assert_eq!(reserved.consumed("n1", "gpu-0"), 56 * GIB, "b, c and e");
    assert!(reserved.contains("n1", "gpu-1"));
    assert!(!reserved.contains("n1", "gpu-0"));
    assert_eq!(ledger.holders_on("n1").len(), 6, "a, b, c, e, g and i");

    // Re-inserting a placement replaces its share (counted once, not beside its old one),
    // within what the others leave; removing it frees it.
    assert!(
        ledger
            .insert(key("a"), holding(0, &["gpu-0"], Some(32 * GIB)))
            .is_err(),
        "56Gi + 32Gi > 80Gi"
    );
    ledger
        .insert(key("a"), holding(0, &["gpu-0"], Some(16 * GIB)))
        .unwrap();
    assert_eq!(
        ledger
            .shares_of("n1", "gpu-0")
            .unwrap()
            .used_except(|_| false),
        72 * GIB
    );
    for name in ["a", "b", "c", "e"] {
        ledger.remove(&key(name));
    }
    assert!(
        ledger.shares_of("n1", "gpu-0").is_none(),
        "no empty entry left"
    );
    ledger
        .insert(key("f"), holding(6, &["gpu-0"], None))
        .unwrap();
    assert_eq!(ledger.index_mismatch(), None);
}

#[test]
fn concurrent_commits_of_shares_land_while_they_fit_together() {
    let mut ledger = Ledger::new();
    ledger
        .insert(key("a"), holding(1, &["gpu-0"], Some(40 * GIB)))
        .unwrap();
    // Two reconciles plan on snapshots of the same ledger: 24Gi and 16Gi fit alone and
    // together (80Gi), and both land.
    let mut first = ledger.snapshot();
    let mut second = ledger.snapshot();
    first
        .insert(key("b"), holding(2, &["gpu-0"], Some(24 * GIB)))
        .unwrap();
    second
        .insert(key("c"), holding(3, &["gpu-0"], Some(16 * GIB)))
        .unwrap();
    ledger.commit(first, &key("b"), |_, _| true).unwrap();
    ledger.commit(second, &key("c"), |_, _| true).unwrap();
    assert_eq!(
        ledger
            .shares_of("n1", "gpu-0")
            .unwrap()
            .used_except(|_| false),
        CAPACITY
    );
    // Two that fit alone but not together: the first to commit gets the room.
    ledger.remove(&key("b"));
    ledger.remove(&key("c"));
    let mut first = ledger.snapshot();
    let mut second = ledger.snapshot();
    first
        .insert(key("d"), holding(4, &["gpu-0"], Some(24 * GIB)))
        .unwrap();
    second
        .insert(key("e"), holding(5, &["gpu-0"], Some(24 * GIB)))
        .unwrap();
    ledger.commit(first, &key("d"), |_, _| true).unwrap();
    assert!(
        matches!(
            ledger.commit(second, &key("e"), |_, _| true),
            Err(commit::CommitConflict::Taken(_))
        ),
        "40 + 24 + 24 > 80"
    );
    assert!(ledger.get(&key("e")).is_none());
    // A whole device committed over a share made since is refused too.
    let mut whole = ledger.snapshot();
    whole
        .insert(key("w"), holding(6, &["gpu-1"], None))
        .unwrap();
    let mut share = ledger.snapshot();
    share
        .insert(key("s"), holding(7, &["gpu-1"], Some(8 * GIB)))
        .unwrap();
    ledger.commit(share, &key("s"), |_, _| true).unwrap();
    assert!(matches!(
        ledger.commit(whole, &key("w"), |_, _| true),
        Err(commit::CommitConflict::Taken(_))
    ));
    // Claims outside the ledger count: 72Gi consumed by others leaves no room for 16Gi.
    let mut outside = HeldOutside::default();
    outside.devices.consume("n1", "gpu-2", 72 * GIB);
    ledger.set_external(outside);
    let mut late = ledger.snapshot();
    late.insert(key("x"), holding(8, &["gpu-2"], Some(16 * GIB)))
        .unwrap();
    assert!(matches!(
        ledger.commit(late, &key("x"), |_, _| true),
        Err(commit::CommitConflict::External { .. })
    ));
    assert_eq!(ledger.index_mismatch(), None);
}

/// One worker's step: take a snapshot, plan a holding on it, or commit it.
#[derive(Debug, Clone)]
enum Step {
    Snapshot {
        worker: usize,
    },
    Hold {
        worker: usize,
        placement: usize,
        devices: Vec<usize>,
        share: Option<u64>,
    },
    Release {
        worker: usize,
        placement: usize,
    },
    Commit {
        worker: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..3usize).prop_map(|worker| Step::Snapshot { worker }),
        (
            0..3usize,
            0..6usize,
            proptest::collection::vec(0..3usize, 1..3),
            proptest::option::of((1..=10u64).prop_map(|steps| steps * 8 * GIB)),
        )
            .prop_map(|(worker, placement, devices, share)| Step::Hold {
                worker,
                placement,
                devices,
                share,
            }),
        (0..3usize, 0..6usize).prop_map(|(worker, placement)| Step::Release { worker, placement }),
        (0..3usize).prop_map(|worker| Step::Commit { worker }),
    ]
}

proptest! {
    /// Whatever snapshots plan and in whatever order they commit, no device is held whole
    /// and shared, none whole twice, no device's shares exceed its capacity, and the index is
    /// exactly what the holdings say.
    #[test]
    fn no_interleaving_of_commits_overfills_or_double_holds_a_device(
        steps in proptest::collection::vec(step(), 1..60)
    ) {
        let mut ledger = Ledger::new();
        let mut drafts: Vec<Option<(Ledger, PlacementKey)>> = vec![None, None, None];
        for step in steps {
            match step {
                Step::Snapshot { worker } => {
                    drafts[worker] = Some((ledger.snapshot(), key("none")));
                }
                Step::Hold { worker, placement, devices, share } => {
                    if let Some((draft, own)) = drafts[worker].as_mut() {
                        let names: Vec<String> =
                            devices.iter().map(|d| format!("gpu-{d}")).collect();
                        let names: Vec<&str> = names.iter().map(String::as_str).collect();
                        let name = format!("p{placement}");
                        // The draft refuses what does not fit in it; that is a plan not made.
                        if draft
                            .insert(key(&name), holding(placement as i64, &names, share))
                            .is_ok()
                        {
                            *own = key(&name);
                        }
                    }
                }
                Step::Release { worker, placement } => {
                    if let Some((draft, own)) = drafts[worker].as_mut() {
                        draft.remove(&key(&format!("p{placement}")));
                        *own = key(&format!("p{placement}"));
                    }
                }
                Step::Commit { worker } => {
                    if let Some((draft, own)) = drafts[worker].take() {
                        let _ = ledger.commit(draft, &own, |_, _| true);
                    }
                }
            }
            prop_assert_eq!(ledger.index_mismatch(), None);
            let mut whole: BTreeMap<String, usize> = BTreeMap::new();
            let mut shared: BTreeMap<String, u64> = BTreeMap::new();
            for (_, holding) in ledger.iter() {
                for (_, device) in holding.devices() {
                    match holding.take() {
                        Take::Whole => *whole.entry(device.to_string()).or_default() += 1,
                        Take::Share { bytes, .. } => {
                            *shared.entry(device.to_string()).or_default() += bytes;
                        }
                    }
                }
            }
            for (device, count) in &whole {
                prop_assert_eq!(*count, 1, "{} held whole {} times", device, count);
                prop_assert!(!shared.contains_key(device), "{} whole and shared", device);
            }
            for (device, bytes) in &shared {
                prop_assert!(*bytes <= CAPACITY, "{} shares {} > capacity", device, bytes);
            }
        }
    }
}
