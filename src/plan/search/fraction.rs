//! A fraction of a device for a serving plan that needs less than one (issue 39,
//! docs/decisions/0011). The search plans whole devices; when its plan lands on devices a DRA
//! driver publishes shareable by memory, this step decides how much of each a replica takes:
//! a share sized to the replica (its weights, KV cache for its requests, activations and
//! runtime memory, plus the CUDA context that sits outside the engine's budget), rounded up
//! as the scheduler rounds it to the driver's policy, packed best-fit onto the shareable
//! devices of the node the search chose; else the whole device, and the reason why.
//!
//! A share is a vLLM budget: `--gpu-memory-utilization` is per instance ("if you have two vLLM
//! instances running on the same GPU, you can set the GPU memory utilization to 0.5 for each
//! instance", vLLM's `CacheConfig` docs), so the share less the CUDA context, as a fraction of
//! what CUDA reports, is the engine's argument, and the plan's memory is re-fitted to it.
//! SGLang sizes its pool from the memory free on the device when it starts, which other
//! tenants of the GPU change, so SGLang plans keep whole devices.

use std::collections::BTreeMap;

use super::PlanRequest;
use super::serving::serving_target;
use crate::hardware::{MIB, Precision};
use crate::plan::engine::choice::EngineKind;
use crate::plan::inventory::{DeviceSpec, NodeSpec, Reservations, any_shareable, find_node};
use crate::plan::memory::{DeviceMemory, ServingDevice, ServingFit, serving_fit};
use crate::plan::model::Model;
use crate::plan::report::{Fraction, FractionKind, Plan};
use crate::plan::share::Partition;
use crate::plan::units::Bytes;
use crate::plan::weights::WeightBytes;

/// What a vLLM process holds outside its `--gpu-memory-utilization` budget: the CUDA context
/// and the libraries' workspaces created before vLLM takes its baseline snapshot. The same
/// 512 MiB the training planner counts for the CUDA context (`training::BASE_OVERHEAD`); a
/// share is this much larger than the engine's budget.
pub const OUTSIDE_BUDGET: Bytes = Bytes(512 * MIB);

/// The fraction each replica of `plan` takes, when its devices are published in partitions
/// or shareable: a partition, else a share, with the plan's assignments, memory and engine
/// budget re-fitted to it; else the whole devices, with the reason. Plans on devices no
/// driver publishes either way are left as they are.
pub(super) fn choose(
    plan: &mut Plan,
    model: &Model,
    (nodes, reserved): (&[NodeSpec], &Reservations),
    request: &PlanRequest,
) {
    if !plan.fits {
        return;
    }
    let used: Vec<&DeviceSpec> = plan
        .assignments
        .iter()
        .flat_map(|a| a.devices.iter().map(move |id| (a.node.as_str(), id)))
        .filter_map(|(node, id)| device(nodes, node, id))
        .collect();
    let shareable = used.iter().find_map(|d| d.share.as_ref().map(|s| (*d, s)));
    let partitioned = used.iter().find(|d| !d.partitions.is_empty()).copied();
    let Some(sample) = shareable.map(|(d, _)| d).or(partitioned) else {
        return;
    };
    let mut why_not = Vec::new();
    match eligible(plan, request) {
        Err(why) => why_not.push(why),
        Ok(()) => {
            if partitioned.is_some() {
                match partitions(plan, model, (nodes, reserved), request) {
                    Ok(chosen) => return apply_partition(plan, chosen),
                    Err(why) => why_not.push(why),
                }
            }
            if shareable.is_some() {
                match shares(plan, model, (nodes, reserved), request) {
                    Ok(chosen) => return apply(plan, chosen),
                    Err(why) => why_not.push(why),
                }
            }
        }
    }
    if let Some(device) = used.iter().find(|d| d.partitions_only) {
        // Published only in partitions: without one, nothing of it can be held.
        plan.fits = false;
        plan.reasons.insert(
            0,
            format!(
                "{} ({}) is published only in partitions, and {}",
                device.id,
                device.product,
                why_not.join("; ")
            ),
        );
        return;
    }
    let device_bytes = shareable.map_or(sample.memory, |(_, share)| Bytes(share.policy.capacity));
    plan.fraction = Some(Fraction {
        kind: FractionKind::Device,
        bytes: device_bytes,
        device_bytes,
        profile: None,
    });
    let held = if shareable.is_some() {
        "each replica's claim requests all of its memory, so no share lands beside it"
    } else {
        "each replica holds the whole device"
    };
    plan.reasons.push(format!(
        "whole devices: {} is published {}, but {}; {held}",
        sample.product,
        if shareable.is_some() {
            "shareable"
        } else {
            "in partitions"
        },
        why_not.join("; ")
    ));
}

/// Whether a serving request may take shares on `nodes`: fractions allowed and some device
/// published shareable (a scan, no copy).
pub(super) fn may_share(any_shareable: bool, request: &PlanRequest) -> bool {
    !request.whole_devices && request.disaggregation.is_none() && any_shareable
}

/// Most replicas a search may size on one shareable device (the share step then decides how
/// many really fit): more engines than this on one GPU is not a serving layout worth
/// planning, and it bounds the search's view.
pub const MAX_SHARES_PER_DEVICE: u64 = 8;

/// The fleet as a search for shares sees it: each shareable device that is not full appears
/// as free whole devices, one per share its policy's smallest amount fits in what is left
/// (at most [`MAX_SHARES_PER_DEVICE`]), under the same id, so the search can size more
/// replicas than there are devices and devices others already hold shares of; a full one is
/// taken, and nothing is consumed. `None` when no device is shareable with room left, or the
/// request asks for whole devices. A plan made on this view is kept only when each replica
/// then gets a share of what is really left ([`choose`] on the real view, which picks the
/// devices again by best fit): the view only lets the search size the replicas.
pub(super) fn share_view(
    nodes: &[NodeSpec],
    reserved: &Reservations,
    request: &PlanRequest,
) -> Option<(Vec<NodeSpec>, Reservations)> {
    if !may_share(any_shareable(nodes), request) {
        return None;
    }
    let mut any_room = false;
    let mut view_reserved = Reservations::none();
    for (node, id) in reserved.iter() {
        view_reserved.insert(node, id);
    }
    let mut view = Vec::with_capacity(nodes.len());
    for node in nodes {
        let taken = reserved.on_node(&node.name);
        let mut seen = node.clone();
        seen.devices.clear();
        for device in &node.devices {
            let Some(share) = device.share.as_ref() else {
                seen.devices.push(device.clone());
                continue;
            };
            if taken.is_some_and(|ids| ids.contains(&device.id)) {
                seen.devices.push(device.clone());
                continue;
            }
            let consumed = share
                .consumed
                .saturating_add(reserved.consumed(&node.name, &device.id));
            let headroom = share.policy.capacity.saturating_sub(consumed);
            let smallest = share
                .policy
                .round(1)
                .unwrap_or(share.policy.capacity)
                .max(1);
            let slots = (headroom / smallest).min(MAX_SHARES_PER_DEVICE);
            if slots == 0 {
                view_reserved.insert(node.name.clone(), device.id.clone());
                seen.devices.push(device.clone());
                continue;
            }
            any_room = true;
            let mut free = device.clone();
            if let Some(share) = free.share.as_mut() {
                share.consumed = 0;
            }
            for _ in 0..slots {
                seen.devices.push(free.clone());
            }
        }
        view.push(seen);
    }
    any_room.then_some((view, view_reserved))
}

/// The fleet as a search for partitions sees it: only the devices a replica could take a
/// partition of (some partition free, leaving room for others), each free and appearing once
/// per free partition (so several replicas may go to one device's partitions), with the
/// nodes' other devices left out. That takes in a device reserved only because some of its
/// partitions are taken (a GPU one of whose MIG devices is held) and a device published only
/// in partitions ([`DeviceSpec::partitions_only`]), which the whole-device search never sees.
/// `None` when no such device exists, or the request may take no fraction. A plan made on
/// this view is kept only when every replica then gets a free partition ([`choose`] on the
/// real fleet): the view only lets the search size the replicas. A device held whole has
/// every partition reserved too, so it is left out.
pub(super) fn partition_view(
    nodes: &[NodeSpec],
    reserved: &Reservations,
    request: &PlanRequest,
) -> Option<(Vec<NodeSpec>, Reservations)> {
    if request.whole_devices || request.disaggregation.is_some() {
        return None;
    }
    let mut view = Vec::new();
    let mut view_reserved = reserved.clone();
    for node in nodes {
        let taken = reserved.on_node(&node.name);
        let free = |id: &String| !taken.is_some_and(|ids| ids.contains(id));
        // Each appears once per free partition (at most [`MAX_SHARES_PER_DEVICE`]) under its
        // own id, so the search may size more replicas than there are devices; the fraction
        // step then gives each replica a partition of its own.
        let mut candidates: Vec<DeviceSpec> = Vec::new();
        for device in &node.devices {
            let free_parts = device
                .partitions
                .iter()
                .filter(|partition| leaves_room(partition, device) && free(&partition.id))
                .count();
            if free_parts == 0 {
                continue;
            }
            view_reserved.remove(&node.name, &device.id);
            let copies = u64::try_from(free_parts)
                .unwrap_or(u64::MAX)
                .min(MAX_SHARES_PER_DEVICE);
            for _ in 0..copies {
                candidates.push(device.clone());
            }
        }
        if candidates.is_empty() {
            continue;
        }
        let mut seen = node.clone();
        seen.devices = candidates;
        view.push(seen);
    }
    (!view.is_empty()).then_some((view, view_reserved))
}

/// Most searches on a partition view for one plan ([`without_chosen`] takes out the devices
/// each failed one chose): enough for the GPUs of a node or two, and a bound on the cost.
pub const MAX_PARTITION_TRIES: usize = 8;

/// `view` with the devices `plan` chose reserved too, or `None` when it chose none that was
/// not already (nothing left to try).
pub(super) fn without_chosen(mut view: Reservations, plan: &Plan) -> Option<Reservations> {
    let mut changed = false;
    for assignment in &plan.assignments {
        for device in &assignment.devices {
            if !view.contains(&assignment.node, device) {
                view.insert(assignment.node.clone(), device.clone());
                changed = true;
            }
        }
    }
    changed.then_some(view)
}

/// Why no replica of `plan` may take a fraction, whatever the devices publish.
fn eligible(plan: &Plan, request: &PlanRequest) -> Result<(), String> {
    if plan.goal != "serve" {
        return Err("training plans take whole devices".to_string());
    }
    if request.whole_devices {
        return Err("the request asks for whole devices".to_string());
    }
    if request.disaggregation.is_some() {
        return Err("disaggregated pools are planned on whole devices".to_string());
    }
    let (tp, pp) = (plan.tp.unwrap_or(1), plan.pp.unwrap_or(1));
    if tp.saturating_mul(pp) > 1 {
        return Err(format!(
            "a replica spans {} devices (TP {tp} x PP {pp}), and fractions are planned for \
             one-device replicas",
            tp.saturating_mul(pp)
        ));
    }
    Ok(())
}

/// The plan's memory, precision, context and requests per replica.
fn layout(plan: &Plan) -> Result<(DeviceMemory, Precision, u64, u64), String> {
    let (Some(memory), Some(precision), Some(context)) =
        (plan.per_device, plan.precision, plan.context)
    else {
        return Err("the plan has no memory breakdown".to_string());
    };
    let replicas = u64::from(plan.replicas.unwrap_or(1).max(1));
    let per_replica = plan.concurrency.unwrap_or(1).div_ceil(replicas).max(1);
    Ok((memory, precision, context, per_replica))
}

/// A plan's replicas moved onto partitions.
#[derive(Debug)]
struct Partitions {
    /// The partition each assignment (in order) takes, by planner id.
    devices: Vec<String>,
    /// The smallest partition chosen (its profile sizes every replica's engine).
    partition: Partition,
    /// Its parent's memory.
    device_bytes: Bytes,
    /// The memory re-fitted to the partition.
    fit: ServingFit,
    /// Requests each replica serves.
    per_replica: u64,
    /// The product.
    product: String,
}

/// For every replica, the smallest published partition of its device, not reserved nor taken
/// by an earlier replica, whose memory holds the replica's requests (the engine sees the
/// partition as its device, so the request's budget applies to the partition's memory), or
/// why none does. Replicas on one device take partitions of one profile: a driver's
/// partitions of one profile never overlap (MIG placements of a profile tile the GPU; AMD's
/// are the GPU's whole layout), where two profiles may.
fn partitions(
    plan: &Plan,
    model: &Model,
    (nodes, reserved): (&[NodeSpec], &Reservations),
    request: &PlanRequest,
) -> Result<Partitions, String> {
    let (_, precision, context, per_replica) = layout(plan)?;
    let target = serving_target(request, context);
    let weights = WeightBytes::of(model, precision);
    let mut chosen: Vec<String> = Vec::with_capacity(plan.assignments.len());
    let mut profile_on: BTreeMap<(&str, &str), &str> = BTreeMap::new();
    let mut smallest: Option<(&Partition, ServingFit, &DeviceSpec)> = None;
    for assignment in &plan.assignments {
        let Some(device) = assignment
            .devices
            .first()
            .and_then(|id| device(nodes, &assignment.node, id))
        else {
            return Err(format!(
                "a device of node {} is not in the fleet",
                assignment.node
            ));
        };
        let pick = device
            .partitions
            .iter()
            .filter(|partition| leaves_room(partition, device))
            .filter(|partition| !reserved.contains(&assignment.node, &partition.id))
            .filter(|partition| !chosen.contains(&partition.id))
            .filter(|partition| {
                profile_on
                    .get(&(assignment.node.as_str(), device.id.as_str()))
                    .is_none_or(|profile| *profile == partition.profile)
            })
            .find_map(|partition| {
                let serving = ServingDevice::new(device.vendor, partition.memory, &device.product);
                let fit = serving_fit(model, &weights, serving, 1, 1, &target);
                (fit.fits() && fit.max_concurrency >= per_replica).then_some((partition, fit))
            });
        let Some((partition, fit)) = pick else {
            return Err(format!(
                "no free published partition of {} on {} holds a replica's {per_replica} \
                 request(s) of {context} tokens",
                device.id, assignment.node
            ));
        };
        if smallest.is_none_or(|(best, _, _)| partition.memory < best.memory) {
            smallest = Some((partition, fit, device));
        }
        profile_on.insert(
            (assignment.node.as_str(), device.id.as_str()),
            partition.profile.as_str(),
        );
        chosen.push(partition.id.clone());
    }
    let (partition, fit, device) = smallest.ok_or("the plan has no replicas")?;
    Ok(Partitions {
        devices: chosen,
        partition: partition.clone(),
        device_bytes: parent_bytes(device),
        fit,
        per_replica,
        product: device.product.clone(),
    })
}

/// True when `partition` leaves room on `device` for another: at most 7/8 of its memory (an
/// NVIDIA GPU has 8 memory slices, and `7g.80gb` takes all of an H100's). A profile that
/// takes all of the memory is the whole device in another form, so the device is held whole.
/// A device published only in partitions cannot be held whole: any of them will do.
fn leaves_room(partition: &Partition, device: &DeviceSpec) -> bool {
    device.partitions_only || u128::from(partition.memory.0) * 8 <= u128::from(device.memory.0) * 7
}

/// The memory of the device `partition`s are part of, for the plan's `device_bytes`: its
/// own, or for a device published only in partitions the sum of them where that is more
/// (the agent may read one partition's memory as the device's).
fn parent_bytes(device: &DeviceSpec) -> Bytes {
    if !device.partitions_only {
        return device.memory;
    }
    let parts = device
        .partitions
        .iter()
        .fold(0u64, |sum, p| sum.saturating_add(p.memory.0));
    Bytes(device.memory.0.max(parts))
}

/// Moves `plan` onto `chosen` partitions: its devices, memory and the fraction.
fn apply_partition(plan: &mut Plan, chosen: Partitions) {
    let Partitions {
        devices,
        partition,
        device_bytes,
        fit,
        per_replica,
        product,
    } = chosen;
    for (assignment, device) in plan.assignments.iter_mut().zip(devices) {
        assignment.devices = vec![device];
    }
    let replicas = plan.replicas.unwrap_or(1).max(1);
    let memory = fit.memory;
    if memory.capacity.0 > 0 {
        plan.gpu_memory_utilization = Some(memory.budget.as_f64() / memory.capacity.as_f64());
    }
    plan.per_device = Some(fit.with_concurrency(per_replica.min(fit.max_concurrency)));
    plan.kv_tokens = Some(fit.kv_tokens);
    plan.max_concurrency = Some(fit.max_concurrency.saturating_mul(u64::from(replicas)));
    plan.throughput = None;
    replace_replicas_line(plan, fit.max_concurrency, per_replica);
    replace_budget_line(
        plan,
        format!(
            "budget: {:.2} x the partition's {} = {}; activations {}, overhead {}; {} left for \
             KV = {} full-context request(s) per replica",
            memory.budget.as_f64() / memory.capacity.as_f64().max(1.0),
            memory.capacity,
            memory.budget,
            memory.activations,
            memory.overhead,
            fit.kv_free,
            fit.max_concurrency
        ),
    );
    plan.reasons.push(format!(
        "a {} partition ({}) of each {product} ({device_bytes}) per replica: the smallest \
         published profile whose memory holds a replica's {per_replica} request(s); its compute \
         and bandwidth are a part of the device's, so no throughput estimate is given",
        partition.profile, partition.memory
    ));
    plan.fraction = Some(Fraction {
        kind: FractionKind::Partition,
        bytes: partition.memory,
        device_bytes,
        profile: Some(partition.profile),
    });
}

/// Replaces the whole-device budget line with `line`; the suggestions checked against whole
/// devices no longer describe a plan on a fraction.
fn replace_budget_line(plan: &mut Plan, line: String) {
    match plan.reasons.iter_mut().find(|r| r.starts_with("budget: ")) {
        Some(existing) => *existing = line,
        None => plan.reasons.push(line),
    }
    plan.suggestions.clear();
    plan.suggested_changes.clear();
}

/// Re-states the search's `N replicas: each holds ...` line (counted on whole devices) for the
/// fraction each replica got: `holds` requests each, `asked` of each.
fn replace_replicas_line(plan: &mut Plan, holds: u64, asked: u64) {
    let replicas = plan.replicas.unwrap_or(1);
    let prefix = format!("{replicas} replicas: each holds ");
    if let Some(line) = plan.reasons.iter_mut().find(|r| r.starts_with(&prefix)) {
        *line = format!(
            "{replicas} replicas: each holds {holds} full-context request(s) in its fraction, \
             {asked} asked of each"
        );
    }
}

/// A device of the fleet by node and id.
fn device<'a>(nodes: &'a [NodeSpec], node: &str, id: &str) -> Option<&'a DeviceSpec> {
    find_node(nodes, node)?.devices.iter().find(|d| d.id == id)
}

/// A plan's replicas moved onto shares.
#[derive(Debug)]
struct Shares {
    /// The device each assignment (in order) takes a share of.
    devices: Vec<String>,
    /// The smallest share a replica got (every replica's engine gets this budget).
    bytes: Bytes,
    /// The devices' memory capacity.
    device_bytes: Bytes,
    /// The memory re-fitted to the share's budget.
    fit: ServingFit,
    /// `--gpu-memory-utilization` of the share.
    util: f64,
    /// Requests each replica serves.
    per_replica: u64,
    /// The policy, in words.
    policy: String,
}

/// Shares for every replica of `plan`, or why it keeps whole devices.
fn shares(
    plan: &Plan,
    model: &Model,
    (nodes, reserved): (&[NodeSpec], &Reservations),
    request: &PlanRequest,
) -> Result<Shares, String> {
    if request.engine.kind == EngineKind::Sglang {
        return Err(
            "SGLang sizes its memory pool from what is free on the device when it \
                    starts, which other tenants of a shared device change"
                .to_string(),
        );
    }
    let (memory, precision, context, per_replica) = layout(plan)?;
    let need = memory.total + OUTSIDE_BUDGET;

    // Best fit, replica by replica, on the node the search chose for it: the shareable
    // device of the plan's product with the least room left that still holds the share, so
    // small models fill one device before starting the next.
    let product = plan.device.as_deref().unwrap_or_default();
    let mut consumed: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut chosen = Vec::with_capacity(plan.assignments.len());
    let mut smallest: Option<(u64, &DeviceSpec)> = None;
    for assignment in &plan.assignments {
        let node = find_node(nodes, &assignment.node)
            .ok_or_else(|| format!("node {} is not in the fleet", assignment.node))?;
        let taken = reserved.on_node(&node.name);
        let mut best: Option<(u64, u64, &DeviceSpec)> = None;
        let mut last_refusal = None;
        for device in &node.devices {
            let Some(share) = &device.share else { continue };
            if device.product != product || taken.is_some_and(|t| t.contains(&device.id)) {
                continue;
            }
            // What the device's publication says is consumed, what others hold of it
            // (claims, other placements: the reservations), and this plan's replicas so far.
            let mut state = share.clone();
            state.consumed = state
                .consumed
                .saturating_add(reserved.consumed(&node.name, &device.id))
                .saturating_add(
                    consumed
                        .get(&(node.name.as_str(), device.id.as_str()))
                        .copied()
                        .unwrap_or(0),
                );
            match state.fit(need.0) {
                Ok(rounded) if rounded >= state.policy.capacity => {
                    last_refusal = Some(format!(
                        "a share that holds a replica ({need}) is all of the device's {}",
                        Bytes(state.policy.capacity)
                    ));
                }
                Ok(rounded) => {
                    let left = state.headroom() - rounded;
                    if best.is_none_or(|(best_left, _, _)| left < best_left) {
                        best = Some((left, rounded, device));
                    }
                }
                Err(why) => last_refusal = Some(why),
            }
        }
        let Some((_, rounded, device)) = best else {
            return Err(last_refusal.map_or_else(
                || format!("no shareable {product} on {} is free", node.name),
                |why| format!("no share on {} holds a replica ({need}): {why}", node.name),
            ));
        };
        *consumed
            .entry((node.name.as_str(), device.id.as_str()))
            .or_default() += rounded;
        if smallest.is_none_or(|(bytes, _)| rounded < bytes) {
            smallest = Some((rounded, device));
        }
        chosen.push(device.id.clone());
    }
    let (bytes, device) = smallest.ok_or("the plan has no replicas")?;
    let share = device.share.as_ref().ok_or("the device is not shareable")?;
    let runtime = device.runtime_memory();
    let budget = Bytes(bytes).saturating_sub(OUTSIDE_BUDGET);
    // Rounded down to the engine's printed precision, so the budget never grows past the share.
    let util = (budget.as_f64() / runtime.as_f64() * 1000.0).floor() / 1000.0;
    let mut target = serving_target(request, context);
    target.gpu_util = util;
    target.engine_default_util = false;
    let weights = WeightBytes::of(model, precision);
    let serving = ServingDevice::new(device.vendor, runtime, &device.product);
    let fit = serving_fit(model, &weights, serving, 1, 1, &target);
    if !fit.fits() || fit.max_concurrency < per_replica {
        return Err(format!(
            "a share of {} holds {} of the {per_replica} requests a replica serves",
            Bytes(bytes),
            fit.max_concurrency
        ));
    }
    Ok(Shares {
        devices: chosen,
        bytes: Bytes(bytes),
        device_bytes: Bytes(share.policy.capacity),
        fit,
        util,
        per_replica,
        policy: share.policy.describe(),
    })
}

/// Moves `plan` onto `shares`: its devices, memory, engine budget and the fraction.
fn apply(plan: &mut Plan, shares: Shares) {
    let Shares {
        devices,
        bytes,
        device_bytes,
        fit,
        util,
        per_replica,
        policy,
    } = shares;
    for (assignment, device) in plan.assignments.iter_mut().zip(devices) {
        assignment.devices = vec![device];
    }
    let distinct = plan
        .assignments
        .iter()
        .flat_map(|a| a.devices.iter().map(move |d| (a.node.as_str(), d.as_str())))
        .collect::<std::collections::BTreeSet<(&str, &str)>>()
        .len();
    let replicas = plan.replicas.unwrap_or(1).max(1);
    plan.devices = u32::try_from(distinct).ok();
    plan.gpu_memory_utilization = Some(util);
    plan.per_device = Some(fit.with_concurrency(per_replica.min(fit.max_concurrency)));
    plan.kv_tokens = Some(fit.kv_tokens);
    plan.max_concurrency = Some(fit.max_concurrency.saturating_mul(u64::from(replicas)));
    replace_replicas_line(plan, fit.max_concurrency, per_replica);
    plan.fraction = Some(Fraction {
        kind: FractionKind::Share,
        bytes,
        device_bytes,
        profile: None,
    });
    let memory = fit.memory;
    replace_budget_line(
        plan,
        format!(
            "budget: the share's {bytes} less {OUTSIDE_BUDGET} of CUDA context = {} ({util:.3} \
             x {}); activations {}, overhead {}; {} left for KV = {} full-context request(s) \
             per replica",
            memory.budget,
            memory.capacity,
            memory.activations,
            memory.overhead,
            fit.kv_free,
            fit.max_concurrency
        ),
    );
    plan.reasons.push(format!(
        "a share of {bytes} of each device's {device_bytes} per replica ({} replica(s) on {} \
         device(s)): the replica's memory plus {OUTSIDE_BUDGET} of CUDA context, rounded up \
         to the driver's policy ({policy}); --gpu-memory-utilization {util:.3} is that share \
         less the context, and other tenants of the device share its bandwidth, so throughput \
         may be lower than estimated",
        replicas, distinct
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::error::PlanError;
    use crate::plan::model::presets;
    use crate::plan::search::plan;
    use crate::plan::share::{SharePolicy, ShareRule, Shareable};
    use crate::plan::shorthand::parse_hardware;
    use crate::plan::training::{LoraTarget, Method, OptimizerStates, TrainingTarget};
    use crate::plan::{Goal, Model};

    const GI: u64 = 1 << 30;

    fn model(key: &str) -> Model {
        presets::find(key).expect("presets").expect("preset")
    }

    /// The example driver's policy: 80Gi, 8Gi to 80Gi in 8Gi steps.
    fn stepped() -> SharePolicy {
        let rule = ShareRule::Range {
            min: 8 * GI,
            max: Some(80 * GI),
            step: Some(8 * GI),
        };
        SharePolicy::checked(80 * GI, Some(80 * GI), rule).unwrap()
    }

    /// `count` H100s on one node, shareable under `policy`, with `consumed` bytes of each
    /// already taken.
    fn shared_h100s(policy: &SharePolicy, consumed: &[u64]) -> Vec<NodeSpec> {
        let mut nodes = parse_hardware(&format!("1x{}xH100", consumed.len())).unwrap();
        for (device, used) in nodes[0].devices.iter_mut().zip(consumed) {
            device.share = Some(Shareable {
                policy: policy.clone(),
                consumed: *used,
            });
        }
        nodes
    }

    fn serve(concurrency: u64) -> PlanRequest {
        PlanRequest::serve(Some(8192), concurrency).with_precision(crate::hardware::Precision::Bf16)
    }

    fn planned(model_key: &str, nodes: &[NodeSpec], request: &PlanRequest) -> Plan {
        let result = plan(&model(model_key), nodes, &Reservations::none(), request).unwrap();
        assert!(result.fits, "{:?}", result.reasons);
        result
    }

    fn devices_of(plan: &Plan) -> Vec<String> {
        plan.assignments
            .iter()
            .flat_map(|a| a.devices.iter().cloned())
            .collect()
    }

    /// The share is the whole-device plan's memory for the replica's requests plus the CUDA
    /// context, rounded up to the next 8Gi step; the engine's budget is that share less the
    /// context, and the re-fitted memory still holds every request asked for.
    #[test]
    fn a_small_model_takes_the_share_its_memory_rounds_to() {
        let nodes = shared_h100s(&stepped(), &[0, 0]);
        let mut whole_request = serve(4);
        whole_request.whole_devices = true;
        let whole = planned("llama-3.1-8b", &nodes, &whole_request);
        let need = whole.per_device.unwrap().total + OUTSIDE_BUDGET;
        let expected = need.0.div_ceil(8 * GI) * 8 * GI;

        let shared = planned("llama-3.1-8b", &nodes, &serve(4));
        let fraction = shared.fraction.expect("a fraction");
        assert_eq!(fraction.kind, FractionKind::Share);
        assert_eq!(fraction.bytes, Bytes(expected));
        assert_eq!(fraction.device_bytes, Bytes(80 * GI));
        let memory = shared.per_device.unwrap();
        assert!(memory.budget + OUTSIDE_BUDGET <= fraction.bytes);
        assert!(memory.within_budget(), "{memory:?}");
        assert!(shared.max_concurrency.unwrap() >= 4);
        let util = shared.gpu_memory_utilization.unwrap();
        assert!(util < whole.gpu_memory_utilization.unwrap());
        let runtime = nodes[0].devices[0].runtime_memory();
        assert!(util * runtime.as_f64() + OUTSIDE_BUDGET.as_f64() <= expected as f64);
        let engine = shared.engine.as_ref().expect("engine arguments");
        assert!(
            engine.vllm.contains(&format!("{util:.3}")),
            "{:?}",
            engine.vllm
        );
        assert!(shared.suggestions.is_empty(), "{:?}", shared.suggestions);
        assert!(
            shared
                .reasons
                .iter()
                .any(|r| r.starts_with("budget: the share's"))
        );
        // The whole-device plan says it holds all of each shareable device.
        let fraction = whole.fraction.expect("a fraction");
        assert_eq!(
            (fraction.kind, fraction.bytes),
            (FractionKind::Device, Bytes(80 * GI))
        );
    }

    /// Best fit: replicas go to the device with the least room that still holds them, so a
    /// device others already share fills up before an empty one is started, and a share that
    /// would overflow a device lands on another.
    /// Where every shareable GPU already holds shares, no whole device is free for the search
    /// to size a replica on; a share of what is left is still planned, through reservations
    /// (other placements' shares) as through the publication's own count, and never past the
    /// capacity: with 8Gi left of each GPU, a 24Gi share does not fit anywhere.
    #[test]
    fn a_share_is_planned_when_every_gpu_already_holds_shares() {
        let request = serve(1);
        let nodes = shared_h100s(&stepped(), &[48 * GI, 0]);
        let mut reserved = Reservations::none();
        reserved.consume(
            nodes[0].name.clone(),
            nodes[0].devices[1].id.clone(),
            40 * GI,
        );
        let shared = plan_fn(&nodes, &reserved, &request).unwrap();
        assert!(shared.fits, "{:?}", shared.reasons);
        let fraction = shared.fraction.clone().expect("a fraction");
        assert_eq!(fraction.kind, FractionKind::Share);
        assert_eq!(fraction.bytes, Bytes(24 * GI));
        // Best fit: 48 + 24 leaves 8Gi on GPU 0, 40 + 24 would leave 16Gi on GPU 1.
        assert_eq!(devices_of(&shared), [nodes[0].devices[0].id.clone()]);

        let full = shared_h100s(&stepped(), &[72 * GI, 72 * GI]);
        match plan_fn(&full, &Reservations::none(), &request) {
            Ok(refused) => assert!(!refused.fits, "{refused:?}"),
            Err(PlanError::NoDevices(_)) => {}
            Err(other) => panic!("{other}"),
        }
        // Asked for whole devices, a GPU with shares on it is no device at all.
        let mut whole = request.clone();
        whole.whole_devices = true;
        let on_used = shared_h100s(&stepped(), &[48 * GI, 8 * GI]);
        assert!(matches!(
            plan(
                &model("llama-3.1-8b"),
                &on_used,
                &Reservations::none(),
                &whole
            ),
            Err(PlanError::NoDevices(_))
        ));
    }

    /// Replicas beyond the device count are planned as shares: six replicas of an 8B model
    /// on two H100s, three 24Gi shares on each; a seventh would overflow, and is refused.
    #[test]
    fn more_replicas_than_devices_are_planned_as_shares() {
        let nodes = shared_h100s(&stepped(), &[0, 0]);
        let mut six = serve(6);
        six.replicas = Some(6);
        let shared = plan_fn(&nodes, &Reservations::none(), &six).unwrap();
        assert!(shared.fits, "{:?}", shared.reasons);
        assert_eq!(shared.replicas, Some(6));
        let fraction = shared.fraction.clone().expect("a fraction");
        assert_eq!(
            (fraction.kind, fraction.bytes),
            (FractionKind::Share, Bytes(24 * GI))
        );
        let mut per_device: BTreeMap<String, usize> = BTreeMap::new();
        for device in devices_of(&shared) {
            *per_device.entry(device).or_default() += 1;
        }
        assert_eq!(per_device.values().copied().collect::<Vec<_>>(), [3, 3]);
        // The reasons count requests in the share, not on the whole device the search saw.
        let fit = shared.per_device.expect("memory").kv_cache;
        assert!(fit.0 > 0);
        let line = shared
            .reasons
            .iter()
            .find(|r| r.starts_with("6 replicas: each holds "))
            .expect("the replicas line");
        assert!(line.contains("in its fraction"), "{line}");
        let mut seven = serve(7);
        seven.replicas = Some(7);
        let refused = plan_fn(&nodes, &Reservations::none(), &seven);
        assert!(refused.is_err() || refused.is_ok_and(|plan| !plan.fits));
    }

    fn plan_fn(
        nodes: &[NodeSpec],
        reserved: &Reservations,
        request: &PlanRequest,
    ) -> crate::plan::Result<Plan> {
        plan(&model("llama-3.1-8b"), nodes, reserved, request)
    }

    #[test]
    fn replicas_pack_best_fit_and_never_overflow_a_device() {
        // gpu0 has 32 GiB left, gpu1 is empty: one replica goes to gpu0 (the search itself
        // only plans on gpu1, the device nobody shares).
        let nodes = shared_h100s(&stepped(), &[48 * GI, 0]);
        let shared = planned("llama-3.1-8b", &nodes, &serve(4));
        assert_eq!(shared.fraction.as_ref().unwrap().kind, FractionKind::Share);
        assert_eq!(devices_of(&shared), ["gpu0"]);
        // With 16 GiB left on gpu0 the share does not fit there.
        let nodes = shared_h100s(&stepped(), &[64 * GI, 0]);
        let shared = planned("llama-3.1-8b", &nodes, &serve(4));
        assert_eq!(devices_of(&shared), ["gpu1"]);
        // Two replicas of 24 GiB share one empty device.
        let nodes = shared_h100s(&stepped(), &[0, 0]);
        let mut two = serve(8);
        two.replicas = Some(2);
        let shared = planned("llama-3.1-8b", &nodes, &two);
        let devices = devices_of(&shared);
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[0], devices[1], "both replicas on one device");
        assert_eq!(shared.devices, Some(1));
        let share = shared.fraction.unwrap().bytes;
        assert!(share.0 * 2 <= 80 * GI);
    }

    /// Whole devices, with the reason, wherever a share would not be honest: a replica of
    /// several devices, SGLang, a request for whole devices, training, and a policy whose
    /// largest share is smaller than the replica.
    #[test]
    fn whole_devices_where_a_share_does_not_apply_and_the_plan_says_why() {
        let nodes = shared_h100s(&stepped(), &[0, 0, 0, 0]);
        let why = |plan: &Plan| {
            assert_eq!(
                plan.fraction.as_ref().map(|f| f.kind),
                Some(FractionKind::Device)
            );
            plan.reasons
                .iter()
                .find(|r| r.starts_with("whole devices: "))
                .cloned()
                .unwrap_or_default()
        };
        let big = planned("llama-3.1-70b", &nodes, &serve(1));
        assert!(why(&big).contains("fractions are planned for one-device replicas"));

        let mut sglang = serve(1);
        sglang.engine.kind = EngineKind::Sglang;
        assert!(why(&planned("llama-3.1-8b", &nodes, &sglang)).contains("SGLang"));

        let mut whole = serve(1);
        whole.whole_devices = true;
        assert!(why(&planned("llama-3.1-8b", &nodes, &whole)).contains("asks for whole"));

        let mut train = serve(1);
        train.goal = Goal::Train(TrainingTarget {
            method: Method::Lora,
            seq_len: 2048,
            micro_batch: 1,
            gradient_checkpointing: true,
            lora_rank: 16,
            lora_targets: LoraTarget::ALL.to_vec(),
            optimizer_states: OptimizerStates::Fp32,
            loss: Default::default(),
            adamw: Default::default(),
            kernels: Default::default(),
        });
        assert!(why(&planned("llama-3.2-1b", &nodes, &train)).contains("training"));

        let small_values = SharePolicy::checked(
            80 * GI,
            Some(10 * GI),
            ShareRule::Values(vec![10 * GI, 16 * GI]),
        )
        .unwrap();
        let nodes = shared_h100s(&small_values, &[0]);
        assert!(why(&planned("llama-3.1-8b", &nodes, &serve(4))).contains("largest valid value"));
    }

    /// H100s whose driver publishes MIG partitions of them (1g.10gb, 3g.40gb, 7g.80gb, as in
    /// `fixtures/dra/nvidia-h100-dynamic-mig.yaml`), optionally shareable as well.
    fn partitioned_h100s(count: usize, share: Option<SharePolicy>) -> Vec<NodeSpec> {
        let mut nodes = parse_hardware(&format!("1x{count}xH100")).unwrap();
        for device in &mut nodes[0].devices {
            device.partitions = [("1g.10gb", 9984), ("3g.40gb", 40320), ("7g.80gb", 80896)]
                .iter()
                .map(|(profile, mib)| Partition {
                    id: format!("{}-mig-{profile}", device.id),
                    profile: profile.to_string(),
                    memory: Bytes(mib * MIB),
                })
                .collect();
            device.share = share.clone().map(|policy| Shareable {
                policy,
                consumed: 0,
            });
        }
        nodes
    }

    /// The smallest profile whose memory holds the replica's requests, with the engine's
    /// budget applied to the partition (the engine sees it as its device); it comes before a
    /// share of the same device, and each replica takes a partition of its own device.
    #[test]
    fn the_smallest_partition_that_holds_a_replica_comes_first() {
        let nodes = partitioned_h100s(2, Some(stepped()));
        let on_mig = planned("llama-3.1-8b", &nodes, &serve(4));
        let fraction = on_mig.fraction.clone().expect("a fraction");
        assert_eq!(fraction.kind, FractionKind::Partition);
        assert_eq!(fraction.profile.as_deref(), Some("3g.40gb"));
        assert_eq!(fraction.bytes, Bytes(40320 * MIB));
        assert_eq!(devices_of(&on_mig), ["gpu0-mig-3g.40gb"]);
        let memory = on_mig.per_device.unwrap();
        assert_eq!(memory.capacity, Bytes(40320 * MIB));
        assert!(memory.within_budget());
        assert!(on_mig.max_concurrency.unwrap() >= 4);
        assert_eq!(on_mig.throughput, None);

        // A 1B model fits the smallest profile; two replicas take one on each GPU.
        let mut two = PlanRequest::serve(Some(4096), 2);
        two.replicas = Some(2);
        let small = planned("llama-3.2-1b", &nodes, &two);
        assert_eq!(
            small.fraction.as_ref().unwrap().profile.as_deref(),
            Some("1g.10gb")
        );
        assert_eq!(devices_of(&small), ["gpu0-mig-1g.10gb", "gpu1-mig-1g.10gb"]);

        // No profile that leaves room for another holds 35 requests (70 over two replicas):
        // a share instead.
        let busy = planned("llama-3.1-8b", &nodes, &serve(70));
        let fraction = busy.fraction.unwrap();
        assert_eq!(fraction.kind, FractionKind::Share, "{:?}", busy.reasons);
        // Without a share policy the GPU is held whole, and the plan says why.
        let nodes = partitioned_h100s(1, None);
        let whole = planned("llama-3.1-8b", &nodes, &serve(50));
        assert_eq!(whole.fraction.as_ref().unwrap().kind, FractionKind::Device);
        assert!(
            whole
                .reasons
                .iter()
                .any(|r| r.contains("no free published partition of gpu0")),
            "{:?}",
            whole.reasons
        );
    }

    /// Issue 39, claims-mode partitions: a GPU reserved only because some of its partitions
    /// are taken still takes a replica on a free partition (the search sees it through
    /// [`partition_view`]); reserved partitions are never chosen; a GPU whose partitions are
    /// all reserved (held whole) is not offered; and a model no free partition holds is
    /// refused rather than given a reserved whole GPU.
    #[test]
    fn partitions_left_free_beside_others_are_planned_and_taken_ones_never() {
        let nodes = partitioned_h100s(2, None);
        let node = nodes[0].name.clone();
        let mut reserved = Reservations::none();
        // GPU 0: held whole (every partition reserved with it); GPU 1: its 1g.10gb is
        // someone's, so the GPU is reserved, its 3g.40gb free.
        for id in [
            "gpu0",
            "gpu0-mig-1g.10gb",
            "gpu0-mig-3g.40gb",
            "gpu0-mig-7g.80gb",
        ] {
            reserved.insert(node.clone(), id);
        }
        for id in ["gpu1", "gpu1-mig-1g.10gb", "gpu1-mig-7g.80gb"] {
            reserved.insert(node.clone(), id);
        }
        let (view, view_reserved) =
            partition_view(&nodes, &reserved, &serve(4)).expect("GPU 1 has room");
        let offered: Vec<&str> = view[0].devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(offered, ["gpu1"], "held whole is not offered");
        assert!(!view_reserved.contains(&node, "gpu1"));
        assert!(view_reserved.contains(&node, "gpu1-mig-1g.10gb"));
        let on_mig = plan(&model("llama-3.1-8b"), &nodes, &reserved, &serve(4)).unwrap();
        assert!(on_mig.fits, "{:?}", on_mig.reasons);
        assert_eq!(devices_of(&on_mig), ["gpu1-mig-3g.40gb"]);
        assert_eq!(
            on_mig.fraction.as_ref().map(|f| f.kind),
            Some(FractionKind::Partition)
        );

        // A 70B model fits no partition: refused, not put on the reserved GPU 1 whole.
        let big = plan(&model("llama-3.1-70b"), &nodes, &reserved, &serve(1));
        assert!(big.is_err() || !big.unwrap().fits);

        // With GPU 1's 3g.40gb taken too, nothing is left.
        reserved.insert(node.clone(), "gpu1-mig-3g.40gb");
        assert_eq!(partition_view(&nodes, &reserved, &serve(4)), None);
        let none = plan(&model("llama-3.1-8b"), &nodes, &reserved, &serve(4));
        assert!(none.is_err(), "{none:?}");

        // Whole devices asked for: no view.
        let mut whole = serve(4);
        whole.whole_devices = true;
        reserved.remove(&node, "gpu1-mig-3g.40gb");
        assert_eq!(partition_view(&nodes, &reserved, &whole), None);
    }

    /// Issue 39, AMD partitions: an MI300X partitioned on its node (DPX: two partitions of
    /// 98,296 MiB, no whole entry) is planned only through them. A small model takes a
    /// partition even where a whole MI300X is free elsewhere; a model no partition holds, or
    /// a request for whole devices, takes the whole one; with that one reserved, such a
    /// model is refused rather than given the partitioned GPU whole; with both partitions
    /// reserved, the small model goes whole.
    #[test]
    fn a_gpu_published_only_in_partitions_is_planned_only_through_them() {
        let mut nodes = parse_hardware("2x1xMI300X").unwrap();
        let (split_node, whole_node) = (nodes[0].name.clone(), nodes[1].name.clone());
        let split = &mut nodes[0].devices[0];
        split.partitions_only = true;
        split.partitions = (0..2)
            .map(|i| Partition {
                id: format!("gpu0-dpx-{i}"),
                profile: "dpx_nps2".to_string(),
                memory: Bytes(98_296 * MIB),
            })
            .collect();
        let small = planned("llama-3.1-8b", &nodes, &serve(4));
        assert_eq!(small.assignments[0].node, split_node);
        assert_eq!(devices_of(&small), ["gpu0-dpx-0"]);
        let fraction = small.fraction.clone().unwrap();
        assert_eq!(
            (fraction.kind, fraction.profile.as_deref()),
            (FractionKind::Partition, Some("dpx_nps2"))
        );
        assert_eq!(fraction.bytes, Bytes(98_296 * MIB));
        assert!(
            fraction.device_bytes >= Bytes(196_592 * MIB),
            "{fraction:?}"
        );

        let big = planned("llama-3.1-70b", &nodes, &serve(1));
        assert_eq!(big.assignments[0].node, whole_node, "{:?}", big.reasons);
        let mut whole = serve(4);
        whole.whole_devices = true;
        let asked_whole = planned("llama-3.1-8b", &nodes, &whole);
        assert_eq!(asked_whole.assignments[0].node, whole_node);

        let mut reserved = Reservations::none();
        reserved.insert(whole_node.clone(), nodes[1].devices[0].id.clone());
        let refused = plan(&model("llama-3.1-70b"), &nodes, &reserved, &serve(1));
        assert!(
            refused.as_ref().is_err() || refused.as_ref().is_ok_and(|p| !p.fits),
            "{refused:?}"
        );
        let mut reserved = Reservations::none();
        reserved.insert(split_node.clone(), "gpu0-dpx-0");
        let second = plan(&model("llama-3.1-8b"), &nodes, &reserved, &serve(4)).unwrap();
        assert_eq!(devices_of(&second), ["gpu0-dpx-1"]);
        reserved.insert(split_node, "gpu0-dpx-1");
        let full = plan(&model("llama-3.1-8b"), &nodes, &reserved, &serve(4)).unwrap();
        assert!(full.fits, "{:?}", full.reasons);
        assert_eq!(full.assignments[0].node, whole_node);
    }

    /// A GPU in CPX mode (eight 24 GiB partitions, published only as them) holds up to eight
    /// replicas of a small model, each on a partition of its own; a ninth replica needs a
    /// second such GPU.
    #[test]
    fn several_replicas_take_partitions_of_one_gpu() {
        let nodes = crate::testing::dra::partitioned_mi300x(2, 8, "cpx_nps4");
        let mut request = serve(4);
        request.replicas = Some(4);
        let four = planned("llama-3.1-8b", &nodes, &request);
        let devices = devices_of(&four);
        assert_eq!(devices.len(), 4, "{devices:?}");
        let distinct: std::collections::BTreeSet<&String> = devices.iter().collect();
        assert_eq!(distinct.len(), 4, "a partition each: {devices:?}");
        assert!(
            devices.iter().all(|d| d.starts_with("gpu0-cpx_nps4-")),
            "{devices:?}"
        );
        assert_eq!(
            four.fraction.as_ref().and_then(|f| f.profile.as_deref()),
            Some("cpx_nps4")
        );
        request.replicas = Some(9);
        let nine = planned("llama-3.1-8b", &nodes, &request);
        let devices = devices_of(&nine);
        let distinct: std::collections::BTreeSet<&String> = devices.iter().collect();
        assert_eq!(distinct.len(), 9, "{devices:?}");
        assert!(
            devices.iter().any(|d| d.starts_with("gpu1-")),
            "{devices:?}"
        );
    }

    /// Devices no driver publishes shareable keep every plan as it was: no fraction at all.
    #[test]
    fn plans_on_devices_nobody_shares_carry_no_fraction() {
        let nodes = parse_hardware("1x2xH100").unwrap();
        let result = planned("llama-3.1-8b", &nodes, &serve(4));
        assert_eq!(result.fraction, None);
        assert!(result.gpu_memory_utilization.unwrap() > 0.85);
    }
}
