//! Partitionable devices (KEP-4815, `resource.k8s.io/v1`): which published devices can no
//! longer be allocated because the counters they consume are used up.
//!
//! A driver publishes named counter sets per pool (`spec.sharedCounters`, in a slice of
//! their own since 1.36: a slice holds devices or counter sets, never both), and each device
//! lists what it consumes from them (`consumesCounters`). NVIDIA's dynamic MIG publishes one
//! set per GPU that the whole GPU consumes entirely and each MIG profile in part; AMD's
//! AutoPartition one `partition-mode` mutex per GPU that every partition layout consumes. An
//! allocated device consumes its counters once, however many claims share it (the
//! scheduler's rule for `allowMultipleAllocations` devices); a device not allocated is
//! allocatable only while everything it consumes fits in what is left. So once a MIG slice
//! is allocated, no claim names the whole GPU, yet nobody may allocate it.
//!
//! The rule here is the scheduler's (`dynamic-resource-allocation/structured`, 1.37), with
//! one difference: what the scheduler skips because API validation should have refused it (a
//! counter set or counter a device names that the pool does not publish) and any quantity
//! that cannot be read block the device here, with a reason, instead of being ignored.
//! Slices are written by other parties: nothing in them makes this panic.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Counter, ResourceSlice};

use super::DeviceRef;
use super::drivers;
use super::pools::complete_generation;
use crate::api::quantity;
use crate::names::truncate_at_char_boundary;

/// Holders named in one reason; the rest are counted.
const MAX_HOLDERS_NAMED: usize = 2;

/// Strings copied from a slice into a reason are cut to this many bytes (a pool name's
/// length; counter and set names are DNS labels).
const MAX_TEXT: usize = 253;

/// A counter's amount in thousandths of its unit, or the text that is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Amount {
    Known(u128),
    Unreadable(String),
}

impl Amount {
    fn of(counter: &Counter) -> Self {
        match quantity::parse_millis(&counter.value) {
            Some(millis) => Self::Known(millis),
            None => Self::Unreadable(bounded(&counter.value.0)),
        }
    }
}

/// What one device consumes: counter set → counter → amount.
type Consumption = BTreeMap<String, BTreeMap<String, Amount>>;

/// One pool's counter sets and the devices that consume them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolCounters {
    driver: String,
    pool: String,
    /// Counter set → counter → amount published.
    sets: BTreeMap<String, BTreeMap<String, Amount>>,
    /// Counter sets published more than once in the pool (names must be unique).
    duplicated: BTreeSet<String>,
    /// Device name → what it consumes, for the devices that consume counters.
    consumers: BTreeMap<String, Consumption>,
}

/// One counter after the allocated devices took their share.
#[derive(Debug, Default)]
struct Used {
    millis: u128,
    /// An allocated device's consumption that is not a quantity: how much is left is unknown.
    unreadable: Option<String>,
}

impl PoolCounters {
    /// The counter sets and consumers of one pool, from the slices of its current generation.
    pub fn new(driver: &str, pool: &str, slices: &[&ResourceSlice]) -> Self {
        let mut counters = Self {
            driver: bounded(driver),
            pool: bounded(pool),
            ..Self::default()
        };
        for slice in slices {
            for set in slice.spec.shared_counters.iter().flatten() {
                let amounts = set
                    .counters
                    .iter()
                    .map(|(name, counter)| (name.clone(), Amount::of(counter)))
                    .collect();
                if counters.sets.insert(set.name.clone(), amounts).is_some() {
                    counters.duplicated.insert(set.name.clone());
                }
            }
            for device in slice.spec.devices.iter().flatten() {
                let Some(consumes) = device.consumes_counters.as_ref().filter(|c| !c.is_empty())
                else {
                    continue;
                };
                let mut consumption = Consumption::new();
                for entry in consumes {
                    let set = consumption.entry(entry.counter_set.clone()).or_default();
                    for (name, counter) in &entry.counters {
                        set.insert(name.clone(), Amount::of(counter));
                    }
                }
                counters.consumers.insert(device.name.clone(), consumption);
            }
        }
        counters
    }

    /// True when no device of the pool consumes counters.
    pub fn is_empty(&self) -> bool {
        self.consumers.is_empty()
    }

    /// Why each device that consumes counters cannot be allocated now, by device name, given
    /// the pool's allocated devices (device name → who holds it, `namespace/claim`). An
    /// allocated device is never in the answer: it is taken, not blocked.
    pub fn blocked(&self, allocated: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, String> {
        let mut used: BTreeMap<(&str, &str), Used> = BTreeMap::new();
        // Counter set → `holder (device)` of the allocated devices that consume from it.
        let mut users: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (device, holders) in allocated {
            let Some(consumption) = self.consumers.get(device) else {
                continue;
            };
            for (set, amounts) in consumption {
                let holder = holders.first().map_or("", String::as_str);
                users
                    .entry(set.as_str())
                    .or_default()
                    .push(format!("{holder} ({device})"));
                for (counter, amount) in amounts {
                    let entry = used.entry((set.as_str(), counter.as_str())).or_default();
                    match amount {
                        Amount::Known(millis) => {
                            entry.millis = entry.millis.saturating_add(*millis);
                        }
                        Amount::Unreadable(text) => {
                            entry.unreadable = Some(format!(
                                "{device}'s consumption of {counter} from counter set {set} \
                                 ({text:?}) is not a quantity"
                            ));
                        }
                    }
                }
            }
        }
        self.consumers
            .iter()
            .filter(|(device, _)| !allocated.contains_key(*device))
            .filter_map(|(device, consumption)| {
                let why = self.misfit(consumption, &used, &users)?;
                Some((device.clone(), why))
            })
            .collect()
    }

    /// The first reason `consumption` does not fit what is left, or `None` when it fits.
    fn misfit(
        &self,
        consumption: &Consumption,
        used: &BTreeMap<(&str, &str), Used>,
        users: &BTreeMap<&str, Vec<String>>,
    ) -> Option<String> {
        let pool = format!("{}/{}", self.driver, self.pool);
        for (set, amounts) in consumption {
            let set_name = bounded(set);
            let Some(available) = self.sets.get(set) else {
                return Some(format!(
                    "consumes counter set {set_name}, which pool {pool} does not publish"
                ));
            };
            if self.duplicated.contains(set) {
                return Some(format!(
                    "counter set {set_name} is published more than once in pool {pool}"
                ));
            }
            for (counter, amount) in amounts {
                let counter_name = bounded(counter);
                let need = match amount {
                    Amount::Known(millis) => *millis,
                    Amount::Unreadable(text) => {
                        return Some(format!(
                            "its consumption of {counter_name} from counter set {set_name} \
                             ({text:?}) is not a quantity"
                        ));
                    }
                };
                let total = match available.get(counter) {
                    Some(Amount::Known(millis)) => *millis,
                    Some(Amount::Unreadable(text)) => {
                        return Some(format!(
                            "counter {counter_name} of counter set {set_name} in pool {pool} \
                             ({text:?}) is not a quantity"
                        ));
                    }
                    None => {
                        return Some(format!(
                            "counter set {set_name} in pool {pool} has no counter {counter_name}"
                        ));
                    }
                };
                let taken = used.get(&(set.as_str(), counter.as_str()));
                if let Some(why) = taken.and_then(|t| t.unreadable.as_ref()) {
                    return Some(format!("counter set {set_name} in pool {pool}: {why}"));
                }
                let left = total.saturating_sub(taken.map_or(0, |t| t.millis));
                if need > left {
                    let by = users
                        .get(set.as_str())
                        .map(|users| format!(", used by {}", named(users)))
                        .unwrap_or_default();
                    return Some(format!(
                        "counter set {set_name} in pool {pool}: needs {} {counter_name}, {} of {} \
                         left{by}",
                        shown(need),
                        shown(left),
                        shown(total)
                    ));
                }
            }
        }
        None
    }
}

/// The published devices of known drivers that cannot be allocated now because the counters
/// they consume do not fit what the `allocated` devices (each with who holds it,
/// `namespace/claim`) left, with why. Pools follow DRA's consumer rules as
/// [`super::slices::published_devices`] reads them (node-local, current and complete
/// generation); a device allocated twice consumes its counters once.
pub fn blocked_by_counters<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
    allocated: impl IntoIterator<Item = (DeviceRef, String)>,
) -> BTreeMap<DeviceRef, String> {
    let pools = counter_pools(slices);
    if pools.is_empty() {
        return BTreeMap::new();
    }
    let mut held: BTreeMap<(String, String), BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for (device, holder) in allocated {
        held.entry((device.driver, device.pool))
            .or_default()
            .entry(device.device)
            .or_default()
            .push(holder);
    }
    let mut blocked = BTreeMap::new();
    let none = BTreeMap::new();
    for ((driver, pool), counters) in pools {
        let allocated = held.get(&(driver.clone(), pool.clone())).unwrap_or(&none);
        for (device, why) in counters.blocked(allocated) {
            let reference = DeviceRef {
                driver: driver.clone(),
                pool: pool.clone(),
                device,
            };
            blocked.insert(reference, why);
        }
    }
    blocked
}

/// The pools of known drivers that publish counter sets, each read from its node-local
/// slices of the current, complete generation (as [`super::slices::published_devices`]
/// reads pools), by `(driver, pool)`.
fn counter_pools<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
) -> Vec<((String, String), PoolCounters)> {
    let mut pools: BTreeMap<(&str, &str), Vec<&ResourceSlice>> = BTreeMap::new();
    let mut with_counters: BTreeSet<(&str, &str)> = BTreeSet::new();
    for slice in slices {
        let spec = &slice.spec;
        if drivers::known(&spec.driver).is_none()
            || spec.node_name.as_deref().is_none_or(str::is_empty)
        {
            continue;
        }
        let key = (spec.driver.as_str(), spec.pool.name.as_str());
        if spec.shared_counters.as_ref().is_some_and(|s| !s.is_empty()) {
            with_counters.insert(key);
        }
        pools.entry(key).or_default().push(slice);
    }
    with_counters
        .into_iter()
        .filter_map(|(driver, pool)| {
            let current = pools
                .get(&(driver, pool))
                .and_then(|slices| complete_generation(driver, pool, slices, &mut Vec::new()))?;
            let counters = PoolCounters::new(driver, pool, &current);
            Some(((driver.to_string(), pool.to_string()), counters))
        })
        .collect()
}

/// A counter set by its pool: `(driver, pool, set name)`.
pub type CounterSetRef = (String, String, String);

/// The counters of partitionable devices as numbers: what each counter set holds and what
/// each device consumes of it, in thousandths of the counter's unit. For keeping count of
/// devices someone is about to hold (the controller's own partitions, between its commit and
/// the claim's allocation), where [`blocked_by_counters`] only sees what is allocated.
/// Sets and consumptions that do not parse, or that a pool publishes twice, are left out:
/// [`blocked_by_counters`] already blocks every device that consumes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishedCounters {
    /// Counter set → counter → amount published.
    pub sets: BTreeMap<CounterSetRef, BTreeMap<String, u128>>,
    /// Device → counter set → counter → amount consumed.
    pub consumers: BTreeMap<DeviceRef, BTreeMap<CounterSetRef, BTreeMap<String, u128>>>,
}

/// The counter sets of known drivers' pools and what their devices consume, read as
/// [`blocked_by_counters`] reads them (node-local pools of their current, complete generation).
pub fn published_counters<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
) -> PublishedCounters {
    let mut published = PublishedCounters::default();
    for ((driver, pool), counters) in counter_pools(slices) {
        let set_ref = |set: &str| (driver.clone(), pool.clone(), set.to_string());
        for (set, amounts) in &counters.sets {
            if counters.duplicated.contains(set) {
                continue;
            }
            if let Some(known) = known_amounts(amounts) {
                published.sets.insert(set_ref(set), known);
            }
        }
        for (device, consumption) in &counters.consumers {
            let known: Option<BTreeMap<CounterSetRef, BTreeMap<String, u128>>> = consumption
                .iter()
                .map(|(set, amounts)| Some((set_ref(set), known_amounts(amounts)?)))
                .collect();
            let Some(known) = known.filter(|k| k.keys().all(|s| published.sets.contains_key(s)))
            else {
                continue;
            };
            let reference = DeviceRef {
                driver: driver.clone(),
                pool: pool.clone(),
                device: device.clone(),
            };
            published.consumers.insert(reference, known);
        }
    }
    published
}

/// Every amount of `amounts` as a number, or `None` when one is not a quantity.
fn known_amounts(amounts: &BTreeMap<String, Amount>) -> Option<BTreeMap<String, u128>> {
    amounts
        .iter()
        .map(|(name, amount)| match amount {
            Amount::Known(millis) => Some((name.clone(), *millis)),
            Amount::Unreadable(_) => None,
        })
        .collect()
}

/// A count of thousandths as a quantity reads: whole units where exact (`132`,
/// `85899345920`), else thousandths (`500m`).
fn shown(millis: u128) -> String {
    if millis.is_multiple_of(1000) {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    }
}

/// The first [`MAX_HOLDERS_NAMED`] of `names`, then how many more.
fn named(names: &[String]) -> String {
    let mut text = names
        .iter()
        .take(MAX_HOLDERS_NAMED)
        .map(|n| truncate_at_char_boundary(n, 2 * 253).to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > MAX_HOLDERS_NAMED {
        text.push_str(&format!(" and {} more", names.len() - MAX_HOLDERS_NAMED));
    }
    text
}

fn bounded(text: &str) -> String {
    truncate_at_char_boundary(text, MAX_TEXT).to_string()
}

#[cfg(test)]
mod tests;
