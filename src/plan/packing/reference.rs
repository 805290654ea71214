//! The placement code as it was before issue 11 (linear scans per device and per replica),
//! kept as a reference: the property test in the parent module checks that the indexed
//! version builds the same classes and makes the same placements on random fleets.

#![allow(clippy::all, clippy::pedantic)]

use std::collections::{BTreeMap, BTreeSet};

use super::{Assignment, Bin, ClassKey, DeviceClass, FreeDevices, Group, Placement, Shape};
use crate::hardware::Family;
use crate::plan::inventory::{NodeSpec, Reservations};
use crate::plan::units::Bytes;

/// Indexes `nodes`, leaving out `reserved` devices.
pub(super) fn new<'a>(nodes: &'a [NodeSpec], reserved: &Reservations) -> FreeDevices<'a> {
    let order = super::name_order(nodes);
    let mut by_key: BTreeMap<ClassKey<'a>, DeviceClass<'a>> = BTreeMap::new();
    for &node_index in &order {
        let node = &nodes[node_index as usize];
        index_node(node, node_index, reserved, &mut by_key);
    }
    let mut classes: Vec<DeviceClass<'a>> = by_key.into_values().collect();
    for class in &mut classes {
        class.count_nodes_by_free();
    }
    FreeDevices { nodes, classes }
}

/// Places `shape` on devices of `class`, using at most `max_nodes` nodes.
pub(super) fn place(
    fleet: &FreeDevices<'_>,
    class: usize,
    shape: Shape,
    max_nodes: Option<u32>,
) -> Option<Placement> {
    let class_ref = fleet.classes.get(class)?;
    let tp = shape.tp.max(1);
    let needed = u64::from(shape.pp) * u64::from(shape.replicas);
    if needed == 0 || fleet.group_capacity(class, tp) < needed {
        return None;
    }
    let mut state = PlacementState::new(fleet, class_ref, tp);
    let mut assignments = Vec::new();
    let mut on_fabric = true;
    for replica in 0..shape.replicas {
        let (groups, fabric_ok) = state.place_replica(shape.pp)?;
        on_fabric &= fabric_ok;
        for (stage, (bin, devices)) in groups.into_iter().enumerate() {
            let node = fleet.node(class_ref.bins[bin].node);
            assignments.push(Assignment {
                replica,
                stage: u32::try_from(stage).unwrap_or(u32::MAX),
                node: node.name.clone(),
                devices: devices
                    .iter()
                    .map(|&d| node.devices[usize::from(d)].id.clone())
                    .collect(),
            });
        }
    }
    let nodes = assignments
        .iter()
        .map(|a| a.node.as_str())
        .collect::<BTreeSet<_>>()
        .len();
    let nodes = u32::try_from(nodes).unwrap_or(u32::MAX);
    if max_nodes.is_some_and(|max| nodes > max) {
        return None;
    }
    Some(Placement {
        assignments,
        nodes,
        tp_in_fast_domain: state.all_in_fast_domain,
        pipeline_on_fabric: on_fabric,
    })
}

/// Places `count` data-parallel devices (training): one node when one has room, else as
/// few nodes as possible. Devices on one node form one assignment.
pub(super) fn place_devices(
    fleet: &FreeDevices<'_>,
    class: usize,
    count: u32,
    max_nodes: Option<u32>,
) -> Option<Placement> {
    let mut placement = place(
        fleet,
        class,
        Shape {
            tp: 1,
            pp: count,
            replicas: 1,
        },
        max_nodes,
    )?;
    let mut merged: Vec<Assignment> = Vec::new();
    for assignment in placement.assignments {
        match merged.iter_mut().find(|a| a.node == assignment.node) {
            Some(existing) => existing.devices.extend(assignment.devices),
            None => merged.push(Assignment {
                stage: 0,
                ..assignment
            }),
        }
    }
    placement.assignments = merged;
    placement.tp_in_fast_domain = true;
    Some(placement)
}

/// Adds a node's free accelerators to the class index.
pub(super) fn index_node<'a>(
    node: &'a NodeSpec,
    node_index: u32,
    reserved: &Reservations,
    classes: &mut BTreeMap<ClassKey<'a>, DeviceClass<'a>>,
) {
    // (class key, domain) -> device indices; a node has a handful of devices.
    let mut groups: Vec<(ClassKey<'a>, Option<&'a str>, Vec<u16>)> = Vec::new();
    for (index, device) in node.devices.iter().enumerate().take(usize::from(u16::MAX)) {
        if device.family == Family::Cpu
            || device.memory == Bytes::ZERO
            || device.partitions_only
            || reserved.contains(&node.name, &device.id)
        {
            continue;
        }
        let key = ClassKey {
            family: device.family,
            product: &device.product,
            memory: device.memory,
            vendor: device.vendor,
            precisions: &device.precisions,
        };
        let domain = device.domain.as_deref();
        let index = u16::try_from(index).unwrap_or(u16::MAX);
        match groups
            .iter_mut()
            .find(|(k, d, _)| *k == key && *d == domain)
        {
            Some((_, _, list)) => list.push(index),
            None => groups.push((key, domain, vec![index])),
        }
    }
    groups.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let mut start = 0;
    while start < groups.len() {
        let key = groups[start].0;
        let end = start + groups[start..].iter().take_while(|g| g.0 == key).count();
        let mut domains: Vec<(bool, Vec<u16>)> = groups[start..end]
            .iter()
            .map(|(_, domain, list)| {
                let mut list = list.clone();
                list.sort_by(|&a, &b| {
                    node.devices[usize::from(a)]
                        .id
                        .cmp(&node.devices[usize::from(b)].id)
                });
                (domain.is_some(), list)
            })
            .collect();
        domains.sort_by_key(|(fast, list)| (!fast, list.first().copied()));
        let free = domains.iter().map(|(_, l)| l.len() as u32).sum::<u32>();
        let fast = domains
            .iter()
            .filter(|(f, _)| *f)
            .map(|(_, l)| l.len() as u32)
            .max()
            .unwrap_or(0);
        // An empty class, sampled from this node's first device of it (the struct's
        // constructor; the accounting below is the reference's own).
        let class = classes
            .entry(key)
            .or_insert_with(|| DeviceClass::open(node, &domains));
        class.free += free;
        class.nodes += 1;
        if free > class.largest_node {
            class.largest_node = free;
            class.template_node = &node.name;
        }
        class.largest_fast_domain = class.largest_fast_domain.max(fast);
        class.bins.push(Bin {
            node: node_index,
            domains: domains.into(),
            free,
        });
        start = end;
    }
}

/// Mutable state of one placement: free devices per bin and an ordered index of node
/// capacities (in TP groups).
pub(super) struct PlacementState<'f, 'a> {
    fleet: &'f FreeDevices<'a>,
    class: &'f DeviceClass<'a>,
    tp: u32,
    free: Vec<Vec<(bool, Vec<u16>)>>,
    /// (groups the bin can still hold, bin index) for bins holding at least one group.
    by_capacity: BTreeSet<(u32, usize)>,
    all_in_fast_domain: bool,
}

impl<'f, 'a> PlacementState<'f, 'a> {
    pub(super) fn new(fleet: &'f FreeDevices<'a>, class: &'f DeviceClass<'a>, tp: u32) -> Self {
        let by_capacity = class
            .bins
            .iter()
            .enumerate()
            .filter(|(_, bin)| bin.free >= tp)
            .map(|(index, bin)| (bin.free / tp, index))
            .collect();
        Self {
            fleet,
            class,
            tp,
            free: class.bins.iter().map(|b| b.domains.to_vec()).collect(),
            by_capacity,
            all_in_fast_domain: true,
        }
    }

    fn capacity(&self, bin: usize) -> u32 {
        self.free[bin]
            .iter()
            .map(|(_, l)| l.len() as u32)
            .sum::<u32>()
            / self.tp
    }

    /// Places one replica of `pp` groups; also says whether a multi-node replica stayed on one
    /// fabric.
    fn place_replica(&mut self, pp: u32) -> Option<(Vec<Group>, bool)> {
        // Best fit: the bin with the smallest capacity that still holds every stage; bins are
        // indexed in node-name order, so ties go to the first name.
        if let Some(&(_, bin)) = self.by_capacity.range((pp, 0)..).next() {
            let groups = (0..pp)
                .map(|_| self.take_group(bin))
                .collect::<Option<Vec<_>>>()?;
            return Some((groups, true));
        }
        let (bins, on_fabric) = self.spanning_bins(pp)?;
        let mut groups = Vec::new();
        for bin in bins {
            while groups.len() < pp as usize && self.capacity(bin) > 0 {
                groups.push(self.take_group(bin)?);
            }
        }
        (groups.len() == pp as usize).then_some((groups, on_fabric))
    }

    /// Bins for a replica that no single node can hold: the largest first, within the
    /// fabric that can hold the replica with the least room to spare.
    fn spanning_bins(&self, pp: u32) -> Option<(Vec<usize>, bool)> {
        let fabric_of = |bin: usize| self.fleet.node(self.class.bins[bin].node).fabric.as_deref();
        let mut room: BTreeMap<&str, u64> = BTreeMap::new();
        for &(capacity, bin) in &self.by_capacity {
            if let Some(fabric) = fabric_of(bin) {
                *room.entry(fabric).or_default() += u64::from(capacity);
            }
        }
        let fabric = room
            .iter()
            .filter(|(_, total)| **total >= u64::from(pp))
            .min_by_key(|(name, total)| (**total, **name))
            .map(|(name, _)| *name);
        // Largest first, and among equals the first by name (bins are in name order).
        let mut eligible: Vec<(u32, usize)> = self
            .by_capacity
            .iter()
            .filter(|&&(_, bin)| fabric.is_none() || fabric_of(bin) == fabric)
            .copied()
            .collect();
        eligible.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut chosen = Vec::new();
        let mut groups = 0u64;
        for (capacity, bin) in eligible {
            chosen.push((capacity, bin));
            groups += u64::from(capacity);
            if groups >= u64::from(pp) {
                break;
            }
        }
        if groups < u64::from(pp) {
            return None;
        }
        Some((
            chosen.into_iter().map(|(_, bin)| bin).collect(),
            fabric.is_some(),
        ))
    }

    /// Takes `tp` devices from `bin`: the smallest domain that holds them all, else the
    /// largest domains first.
    fn take_group(&mut self, bin: usize) -> Option<Group> {
        let tp = self.tp as usize;
        let before = self.capacity(bin);
        let domains = &mut self.free[bin];
        let whole = domains
            .iter()
            .enumerate()
            .filter(|(_, (_, list))| list.len() >= tp)
            .min_by_key(|(index, (fast, list))| (!*fast, list.len(), *index))
            .map(|(index, _)| index);
        let mut taken = Vec::with_capacity(tp);
        match whole {
            Some(index) => {
                let (fast, list) = &mut domains[index];
                if !*fast && tp > 1 {
                    self.all_in_fast_domain = false;
                }
                taken.extend(list.drain(..tp));
            }
            None => {
                self.all_in_fast_domain = false;
                let mut order: Vec<usize> = (0..domains.len()).collect();
                order.sort_by_key(|&i| (std::cmp::Reverse(domains[i].1.len()), i));
                for index in order {
                    let want = tp - taken.len();
                    let list = &mut domains[index].1;
                    let count = want.min(list.len());
                    taken.extend(list.drain(..count));
                }
            }
        }
        if taken.len() < tp {
            return None;
        }
        let after = self.capacity(bin);
        self.by_capacity.remove(&(before, bin));
        if after > 0 {
            self.by_capacity.insert((after, bin));
        }
        Some((bin, taken))
    }
}
