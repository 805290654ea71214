//! Packing replicas onto nodes: which nodes and which device indices a plan uses.
//!
//! The fleet is indexed once per plan: free devices are grouped into *classes* (identical
//! product, memory and precisions — a TP group or a data-parallel job must not mix them) and,
//! per class, into one *bin* per node, itself split by scale-up domain. Nothing is cloned from
//! the inventories: bins hold device indices into the caller's [`NodeSpec`]s.
//!
//! Placing `replicas` replicas of `pp` stages of `tp` devices:
//! * a TP group stays inside one node, and inside one NVLink/XGMI domain when one is big
//!   enough (best fit among the node's domains); a group wider than any node goes to a
//!   multi-node NVLink domain (`packing/rack.rs`: GB200 NVL72 racks);
//! * a replica goes to a single node when one can hold all its stages — the node that leaves
//!   the fewest groups unused (best fit), ties broken by node name;
//! * otherwise its stages span nodes, largest first so as few nodes as possible are used,
//!   all on one InfiniBand fabric when some fabric has room (pipeline traffic crosses nodes).
//!
//! Cost, in devices `n`: indexing sorts each node's devices once, so it is `O(n log n)` however
//! many device classes or domains a node claims. A placement keeps ordered sets of node
//! capacities (per InfiniBand fabric too, once a replica has to span nodes) and, for each node
//! it touches, of that node's domain sizes; devices are taken by advancing a cursor. A TP group
//! costs `O(tp + log n)`, a replica that spans nodes drains every node it uses but the last,
//! and no step walks the whole fleet per replica or per group.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::hardware::{Family, Precision, Vendor};

use super::inventory::{DeviceSpec, NodeSpec, Reservations, find_node};
use super::memory::ServingDevice;
use super::units::Bytes;

impl<'a> DeviceClass<'a> {
    /// The class's device as the memory model sees it: what the runtime lets an engine allocate,
    /// and how many of the class's free devices share one NVLink-class domain (so whether a TP
    /// group's collectives run over that fabric or over PCIe).
    pub fn serving_device(&self) -> ServingDevice<'a> {
        ServingDevice::new(
            self.sample.vendor,
            self.sample.runtime_memory(),
            &self.sample.product,
        )
        .with_fast_domain(self.largest_fast_domain)
    }

    /// The widest TP group the class can form: a node's devices, or a multi-node NVLink
    /// domain's.
    pub fn largest_tp_group(&self) -> u32 {
        self.largest_node.max(self.largest_rack)
    }

    /// TP groups of `tp` devices the class could host at once: per node, or per multi-node
    /// NVLink domain for groups wider than a node. `O(nodes)`.
    pub fn group_capacity(&self, tp: u32) -> u64 {
        let tp = tp.max(1);
        if tp > self.largest_node {
            self.racks.iter().map(|&free| u64::from(free / tp)).sum()
        } else {
            self.node_groups(tp)
        }
    }

    /// TP groups of `tp` devices the class's nodes could host at once, from the count of nodes
    /// per number of free devices (the search asks this for every layout it tries).
    fn node_groups(&self, tp: u32) -> u64 {
        self.nodes_by_free
            .iter()
            .map(|&(free, nodes)| u64::from(free / tp) * u64::from(nodes))
            .sum()
    }

    /// Counts the class's nodes per number of free devices, once its bins are all added.
    fn count_nodes_by_free(&mut self) {
        let mut counts: Vec<u32> = Vec::new();
        for bin in &self.bins {
            let free = bin.free as usize;
            if counts.len() <= free {
                counts.resize(free + 1, 0);
            }
            counts[free] += 1;
        }
        self.nodes_by_free = (0u32..)
            .zip(counts)
            .filter(|&(_, nodes)| nodes > 0)
            .collect();
    }
}

impl<'a> DeviceClass<'a> {
    /// An empty class whose first bin will be `domains` of `node`.
    fn open(node: &'a NodeSpec, domains: &[(bool, Vec<u16>)]) -> Self {
        Self {
            sample: &node.devices[usize::from(domains[0].1[0])],
            free: 0,
            largest_node: 0,
            largest_fast_domain: 0,
            largest_rack: 0,
            racks: Vec::new(),
            nodes: 0,
            template_node: &node.name,
            bins: Vec::new(),
            nodes_by_free: Vec::new(),
        }
    }

    /// Adds `node`'s free devices of the class (nodes come in name order); `fast` is the most
    /// of them in one fast domain.
    fn add(
        &mut self,
        node: &'a NodeSpec,
        node_index: u32,
        domains: Cow<'a, [(bool, Vec<u16>)]>,
        fast: u32,
    ) {
        let free = domains.iter().map(|(_, l)| l.len() as u32).sum::<u32>();
        self.free = self.free.saturating_add(free);
        self.nodes = self.nodes.saturating_add(1);
        if free > self.largest_node {
            self.largest_node = free;
            self.template_node = &node.name;
        }
        self.largest_fast_domain = self.largest_fast_domain.max(fast);
        self.bins.push(Bin {
            node: node_index,
            domains,
            free,
        });
    }
}

/// Devices that can stand in for each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct ClassKey<'a> {
    family: Family,
    product: &'a str,
    memory: Bytes,
    vendor: Vendor,
    precisions: &'a BTreeSet<Precision>,
}

impl<'a> ClassKey<'a> {
    fn of(device: &'a DeviceSpec) -> Self {
        Self {
            family: device.family,
            product: &device.product,
            memory: device.memory,
            vendor: device.vendor,
            precisions: &device.precisions,
        }
    }
}

/// A node's devices of one class by scale-up domain: (in a fast domain, device indices sorted
/// by id), fast domains first.
type Domains = Vec<(bool, Vec<u16>)>;

/// Free devices of one class on one node.
#[derive(Debug, Clone)]
struct Bin<'a> {
    /// Index into the fleet's nodes.
    node: u32,
    /// Devices by scale-up domain: borrowed from a [`FleetIndex`] for a node nothing is
    /// reserved on, else indexed for this plan.
    domains: Cow<'a, [(bool, Vec<u16>)]>,
    free: u32,
}

/// One node's free devices of one class, as [`index_node`] finds them.
struct NodeGroup<'a> {
    key: ClassKey<'a>,
    domains: Domains,
    /// Most of them in one fast domain.
    fast: u32,
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
    /// Most free devices of the class in one fast (NVLink/XGMI...) domain: a node's, or a
    /// multi-node NVLink domain's.
    pub largest_fast_domain: u32,
    /// Most free devices of the class in one multi-node NVLink domain (nodes sharing an
    /// `nvidia.com/gpu.clique` label, a GB200 NVL72 rack); 0 when there is none.
    pub largest_rack: u32,
    /// Free devices of the class per multi-node NVLink domain, in clique order.
    racks: Vec<u32>,
    /// Nodes with free devices of the class.
    pub nodes: u32,
    /// The node with the most free devices of the class (ties by name), as a model for
    /// "add more nodes like this one".
    pub template_node: &'a str,
    bins: Vec<Bin<'a>>,
    /// (free devices, nodes with that many free), by free devices.
    nodes_by_free: Vec<(u32, u32)>,
}

/// The indexed fleet.
#[derive(Debug, Clone)]
pub struct FreeDevices<'a> {
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

impl Placement {
    /// A placement of `assignments`, or `None` when they span more than `max_nodes` nodes.
    pub(crate) fn capped(
        assignments: Vec<Assignment>,
        max_nodes: Option<u32>,
        tp_in_fast_domain: bool,
        pipeline_on_fabric: bool,
    ) -> Option<Self> {
        let nodes = assignments
            .iter()
            .map(|a| a.node.as_str())
            .collect::<BTreeSet<_>>()
            .len();
        let nodes = u32::try_from(nodes).unwrap_or(u32::MAX);
        if max_nodes.is_some_and(|max| nodes > max) {
            return None;
        }
        Some(Self {
            assignments,
            nodes,
            tp_in_fast_domain,
            pipeline_on_fabric,
        })
    }
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

impl<'a> FreeDevices<'a> {
    /// Indexes `nodes`, leaving out `reserved` devices and devices published only in
    /// partitions ([`DeviceSpec::partitions_only`]: never held whole).
    pub fn new(nodes: &'a [NodeSpec], reserved: &Reservations) -> Self {
        Self::indexing(nodes, reserved, false)
    }

    /// [`FreeDevices::new`] with the devices published only in partitions too: for a search
    /// whose plan is kept only if each replica then takes one of its device's partitions
    /// (`search::fraction::partition_view`).
    pub fn for_partitions(nodes: &'a [NodeSpec], reserved: &Reservations) -> Self {
        Self::indexing(nodes, reserved, true)
    }

    fn indexing(nodes: &'a [NodeSpec], reserved: &Reservations, partitions_only: bool) -> Self {
        let order = name_order(nodes);
        let mut by_key: BTreeMap<ClassKey<'a>, DeviceClass<'a>> = BTreeMap::new();
        let mut scratch = Scratch::default();
        for &node_index in &order {
            let node = &nodes[node_index as usize];
            index_node(node, (reserved, partitions_only), &mut scratch, |group| {
                by_key
                    .entry(group.key)
                    .or_insert_with(|| DeviceClass::open(node, &group.domains))
                    .add(node, node_index, Cow::Owned(group.domains), group.fast);
            });
        }
        Self::finish(nodes, by_key.into_values().collect(), true)
    }

    /// [`FreeDevices::new`] from an index of the same `nodes` built beforehand: only the nodes
    /// `reserved` names are indexed again, the others' bins are borrowed from `index`.
    /// `O(nodes + devices on reserved nodes)`, without comparing a device or a node name to
    /// another but the reserved nodes'. An index of other nodes is not used.
    pub fn indexed(nodes: &'a [NodeSpec], index: &'a FleetIndex, reserved: &Reservations) -> Self {
        index::free_devices(nodes, index, reserved).unwrap_or_else(|| Self::new(nodes, reserved))
    }

    /// The fleet of `classes` (in class order), with their multi-node NVLink domains measured
    /// when `cliques` says some node may be in one (a label lookup per bin otherwise spent for
    /// nothing).
    fn finish(nodes: &'a [NodeSpec], mut classes: Vec<DeviceClass<'a>>, cliques: bool) -> Self {
        for class in &mut classes {
            class.count_nodes_by_free();
            if cliques {
                rack::measure(nodes, class);
            }
        }
        Self { nodes, classes }
    }

    /// The fleet cut down to the `max` device classes with the most memory on one node
    /// (memory per device times the most free devices of the class on one node; ties by class
    /// order), kept in class order; the fleet itself when it has no more classes than that.
    pub fn roomiest(&self, max: usize) -> Cow<'_, FreeDevices<'a>> {
        if self.classes.len() <= max {
            return Cow::Borrowed(self);
        }
        let mut order: Vec<usize> = (0..self.classes.len()).collect();
        let room = |c: &DeviceClass<'_>| u128::from(c.sample.memory.0) * u128::from(c.largest_node);
        order.sort_by_key(|&i| (Reverse(room(&self.classes[i])), i));
        order.truncate(max);
        order.sort_unstable();
        Cow::Owned(FreeDevices {
            nodes: self.nodes,
            classes: order.into_iter().map(|i| self.classes[i].clone()).collect(),
        })
    }

    /// The node a bin index refers to.
    fn node(&self, index: u32) -> &'a NodeSpec {
        &self.nodes[index as usize]
    }

    /// Free devices in the whole fleet.
    pub fn free_devices(&self) -> u32 {
        self.classes
            .iter()
            .fold(0u32, |total, c| total.saturating_add(c.free))
    }

    /// TP groups of `tp` devices the class could host at once.
    pub fn group_capacity(&self, class: usize, tp: u32) -> u64 {
        let tp = tp.max(1);
        self.classes.get(class).map_or(0, |c| c.node_groups(tp))
    }

    /// The oldest kernel driver among the devices `assignments` use, when any states one.
    pub fn oldest_driver(&self, assignments: &[Assignment]) -> Option<String> {
        let versions = assignments.iter().flat_map(|assignment| {
            let node = find_node(self.nodes, &assignment.node);
            assignment.devices.iter().filter_map(move |id| {
                node?
                    .devices
                    .iter()
                    .find(|device| device.id == *id)?
                    .driver_version
                    .as_deref()
            })
        });
        crate::plan::engine::images::oldest_driver(versions).map(str::to_string)
    }

    /// Places `shape` on devices of `class`, using at most `max_nodes` nodes. TP groups wider
    /// than a node go to multi-node NVLink domains.
    pub fn place(&self, class: usize, shape: Shape, max_nodes: Option<u32>) -> Option<Placement> {
        let class_ref = self.classes.get(class)?;
        let tp = shape.tp.max(1);
        if tp > class_ref.largest_node {
            return rack::place(self, class_ref, shape, max_nodes);
        }
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
        Placement::capped(assignments, max_nodes, state.all_in_fast_domain, on_fabric)
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
        // Node name -> its entry in `merged`, in order of first use.
        let mut slot: HashMap<String, usize> = HashMap::new();
        for assignment in placement.assignments {
            match slot.get(&assignment.node) {
                Some(&index) => merged[index].devices.extend(assignment.devices),
                None => {
                    slot.insert(assignment.node.clone(), merged.len());
                    merged.push(Assignment {
                        stage: 0,
                        ..assignment
                    });
                }
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

/// Buffers [`index_node`] reuses from node to node, so indexing allocates nothing per node
/// beyond the bins it keeps.
#[derive(Default)]
struct Scratch<'a> {
    /// The class key of each run of consecutive devices with one key.
    runs: Vec<ClassKey<'a>>,
    /// Run indices sorted by key, and the class each run belongs to.
    order: Vec<u32>,
    class_of_run: Vec<u32>,
    /// The key of each class of the node.
    class_keys: Vec<ClassKey<'a>>,
    /// (class, domain, id, index) per usable device.
    usable: Vec<(u32, Option<&'a str>, &'a str, u16)>,
}

/// Finds a node's free accelerators, one [`NodeGroup`] per class in class order.
///
/// Devices of one class come in runs, so a device is compared with the previous one's key
/// only; the distinct runs are then sorted by key (none to sort on a node of one product), and
/// the devices by (class, domain, id, position). `O(d log d)` however many classes the node
/// claims (a linear search of the classes found so far was `O(d x classes)`).
///
/// A device published only in partitions counts only when `partitions_only` says so.
fn index_node<'a>(
    node: &'a NodeSpec,
    (reserved, partitions_only): (&Reservations, bool),
    scratch: &mut Scratch<'a>,
    mut emit: impl FnMut(NodeGroup<'a>),
) {
    let taken = reserved.on_node(&node.name);
    let consumed = reserved.consumed_on(&node.name);
    let Scratch {
        runs,
        order,
        class_of_run,
        class_keys,
        usable,
    } = scratch;
    runs.clear();
    usable.clear();
    for (index, device) in node.devices.iter().enumerate().take(usize::from(u16::MAX)) {
        // A shareable device others already hold shares of is no whole device to plan on
        // (a share of it is chosen after the search, `search::fraction`).
        if device.family == Family::Cpu
            || device.memory == Bytes::ZERO
            || (device.partitions_only && !partitions_only)
            || taken.is_some_and(|ids| ids.contains(&device.id))
            || consumed.is_some_and(|ids| ids.contains_key(&device.id))
            || device
                .share
                .as_ref()
                .is_some_and(|share| share.consumed > 0)
        {
            continue;
        }
        let key = ClassKey::of(device);
        if runs.last() != Some(&key) {
            runs.push(key);
        }
        let run = u32::try_from(runs.len() - 1).unwrap_or(u32::MAX);
        let index = u16::try_from(index).unwrap_or(u16::MAX);
        usable.push((run, device.domain.as_deref(), device.id.as_str(), index));
    }
    if usable.is_empty() {
        return;
    }
    order.clear();
    order.extend(0..u32::try_from(runs.len()).unwrap_or(u32::MAX));
    if runs.len() > 1 {
        order.sort_by(|&a, &b| runs[a as usize].cmp(&runs[b as usize]));
    }
    class_of_run.clear();
    class_of_run.resize(runs.len(), 0);
    class_keys.clear();
    for &run in order.iter() {
        let key = runs[run as usize];
        if class_keys.last() != Some(&key) {
            class_keys.push(key);
        }
        class_of_run[run as usize] = u32::try_from(class_keys.len() - 1).unwrap_or(u32::MAX);
    }
    for entry in usable.iter_mut() {
        entry.0 = class_of_run[entry.0 as usize];
    }
    usable.sort_unstable();
    for group in usable.chunk_by(|a, b| a.0 == b.0) {
        let key = class_keys[group[0].0 as usize];
        let mut domains: Domains = group
            .chunk_by(|a, b| a.1 == b.1)
            .map(|run| (run[0].1.is_some(), run.iter().map(|d| d.3).collect()))
            .collect();
        domains.sort_by_key(|(fast, list)| (!fast, list.first().copied()));
        let fast = fast_domain(&domains);
        emit(NodeGroup { key, domains, fast });
    }
}

/// Most devices of `domains` in one fast domain.
fn fast_domain(domains: &[(bool, Vec<u16>)]) -> u32 {
    domains
        .iter()
        .filter(|(fast, _)| *fast)
        .map(|(_, list)| list.len() as u32)
        .max()
        .unwrap_or(0)
}

/// A TP group: the bin it came from and the device indices taken.
type Group = (usize, Vec<u16>);

/// Mutable state of one placement: what is left of each bin it touched, and ordered indexes of
/// node capacities (in TP groups).
struct PlacementState<'f, 'a> {
    fleet: &'f FreeDevices<'a>,
    class: &'f DeviceClass<'a>,
    tp: u32,
    /// The bins devices were taken from; the others are as indexed.
    touched: HashMap<usize, BinState>,
    /// (groups the bin can still hold, bin index) for bins holding at least one group.
    by_capacity: BTreeSet<(u32, usize)>,
    /// Built the first time a replica has to span nodes.
    spanning: Option<Spanning<'a>>,
    all_in_fast_domain: bool,
}

/// What is left of one bin: a cursor into each domain's id-sorted device list, and the
/// domains with devices left, ordered for both of `take_group`'s rules.
struct BinState {
    /// Devices taken from the front of each domain.
    taken: Vec<u32>,
    free: u32,
    /// (not in a fast domain, devices left, domain index).
    by_fit: BTreeSet<(bool, u32, u32)>,
    /// (devices left, largest first; domain index).
    by_size: BTreeSet<(Reverse<u32>, u32)>,
}

impl BinState {
    fn new(bin: &Bin<'_>) -> Self {
        let mut by_fit = BTreeSet::new();
        let mut by_size = BTreeSet::new();
        for (index, (fast, list)) in bin.domains.iter().enumerate() {
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            let len = list.len() as u32;
            if len > 0 {
                by_fit.insert((!fast, len, index));
                by_size.insert((Reverse(len), index));
            }
        }
        Self {
            taken: vec![0; bin.domains.len()],
            free: bin.free,
            by_fit,
            by_size,
        }
    }

    /// Takes `count` devices from the front of domain `index` into `out`.
    fn take(&mut self, bin: &Bin<'_>, index: u32, count: u32, out: &mut Vec<u16>) {
        let (fast, list) = &bin.domains[index as usize];
        let start = self.taken[index as usize];
        let left = list.len() as u32 - start;
        let count = count.min(left);
        out.extend_from_slice(&list[start as usize..(start + count) as usize]);
        self.taken[index as usize] = start + count;
        self.free -= count;
        self.by_fit.remove(&(!fast, left, index));
        self.by_size.remove(&(Reverse(left), index));
        if left > count {
            self.by_fit.insert((!fast, left - count, index));
            self.by_size.insert((Reverse(left - count), index));
        }
    }
}

/// Capacities for replicas that span nodes: largest first, in the whole class and per fabric,
/// and each fabric's total room.
struct Spanning<'a> {
    all: BTreeSet<(Reverse<u32>, usize)>,
    by_fabric: HashMap<&'a str, BTreeSet<(Reverse<u32>, usize)>>,
    room: HashMap<&'a str, u64>,
    /// (total room, fabric) for fabrics with room.
    rooms: BTreeSet<(u64, &'a str)>,
}

impl<'a> Spanning<'a> {
    fn new(
        by_capacity: &BTreeSet<(u32, usize)>,
        fabric_of: impl Fn(usize) -> Option<&'a str>,
    ) -> Self {
        let mut spanning = Self {
            all: BTreeSet::new(),
            by_fabric: HashMap::new(),
            room: HashMap::new(),
            rooms: BTreeSet::new(),
        };
        for &(capacity, bin) in by_capacity {
            spanning.all.insert((Reverse(capacity), bin));
            if let Some(fabric) = fabric_of(bin) {
                spanning
                    .by_fabric
                    .entry(fabric)
                    .or_default()
                    .insert((Reverse(capacity), bin));
                *spanning.room.entry(fabric).or_default() += u64::from(capacity);
            }
        }
        spanning.rooms = spanning
            .room
            .iter()
            .map(|(fabric, room)| (*room, *fabric))
            .collect();
        spanning
    }
}

impl<'f, 'a> PlacementState<'f, 'a> {
    fn new(fleet: &'f FreeDevices<'a>, class: &'f DeviceClass<'a>, tp: u32) -> Self {
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
            touched: HashMap::new(),
            by_capacity,
            spanning: None,
            all_in_fast_domain: true,
        }
    }

    fn fabric_of(&self, bin: usize) -> Option<&'a str> {
        self.fleet.node(self.class.bins[bin].node).fabric.as_deref()
    }

    fn capacity(&self, bin: usize) -> u32 {
        self.touched
            .get(&bin)
            .map_or(self.class.bins[bin].free, |state| state.free)
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

    /// The capacity indexes for spanning replicas, built on first use.
    fn spanning(&mut self) -> &mut Spanning<'a> {
        let (fleet, class) = (self.fleet, self.class);
        let by_capacity = &self.by_capacity;
        self.spanning.get_or_insert_with(|| {
            Spanning::new(by_capacity, |bin| {
                fleet.node(class.bins[bin].node).fabric.as_deref()
            })
        })
    }

    /// Bins for a replica that no single node can hold: the largest first, within the
    /// fabric that can hold the replica with the least room to spare.
    fn spanning_bins(&mut self, pp: u32) -> Option<(Vec<usize>, bool)> {
        let spanning = self.spanning();
        let fabric = spanning
            .rooms
            .range((u64::from(pp), "")..)
            .next()
            .map(|(_, name)| *name);
        // Largest first, and among equals the first by name (bins are in name order).
        let eligible = match fabric {
            Some(fabric) => spanning.by_fabric.get(fabric)?,
            None => &spanning.all,
        };
        let mut chosen = Vec::new();
        let mut groups = 0u64;
        for &(Reverse(capacity), bin) in eligible {
            chosen.push(bin);
            groups += u64::from(capacity);
            if groups >= u64::from(pp) {
                break;
            }
        }
        if groups < u64::from(pp) {
            return None;
        }
        Some((chosen, fabric.is_some()))
    }

    /// Records that `bin` went from `before` to `after` groups in every index.
    fn update_capacity(&mut self, bin: usize, before: u32, after: u32) {
        if before == after {
            return;
        }
        self.by_capacity.remove(&(before, bin));
        if after > 0 {
            self.by_capacity.insert((after, bin));
        }
        let fabric = self.fabric_of(bin);
        let Some(spanning) = self.spanning.as_mut() else {
            return;
        };
        spanning.all.remove(&(Reverse(before), bin));
        if after > 0 {
            spanning.all.insert((Reverse(after), bin));
        }
        let Some(fabric) = fabric else {
            return;
        };
        if let Some(set) = spanning.by_fabric.get_mut(fabric) {
            set.remove(&(Reverse(before), bin));
            if after > 0 {
                set.insert((Reverse(after), bin));
            }
        }
        if let Some(room) = spanning.room.get_mut(fabric) {
            spanning.rooms.remove(&(*room, fabric));
            *room = (*room + u64::from(after)).saturating_sub(u64::from(before));
            if *room > 0 {
                spanning.rooms.insert((*room, fabric));
            }
        }
    }

    /// Takes `tp` devices from `bin`: the smallest domain that holds them all, else the
    /// largest domains first.
    fn take_group(&mut self, bin: usize) -> Option<Group> {
        let tp = self.tp;
        let before = self.capacity(bin);
        let class = self.class;
        let bin_ref = &class.bins[bin];
        let state = self
            .touched
            .entry(bin)
            .or_insert_with(|| BinState::new(bin_ref));
        // Fast domains first, then the fewest devices that still hold the group, then the
        // domain order.
        let whole = state
            .by_fit
            .range((false, tp, 0)..=(false, u32::MAX, u32::MAX))
            .next()
            .or_else(|| state.by_fit.range((true, tp, 0)..).next())
            .copied();
        let mut taken = Vec::with_capacity(tp as usize);
        match whole {
            Some((not_fast, _, index)) => {
                if not_fast && tp > 1 {
                    self.all_in_fast_domain = false;
                }
                state.take(bin_ref, index, tp, &mut taken);
            }
            None => {
                self.all_in_fast_domain = false;
                while (taken.len() as u32) < tp {
                    let Some(&(_, index)) = state.by_size.first() else {
                        break;
                    };
                    let want = tp - taken.len() as u32;
                    state.take(bin_ref, index, want, &mut taken);
                }
            }
        }
        let after = state.free / tp;
        self.update_capacity(bin, before, after);
        if (taken.len() as u32) < tp {
            return None;
        }
        Some((bin, taken))
    }
}

mod index;
mod rack;
#[cfg(test)]
mod reference;

pub use index::FleetIndex;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::products;
    use crate::plan::shorthand::parse_hardware;
    use proptest::prelude::*;

    fn fleet_of(spec: &str) -> Vec<NodeSpec> {
        parse_hardware(spec).unwrap()
    }

    #[test]
    fn classes_group_identical_devices() {
        let nodes = fleet_of("2x8xH100,1x4xL4,1x2xA100-40GB");
        let fleet = FreeDevices::new(&nodes, &Reservations::none());
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
        let fleet = FreeDevices::new(&nodes, &reserved);
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
        let fleet = FreeDevices::new(&nodes, &Reservations::none());
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
        let fleet = FreeDevices::new(&nodes, &Reservations::none());
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
        let fleet = FreeDevices::new(&nodes, &Reservations::none());
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
        let fleet = FreeDevices::new(&nodes, &Reservations::none());
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
        let fleet = FreeDevices::new(&nodes, &Reservations::none());
        let placement = fleet.place_devices(0, 12, None).unwrap();
        assert_eq!(placement.assignments.len(), 2);
        assert_eq!(
            placement.assignments[0].devices.len() + placement.assignments[1].devices.len(),
            12
        );
    }

    /// A random small fleet: a few nodes (names may repeat), devices of two products in a few
    /// memory sizes, in a few domains (ids in another order than the list), some reserved,
    /// some nodes on fabrics.
    fn random_fleet() -> impl Strategy<Value = (Vec<NodeSpec>, Reservations)> {
        let device = (0usize..2, 0u64..3, 0usize..4, 0usize..12, any::<bool>());
        let node = (0usize..6, 0usize..3, prop::collection::vec(device, 0..12));
        prop::collection::vec(node, 1..7).prop_map(|nodes| {
            let mut reserved = Reservations::none();
            let nodes = nodes
                .into_iter()
                .map(|(name, fabric, devices)| {
                    let name = format!("n{name}");
                    let devices = devices
                        .into_iter()
                        .enumerate()
                        .map(|(position, (product, memory, domain, id, taken))| {
                            let product = products::lookup(["H100", "L4"][product], None)
                                .expect("a known product");
                            let mut spec = DeviceSpec::of_product(
                                product,
                                format!("gpu{id:02}-{position}"),
                                None,
                            );
                            spec.memory = Bytes(spec.memory.0 + memory * (1 << 20));
                            spec.domain = [None, Some("nvlink:a"), Some("nvlink:b"), None][domain]
                                .map(str::to_string);
                            if taken {
                                reserved.insert(&name, spec.id.clone());
                            }
                            spec
                        })
                        .collect();
                    NodeSpec {
                        name,
                        devices,
                        fabric: [None, Some("ib-a"), Some("ib-b")][fabric].map(str::to_string),
                        labels: BTreeMap::new(),
                    }
                })
                .collect();
            (nodes, reserved)
        })
    }

    /// Every group has `tp` devices of one node, no device is used twice, none is reserved.
    fn check_invariants(
        placement: &Placement,
        tp: usize,
        reserved: &Reservations,
    ) -> std::result::Result<(), TestCaseError> {
        let mut seen = BTreeSet::new();
        for a in &placement.assignments {
            prop_assert_eq!(a.devices.len(), tp);
            for d in &a.devices {
                prop_assert!(
                    !reserved.contains(&a.node, d),
                    "{}/{} is reserved",
                    a.node,
                    d
                );
                prop_assert!(
                    seen.insert((a.node.clone(), d.clone())),
                    "{}/{} twice",
                    a.node,
                    d
                );
            }
        }
        Ok(())
    }

    proptest! {
        /// The indexed placement builds the same classes and makes the same placements as the
        /// reference (the code before issue 11), and every placement is sound.
        #[test]
        fn same_placements_as_the_reference(
            (nodes, reserved) in random_fleet(),
            shapes in prop::collection::vec((1u32..5, 1u32..5, 1u32..5, prop::option::of(1u32..4)), 1..8),
        ) {
            let fleet = FreeDevices::new(&nodes, &reserved);
            let old = reference::new(&nodes, &reserved);
            // Devices are told apart by node name and id: only with unique names.
            let names: BTreeSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
            let unique_names = names.len() == nodes.len();
            prop_assert_eq!(format!("{:?}", fleet.classes), format!("{:?}", old.classes));
            for class in 0..fleet.classes.len() {
                for &(tp, pp, replicas, max_nodes) in &shapes {
                    let shape = Shape { tp, pp, replicas };
                    let placed = fleet.place(class, shape, max_nodes);
                    prop_assert_eq!(&placed, &reference::place(&fleet, class, shape, max_nodes));
                    if let Some(placement) = placed.as_ref().filter(|_| unique_names) {
                        check_invariants(placement, tp as usize, &reserved)?;
                        prop_assert!(max_nodes.is_none_or(|max| placement.nodes <= max));
                    }
                }
                for count in 1..=fleet.classes[class].free + 1 {
                    prop_assert_eq!(
                        fleet.place_devices(class, count, None),
                        reference::place_devices(&fleet, class, count, None)
                    );
                }
            }
        }
    }

    proptest! {
        /// A plan's free devices built from an index of the fleet made beforehand are those
        /// built from scratch, whatever is reserved: devices taken, shares consumed, nodes
        /// the fleet does not have, and nodes that share a name.
        #[test]
        fn an_index_built_once_gives_the_same_free_devices(
            (nodes, mut reserved) in random_fleet(),
            consumed in prop::collection::vec((0usize..7, 0usize..12, 1u64..1 << 40), 0..6),
            gone in prop::collection::vec("[a-z][0-9]?", 0..3),
        ) {
            for (node, device, bytes) in consumed {
                let Some(node) = nodes.get(node) else { continue };
                if let Some(device) = node.devices.get(device) {
                    reserved.consume(&node.name, &device.id, bytes);
                }
            }
            for name in gone {
                reserved.insert(name, "gpu00-0");
            }
            let index = FleetIndex::new(&nodes);
            prop_assert!(index.indexes(&nodes));
            let scratch = FreeDevices::new(&nodes, &reserved);
            let indexed = FreeDevices::indexed(&nodes, &index, &reserved);
            prop_assert_eq!(format!("{:?}", indexed.classes), format!("{:?}", scratch.classes));
            let none = Reservations::none();
            prop_assert_eq!(
                format!("{:?}", FreeDevices::indexed(&nodes, &index, &none).classes),
                format!("{:?}", FreeDevices::new(&nodes, &none).classes)
            );
        }
    }

    #[test]
    fn an_index_of_other_nodes_is_not_used() {
        let nodes = fleet_of("2x8xH100");
        let index = FleetIndex::new(&nodes);
        let other = fleet_of("2x4xL4");
        assert!(!index.indexes(&other));
        assert!(!index.indexes(&nodes[..1]));
        let fleet = FreeDevices::indexed(&other, &index, &Reservations::none());
        assert_eq!(fleet.classes.len(), 1);
        assert!(fleet.classes[0].sample.product.contains("L4"));
        assert_eq!(fleet.free_devices(), 8);
    }

    #[test]
    fn reserved_nodes_are_indexed_again_and_the_others_borrowed() {
        let nodes = fleet_of("3x8xH100");
        let index = FleetIndex::new(&nodes);
        let mut reserved = Reservations::none();
        reserved.insert(&nodes[1].name, "gpu0");
        reserved.insert(&nodes[1].name, "gpu1");
        let fleet = FreeDevices::indexed(&nodes, &index, &reserved);
        let borrowed: Vec<bool> = fleet.classes[0]
            .bins
            .iter()
            .map(|bin| matches!(bin.domains, Cow::Borrowed(_)))
            .collect();
        assert_eq!(borrowed, [true, false, true]);
        assert_eq!(fleet.classes[0].free, 22);
    }

    #[test]
    fn a_node_claiming_thousands_of_memory_sizes_is_indexed_per_class() {
        let h100 = products::lookup("H100", None).unwrap();
        let devices = (0..3000u64)
            .map(|i| {
                let mut spec = DeviceSpec::of_product(h100, format!("gpu{i}"), None);
                spec.memory = Bytes(spec.memory.0 - i * (1 << 20));
                spec
            })
            .collect();
        let nodes = vec![NodeSpec {
            name: "hostile".into(),
            devices,
            fabric: None,
            labels: BTreeMap::new(),
        }];
        let fleet = FreeDevices::new(&nodes, &Reservations::none());
        assert_eq!(fleet.classes.len(), 3000);
        assert!(fleet.classes.iter().all(|c| c.free == 1 && c.nodes == 1));
        let one = Shape {
            tp: 1,
            pp: 1,
            replicas: 1,
        };
        assert_eq!(
            fleet.place(0, one, None).unwrap().assignments[0].devices,
            ["gpu2999"]
        );
    }

    #[test]
    fn a_node_with_thousands_of_domains_places_every_device_once() {
        let mut nodes = fleet_of("1x1xH100");
        let template = nodes[0].devices[0].clone();
        nodes[0].devices = (0..4000)
            .map(|i| DeviceSpec {
                id: format!("gpu{i:04}"),
                domain: Some(format!("nvlink:{}", i % 2000)),
                ..template.clone()
            })
            .collect();
        let fleet = FreeDevices::new(&nodes, &Reservations::none());
        let placement = fleet
            .place(
                0,
                Shape {
                    tp: 2,
                    pp: 1,
                    replicas: 2000,
                },
                None,
            )
            .unwrap();
        assert!(placement.tp_in_fast_domain, "each pair shares a domain");
        let used: BTreeSet<&String> = placement
            .assignments
            .iter()
            .flat_map(|a| &a.devices)
            .collect();
        assert_eq!(used.len(), 4000);
    }
}
