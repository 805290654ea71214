//! The DRA counters of partitionable devices, by the fleet's node and device ids: what lets
//! the ledger hand out partitions (a MIG device of a GPU) without handing out the same GPU
//! memory twice.
//!
//! A partition and its parent GPU are distinct devices with distinct ids, so the ledger's
//! one-holder-per-device rule alone would let one placement hold the whole GPU while another
//! holds one of its MIG devices, or two placements hold MIG devices that overlap. What
//! forbids that is the counter sets the driver publishes (KEP-4815; [`crate::dra::counters`]):
//! each device consumes counters of its GPU's set, and devices held together must fit in it.
//! [`blocked_by_counters`](crate::dra::counters::blocked_by_counters) applies that rule to
//! what claims have allocated; this book applies it to what the ledger holds, which includes
//! the plans committed but not yet allocated, where two reconciles would otherwise collide.
//! `outside` is what allocated claims the ledger does not count consume, so both together
//! are the scheduler's arithmetic.
//!
//! The sets and their consumers ([`CounterIndex`]) come from the slices the fleet view is
//! built from and are built with it (`FleetView::with_counters`), once per view; each
//! reconcile only adds what the claims allocated ([`CounterBook::new`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::dra::DeviceRef;
use crate::dra::counters::{CounterSetRef, PublishedCounters};

/// A device by the fleet's node name and planner device id.
pub type DeviceKey = (String, String);

/// Counter → amount, in thousandths of the counter's unit.
type Amounts = BTreeMap<String, u128>;

/// The counter sets the fleet's devices consume from, in planner ids: built with the fleet
/// view (from the same slices), shared by every reconcile until the next view.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterIndex {
    /// Device → (set index, counter → amount consumed), for the devices the fleet plans on.
    consumers: BTreeMap<DeviceKey, Vec<(usize, Amounts)>>,
    /// The DRA name of each consumer, to count what claims allocated.
    by_reference: BTreeMap<DeviceRef, DeviceKey>,
    /// The sets those devices consume from.
    sets: Vec<CounterSet>,
}

/// One counter set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct CounterSet {
    /// `name in pool driver/pool`, for reasons.
    name: String,
    /// Counter → amount published.
    capacity: Amounts,
    /// The devices of the fleet that consume from it.
    members: Vec<DeviceKey>,
}

impl CounterIndex {
    /// The sets of `published` the devices `index` names in the fleet consume from.
    pub fn new(
        published: &PublishedCounters,
        index: impl Fn(&DeviceRef) -> Option<DeviceKey>,
    ) -> Self {
        let mut built = Self::default();
        let mut positions: BTreeMap<&CounterSetRef, usize> = BTreeMap::new();
        for (device, consumption) in &published.consumers {
            let Some(key) = index(device) else { continue };
            let mut uses = Vec::with_capacity(consumption.len());
            for (set, amounts) in consumption {
                let Some(capacity) = published.sets.get(set) else {
                    continue;
                };
                let at = *positions.entry(set).or_insert_with(|| {
                    let (driver, pool, name) = set;
                    built.sets.push(CounterSet {
                        name: format!("{name} in pool {driver}/{pool}"),
                        capacity: capacity.clone(),
                        members: Vec::new(),
                    });
                    built.sets.len() - 1
                });
                built.sets[at].members.push(key.clone());
                uses.push((at, amounts.clone()));
            }
            built.by_reference.insert(device.clone(), key.clone());
            built.consumers.insert(key, uses);
        }
        built
    }

    /// True when no device of the fleet consumes counters.
    pub fn is_empty(&self) -> bool {
        self.consumers.is_empty()
    }

    /// For a device whose published partitions consume no counters (a driver, or an
    /// apiserver without partitionable devices, that says nothing of how they share the
    /// device): a set that keeps the device and its partitions apart, and nothing more. The
    /// device consumes all of it and each partition a part, so the device is never held
    /// beside any partition, while partitions may be held side by side, as DRA would allocate
    /// them. Nothing is added when the device or a partition already consumes counters.
    ///
    /// `parent_ref` is `None` for a device published only in partitions (an AMD GPU
    /// partitioned on its node): nobody can allocate it, but the set still tells the counts
    /// that a held partition takes the device.
    pub fn add_exclusive_parts(
        &mut self,
        (parent, parent_ref): (DeviceKey, Option<&DeviceRef>),
        parts: &[(DeviceKey, &DeviceRef)],
    ) {
        if parts.is_empty()
            || self.consumers.contains_key(&parent)
            || parts
                .iter()
                .any(|(key, _)| self.consumers.contains_key(key))
        {
            return;
        }
        let count = u128::try_from(parts.len()).unwrap_or(u128::MAX);
        let at = self.sets.len();
        self.sets.push(CounterSet {
            name: format!("{} and its partitions (no counters published)", parent.1),
            capacity: Amounts::from([("parts".to_string(), count.saturating_mul(1000))]),
            members: std::iter::once(parent.clone())
                .chain(parts.iter().map(|(key, _)| key.clone()))
                .collect(),
        });
        let whole = Amounts::from([("parts".to_string(), count.saturating_mul(1000))]);
        if let Some(parent_ref) = parent_ref {
            self.by_reference.insert(parent_ref.clone(), parent.clone());
        }
        self.consumers.insert(parent, vec![(at, whole)]);
        for (key, reference) in parts {
            let one = Amounts::from([("parts".to_string(), 1000)]);
            self.by_reference.insert((*reference).clone(), key.clone());
            self.consumers.insert(key.clone(), vec![(at, one)]);
        }
    }
}

/// Counter sets, their consumers, and what allocations outside the ledger consume of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterBook {
    index: Arc<CounterIndex>,
    /// Set index → counter → amount consumed by allocated devices the ledger does not count.
    outside: BTreeMap<usize, Amounts>,
    /// Those devices: taken, so never reported blocked.
    allocated: BTreeSet<DeviceKey>,
}

impl CounterBook {
    /// The book of `index`, with what the allocated devices `outside` consume (a device
    /// named twice is counted once: an allocated device consumes its counters once, however
    /// many claims share it).
    pub fn new<'a>(
        index: Arc<CounterIndex>,
        outside: impl IntoIterator<Item = &'a DeviceRef>,
    ) -> Self {
        let mut used: BTreeMap<usize, Amounts> = BTreeMap::new();
        let mut counted = BTreeSet::new();
        for device in outside {
            let Some(key) = index.by_reference.get(device) else {
                continue;
            };
            if !counted.insert(key) {
                continue;
            }
            for (at, amounts) in index.consumers.get(key).into_iter().flatten() {
                let set = used.entry(*at).or_default();
                for (counter, amount) in amounts {
                    let entry = set.entry(counter.clone()).or_default();
                    *entry = entry.saturating_add(*amount);
                }
            }
        }
        let allocated = counted.into_iter().cloned().collect();
        Self {
            index,
            outside: used,
            allocated,
        }
    }

    /// True when no device of the fleet consumes counters.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// True when both books read the same counter sets (one fleet view's index).
    pub fn same_sets(&self, other: &CounterBook) -> bool {
        Arc::ptr_eq(&self.index, &other.index) || self.index == other.index
    }

    /// The same sets, with nothing allocated outside the ledger.
    pub fn without_outside(&self) -> CounterBook {
        CounterBook::new(self.index.clone(), [])
    }

    /// True when `device` consumes counters.
    pub fn counts(&self, device: &DeviceKey) -> bool {
        self.index.consumers.contains_key(device)
    }

    /// Why `device` cannot be held beside the devices `held` picks out (and what is allocated
    /// outside the ledger): the first counter it needs more of than is left, with the held
    /// devices of that set that use it; `None` when it fits, or consumes no counters.
    pub fn misfit(
        &self,
        device: &DeviceKey,
        held: impl Fn(&DeviceKey) -> bool,
    ) -> Option<(String, Vec<&DeviceKey>)> {
        let uses = self.index.consumers.get(device)?;
        for (at, need) in uses {
            let set = &self.index.sets[*at];
            let mut used = self.outside.get(at).cloned().unwrap_or_default();
            let mut holders = Vec::new();
            for member in set.members.iter().filter(|m| *m != device && held(m)) {
                holders.push(member);
                for (counter, amount) in self.consumption(member, *at) {
                    let entry = used.entry(counter.clone()).or_default();
                    *entry = entry.saturating_add(*amount);
                }
            }
            for (counter, amount) in need {
                let total = set.capacity.get(counter).copied().unwrap_or(0);
                let left = total.saturating_sub(used.get(counter).copied().unwrap_or(0));
                if *amount > left {
                    // The holders that use up this counter, not every holder of the set.
                    holders.retain(|member| {
                        self.consumption(member, *at)
                            .any(|(name, amount)| name == counter && *amount > 0)
                    });
                    let why = format!(
                        "counter set {}: needs {} {counter}, {} of {} left",
                        set.name,
                        shown(*amount),
                        shown(left),
                        shown(total)
                    );
                    return Some((why, holders));
                }
            }
        }
        None
    }

    /// The devices not `held` that cannot be held beside those that are (and what is
    /// allocated outside the ledger), with why: each partition of a GPU held whole, the GPU
    /// and the overlapping partitions of one held in part. Only sets with a held member or
    /// an outside allocation are looked at.
    pub fn blocked(&self, held: impl Fn(&DeviceKey) -> bool) -> Vec<(&DeviceKey, String)> {
        let mut blocked = Vec::new();
        for (at, set) in self.index.sets.iter().enumerate() {
            if !set.members.iter().any(&held) && !self.outside.contains_key(&at) {
                continue;
            }
            for member in set
                .members
                .iter()
                .filter(|m| !held(m) && !self.allocated.contains(*m))
            {
                if let Some((why, _)) = self.misfit(member, &held) {
                    blocked.push((member, why));
                }
            }
        }
        blocked.sort();
        blocked.dedup_by(|a, b| a.0 == b.0);
        blocked
    }

    /// What `device` consumes of set `at`.
    fn consumption(&self, device: &DeviceKey, at: usize) -> impl Iterator<Item = (&String, &u128)> {
        self.index
            .consumers
            .get(device)
            .into_iter()
            .flatten()
            .filter(move |(set, _)| *set == at)
            .flat_map(|(_, amounts)| amounts.iter())
    }
}

/// A count of thousandths as a quantity reads: whole units where exact, else thousandths.
fn shown(millis: u128) -> String {
    if millis.is_multiple_of(1000) {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::counters::published_counters;
    use crate::testing::dra::fixture_slices;

    const NODE: &str = "h100-mig-node";

    /// The dynamic-MIG fixture's book, planner ids being the DRA device names.
    fn book(outside: &[&str]) -> CounterBook {
        let slices = fixture_slices(&["nvidia-h100-dynamic-mig.yaml"]);
        let published = published_counters(&slices);
        let outside: Vec<DeviceRef> = outside
            .iter()
            .map(|device| DeviceRef {
                driver: "gpu.nvidia.com".into(),
                pool: NODE.into(),
                device: (*device).into(),
            })
            .collect();
        let index = CounterIndex::new(&published, |d| Some((NODE.to_string(), d.device.clone())));
        CounterBook::new(Arc::new(index), &outside)
    }

    fn key(device: &str) -> DeviceKey {
        (NODE.to_string(), device.to_string())
    }

    fn held<'a>(devices: &'a [&'a str]) -> impl Fn(&DeviceKey) -> bool + 'a {
        move |k: &DeviceKey| devices.iter().any(|d| k.1 == *d)
    }

    #[test]
    fn a_whole_gpu_and_its_partitions_exclude_each_other() {
        let book = book(&[]);
        assert!(book.counts(&key("gpu-0")) && book.counts(&key("gpu-0-mig-3g40gb-9-0")));
        assert_eq!(book.misfit(&key("gpu-0"), held(&[])), None);
        let (why, holders) = book
            .misfit(&key("gpu-0"), held(&["gpu-0-mig-1g10gb-19-3"]))
            .expect("one MIG device blocks the whole GPU");
        assert!(why.contains("gpu-0-counter-set"), "{why}");
        assert_eq!(holders, vec![&key("gpu-0-mig-1g10gb-19-3")]);
        assert!(
            book.misfit(&key("gpu-0-mig-3g40gb-9-4"), held(&["gpu-0"]))
                .is_some(),
            "the whole GPU blocks every partition"
        );
        assert_eq!(
            book.misfit(&key("gpu-1-mig-3g40gb-9-4"), held(&["gpu-0"])),
            None,
            "another GPU's set is not touched"
        );
    }

    #[test]
    fn partitions_fit_side_by_side_until_they_overlap() {
        let book = book(&[]);
        let first = ["gpu-0-mig-3g40gb-9-0"];
        assert_eq!(
            book.misfit(&key("gpu-0-mig-3g40gb-9-4"), held(&first)),
            None
        );
        assert!(
            book.misfit(&key("gpu-0-mig-1g10gb-19-0"), held(&first))
                .is_some(),
            "memory slice 0 is the first 3g.40gb's"
        );
        let blocked: Vec<String> = book
            .blocked(held(&first))
            .into_iter()
            .map(|(k, _)| k.1.clone())
            .collect();
        assert!(blocked.contains(&"gpu-0".to_string()), "{blocked:?}");
        assert!(!blocked.contains(&"gpu-0-mig-3g40gb-9-4".to_string()));
        assert!(
            !blocked.iter().any(|d| d.starts_with("gpu-1")),
            "{blocked:?}"
        );
        let both = ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"];
        assert!(
            book.misfit(&key("gpu-0-mig-1g10gb-19-6"), held(&both))
                .is_some(),
            "two 3g.40gb take all eight memory slices"
        );
    }

    #[test]
    fn what_claims_outside_the_ledger_consume_counts_once() {
        let book = book(&["gpu-0-mig-3g40gb-9-4", "gpu-0-mig-3g40gb-9-4"]);
        assert!(book.misfit(&key("gpu-0"), held(&[])).is_some());
        assert_eq!(book.misfit(&key("gpu-0-mig-3g40gb-9-0"), held(&[])), None);
        assert!(
            book.misfit(
                &key("gpu-0-mig-3g40gb-9-0"),
                held(&["gpu-0-mig-1g10gb-19-0"])
            )
            .is_some()
        );
    }
}
