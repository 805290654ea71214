//! Fleet placement: which nodes and which device indices a plan uses.
//!
//! The fleet is indexed once per plan: free devices are grouped into *classes* (identical
//! product, memory and precisions — a TP group or a data-parallel job must not mix them) and,
//! per class, into one *bin* per node, itself split by scale-up domain. Nothing is cloned from
//! the inventories: bins hold device indices into the caller's [`NodeSpec`]s.
//!
//! Placing `replicas` replicas of `pp` stages of `tp` devices:
//! * a TP group stays inside one node, and inside one NVLink/XGMI domain when one is big
//!   enough (best fit among the node's domains);
//! * a replica goes to a single node when one can hold all its stages — the node that leaves
//!   the fewest groups unused (best fit), ties broken by node name;
//! * otherwise its stages span nodes, largest first so as few nodes as possible are used,
//!   all on one InfiniBand fabric when some fabric has room (pipeline traffic crosses nodes).
//!
//! Cost: indexing is linear in devices; each placement keeps an ordered set of node
//! capacities, so a replica costs `O(log nodes)` when it fits one node.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::hardware::{Family, Precision, Vendor};

use super::inventory::{DeviceSpec, NodeSpec, Reservations};
use super::units::Bytes;

/// Devices that can stand in for each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct ClassKey<'a> {
    family: Family,
    product: &'a str,
    memory: Bytes,
    vendor: Vendor,
    precisions: &'a BTreeSet<Precision>,
}

/// Free devices of one class on one node.
#[derive(Debug, Clone)]
struct Bin {
    /// Index into the fleet's nodes.
    node: u32,
    /// Devices by scale-up domain: (in a fast domain, device indices sorted by id).
    domains: Vec<(bool, Vec<u16>)>,
    free: u32,
}

/// One class of interchangeable devices across the fleet.
#[derive(Debug, Clone)]
pub struct DeviceClass<'a> {
    /// A representative device (product, memory, precisions, bandwidth).
    pub sample: &'a DeviceSpec,
    /// Free devices of the class in the whole fleet.
    pub free: u32,
    /// Most free devices of the class on one node (bounds TP).
    pub largest_node: u32,
    /// Most free devices of the class in one fast (NVLink/XGMI...) domain.
    pub largest_fast_domain: u32,
    /// Nodes with free devices of the class.
    pub nodes: u32,
    /// The node with the most free devices of the class (ties by name), as a model for
    /// "add more nodes like this one".
    pub template_node: &'a str,
    bins: Vec<Bin>,
}

/// The indexed fleet.
#[derive(Debug, Clone)]
pub struct Fleet<'a> {
    nodes: &'a [NodeSpec],
    /// Device classes, ordered by family, product and memory.
    pub classes: Vec<DeviceClass<'a>>,
}

/// Where one TP group of one stage of one replica runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Assignment {
    /// Replica index.
    pub replica: u32,
    /// Pipeline stage.
    pub stage: u32,
    /// Node name.
    pub node: String,
    /// Device ids on that node.
    pub devices: Vec<String>,
}

/// A complete placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// Every group, by replica then stage.
    pub assignments: Vec<Assignment>,
    /// Distinct nodes used.
    pub nodes: u32,
    /// Whether every TP group sits inside one fast domain.
    pub tp_in_fast_domain: bool,
    /// Whether every multi-node replica shares an InfiniBand fabric.
    pub pipeline_on_fabric: bool,
}

/// The shape to place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Devices per group (TP).
    pub tp: u32,
    /// Groups per replica (PP stages).
    pub pp: u32,
    /// Replicas.
    pub replicas: u32,
}

impl<'a> Fleet<'a> {
    /// Indexes `nodes`, leaving out `reserved` devices.
    pub fn new(nodes: &'a [NodeSpec], reserved: &Reservations) -> Self {
        let order = name_order(nodes);
        let mut by_key: BTreeMap<ClassKey<'a>, DeviceClass<'a>> = BTreeMap::new();
        for &node_index in &order {
            let node = &nodes[node_index as usize];
            index_node(node, node_index, reserved, &mut by_key);
        }
        Self {
            nodes,
            classes: by_key.into_values().collect(),
        }
    }

    /// The node a bin index refers to.
    fn node(&self, index: u32) -> &'a NodeSpec {
        &self.nodes[index as usize]
    }

    /// Free devices in the whole fleet.
    pub fn free_devices(&self) -> u32 {
        self.classes.iter().map(|c| c.free).sum()
    }

    /// TP groups of `tp` devices the class could host at once.
    pub fn group_capacity(&self, class: usize, tp: u32) -> u64 {
        let tp = tp.max(1);
        self.classes
            .get(class)
            .map_or(0, |c| c.bins.iter().map(|b| u64::from(b.free / tp)).sum())
    }

    /// Places `shape` on devices of `class`, using at most `max_nodes` nodes.
    pub fn place(&self, class: usize, shape: Shape, max_nodes: Option<u32>) -> Option<Placement> {
        let class_ref = self.classes.get(class)?;
        let tp = shape.tp.max(1);
        let needed = u64::from(shape.pp) * u64::from(shape.replicas);
        if needed == 0 || self.group_capacity(class, tp) < needed {
            return None;
        }
        let mut state = PlacementState::new(self, class_ref, tp);
        let mut assignments = Vec::new();
        let mut on_fabric = true;
        for replica in 0..shape.replicas {
            let (groups, fabric_ok) = state.place_replica(shape.pp)?;
            on_fabric &= fabric_ok;
            for (stage, (bin, devices)) in groups.into_iter().enumerate() {
                let node = self.node(class_ref.bins[bin].node);
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
    pub fn place_devices(
        &self,
        class: usize,
        count: u32,
        max_nodes: Option<u32>,
    ) -> Option<Placement> {
        let mut placement = self.place(
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
}

/// Node indices sorted by name (cheap when the input is already sorted, as directories are).
fn name_order(nodes: &[NodeSpec]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..u32::try_from(nodes.len()).unwrap_or(u32::MAX)).collect();
    if !nodes.windows(2).all(|pair| pair[0].name <= pair[1].name) {
        order.sort_by(|&a, &b| nodes[a as usize].name.cmp(&nodes[b as usize].name));
    }
    order
}

/// Adds a node's free accelerators to the class index.
fn index_node<'a>(
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
        let sample = &node.devices[usize::from(domains[0].1[0])];
        let class = classes.entry(key).or_insert_with(|| DeviceClass {
            sample,
            free: 0,
            largest_node: 0,
            largest_fast_domain: 0,
            nodes: 0,
            template_node: &node.name,
            bins: Vec::new(),
        });
        class.free += free;
        class.nodes += 1;
        if free > class.largest_node {
            class.largest_node = free;
            class.template_node = &node.name;
        }
        class.largest_fast_domain = class.largest_fast_domain.max(fast);
        class.bins.push(Bin {
            node: node_index,
            domains,
            free,
        });
        start = end;
    }
}

/// A TP group: the bin it came from and the device indices taken.
type Group = (usize, Vec<u16>);

/// Mutable state of one placement: free devices per bin and an ordered index of node
/// capacities (in TP groups).
struct PlacementState<'f, 'a> {
    fleet: &'f Fleet<'a>,
    class: &'f DeviceClass<'a>,
    tp: u32,
    free: Vec<Vec<(bool, Vec<u16>)>>,
    /// (groups the bin can still hold, bin index) for bins holding at least one group.
    by_capacity: BTreeSet<(u32, usize)>,
    all_in_fast_domain: bool,
}

impl<'f, 'a> PlacementState<'f, 'a> {
    fn new(fleet: &'f Fleet<'a>, class: &'f DeviceClass<'a>, tp: u32) -> Self {
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
            free: class.bins.iter().map(|b| b.domains.clone()).collect(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::shorthand::parse_hardware;

    fn fleet_of(spec: &str) -> Vec<NodeSpec> {
        parse_hardware(spec).unwrap()
    }

    #[test]
    fn classes_group_identical_devices() {
        let nodes = fleet_of("2x8xH100,1x4xL4,1x2xA100-40GB");
        let fleet = Fleet::new(&nodes, &Reservations::none());
        assert_eq!(fleet.classes.len(), 3);
        let h100 = fleet
            .classes
            .iter()
            .find(|c| c.sample.product.contains("H100"))
            .unwrap();
        assert_eq!((h100.free, h100.largest_node, h100.nodes), (16, 8, 2));
        assert_eq!(fleet.free_devices(), 22);
    }

    #[test]
    fn best_fit_prefers_the_node_with_least_room() {
        let mut nodes = fleet_of("1x8xH100,1x8xH100");
        nodes[0].name = "big".into();
        nodes[1].name = "small".into();
        let mut reserved = Reservations::none();
        for d in 0..6 {
            reserved.insert("small", format!("gpu{d}"));
        }
        let fleet = Fleet::new(&nodes, &reserved);
        let placement = fleet
            .place(
                0,
                Shape {
                    tp: 2,
                    pp: 1,
                    replicas: 1,
                },
                None,
            )
            .unwrap();
        assert_eq!(placement.assignments[0].node, "small");
        assert_eq!(placement.assignments[0].devices, ["gpu6", "gpu7"]);
    }

    #[test]
    fn ties_go_to_the_first_name() {
        let nodes = fleet_of("3x8xH100");
        let fleet = Fleet::new(&nodes, &Reservations::none());
        let placement = fleet
            .place(
                0,
                Shape {
                    tp: 8,
                    pp: 1,
                    replicas: 1,
                },
                None,
            )
            .unwrap();
        assert_eq!(placement.assignments[0].node, "h100-0-0");
    }

    #[test]
    fn pipeline_spans_nodes_on_one_fabric() {
        let mut nodes = fleet_of("2x8xH100+ib,2x8xH100");
        nodes[2].fabric = Some("other".into());
        let fleet = Fleet::new(&nodes, &Reservations::none());
        let placement = fleet
            .place(
                0,
                Shape {
                    tp: 8,
                    pp: 2,
                    replicas: 1,
                },
                None,
            )
            .unwrap();
        assert_eq!(placement.nodes, 2);
        assert!(placement.pipeline_on_fabric);
        let used: Vec<_> = placement
            .assignments
            .iter()
            .map(|a| a.node.as_str())
            .collect();
        assert_eq!(used, ["h100-0-0", "h100-0-1"]);
        assert!(
            fleet
                .place(
                    0,
                    Shape {
                        tp: 8,
                        pp: 2,
                        replicas: 1
                    },
                    Some(1)
                )
                .is_none()
        );
    }

    #[test]
    fn tp_groups_prefer_one_fast_domain() {
        let mut nodes = fleet_of("1x8xH100");
        for (i, device) in nodes[0].devices.iter_mut().enumerate() {
            device.domain = Some(if i < 4 {
                "nvlink:a".into()
            } else {
                "nvlink:b".into()
            });
        }
        let fleet = Fleet::new(&nodes, &Reservations::none());
        let four = fleet
            .place(
                0,
                Shape {
                    tp: 4,
                    pp: 1,
                    replicas: 2,
                },
                None,
            )
            .unwrap();
        assert!(four.tp_in_fast_domain);
        assert_eq!(
            four.assignments[0].devices,
            ["gpu0", "gpu1", "gpu2", "gpu3"]
        );
        let eight = fleet
            .place(
                0,
                Shape {
                    tp: 8,
                    pp: 1,
                    replicas: 1,
                },
                None,
            )
            .unwrap();
        assert!(!eight.tp_in_fast_domain);
    }

    #[test]
    fn placement_never_reuses_a_device_and_respects_capacity() {
        let nodes = fleet_of("3x8xH100,2x4xH100");
        let fleet = Fleet::new(&nodes, &Reservations::none());
        let placement = fleet
            .place(
                0,
                Shape {
                    tp: 4,
                    pp: 2,
                    replicas: 4,
                },
                None,
            )
            .unwrap();
        let mut seen = BTreeSet::new();
        for a in &placement.assignments {
            assert_eq!(a.devices.len(), 4);
            for d in &a.devices {
                assert!(seen.insert((a.node.clone(), d.clone())), "{d} twice");
            }
        }
        assert_eq!(seen.len(), 32);
        assert!(
            fleet
                .place(
                    0,
                    Shape {
                        tp: 4,
                        pp: 2,
                        replicas: 5
                    },
                    None
                )
                .is_none()
        );
    }

    #[test]
    fn training_devices_merge_per_node() {
        let nodes = fleet_of("2x8xH100+ib");
        let fleet = Fleet::new(&nodes, &Reservations::none());
        let placement = fleet.place_devices(0, 12, None).unwrap();
        assert_eq!(placement.assignments.len(), 2);
        assert_eq!(
            placement.assignments[0].devices.len() + placement.assignments[1].devices.len(),
            12
        );
    }
}
