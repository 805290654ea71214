//! When nothing fits: why, per device class, and what would fit instead — a narrower
//! precision, an FP8 KV cache, a shorter context (the longest that fits is computed), a looser
//! node cap, or more nodes like one already in the inventory.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::PlanRequest;
use super::parallel::{valid_pipeline_sizes, valid_tensor_parallel_sizes};
use super::serving::{Demand, Outcome, search};
use crate::hardware::Precision;
use crate::plan::capability::{PrecisionChoice, serving_candidates, serving_support};
use crate::plan::fleet::{DeviceClass, Fleet};
use crate::plan::inventory::{NodeSpec, Reservations};
use crate::plan::kv::{KvDtype, KvLayout};
use crate::plan::memory::{ServingFit, ServingTarget, scheduler_defaults, serving_fit};
use crate::plan::model::Model;
use crate::plan::report::Plan;
use crate::plan::weights::WeightBytes;

/// Most nodes the "add nodes like X" suggestion considers.
const MAX_EXTRA_NODES: u32 = 64;

/// Most devices the "add nodes like X" suggestion puts in one imagined fleet: 64 nodes of 8,
/// or fewer nodes when one node claims thousands of devices (each attempt indexes them all).
const MAX_VIRTUAL_DEVICES: usize = 1 << 16;

/// Most device classes a refusal explains and tries alternatives on. Real fleets have a
/// handful of classes; an inventory claiming thousands (every device a different memory size)
/// must not multiply the cost of a refusal, which re-plans per class. Beyond this only the
/// roomiest classes are explained ([`Fleet::roomiest`]); the search itself sees them all.
pub(super) const MAX_EXPLAINED_CLASSES: usize = 32;

/// The fleet a refusal explains, with a reason saying so when classes were left out.
pub(super) fn explained<'f, 'a>(
    plan: &mut Plan,
    fleet: &'f Fleet<'a>,
) -> std::borrow::Cow<'f, Fleet<'a>> {
    let explained = fleet.roomiest(MAX_EXPLAINED_CLASSES);
    if explained.classes.len() < fleet.classes.len() {
        plan.reasons.push(format!(
            "{} device classes are free; only the {} with the most memory on one node are \
             explained and tried below",
            fleet.classes.len(),
            explained.classes.len()
        ));
    }
    explained
}

/// The largest layout a class allows, at one precision.
struct Largest {
    precision: Precision,
    tp: u32,
    pp: u32,
    fit: ServingFit,
}

/// The widest-to-narrowest precisions `class` allows for `model` under `choice`.
fn allowed(model: &Model, class: &DeviceClass<'_>, choice: PrecisionChoice) -> Vec<Precision> {
    serving_candidates(choice, model)
        .into_iter()
        .filter(|p| serving_support(model, class.sample, *p).is_ok())
        .collect()
}

/// The biggest TP x PP the class can form, at `precision`.
fn largest(
    model: &Model,
    class: &DeviceClass<'_>,
    precision: Precision,
    target: &ServingTarget,
) -> Option<Largest> {
    let tp = *valid_tensor_parallel_sizes(model, class.largest_node).last()?;
    let pp = *valid_pipeline_sizes(model, tp, class.free).end();
    let pp = pp.clamp(1, 64);
    let weights = WeightBytes::of(model, precision);
    let fit = serving_fit(
        model,
        &weights,
        (class.sample.memory, &class.sample.product),
        tp,
        pp,
        target,
    );
    Some(Largest {
        precision,
        tp,
        pp,
        fit,
    })
}

/// Fills in a serving refusal.
pub(super) fn serving(
    plan: &mut Plan,
    model: &Model,
    fleet: &Fleet<'_>,
    request: &PlanRequest,
    target: &ServingTarget,
    outcome: &Outcome,
    nodes: &[NodeSpec],
) {
    let mut seen = BTreeSet::new();
    plan.reasons.extend(
        outcome
            .refusals
            .iter()
            .filter(|r| seen.insert((*r).clone()))
            .cloned(),
    );
    let all = fleet;
    let fleet: &Fleet<'_> = &explained(plan, all);
    nearest_misses(plan, model, fleet, request.precision, target);
    if let Some(c) = outcome.unplaceable.first() {
        let fleet = all;
        let class = &fleet.classes[c.class];
        plan.reasons.push(format!(
            "{} at {} with TP {} x PP {} x {} replica(s) fits in memory, but the fleet cannot place it ({} free on {} node(s){})",
            class.sample.product,
            c.precision,
            c.tp,
            c.pp,
            c.replicas,
            class.free,
            class.nodes,
            request.max_nodes.map_or(String::new(), |m| format!(", at most {m} node(s) allowed")),
        ));
    }
    let demand = Demand {
        concurrency: plan.concurrency.unwrap_or(1),
        replicas: request.replicas,
    };
    suggest_alternatives(plan, model, fleet, request, target, demand);
    suggest_shorter_context(plan, model, fleet, request.precision, target);
    suggest_more_nodes(plan, model, fleet, request, target, demand, nodes);
}

/// One reason per class: the largest layout at the narrowest allowed precision, and by how
/// much it misses. The closest miss becomes the plan's `per_device`.
fn nearest_misses(
    plan: &mut Plan,
    model: &Model,
    fleet: &Fleet<'_>,
    choice: PrecisionChoice,
    target: &ServingTarget,
) {
    let mut closest: Option<(f64, ServingFit)> = None;
    for class in &fleet.classes {
        let Some(narrowest) = allowed(model, class, choice).last().copied() else {
            continue;
        };
        let Some(l) = largest(model, class, narrowest, target) else {
            plan.reasons.push(format!(
                "{}: no valid tensor-parallel size for {} heads",
                class.sample.product, model.arch.heads
            ));
            continue;
        };
        let m = l.fit.memory;
        let fixed = m.weights + m.activations + m.overhead;
        let reason = if fixed > m.budget {
            format!(
                "{} x{} on {} node(s): even at {} with TP {} x PP {}, weights {} + activations {} + overhead {} exceed the {} budget per device",
                class.sample.product,
                class.free,
                class.nodes,
                l.precision,
                l.tp,
                l.pp,
                m.weights,
                m.activations,
                m.overhead,
                m.budget
            )
        } else {
            format!(
                "{} x{} on {} node(s): at {} with TP {} x PP {}, {} is left for KV per device but one {}-token request needs {}",
                class.sample.product,
                class.free,
                class.nodes,
                l.precision,
                l.tp,
                l.pp,
                l.fit.kv_free,
                target.context,
                l.fit.per_request
            )
        };
        plan.reasons.push(reason);
        let need = (fixed + l.fit.per_request).as_f64();
        let shortfall = need / m.budget.as_f64().max(1.0);
        if closest.as_ref().is_none_or(|(best, _)| shortfall < *best) {
            closest = Some((shortfall, l.fit));
        }
    }
    plan.per_device = closest.map(|(_, fit)| fit.memory);
}

/// Re-runs the search with one constraint relaxed: any precision, an FP8 KV cache, no node
/// cap.
fn suggest_alternatives(
    plan: &mut Plan,
    model: &Model,
    fleet: &Fleet<'_>,
    request: &PlanRequest,
    target: &ServingTarget,
    demand: Demand,
) {
    let describe = |outcome: &Outcome| {
        outcome.best.as_ref().map(|(c, p)| {
            format!(
                "fits at {} on {} x {} (TP {} x PP {} x {} replica(s), {} node(s))",
                c.precision,
                c.devices(),
                fleet.classes[c.class].sample.product,
                c.tp,
                c.pp,
                c.replicas,
                p.nodes
            )
        })
    };
    // With a pinned precision, the widest other precision that fits.
    if request.precision != PrecisionChoice::Auto {
        let widest = serving_candidates(PrecisionChoice::Auto, model)
            .into_iter()
            .find_map(|precision| {
                let choice = PrecisionChoice::from(precision);
                (choice != request.precision)
                    .then(|| search(model, fleet, choice, target, demand, request.max_nodes))
                    .and_then(|outcome| describe(&outcome).map(|text| (precision, text)))
            });
        if let Some((precision, text)) = widest {
            plan.suggestions
                .push(format!("--precision {precision}: {text}"));
        }
    }
    if target.kv_dtype != KvDtype::Fp8 {
        let fp8 = ServingTarget {
            kv_dtype: KvDtype::Fp8,
            ..*target
        };
        if let Some(text) = describe(&search(
            model,
            fleet,
            request.precision,
            &fp8,
            demand,
            request.max_nodes,
        )) {
            plan.suggestions.push(format!("--kv-dtype fp8: {text}"));
        }
    }
    if request.max_nodes.is_some()
        && let Some(text) = describe(&search(
            model,
            fleet,
            request.precision,
            target,
            demand,
            None,
        ))
    {
        plan.suggestions.push(format!("raise --max-nodes: {text}"));
    }
}

/// The longest context one request can have on the largest layout of any class, at the
/// widest precision that leaves room for any KV at all.
fn suggest_shorter_context(
    plan: &mut Plan,
    model: &Model,
    fleet: &Fleet<'_>,
    choice: PrecisionChoice,
    target: &ServingTarget,
) {
    let mut best: Option<(u64, String)> = None;
    for class in &fleet.classes {
        for precision in allowed(model, class, choice) {
            let Some(l) = largest(model, class, precision, target) else {
                break;
            };
            let (batched, _) = scheduler_defaults(class.sample.memory, &class.sample.product);
            let kv = KvLayout::new(model, target.kv_dtype, l.tp, l.pp);
            let longest = kv.max_context(l.fit.kv_free, batched, target.context.saturating_sub(1));
            if longest > 0 {
                let text = format!(
                    "{} with TP {} x PP {} on {}",
                    precision, l.tp, l.pp, class.sample.product
                );
                if best.as_ref().is_none_or(|(b, _)| longest > *b) {
                    best = Some((longest, text));
                }
                break;
            }
        }
    }
    if let Some((longest, how)) = best {
        plan.suggestions.push(format!(
            "--context {longest}: the longest request that fits ({how})"
        ));
    }
}

/// The smallest count in `1..=max` for which `attempt` succeeds, assuming success is
/// monotone in the count.
fn fewest_nodes<T>(max: u32, attempt: impl Fn(u32) -> Option<T>) -> Option<(u32, T)> {
    let mut high = 1;
    let mut found = loop {
        if let Some(found) = attempt(high) {
            break found;
        }
        if high >= max {
            return None;
        }
        high = (high * 2).min(max);
    };
    let mut low = high / 2; // fails (or is zero)
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        match attempt(mid) {
            Some(hit) => {
                high = mid;
                found = hit;
            }
            None => low = mid,
        }
    }
    Some((high, found))
}

/// How many nodes like the roomiest one of each class would fit the goal.
fn suggest_more_nodes(
    plan: &mut Plan,
    model: &Model,
    fleet: &Fleet<'_>,
    request: &PlanRequest,
    target: &ServingTarget,
    demand: Demand,
    nodes: &[NodeSpec],
) {
    let mut best: Option<(u64, String)> = None;
    // The first node of each template's name, as a search by name finds it: one pass over the
    // nodes, not one per class.
    let wanted: HashSet<&str> = fleet.classes.iter().map(|c| c.template_node).collect();
    let mut templates: HashMap<&str, &NodeSpec> = HashMap::new();
    for node in nodes {
        if wanted.contains(node.name.as_str()) {
            templates.entry(node.name.as_str()).or_insert(node);
        }
    }
    for class in &fleet.classes {
        let Some(template) = templates.get(class.template_node) else {
            continue;
        };
        // Only the class's devices are copied, not the whole node.
        let template = NodeSpec {
            name: template.name.clone(),
            devices: template
                .devices
                .iter()
                .filter(|d| d.product == class.sample.product && d.memory == class.sample.memory)
                .cloned()
                .collect(),
            fabric: template.fabric.clone(),
            labels: template.labels.clone(),
        };
        let attempt = |count: u32| {
            let virtual_nodes: Vec<NodeSpec> = (0..count)
                .map(|i| NodeSpec {
                    name: format!("{}#{i}", template.name),
                    ..template.clone()
                })
                .collect();
            let virtual_fleet = Fleet::new(&virtual_nodes, &Reservations::none());
            search(
                model,
                &virtual_fleet,
                request.precision,
                target,
                demand,
                None,
            )
            .best
            .map(|(c, _)| c)
        };
        // More identical nodes never hurt, so double until it fits, then bisect.
        let per_node = template.devices.len().max(1);
        let max_nodes = u32::try_from(MAX_VIRTUAL_DEVICES / per_node)
            .unwrap_or(u32::MAX)
            .clamp(1, MAX_EXTRA_NODES);
        let Some((count, c)) = fewest_nodes(max_nodes, attempt) else {
            continue;
        };
        let devices = c.devices();
        let extra = count.saturating_sub(class.nodes);
        let action = if extra > 0 {
            format!("add {extra} more node(s) like {}", template.name)
        } else {
            format!(
                "free up devices: {count} node(s) like {} would do",
                template.name
            )
        };
        let text = format!(
            "{action} ({} x {}): {count} such node(s) fit it at {} with TP {} x PP {} x {} replica(s)",
            template.devices.len(),
            class.sample.product,
            c.precision,
            c.tp,
            c.pp,
            c.replicas
        );
        if best.as_ref().is_none_or(|(d, _)| devices < *d) {
            best = Some((devices, text));
        }
    }
    if let Some((_, text)) = best {
        plan.suggestions.push(text);
    }
}
