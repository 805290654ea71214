//! Partitions in the ledger (issue 39): a GPU whose driver publishes MIG devices through a
//! counter set (NVIDIA's dynamic MIG, `fixtures/dra/nvidia-h100-dynamic-mig.yaml`) may be held
//! whole by one placement or as MIG devices by several, while the devices held fit in its
//! counters; never both, never overlapping, whichever order snapshots are taken and committed
//! in.

use proptest::prelude::*;

use std::sync::Arc;

use super::*;
use crate::controller::core::counter_book::{CounterBook, CounterIndex};
use crate::dra::counters::published_counters;
use crate::testing::dra::fixture_slices;

const NODE: &str = "h100-mig-node";

/// The devices of the fixture, by planner id (the DRA device names).
const DEVICES: &[&str] = &[
    "gpu-0",
    "gpu-0-mig-1g10gb-19-0",
    "gpu-0-mig-1g10gb-19-3",
    "gpu-0-mig-1g10gb-19-6",
    "gpu-0-mig-3g40gb-9-0",
    "gpu-0-mig-3g40gb-9-4",
    "gpu-0-mig-7g80gb-0-0",
    "gpu-1",
    "gpu-1-mig-1g10gb-19-4",
    "gpu-1-mig-3g40gb-9-0",
    "gpu-1-mig-3g40gb-9-4",
];

fn key(name: &str) -> PlacementKey {
    PlacementKey::new("ml", name)
}

/// The fixture's counters, with `outside` allocated by claims the ledger does not count.
fn counters(outside: &[&str]) -> HeldOutside {
    let slices = fixture_slices(&["nvidia-h100-dynamic-mig.yaml"]);
    let outside: Vec<crate::dra::DeviceRef> = outside
        .iter()
        .map(|device| crate::dra::DeviceRef {
            driver: "gpu.nvidia.com".into(),
            pool: NODE.into(),
            device: (*device).into(),
        })
        .collect();
    HeldOutside {
        counters: CounterBook::new(
            Arc::new(CounterIndex::new(&published_counters(&slices), |d| {
                Some((NODE.to_string(), d.device.clone()))
            })),
            &outside,
        ),
        ..HeldOutside::default()
    }
}

fn ledger() -> Ledger {
    let mut ledger = Ledger::new();
    ledger.set_external(counters(&[]));
    ledger
}

/// A holding of `devices` on the MIG node, one replica each.
fn holding(created: i64, devices: &[&str]) -> Holding {
    let assignments = devices
        .iter()
        .enumerate()
        .map(|(replica, device)| Assignment {
            node: NODE.to_string(),
            devices: vec![device.to_string()],
            replica: u32::try_from(replica).unwrap(),
            stage: 0,
        })
        .collect();
    Holding {
        created,
        uid: format!("uid-{created}"),
        generation: 1,
        status: ModelPlacementStatus {
            assignments,
            ..ModelPlacementStatus::default()
        },
    }
}

#[test]
fn a_gpu_is_held_whole_or_in_partitions_that_fit_never_both() {
    let mut ledger = ledger();
    ledger.insert(key("whole"), holding(1, &["gpu-0"])).unwrap();
    let refused = ledger
        .insert(key("mig"), holding(2, &["gpu-0-mig-3g40gb-9-4"]))
        .unwrap_err();
    assert_eq!(refused.holder, key("whole"), "{refused}");
    ledger
        .insert(key("a"), holding(3, &["gpu-1-mig-3g40gb-9-0"]))
        .unwrap();
    ledger
        .insert(key("b"), holding(4, &["gpu-1-mig-3g40gb-9-4"]))
        .unwrap();
    let full = ledger
        .insert(key("c"), holding(5, &["gpu-1-mig-1g10gb-19-4"]))
        .unwrap_err();
    assert!(
        [key("a"), key("b")].contains(&full.holder),
        "gpu-1's multiprocessors and memory slice 4 are a's and b's: {full}"
    );
    assert!(
        ledger.insert(key("d"), holding(6, &["gpu-1"])).is_err(),
        "a GPU with MIG devices held is not held whole"
    );
    // One placement cannot take overlapping partitions either.
    let mut fresh = self::ledger();
    assert!(
        fresh
            .insert(
                key("e"),
                holding(7, &["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-1g10gb-19-3"])
            )
            .is_err()
    );

    // What others hold keeps the blocked devices from every other plan, not from the holder.
    let for_c = ledger.reserved_by_others(&key("c"));
    for device in [
        "gpu-0",
        "gpu-0-mig-3g40gb-9-4",
        "gpu-1",
        "gpu-1-mig-1g10gb-19-4",
        "gpu-1-mig-3g40gb-9-0",
    ] {
        assert!(for_c.contains(NODE, device), "{device} is not free for c");
    }
    let for_a = ledger.reserved_by_others(&key("a"));
    assert!(!for_a.contains(NODE, "gpu-1-mig-3g40gb-9-0"), "a's own");
    assert!(
        for_a.contains(NODE, "gpu-1"),
        "b's partition blocks the GPU"
    );
    assert!(ledger.reserved_all().contains(NODE, "gpu-1"));
    let through: Vec<(&str, &str)> = ledger.held_through_counters().collect();
    assert!(through.contains(&(NODE, "gpu-1")), "{through:?}");
    assert!(
        through.contains(&(NODE, "gpu-0-mig-3g40gb-9-4")),
        "{through:?}"
    );
    let lines = ledger.blocked_by_counters(50);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("{NODE}/gpu-1 cannot be allocated: counter set"))),
        "a refusal says why: {lines:?}"
    );
    ledger.remove(&key("b"));
    ledger.remove(&key("a"));
    assert!(!ledger.reserved_all().contains(NODE, "gpu-1"), "freed");
    assert_eq!(ledger.index_mismatch(), None);
}

#[test]
fn two_commits_of_overlapping_partitions_do_not_both_land() {
    let mut ledger = ledger();
    let mut first = ledger.snapshot();
    first
        .insert(key("a"), holding(1, &["gpu-0-mig-3g40gb-9-0"]))
        .unwrap();
    let mut second = ledger.snapshot();
    second
        .insert(key("b"), holding(2, &["gpu-0-mig-1g10gb-19-3"]))
        .unwrap();
    let mut third = ledger.snapshot();
    third
        .insert(key("c"), holding(3, &["gpu-0-mig-3g40gb-9-4"]))
        .unwrap();
    ledger.commit(first, &key("a"), |_, _| true).unwrap();
    assert_eq!(
        ledger.commit(second, &key("b"), |_, _| true),
        Err(commit::CommitConflict::Taken(Conflict {
            node: NODE.to_string(),
            device: "gpu-0-mig-1g10gb-19-3".to_string(),
            holder: key("a"),
        }))
    );
    ledger.commit(third, &key("c"), |_, _| true).unwrap();
    // What claims outside the ledger consume counts too.
    let mut outside = self::ledger();
    let mut late = outside.snapshot();
    late.insert(key("d"), holding(4, &["gpu-1"])).unwrap();
    outside.set_external(counters(&["gpu-1-mig-3g40gb-9-0"]));
    assert!(outside.commit(late, &key("d"), |_, _| true).is_err());
    assert!(
        outside
            .insert(key("e"), holding(5, &["gpu-1-mig-3g40gb-9-4"]))
            .is_ok()
    );
}

/// One worker's step.
#[derive(Debug, Clone)]
enum Step {
    Snapshot {
        worker: usize,
    },
    Hold {
        worker: usize,
        placement: usize,
        devices: Vec<usize>,
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
            proptest::collection::vec(0..DEVICES.len(), 1..3),
        )
            .prop_map(|(worker, placement, devices)| Step::Hold {
                worker,
                placement,
                devices,
            }),
        (0..3usize, 0..6usize).prop_map(|(worker, placement)| Step::Release { worker, placement }),
        (0..3usize).prop_map(|worker| Step::Commit { worker }),
    ]
}

proptest! {
    /// Whatever snapshots plan and in whatever order they commit, the devices held on each
    /// GPU always fit in its counters together (no GPU whole beside its MIG devices, no two
    /// MIG devices sharing a memory slice), and the index is what the holdings say.
    #[test]
    fn no_interleaving_of_commits_overcommits_a_counter_set(
        steps in proptest::collection::vec(step(), 1..60)
    ) {
        let book = counters(&[]).counters;
        let mut ledger = ledger();
        let mut drafts: Vec<Option<(Ledger, PlacementKey)>> = vec![None, None, None];
        for step in steps {
            match step {
                Step::Snapshot { worker } => {
                    drafts[worker] = Some((ledger.snapshot(), key("none")));
                }
                Step::Hold { worker, placement, devices } => {
                    if let Some((draft, own)) = drafts[worker].as_mut() {
                        let names: Vec<&str> = devices.iter().map(|d| DEVICES[*d]).collect();
                        let name = format!("p{placement}");
                        if draft.insert(key(&name), holding(placement as i64, &names)).is_ok() {
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
            let held: Vec<(String, String)> = ledger
                .iter()
                .flat_map(|(_, h)| h.devices().map(|(n, d)| (n.to_string(), d.to_string())))
                .collect();
            for device in &held {
                let misfit = book.misfit(device, |other| other != device && held.contains(other));
                prop_assert!(misfit.is_none(), "{:?} held beside {:?}: {:?}", device, held, misfit);
            }
        }
    }
}

/// A rebuild sees no slices, so two statuses naming overlapping MIG devices (a hand-edited
/// status) are both taken in; when the counters become known the younger holding is removed,
/// to be planned again, as a rebuild leaves out a whole device claimed twice. Counters seen
/// again change nothing.
#[test]
fn holdings_that_overlap_once_the_counters_are_known_keep_the_older_one() {
    let (mut ledger, dropped) = Ledger::rebuild(vec![
        (key("young"), holding(20, &["gpu-0-mig-1g10gb-19-3"])),
        (key("old"), holding(10, &["gpu-0-mig-3g40gb-9-0"])),
        (key("apart"), holding(30, &["gpu-1-mig-3g40gb-9-0"])),
    ]);
    assert!(dropped.is_empty(), "no counters, no conflict seen");
    assert!(ledger.take_counter_dropped().is_empty());
    let releases = ledger.releases();
    assert!(ledger.set_external(counters(&[])));
    assert_eq!(ledger.take_counter_dropped(), vec![key("young")]);
    assert!(ledger.get(&key("young")).is_none());
    assert!(ledger.get(&key("old")).is_some() && ledger.get(&key("apart")).is_some());
    assert!(ledger.releases() > releases, "a removal is a release");
    assert_eq!(ledger.index_mismatch(), None);
    // The same counters again: nothing more to check or drop.
    assert!(!ledger.set_external(counters(&[])) || ledger.take_counter_dropped().is_empty());
    assert!(ledger.take_counter_dropped().is_empty());
}
