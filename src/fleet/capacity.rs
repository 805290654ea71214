//! Capacity in units of models: how many more replicas of a model fit on the free devices,
//! which free devices are stranded, and which nodes to add when a model does not fit.
//!
//! Every answer is the planner's own: nothing here re-implements memory, parallelism or
//! placement rules, it only asks [`plan`] well-chosen questions and reads the answers.
//!
//! * **More replicas.** One replica serves the goal's `concurrency` on its own, so `n` replicas
//!   are the request `--replicas n --concurrency n×c`. The largest `n` that plans is found by
//!   doubling then bisecting (`O(log n)` plans, `n` at most [`MAX_REPLICAS`]); a test checks
//!   that `n` plans and `n + 1` does not. That is one placement, on one device class, like one
//!   ModelPlacement would get.
//! * **Packing and stranded devices.** The replicas of that placement are then held, and the
//!   question asked again on what is left, up to [`MAX_ROUNDS`] times: another device class
//!   may hold more. The free devices still left when nothing more plans are stranded for this
//!   model: fragments smaller than a group on a product that can hold the model, or a
//!   product that cannot hold it at all.
//! * **Nodes to add.** For each node shape already in the fleet (one product, the devices one
//!   node has of it; the first node by name is the template, its domains and fabric kept), the
//!   fewest such nodes (at most [`MAX_ADDED_NODES`]) with which the wanted replicas plan on
//!   the fleet as it is, reservations included. The cheapest shape wins: fewest devices
//!   added, then fewest nodes, then shape order. The plan that would result comes with it,
//!   made on the fleet with the synthetic nodes added.
//!
//! Each plan indexes the fleet once (`O(d log d)` in devices), so the whole answer costs
//! `O(rounds × log(replicas) × d log d)` plus, for nodes to add, `O(shapes × log(nodes) × d log
//! d)`: bounded, however large and strange the fleet.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::health::NodeInput;
use crate::hardware::{Family, Precision, Vendor};
use crate::plan::report::{FractionKind, Plan};
use crate::plan::units::Bytes;
use crate::plan::{Goal, Model, NodeSpec, PlanError, PlanRequest, Reservations, Result, plan};

/// Most replicas counted in one placement.
pub const MAX_REPLICAS: u32 = 1024;
/// Most placements packed one after the other (one per device class, in practice).
pub const MAX_ROUNDS: usize = 8;
/// Most nodes of one shape suggested.
pub const MAX_ADDED_NODES: u32 = 64;
/// Most node shapes tried as templates (the roomiest ones).
pub const MAX_SHAPES: usize = 32;

/// One placement of replicas the free devices hold.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Packed {
    /// Device product.
    pub device: String,
    /// Weight precision.
    pub precision: Option<Precision>,
    /// Tensor-parallel size.
    pub tp: u32,
    /// Pipeline stages.
    pub pp: u32,
    /// Replicas.
    pub replicas: u32,
    /// Devices they take.
    pub devices: u32,
    /// Bytes of a device each replica takes as a share, when the devices are published
    /// shareable by memory and a replica needs less than one (several replicas then share a
    /// device).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_bytes: Option<u64>,
    /// The partition profile each replica takes, when the devices are published in
    /// partitions (`3g.40gb`, `cpx_nps4`) and a replica fits one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
}

/// Free devices of one product on one node that no replica of the model can use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stranded {
    /// Node name.
    pub node: String,
    /// Product.
    pub product: String,
    /// Device ids, sorted.
    pub devices: Vec<String>,
    /// Why they are left over.
    pub reason: String,
}

/// A node shape already in the fleet: one product, as many devices as one node has of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeShape {
    /// The node copied (first by name with this shape).
    pub like: String,
    /// Product.
    pub product: String,
    /// Devices per node.
    pub devices_per_node: u32,
}

/// The cheapest nodes to add for the wanted replicas.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AddNodes {
    /// Nodes to add.
    pub nodes: u32,
    /// Their shape.
    pub shape: NodeShape,
    /// Devices added.
    pub devices: u32,
    /// The plan on the fleet with those nodes added.
    pub plan: Plan,
}

/// What the free devices can still run of one model and goal.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capacity {
    /// Model name.
    pub model: String,
    /// Full-context requests each replica holds.
    pub concurrency_per_replica: u64,
    /// Tokens per request the answer assumed (the asked context, else the model's maximum).
    pub context: u64,
    /// The precision policy asked (`auto`: the widest the model and the devices allow; the
    /// precision each packing chose is in `packing`).
    pub precision_asked: String,
    /// Replicas one more placement could take now (what `hwaccel plan --replicas N` places).
    pub more_replicas: u32,
    /// The placements that pack the free devices, one after the other.
    pub packing: Vec<Packed>,
    /// Replicas across every packed placement.
    pub total_replicas: u32,
    /// Free devices left when nothing more fits, per node and product.
    pub stranded: Vec<Stranded>,
    /// How many devices that is.
    pub stranded_devices: u32,
    /// Nodes to add, when asked for more replicas than fit (or none fits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub add: Option<AddNodes>,
    /// Replicas the `add` answer is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wanted: Option<u32>,
    /// Why one replica does not fit now (the planner's reasons), when it does not.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

/// The question: one model, its goal, and how many replicas are wanted (for `add`).
#[derive(Debug, Clone)]
pub struct Question<'a> {
    /// The model.
    pub model: &'a Model,
    /// The request as `prepare` made it; its `replicas` is ignored.
    pub request: &'a PlanRequest,
    /// Replicas wanted on top of what runs now: nodes to add are computed when more than
    /// that fit (`Some(1)`: only when not even one fits); `None` never computes them.
    pub wanted: Option<u32>,
    /// Node shapes to add from ([`whole_shapes`] of the fleet); empty: [`node_shapes`] of
    /// the planner's nodes as they are now.
    pub shapes: &'a [NodeSpec],
}

/// Requests each replica holds: the goal's concurrency (serving only).
fn concurrency_of(request: &PlanRequest) -> Result<u64> {
    match &request.goal {
        Goal::Serve { concurrency, .. } => Ok((*concurrency).max(1)),
        Goal::Train(_) => Err(PlanError::constraint(
            "fleet capacity counts serving replicas; ask `hwaccel plan` about training",
        )),
    }
}

/// The request for `replicas` replicas of `concurrency` requests each.
fn replicas_request(request: &PlanRequest, concurrency: u64, replicas: u32) -> PlanRequest {
    let mut asked = request.clone();
    if let Goal::Serve {
        concurrency: total, ..
    } = &mut asked.goal
    {
        *total = concurrency.saturating_mul(u64::from(replicas));
    }
    asked.replicas = Some(replicas);
    asked
}

/// The plan for `replicas` replicas, or `None` when it does not fit (or the fleet has no free
/// device at all).
pub fn plan_replicas(
    model: &Model,
    nodes: &[NodeSpec],
    reserved: &Reservations,
    request: &PlanRequest,
    replicas: u32,
) -> Result<Option<Plan>> {
    let concurrency = concurrency_of(request)?;
    let asked = replicas_request(request, concurrency, replicas);
    match plan(model, nodes, reserved, &asked) {
        Ok(plan) if plan.fits => Ok(Some(plan)),
        Ok(_) | Err(PlanError::NoDevices(_)) => Ok(None),
        Err(err) => Err(err),
    }
}

/// The most replicas one placement takes now (at most [`MAX_REPLICAS`]) and its plan.
pub fn most_replicas(
    model: &Model,
    nodes: &[NodeSpec],
    reserved: &Reservations,
    request: &PlanRequest,
) -> Result<(u32, Option<Plan>)> {
    let attempt = |n: u32| plan_replicas(model, nodes, reserved, request, n);
    let Some(first) = attempt(1)? else {
        return Ok((0, None));
    };
    let ceiling = free_devices(nodes, reserved).clamp(1, MAX_REPLICAS);
    // Double while it fits, then bisect between the last fit and the first miss.
    let (mut low, mut best) = (1u32, first);
    let mut high = None;
    while high.is_none() && low < ceiling {
        let next = low.saturating_mul(2).min(ceiling);
        match attempt(next)? {
            Some(plan) => (low, best) = (next, plan),
            None => high = Some(next),
        }
    }
    if let Some(mut high) = high {
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            match attempt(mid)? {
                Some(plan) => (low, best) = (mid, plan),
                None => high = mid,
            }
        }
    }
    Ok((low, Some(best)))
}

/// Whether the planner indexes `family`/`memory` devices at all.
fn plannable(family: Family, memory: Bytes) -> bool {
    family != Family::Cpu && memory != Bytes::ZERO
}

/// Free plannable devices, an upper bound on replicas: a device published in partitions
/// counts once per free partition (each may hold a replica).
fn free_devices(nodes: &[NodeSpec], reserved: &Reservations) -> u32 {
    let mut free = 0u32;
    for node in nodes {
        let taken = reserved.on_node(&node.name);
        let is_free = |id: &String| !taken.is_some_and(|ids| ids.contains(id));
        for device in &node.devices {
            if !plannable(device.family, device.memory) {
                continue;
            }
            let parts = device.partitions.iter().filter(|p| is_free(&p.id)).count();
            let whole = u32::from(is_free(&device.id) && !device.partitions_only);
            free = free.saturating_add(whole.max(u32::try_from(parts).unwrap_or(u32::MAX)));
        }
    }
    free
}

/// The placements packed so far: how many rounds, how many replicas.
#[derive(Debug, Default)]
struct Rounds {
    done: usize,
    total: u32,
}

impl Rounds {
    /// Packs placements onto `nodes`, one after the other, each holding what it takes in
    /// `held` (a share holds its bytes of the device, so the next packs beside it; a
    /// partition holds itself and its device, whose other free partitions the next may
    /// take), until nothing more plans or the bounds are reached; with `only`, until a plan
    /// would not be on that kind of fraction.
    fn pack(
        &mut self,
        question: &Question<'_>,
        nodes: &[NodeSpec],
        held: &mut Reservations,
        packing: &mut Vec<Packed>,
        only: Option<FractionKind>,
    ) -> Result<()> {
        while self.done < MAX_ROUNDS && self.total < MAX_REPLICAS {
            let (count, Some(placed)) =
                most_replicas(question.model, nodes, held, question.request)?
            else {
                break;
            };
            let kind = placed.fraction.as_ref().map(|fraction| fraction.kind);
            let share = placed
                .fraction
                .as_ref()
                .filter(|fraction| fraction.kind == FractionKind::Share)
                .map(|fraction| fraction.bytes.0);
            let partition = placed
                .fraction
                .as_ref()
                .filter(|fraction| fraction.kind == FractionKind::Partition)
                .and_then(|fraction| fraction.profile.clone());
            if only.is_some() && kind != only {
                break;
            }
            if partition.is_some() {
                hold_partitions(nodes, &placed, held);
            }
            self.done += 1;
            self.total = self.total.saturating_add(count);
            for assignment in &placed.assignments {
                for device in &assignment.devices {
                    match share {
                        Some(bytes) => held.consume(assignment.node.clone(), device.clone(), bytes),
                        None => held.insert(assignment.node.clone(), device.clone()),
                    }
                }
            }
            packing.push(Packed {
                device: placed.device.clone().unwrap_or_default(),
                precision: placed.precision,
                tp: placed.tp.unwrap_or(1),
                pp: placed.pp.unwrap_or(1),
                replicas: count,
                devices: placed.devices.unwrap_or(0),
                share_bytes: share,
                partition,
            });
        }
        Ok(())
    }
}

/// Holds what a plan on partitions takes: the device each partition is part of (so no later
/// whole-device plan counts it) and, beside the partitions themselves, those of its other
/// profiles (partitions of two profiles may overlap; of one, never).
fn hold_partitions(nodes: &[NodeSpec], placed: &Plan, held: &mut Reservations) {
    for assignment in &placed.assignments {
        let Some(node) = crate::plan::inventory::find_node(nodes, &assignment.node) else {
            continue;
        };
        for id in &assignment.devices {
            let Some(device) = node
                .devices
                .iter()
                .find(|d| d.partitions.iter().any(|p| &p.id == id))
            else {
                continue;
            };
            let profile = device
                .partitions
                .iter()
                .find(|p| &p.id == id)
                .map(|p| p.profile.as_str());
            held.insert(node.name.clone(), device.id.clone());
            for other in device
                .partitions
                .iter()
                .filter(|p| Some(p.profile.as_str()) != profile)
            {
                held.insert(node.name.clone(), other.id.clone());
            }
        }
    }
}

/// The nodes with only their devices published in partitions, when there are any and the
/// request may take fractions.
fn partitioned_only(nodes: &[NodeSpec], request: &PlanRequest) -> Option<Vec<NodeSpec>> {
    if request.whole_devices {
        return None;
    }
    let partitioned: Vec<NodeSpec> = nodes
        .iter()
        .filter_map(|node| {
            let mut node = node.clone();
            node.devices.retain(|device| !device.partitions.is_empty());
            (!node.devices.is_empty()).then_some(node)
        })
        .collect();
    (!partitioned.is_empty()).then_some(partitioned)
}

/// The nodes with only their devices published shareable by memory, when there are any and
/// the request may take shares.
fn shareable_only(nodes: &[NodeSpec], request: &PlanRequest) -> Option<Vec<NodeSpec>> {
    if request.whole_devices {
        return None;
    }
    let shareable: Vec<NodeSpec> = nodes
        .iter()
        .filter_map(|node| {
            let mut node = node.clone();
            node.devices.retain(|device| device.share.is_some());
            (!node.devices.is_empty()).then_some(node)
        })
        .collect();
    (!shareable.is_empty()).then_some(shareable)
}

/// Answers the question on `nodes` with `reserved` devices held.
pub fn capacity(
    question: &Question<'_>,
    nodes: &[NodeSpec],
    reserved: &Reservations,
) -> Result<Capacity> {
    let concurrency = concurrency_of(question.request)?;
    let context = match &question.request.goal {
        Goal::Serve { context, .. } => {
            crate::plan::search::resolve_context(question.model, *context)?.0
        }
        Goal::Train(_) => 0,
    };
    let mut held = reserved.clone();
    let mut packing = Vec::new();
    // Small models belong on fractions: shares of the devices published shareable are packed
    // first, then whole devices. One plan takes one fraction for all its replicas, so a plan
    // across shareable and other devices would take every one of them whole.
    let mut rounds = Rounds::default();
    // Partitions come first, as the planner takes them first.
    let partitioned = partitioned_only(nodes, question.request);
    if let Some(partitioned) = &partitioned {
        rounds.pack(
            question,
            partitioned,
            &mut held,
            &mut packing,
            Some(FractionKind::Partition),
        )?;
    }
    let shareable = shareable_only(nodes, question.request);
    if let Some(shareable) = &shareable {
        rounds.pack(
            question,
            shareable,
            &mut held,
            &mut packing,
            Some(FractionKind::Share),
        )?;
    }
    rounds.pack(question, nodes, &mut held, &mut packing, None)?;
    let more_replicas = if partitioned.is_some() || shareable.is_some() {
        // What one more placement could take now is asked of the whole fleet as it is.
        most_replicas(question.model, nodes, reserved, question.request)?.0
    } else {
        packing.first().map_or(0, |first| first.replicas)
    };
    let total = rounds.total;
    let stranded = stranded(nodes, &held, &packing, &question.model.name);
    let stranded_devices = stranded
        .iter()
        .map(|s| u32::try_from(s.devices.len()).unwrap_or(u32::MAX))
        .fold(0u32, u32::saturating_add);
    let reasons = if more_replicas == 0 {
        match plan(
            question.model,
            nodes,
            reserved,
            &replicas_request(question.request, concurrency, 1),
        ) {
            Ok(refusal) => refusal.reasons,
            Err(err) => vec![err.to_string()],
        }
    } else {
        Vec::new()
    };
    let wanted = question.wanted.filter(|&w| w > more_replicas);
    let add = match wanted {
        Some(w) => {
            let derived;
            let shapes = if question.shapes.is_empty() {
                derived = node_shapes(nodes);
                derived.as_slice()
            } else {
                question.shapes
            };
            add_nodes(question.model, nodes, reserved, question.request, w, shapes)?
        }
        None => None,
    };
    Ok(Capacity {
        model: question.model.name.clone(),
        concurrency_per_replica: concurrency,
        context,
        precision_asked: precision_name(question.request.precision),
        more_replicas,
        packing,
        total_replicas: total,
        stranded,
        stranded_devices,
        add,
        wanted,
        reasons,
    })
}

/// The name of a precision policy as a user types it (`auto`, `bf16`).
pub fn precision_name(choice: crate::plan::capability::PrecisionChoice) -> String {
    use crate::plan::capability::PrecisionChoice;
    match (choice, choice.exact()) {
        (PrecisionChoice::Auto, _) => "auto".to_string(),
        (_, Some(exact)) => exact.to_string(),
        (_, None) => "fp4".to_string(),
    }
}

/// The free devices left once `held`, per node and product, with why.
fn stranded(
    nodes: &[NodeSpec],
    held: &Reservations,
    packing: &[Packed],
    model: &str,
) -> Vec<Stranded> {
    let group: BTreeMap<&str, (u32, u32)> = packing
        .iter()
        .map(|p| (p.device.as_str(), (p.tp, p.pp)))
        .collect();
    let mut out = Vec::new();
    for node in nodes {
        let taken = held.on_node(&node.name);
        let shared = held.consumed_on(&node.name);
        let mut left: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for device in &node.devices {
            // A device with shares on it is in use; what is left of it is no free device.
            if plannable(device.family, device.memory)
                && !taken.is_some_and(|ids| ids.contains(&device.id))
                && !shared.is_some_and(|ids| ids.contains_key(&device.id))
            {
                left.entry(device.product.as_str())
                    .or_default()
                    .push(device.id.clone());
            }
        }
        for (product, mut devices) in left {
            devices.sort();
            let reason = match group.get(product) {
                Some(&(tp, pp)) => format!(
                    "{} left here; a replica of {model} on {product} takes {tp} device(s) per group ({} in all)",
                    devices.len(),
                    tp.saturating_mul(pp)
                ),
                None => format!("no replica of {model} fits on the free {product} devices"),
            };
            out.push(Stranded {
                node: node.name.clone(),
                product: product.to_string(),
                devices,
                reason,
            });
        }
    }
    out.sort_by(|a, b| (&a.node, &a.product).cmp(&(&b.node, &b.product)));
    out
}

/// Devices stranded for every one of `answers` (one per model): free devices none of them
/// can use, per node and product.
pub fn stranded_for_all(answers: &[Capacity]) -> Vec<Stranded> {
    let Some((first, rest)) = answers.split_first() else {
        return Vec::new();
    };
    let sets: Vec<BTreeSet<(&str, &str)>> = rest
        .iter()
        .map(|answer| {
            answer
                .stranded
                .iter()
                .flat_map(|s| s.devices.iter().map(|d| (s.node.as_str(), d.as_str())))
                .collect()
        })
        .collect();
    first
        .stranded
        .iter()
        .filter_map(|s| {
            let devices: Vec<String> = s
                .devices
                .iter()
                .filter(|d| {
                    sets.iter()
                        .all(|set| set.contains(&(s.node.as_str(), d.as_str())))
                })
                .cloned()
                .collect();
            (!devices.is_empty()).then(|| Stranded {
                node: s.node.clone(),
                product: s.product.clone(),
                reason: format!("no model asked about can use {}", s.product),
                devices,
            })
        })
        .collect()
}

/// A shape's identity: product, memory, maker, kind and device count per node.
type ShapeKey<'a> = (&'a str, Bytes, Vendor, Family, u32);

/// The node shapes of the fleet: per node and product, the devices it has (free or not),
/// the first node by name as template, at most [`MAX_SHAPES`] of them, roomiest first.
pub fn node_shapes(nodes: &[NodeSpec]) -> Vec<NodeSpec> {
    let mut order: Vec<&NodeSpec> = nodes.iter().collect();
    order.sort_by(|a, b| a.name.cmp(&b.name));
    let mut seen: BTreeMap<ShapeKey<'_>, NodeSpec> = BTreeMap::new();
    for node in order {
        let mut per_product: BTreeMap<(&str, Bytes, Vendor, Family), Vec<usize>> = BTreeMap::new();
        for (index, device) in node.devices.iter().enumerate() {
            if plannable(device.family, device.memory) {
                per_product
                    .entry((&device.product, device.memory, device.vendor, device.family))
                    .or_default()
                    .push(index);
            }
        }
        for ((product, memory, vendor, family), indices) in per_product {
            let count = u32::try_from(indices.len()).unwrap_or(u32::MAX);
            seen.entry((product, memory, vendor, family, count))
                .or_insert_with(|| NodeSpec {
                    name: node.name.clone(),
                    devices: indices.iter().map(|&i| node.devices[i].clone()).collect(),
                    fabric: node.fabric.clone(),
                    labels: BTreeMap::new(),
                });
        }
    }
    let mut shapes: Vec<(ShapeKey<'_>, NodeSpec)> = seen.into_iter().collect();
    // Roomiest (memory on one node) first; the key breaks ties.
    shapes.sort_by_key(|((_, memory, _, _, count), _)| {
        std::cmp::Reverse(u128::from(memory.0) * u128::from(*count))
    });
    shapes.truncate(MAX_SHAPES);
    shapes.into_iter().map(|(_, node)| node).collect()
}

/// `count` copies of `template`, named so they sort after and never equal a real node.
fn synthetic(template: &NodeSpec, count: u32) -> impl Iterator<Item = NodeSpec> + '_ {
    (0..count).map(move |i| NodeSpec {
        name: format!("{}+new{i}", template.name),
        ..template.clone()
    })
}

/// The node shapes of the fleet as its nodes are meant to be: each node's plannable devices
/// of a product padded, with copies of one of them, to the devices of that product it has
/// (unhealthy ones included) and, on a one-product node, to its expected count. A node
/// bought new has all its GPUs, even when its template has lost one.
pub fn whole_shapes(inputs: &[NodeInput]) -> Vec<NodeSpec> {
    let padded: Vec<NodeSpec> = inputs
        .iter()
        .map(|input| {
            let mut node = input.node.clone();
            let mut extra: BTreeMap<&str, u32> = BTreeMap::new();
            let plannable: BTreeSet<&str> = node.devices.iter().map(|d| d.id.as_str()).collect();
            for device in input
                .devices
                .iter()
                .filter(|d| !plannable.contains(d.name.as_str()))
            {
                *extra.entry(device.product.as_str()).or_default() += 1;
            }
            let products: BTreeSet<&str> = node
                .devices
                .iter()
                .map(|d| d.product.as_str())
                .chain(input.devices.iter().map(|d| d.product.as_str()))
                .collect();
            if let (Some(expected), [product]) = (
                input.expected,
                products.iter().copied().collect::<Vec<_>>().as_slice(),
            ) {
                let present =
                    u32::try_from(input.devices.len().max(node.devices.len())).unwrap_or(u32::MAX);
                *extra.entry(product).or_default() += expected.saturating_sub(present);
            }
            let mut copies = Vec::new();
            for (product, count) in extra {
                let Some(sample) = node.devices.iter().find(|d| d.product == product) else {
                    continue;
                };
                for i in 0..count.min(MAX_PADDING) {
                    copies.push(crate::plan::DeviceSpec {
                        id: format!("{}+{i}", sample.id),
                        aliases: Vec::new(),
                        ..sample.clone()
                    });
                }
            }
            node.devices.extend(copies);
            node
        })
        .collect();
    node_shapes(&padded)
}

/// Most devices [`whole_shapes`] adds to one node's shape.
const MAX_PADDING: u32 = 64;

/// The cheapest nodes to add, of one of `shapes` (templates from [`node_shapes`] or
/// [`whole_shapes`]), for `wanted` replicas; `None` when no shape does it within
/// [`MAX_ADDED_NODES`] nodes.
pub fn add_nodes(
    model: &Model,
    nodes: &[NodeSpec],
    reserved: &Reservations,
    request: &PlanRequest,
    wanted: u32,
    shapes: &[NodeSpec],
) -> Result<Option<AddNodes>> {
    let base = nodes.len();
    let mut work: Vec<NodeSpec> = nodes.to_vec();
    let mut best: Option<AddNodes> = None;
    for template in shapes.iter().take(MAX_SHAPES) {
        let per_node = u32::try_from(template.devices.len()).unwrap_or(u32::MAX);
        let mut attempt = |count: u32| -> Result<Option<Plan>> {
            work.truncate(base);
            work.extend(synthetic(template, count));
            plan_replicas(model, &work, reserved, request, wanted)
        };
        // More nodes of one shape never hurt: double until it fits, then bisect.
        let mut high = 1u32;
        let mut found = None;
        while high <= MAX_ADDED_NODES {
            if let Some(plan) = attempt(high)? {
                found = Some(plan);
                break;
            }
            high = high.saturating_mul(2);
        }
        let Some(mut plan) = found else {
            // The top of the range, when doubling jumped past it.
            if high / 2 < MAX_ADDED_NODES
                && let Some(plan) = attempt(MAX_ADDED_NODES)?
            {
                keep_cheapest(&mut best, MAX_ADDED_NODES, template, per_node, plan);
            }
            continue;
        };
        let mut low = high / 2;
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            match attempt(mid)? {
                Some(fits) => (high, plan) = (mid, fits),
                None => low = mid,
            }
        }
        keep_cheapest(&mut best, high, template, per_node, plan);
    }
    Ok(best)
}

fn keep_cheapest(
    best: &mut Option<AddNodes>,
    count: u32,
    template: &NodeSpec,
    per_node: u32,
    plan: Plan,
) {
    let devices = count.saturating_mul(per_node);
    if best
        .as_ref()
        .is_some_and(|b| (b.devices, b.nodes) <= (devices, count))
    {
        return;
    }
    *best = Some(AddNodes {
        nodes: count,
        shape: NodeShape {
            like: template.name.clone(),
            product: template
                .devices
                .first()
                .map(|d| d.product.clone())
                .unwrap_or_default(),
            devices_per_node: per_node,
        },
        devices,
        plan,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::model::presets;
    use crate::plan::shorthand::parse_hardware;

    fn model(key: &str) -> Model {
        presets::find(key).unwrap().unwrap()
    }

    fn request() -> PlanRequest {
        PlanRequest::serve(Some(8192), 1)
    }

    fn ask<'a>(model: &'a Model, request: &'a PlanRequest, wanted: Option<u32>) -> Question<'a> {
        Question {
            model,
            request,
            wanted,
            shapes: &[],
        }
    }

    /// `n` more replicas plan and `n + 1` do not, on the same fleet and reservations.
    fn agrees_with_the_planner(
        model: &Model,
        nodes: &[NodeSpec],
        reserved: &Reservations,
        request: &PlanRequest,
    ) -> u32 {
        let answer = capacity(&ask(model, request, None), nodes, reserved).unwrap();
        let n = answer.more_replicas;
        if n > 0 {
            assert!(
                plan_replicas(model, nodes, reserved, request, n)
                    .unwrap()
                    .is_some(),
                "{n} should plan"
            );
        }
        assert!(
            plan_replicas(model, nodes, reserved, request, n + 1)
                .unwrap()
                .is_none(),
            "{} should not plan",
            n + 1
        );
        n
    }

    #[test]
    fn more_replicas_is_what_the_planner_places() {
        let nodes = parse_hardware("2x8xH100+nvswitch,1x4xL4").unwrap();
        let m = model("llama-3.1-70b");
        let n = agrees_with_the_planner(&m, &nodes, &Reservations::none(), &request());
        assert!(
            n >= 2,
            "two 8xH100 nodes hold at least two 70B replicas: {n}"
        );
        let mut reserved = Reservations::none();
        for d in 0..8 {
            reserved.insert(nodes[0].name.clone(), format!("gpu{d}"));
        }
        let fewer = agrees_with_the_planner(&m, &nodes, &reserved, &request());
        assert!(fewer < n, "{fewer} < {n}");
        let small = model("llama-3.1-8b");
        agrees_with_the_planner(&small, &nodes, &Reservations::none(), &request());
    }

    #[test]
    fn fragments_smaller_than_a_group_are_stranded() {
        // Three free H100s on one node, a TP 4 (or wider) model: all three stranded.
        let nodes = parse_hardware("1x3xH100").unwrap();
        let m = model("llama-3.1-405b");
        let r = request();
        let answer = capacity(&ask(&m, &r, None), &nodes, &Reservations::none()).unwrap();
        assert_eq!(answer.more_replicas, 0);
        assert_eq!(answer.stranded_devices, 3);
        assert!(!answer.reasons.is_empty());
        // A model that fits leaves nothing behind on a node its groups divide.
        let small = model("llama-3.1-8b");
        let nodes = parse_hardware("1x4xH100").unwrap();
        let answer = capacity(&ask(&small, &r, None), &nodes, &Reservations::none()).unwrap();
        assert_eq!(answer.stranded_devices, 0, "{answer:?}");
        assert_eq!(answer.total_replicas, 4);
    }

    #[test]
    fn products_too_small_are_stranded_with_that_reason() {
        let nodes = parse_hardware("1x8xH100+nvswitch,1x1xL4").unwrap();
        let m = model("llama-3.1-70b");
        let r = request();
        let answer = capacity(&ask(&m, &r, None), &nodes, &Reservations::none()).unwrap();
        let l4 = answer
            .stranded
            .iter()
            .find(|s| s.product.contains("L4"))
            .expect("the lone L4 cannot hold 70B");
        assert!(l4.reason.contains("no replica"), "{}", l4.reason);
        let all = stranded_for_all(std::slice::from_ref(&answer));
        assert_eq!(all.len(), answer.stranded.len());
    }

    #[test]
    fn nodes_to_add_are_verified_by_planning_with_them() {
        let nodes = parse_hardware("1x8xH100+nvswitch,1x4xL4").unwrap();
        let m = model("llama-3.1-70b");
        let r = request();
        let have = capacity(&ask(&m, &r, None), &nodes, &Reservations::none()).unwrap();
        let wanted = have.more_replicas + 2;
        let answer = capacity(&ask(&m, &r, Some(wanted)), &nodes, &Reservations::none()).unwrap();
        let add = answer.add.expect("more H100 nodes make room");
        assert!(add.plan.fits);
        assert_eq!(add.plan.replicas, Some(wanted));
        assert!(add.shape.product.contains("H100"), "{:?}", add.shape);
        // Re-plan on the fleet with that many synthetic nodes: it fits; with one fewer, not.
        let template = node_shapes(&nodes)
            .into_iter()
            .find(|t| {
                t.name == add.shape.like && t.devices.len() as u32 == add.shape.devices_per_node
            })
            .unwrap();
        let with = |count: u32| {
            let mut grown = nodes.clone();
            grown.extend(synthetic(&template, count));
            plan_replicas(&m, &grown, &Reservations::none(), &r, wanted).unwrap()
        };
        assert!(with(add.nodes).is_some());
        assert!(with(add.nodes - 1).is_none());
    }

    #[test]
    fn a_model_that_fits_nowhere_gets_the_cheapest_nodes() {
        // 405B in bf16 needs 16 H100s: two more nodes like the L4 one could never do it.
        let nodes = parse_hardware("1x8xH100+nvswitch+ib,1x4xL4").unwrap();
        let m = model("llama-3.1-405b");
        let r = request().with_precision(Precision::Bf16);
        let answer = capacity(&ask(&m, &r, Some(1)), &nodes, &Reservations::none()).unwrap();
        assert_eq!(answer.more_replicas, 0);
        assert_eq!(answer.wanted, Some(1));
        let add = answer.add.expect("H100 nodes on the fabric");
        assert_eq!((add.nodes, add.devices), (1, 8), "{:?}", add.shape);
        assert!(add.plan.fits);
    }

    #[test]
    fn whole_shapes_restore_unhealthy_and_missing_devices() {
        let mut nodes = parse_hardware("1x8xH100+nvswitch").unwrap();
        nodes[0].devices.truncate(7);
        let mut input = NodeInput::plannable(nodes.remove(0));
        // The seventh went unhealthy: present, not plannable; the eighth is gone.
        input.node.devices.truncate(6);
        input.devices[6].health = crate::hardware::HealthStatus::Unhealthy;
        input.devices[6].unplannable = Some("unhealthy".into());
        input.expected = Some(8);
        let shapes = whole_shapes(std::slice::from_ref(&input));
        assert_eq!(shapes.len(), 1);
        assert_eq!(
            shapes[0].devices.len(),
            8,
            "6 plannable + 1 unhealthy + 1 missing"
        );
        let ids: BTreeSet<&str> = shapes[0].devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids.len(), 8, "copies get their own ids");
        assert_eq!(
            node_shapes(std::slice::from_ref(&input.node))[0]
                .devices
                .len(),
            6
        );
    }

    #[test]
    fn training_is_refused_with_a_pointer() {
        use crate::plan::training::{LoraTarget, Method, TrainingTarget};
        let nodes = parse_hardware("1x8xH100").unwrap();
        let m = model("llama-3.1-8b");
        let mut r = request();
        r.goal = Goal::Train(TrainingTarget {
            method: Method::Lora,
            seq_len: 2048,
            micro_batch: 1,
            gradient_checkpointing: true,
            lora_rank: 16,
            lora_targets: LoraTarget::ALL.to_vec(),
            optimizer_states: crate::plan::training::OptimizerStates::Fp32,
            loss: Default::default(),
            adamw: Default::default(),
            kernels: Default::default(),
        });
        let err = capacity(&ask(&m, &r, None), &nodes, &Reservations::none()).unwrap_err();
        assert!(err.to_string().contains("serving"), "{err}");
    }

    #[test]
    fn a_hostile_fleet_of_ten_thousand_nodes_is_answered_quickly() {
        let nodes = parse_hardware("10000x8xH100+nvswitch").unwrap();
        let m = model("llama-3.1-8b");
        let r = request();
        let started = std::time::Instant::now();
        let answer = capacity(&ask(&m, &r, None), &nodes, &Reservations::none()).unwrap();
        assert_eq!(answer.more_replicas, MAX_REPLICAS);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "{:?}",
            started.elapsed()
        );
    }

    /// Issue 39: on GPUs published only in partitions (two MI300X in CPX, eight 24 GiB
    /// partitions each), a small model's replicas are counted one per partition, and a
    /// placement's partitions are left out; a model no partition holds counts none there.
    #[test]
    fn replicas_of_a_small_model_are_counted_on_partitions() {
        let nodes = crate::testing::dra::partitioned_mi300x(2, 8, "cpx_nps4");
        let small = model("llama-3.1-8b");
        let request = PlanRequest::serve(Some(8192), 1).with_precision(Precision::Bf16);
        let answer = capacity(&ask(&small, &request, None), &nodes, &Reservations::none()).unwrap();
        assert_eq!(answer.total_replicas, 16, "{answer:?}");
        assert!(
            answer
                .packing
                .iter()
                .all(|p| p.partition.as_deref() == Some("cpx_nps4")),
            "{:?}",
            answer.packing
        );
        let mut held = Reservations::none();
        held.insert(nodes[0].name.clone(), "gpu0-cpx_nps4-0");
        held.insert(nodes[0].name.clone(), "gpu1-cpx_nps4-3");
        let answer = capacity(&ask(&small, &request, None), &nodes, &held).unwrap();
        assert_eq!(answer.total_replicas, 14, "{answer:?}");
        let big = model("llama-3.1-70b");
        let answer = capacity(&ask(&big, &request, None), &nodes, &Reservations::none()).unwrap();
        assert_eq!(answer.total_replicas, 0, "{answer:?}");
    }

    /// Issue 39: on GPUs published shareable by memory, the free devices hold more replicas
    /// of a small model than there are devices, as shares: two H100s hold three 24Gi shares
    /// each, and what placements already consume is left out.
    #[test]
    fn replicas_of_a_small_model_are_counted_as_shares_of_shareable_gpus() {
        use crate::plan::share::{SharePolicy, ShareRule, Shareable};
        const GI: u64 = 1 << 30;
        let rule = ShareRule::Range {
            min: 8 * GI,
            max: Some(80 * GI),
            step: Some(8 * GI),
        };
        let policy = SharePolicy::checked(80 * GI, Some(80 * GI), rule).unwrap();
        let mut nodes = parse_hardware("1x2xH100").unwrap();
        for device in &mut nodes[0].devices {
            device.share = Some(Shareable {
                policy: policy.clone(),
                consumed: 0,
            });
        }
        let small = model("llama-3.1-8b");
        let request = request().with_precision(crate::hardware::Precision::Bf16);
        let answer = capacity(&ask(&small, &request, None), &nodes, &Reservations::none()).unwrap();
        assert_eq!(answer.total_replicas, 6, "{answer:?}");
        assert!(
            answer
                .packing
                .iter()
                .all(|p| p.share_bytes == Some(24 * GI)),
            "{:?}",
            answer.packing
        );
        assert!(answer.stranded.is_empty(), "{:?}", answer.stranded);

        // A placement's 48Gi on one GPU leaves room for one share there, three on the other.
        let mut reserved = Reservations::none();
        reserved.consume(
            nodes[0].name.clone(),
            nodes[0].devices[0].id.clone(),
            48 * GI,
        );
        let answer = capacity(&ask(&small, &request, None), &nodes, &reserved).unwrap();
        assert_eq!(answer.total_replicas, 4, "{answer:?}");

        // Without shares (whole devices asked for), one replica per free GPU.
        let mut whole = request.clone();
        whole.whole_devices = true;
        let answer = capacity(&ask(&small, &whole, None), &nodes, &Reservations::none()).unwrap();
        assert_eq!(answer.total_replicas, 2, "{answer:?}");
        assert!(answer.packing.iter().all(|p| p.share_bytes.is_none()));
    }
}
