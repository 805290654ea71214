//! The fleet's free devices indexed once for many plans.
//!
//! [`FreeDevices::new`] looks at every device of every node: it builds each device's class key
//! and compares it with its neighbour's (product names, precision sets), and looks each node's
//! name up among the reservations. At 10,000 nodes that was about 10 ms a plan, half of the
//! controller's CPU in the 10,000-node scale run (issue 41), though the nodes change rarely
//! and each plan differs from the last only in the few nodes placements hold devices on.
//!
//! A [`FleetIndex`] keeps what does not depend on reservations: the nodes' name order, the
//! device classes, and each node's bins with nothing reserved. A plan's index is then the
//! index's bins, borrowed, for every node nothing is reserved on, and for the nodes the
//! reservations name (found by hashing those names: no other node's name is compared), the same
//! bins without the reserved devices (no device is classified again). The result is the same [`FreeDevices`] (a property test checks it
//! against [`FreeDevices::new`]), so the search and placement code do not know which built it.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use super::{
    ClassKey, DeviceClass, Domains, FreeDevices, Scratch, fast_domain, index_node, name_order,
};
use crate::plan::inventory::{NodeSpec, Reservations, any_partitions_only, any_shareable};

/// The free-device index of a set of nodes with nothing reserved, to build many plans'
/// [`FreeDevices`] from ([`FreeDevices::indexed`]). Holds no reference to the nodes: it is
/// used only with the very slice it was built from (same address and length), which the
/// caller must not change in between; with any other it is ignored.
#[derive(Debug, Clone)]
pub struct FleetIndex {
    /// The address and length of the nodes it indexes.
    of: (usize, usize),
    /// Node indices in name order.
    order: Vec<u32>,
    /// Each node name's first position in `order` (nodes sharing a name follow it).
    position: HashMap<String, u32>,
    /// How many device classes the nodes have.
    classes: usize,
    /// Per class, how many nodes have devices of it: the most bins a plan's class holds.
    class_bins: Vec<usize>,
    /// Per node, its bins with nothing reserved, in class order.
    bins: Vec<Vec<IndexedBin>>,
    /// Whether some device is published shareable (a plan may then size shares of one).
    any_shareable: bool,
    /// Whether some device is published only in partitions (a plan may take one of them).
    any_partitions_only: bool,
    /// Whether some node is in a multi-node NVLink domain (its classes' racks are measured).
    any_clique: bool,
}

/// A node's free devices of one class with nothing reserved.
#[derive(Debug, Clone)]
struct IndexedBin {
    /// Index into the class order.
    class: u32,
    domains: Domains,
    /// Most of them in one fast domain.
    fast: u32,
}

impl FleetIndex {
    /// Indexes `nodes` with nothing reserved: the cost of one [`FreeDevices::new`].
    pub fn new(nodes: &[NodeSpec]) -> Self {
        let order = name_order(nodes);
        let mut found: Vec<Vec<(ClassKey<'_>, Domains, u32)>> = vec![Vec::new(); nodes.len()];
        let mut class_of: BTreeMap<ClassKey<'_>, u32> = BTreeMap::new();
        let mut scratch = Scratch::default();
        let none = Reservations::none();
        for &node_index in &order {
            let node = &nodes[node_index as usize];
            index_node(node, (&none, false), &mut scratch, |group| {
                class_of.insert(group.key, 0);
                found[node_index as usize].push((group.key, group.domains, group.fast));
            });
        }
        // Numbered in key order, the order `FreeDevices` lists classes in.
        for (class, number) in class_of.values_mut().zip(0u32..) {
            *class = number;
        }
        let mut class_bins = vec![0; class_of.len()];
        for groups in &found {
            for (key, _, _) in groups {
                class_bins[class_of[key] as usize] += 1;
            }
        }
        let bins = found
            .into_iter()
            .map(|groups| {
                groups
                    .into_iter()
                    .map(|(key, domains, fast)| IndexedBin {
                        class: class_of[&key],
                        domains,
                        fast,
                    })
                    .collect()
            })
            .collect();
        let mut position = HashMap::with_capacity(nodes.len());
        for (at, &node_index) in (0u32..).zip(&order) {
            position
                .entry(nodes[node_index as usize].name.clone())
                .or_insert(at);
        }
        Self {
            of: address(nodes),
            order,
            position,
            classes: class_of.len(),
            class_bins,
            bins,
            any_shareable: any_shareable(nodes),
            any_partitions_only: any_partitions_only(nodes),
            any_clique: nodes.iter().any(|node| node.nvlink_clique().is_some()),
        }
    }

    /// True when some device of the nodes is published shareable.
    pub fn any_shareable(&self) -> bool {
        self.any_shareable
    }

    /// True when some device of the nodes is published only in partitions.
    pub fn any_partitions_only(&self) -> bool {
        self.any_partitions_only
    }

    /// True when this index was built from `nodes`.
    pub fn indexes(&self, nodes: &[NodeSpec]) -> bool {
        self.of == address(nodes)
    }
}

fn address(nodes: &[NodeSpec]) -> (usize, usize) {
    (nodes.as_ptr() as usize, nodes.len())
}

/// [`FreeDevices::indexed`]; `None` when `index` is not of `nodes`.
pub(super) fn free_devices<'a>(
    nodes: &'a [NodeSpec],
    index: &'a FleetIndex,
    reserved: &Reservations,
) -> Option<FreeDevices<'a>> {
    if !index.indexes(nodes) {
        return None;
    }
    // Opened on their first bin in name order, as `FreeDevices::new` opens them.
    let mut classes: Vec<Option<DeviceClass<'a>>> = (0..index.classes).map(|_| None).collect();
    // Positions in name order of the nodes something is reserved on: hashed names, so a
    // node nothing is reserved on costs no name comparison at all.
    let mut reserved_at = vec![false; index.order.len()];
    for name in reserved.nodes() {
        let Some(&first) = index.position.get(name) else {
            continue;
        };
        for at in first as usize..index.order.len() {
            if at > first as usize && nodes[index.order[at] as usize].name != name {
                break;
            }
            reserved_at[at] = true;
        }
    }
    for (&node_index, &reserved_here) in index.order.iter().zip(&reserved_at) {
        let node = &nodes[node_index as usize];
        let bins = &index.bins[node_index as usize];
        for bin in bins {
            let domains = if reserved_here {
                match without_reserved(node, &bin.domains, reserved) {
                    Some(domains) => Cow::Owned(domains),
                    None => continue,
                }
            } else {
                Cow::Borrowed(bin.domains.as_slice())
            };
            let fast = if reserved_here {
                fast_domain(&domains)
            } else {
                bin.fast
            };
            classes[bin.class as usize]
                .get_or_insert_with(|| {
                    let mut class = DeviceClass::open(node, &domains);
                    // Pushed once per node: sized up front, not regrown as a fleet fills it.
                    class.bins.reserve(index.class_bins[bin.class as usize]);
                    class
                })
                .add(node, node_index, domains, fast);
        }
    }
    Some(FreeDevices::finish(
        nodes,
        classes.into_iter().flatten().collect(),
        index.any_clique,
    ))
}

/// A bin's `domains` without the devices `reserved` takes or consumes shares of on `node`,
/// ordered as [`index_node`] orders them; `None` when nothing is left.
fn without_reserved(
    node: &NodeSpec,
    domains: &[(bool, Vec<u16>)],
    reserved: &Reservations,
) -> Option<Domains> {
    let taken = reserved.on_node(&node.name);
    let consumed = reserved.consumed_on(&node.name);
    let free = |device: &u16| {
        let id = &node.devices[usize::from(*device)].id;
        !taken.is_some_and(|ids| ids.contains(id))
            && !consumed.is_some_and(|ids| ids.contains_key(id))
    };
    let mut left: Domains = domains
        .iter()
        .filter_map(|(fast, list)| {
            let list: Vec<u16> = list.iter().copied().filter(free).collect();
            (!list.is_empty()).then_some((*fast, list))
        })
        .collect();
    left.sort_by_key(|(fast, list)| (!fast, list.first().copied()));
    (!left.is_empty()).then_some(left)
}
