//! When nothing fits: per device class, the one constraint that binds ([`Binding`]: the
//! weights, one full-context request, the concurrency, the free devices or the node cap) with
//! its numbers, and what would fit instead — each suggestion found by re-running the search
//! with the change applied ([`super::suggest`]): another precision, an FP8 KV cache, a looser
//! node cap, another replica count, a shorter context, a lower concurrency, or more nodes like
//! one already in the inventory.

use std::collections::BTreeSet;

use super::PlanRequest;
use super::parallel::{valid_pipeline_sizes, valid_tensor_parallel_sizes};
use super::serving::{
    Candidate, Demand, Outcome, class_candidates, ladder, place_best, search, sort_candidates,
};
use super::suggest::{self, Change, Suggestion, context_steps, largest_fitting};
use crate::hardware::Precision;
use crate::plan::capability::{PrecisionChoice, serving_candidates, serving_support};
use crate::plan::inventory::{NodeSpec, Reservations, find_node};
use crate::plan::kv::KvDtype;
use crate::plan::memory::{DeviceMemory, ServingFit, ServingTarget, serving_fit};
use crate::plan::model::Model;
use crate::plan::packing::{DeviceClass, FreeDevices, Placement};
use crate::plan::report::Plan;
use crate::plan::units::Bytes;
use crate::plan::weights::WeightBytes;

/// Most nodes the "add nodes like X" suggestion considers.
const MAX_EXTRA_NODES: u32 = 64;

/// Most devices the "add nodes like X" suggestion puts in one imagined fleet: 64 nodes of 8,
/// or fewer nodes when one node claims thousands of devices (each attempt indexes them all).
const MAX_VIRTUAL_DEVICES: usize = 1 << 16;

/// Most device classes a refusal explains and tries alternatives on. Real fleets have a
/// handful of classes; an inventory claiming thousands (every device a different memory size)
/// must not multiply the cost of a refusal, which re-plans per class. Beyond this only the
/// roomiest classes are explained ([`FreeDevices::roomiest`]); the search itself sees them all.
pub(super) const MAX_EXPLAINED_CLASSES: usize = 32;

/// The fleet a refusal explains, with a reason saying so when classes were left out.
pub(super) fn explained<'f, 'a>(
    plan: &mut Plan,
    fleet: &'f FreeDevices<'a>,
) -> std::borrow::Cow<'f, FreeDevices<'a>> {
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
    let fit = serving_fit(model, &weights, class.serving_device(), tp, pp, target);
    Some(Largest {
        precision,
        tp,
        pp,
        fit,
    })
}

/// A layout named in a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    pub precision: Precision,
    pub tp: u32,
    pub pp: u32,
    pub replicas: u32,
}

impl Layout {
    fn of(c: &Candidate) -> Self {
        Self {
            precision: c.precision,
            tp: c.tp,
            pp: c.pp,
            replicas: c.replicas,
        }
    }

    fn devices(&self) -> u64 {
        u64::from(self.tp) * u64::from(self.pp) * u64::from(self.replicas)
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} with TP {} x PP {} x {} replica(s)",
            self.precision, self.tp, self.pp, self.replicas
        )
    }
}

/// The constraint that keeps one device class from serving the goal: the first of these that
/// holds, in this order, so a looser one is never named while a tighter one binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Binding {
    /// Weights, activations and overhead alone exceed the budget on the largest layout at the
    /// narrowest allowed precision.
    Weights { at: Layout, memory: DeviceMemory },
    /// They fit, but no layout leaves room for one full-context request.
    OneRequest {
        at: Layout,
        kv_free: Bytes,
        per_request: Bytes,
    },
    /// One request fits and is placed, but the free devices (under the node cap) hold only
    /// `fit` of the `asked` concurrent requests.
    Concurrency {
        at: Layout,
        per_replica: u64,
        fit: u64,
        asked: u64,
        max_nodes: Option<u32>,
    },
    /// A layout fits in memory but the free devices cannot hold it even once (too few, or
    /// spread over nodes too small for its TP groups).
    Devices { at: Layout },
    /// It would be placed, on more nodes than allowed.
    NodeCap {
        at: Layout,
        nodes: u32,
        max_nodes: u32,
    },
}

impl Binding {
    /// The refusal line for `class`.
    fn render(&self, class: &DeviceClass<'_>, context: u64) -> String {
        let prefix = format!(
            "{} x{} on {} node(s)",
            class.sample.product, class.free, class.nodes
        );
        match self {
            Self::Weights { at, memory: m } => format!(
                "{prefix}: the weights do not fit: even at {} with TP {} x PP {} (the largest layout), weights {} + activations {} + overhead {} exceed the {} budget per device",
                at.precision, at.tp, at.pp, m.weights, m.activations, m.overhead, m.budget
            ),
            Self::OneRequest {
                at,
                kv_free,
                per_request,
            } => format!(
                "{prefix}: one {context}-token request does not fit: at {} with TP {} x PP {} (the largest layout), {kv_free} is left for KV per device and one request needs {per_request}",
                at.precision, at.tp, at.pp
            ),
            Self::Concurrency {
                at,
                per_replica,
                fit,
                asked,
                max_nodes,
            } => format!(
                "{prefix}: the concurrency does not fit: {fit} concurrent {context}-token request(s) fit, {asked} asked (the free devices{} hold {} replica(s) of {} with TP {} x PP {}, each holding {per_replica})",
                max_nodes.map_or(String::new(), |m| format!(" on at most {m} node(s)")),
                at.replicas,
                at.precision,
                at.tp,
                at.pp
            ),
            Self::Devices { at } => format!(
                "{prefix}: not enough free devices: {at} needs {} device(s) in TP groups of {} on one node; {} are free, at most {} on one node",
                at.devices(),
                at.tp,
                class.free,
                class.largest_node
            ),
            Self::NodeCap {
                at,
                nodes,
                max_nodes,
            } => format!(
                "{prefix}: the node cap: {at} fits on {nodes} node(s), at most {max_nodes} allowed"
            ),
        }
    }
}

/// What the planner is asked, in one place for the refusal's helpers.
struct Ask<'r> {
    model: &'r Model,
    request: &'r PlanRequest,
    target: &'r ServingTarget,
    demand: Demand,
}

impl Ask<'_> {
    /// The best placement of the class's candidates for `demand` under `max_nodes`.
    fn place_class(
        &self,
        fleet: &FreeDevices<'_>,
        index: usize,
        ladder: &[(Precision, WeightBytes)],
        demand: Demand,
        max_nodes: Option<u32>,
    ) -> (Vec<Candidate>, Option<(Candidate, Placement)>) {
        let mut candidates = class_candidates(
            self.model,
            (fleet, index),
            ladder,
            self.request.precision,
            self.target,
            demand,
            None,
        );
        sort_candidates(fleet, &mut candidates);
        let best = place_best(fleet, &candidates, max_nodes);
        (candidates, best)
    }

    /// The binding constraint of one class, and the memory of its nearest miss.
    fn bind(
        &self,
        fleet: &FreeDevices<'_>,
        index: usize,
    ) -> Result<(Binding, DeviceMemory), String> {
        let class = &fleet.classes[index];
        let choice = self.request.precision;
        let ladder = ladder(self.model, choice);
        let max_nodes = self.request.max_nodes;
        let one = Demand {
            concurrency: 1,
            replicas: None,
        };
        let (single, single_placed) = self.place_class(fleet, index, &ladder, one, None);
        let Some(first) = single.first().copied() else {
            let narrowest = allowed(self.model, class, choice)
                .last()
                .copied()
                .ok_or_else(|| {
                    format!(
                        "{}: the asked precision does not run on it",
                        class.sample.product
                    )
                })?;
            let l = largest(self.model, class, narrowest, self.target).ok_or_else(|| {
                format!(
                    "{}: no valid tensor-parallel size for {} heads",
                    class.sample.product, self.model.arch.heads
                )
            })?;
            let m = l.fit.memory;
            let at = Layout {
                precision: l.precision,
                tp: l.tp,
                pp: l.pp,
                replicas: 1,
            };
            let binding = if m.weights + m.activations + m.overhead > m.budget {
                Binding::Weights { at, memory: m }
            } else {
                Binding::OneRequest {
                    at,
                    kv_free: l.fit.kv_free,
                    per_request: l.fit.per_request,
                }
            };
            return Ok((binding, m));
        };
        let memory = first.fit.memory;
        // Placed without the cap: the cap binds.
        if let Some(max) = max_nodes {
            let (_, free) = self.place_class(fleet, index, &ladder, self.demand, None);
            if let Some((c, p)) = free {
                let binding = Binding::NodeCap {
                    at: Layout::of(&c),
                    nodes: p.nodes,
                    max_nodes: max,
                };
                return Ok((binding, c.fit.memory));
            }
        }
        // The most requests the class holds under the cap, below the asked number.
        let held = |concurrency: u64| {
            let demand = Demand {
                concurrency,
                ..self.demand
            };
            self.place_class(fleet, index, &ladder, demand, max_nodes).1
        };
        if let Some((fit, (c, _))) = largest_below(self.demand.concurrency, held) {
            let binding = Binding::Concurrency {
                at: Layout::of(&c),
                per_replica: c.fit.max_concurrency,
                fit,
                asked: self.demand.concurrency,
                max_nodes,
            };
            return Ok((binding, c.fit.memory));
        }
        // Not even one request is placed under the cap.
        if let (Some(max), Some((c, p))) = (max_nodes, single_placed) {
            let binding = Binding::NodeCap {
                at: Layout::of(&c),
                nodes: p.nodes,
                max_nodes: max,
            };
            return Ok((binding, c.fit.memory));
        }
        let (asked, _) = self.place_class(fleet, index, &ladder, self.demand, None);
        let at = Layout::of(asked.first().unwrap_or(&first));
        Ok((Binding::Devices { at }, memory))
    }

    /// Whether the goal fits `fleet` with `change` made to the request.
    fn fits(&self, fleet: &FreeDevices<'_>, change: &Change) -> Option<(Candidate, Placement)> {
        let mut choice = self.request.precision;
        let mut target = *self.target;
        let mut demand = self.demand;
        let mut max_nodes = self.request.max_nodes;
        match change {
            Change::Context { context } => target.context = *context,
            Change::Concurrency { concurrency } => demand.concurrency = *concurrency,
            Change::Precision { precision } => choice = PrecisionChoice::from(*precision),
            Change::KvDtype { kv_dtype } => target.kv_dtype = *kv_dtype,
            Change::MaxNodes { max_nodes: m } => max_nodes = Some(*m),
            Change::Replicas { replicas } => demand.replicas = Some(*replicas),
            Change::AddNodes { .. } => return None,
        }
        search(self.model, fleet, choice, &target, demand, max_nodes).best
    }
}

/// The largest count in `1..below` for which `attempt` succeeds (assumed monotone), by
/// doubling then bisecting.
fn largest_below<T>(below: u64, attempt: impl Fn(u64) -> Option<T>) -> Option<(u64, T)> {
    if below <= 1 {
        return None;
    }
    let mut found = (1, attempt(1)?);
    let mut high = below; // fails
    let mut probe = 2u64;
    while probe < high {
        match attempt(probe) {
            Some(hit) => {
                found = (probe, hit);
                probe = probe.saturating_mul(2);
            }
            None => high = probe,
        }
    }
    let mut low = found.0;
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        match attempt(mid) {
            Some(hit) => {
                found = (mid, hit);
                low = mid;
            }
            None => high = mid,
        }
    }
    Some(found)
}

/// How a placed candidate reads in a suggestion.
fn fits_at(fleet: &FreeDevices<'_>, (c, p): &(Candidate, Placement)) -> String {
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
}

/// Fills in a serving refusal.
pub(super) fn serving(
    plan: &mut Plan,
    model: &Model,
    fleet: &FreeDevices<'_>,
    request: &PlanRequest,
    target: &ServingTarget,
    outcome: &Outcome,
    inventory: (&[NodeSpec], &Reservations),
) {
    let mut seen = BTreeSet::new();
    plan.reasons.extend(
        outcome
            .refusals
            .iter()
            .filter(|r| seen.insert((*r).clone()))
            .cloned(),
    );
    let fleet: &FreeDevices<'_> = &explained(plan, fleet);
    let ask = Ask {
        model,
        request,
        target,
        demand: Demand {
            concurrency: plan.concurrency.unwrap_or(1),
            replicas: request.replicas,
        },
    };
    let mut bindings = Vec::new();
    let mut closest: Option<(f64, DeviceMemory)> = None;
    for index in 0..fleet.classes.len() {
        match ask.bind(fleet, index) {
            Ok((binding, memory)) => {
                plan.reasons
                    .push(binding.render(&fleet.classes[index], target.context));
                let need = match binding {
                    Binding::Weights { .. } | Binding::OneRequest { .. } => {
                        (memory.weights + memory.activations + memory.overhead + memory.kv_cache)
                            .as_f64()
                    }
                    _ => memory.total.as_f64(),
                };
                let shortfall = need / memory.budget.as_f64().max(1.0);
                if closest.as_ref().is_none_or(|(best, _)| shortfall < *best) {
                    closest = Some((shortfall, memory));
                }
                bindings.push(binding);
            }
            Err(reason) => plan.reasons.push(reason),
        }
    }
    plan.per_device = closest.map(|(_, memory)| memory);
    suggest_all(plan, &ask, fleet, &bindings, inventory);
}

/// Every change that makes the goal fit, each checked by re-running the search with it.
fn suggest_all(
    plan: &mut Plan,
    ask: &Ask<'_>,
    fleet: &FreeDevices<'_>,
    bindings: &[Binding],
    inventory: (&[NodeSpec], &Reservations),
) {
    let request = ask.request;
    let offer = |plan: &mut Plan, change: Change, why: String| {
        suggest::push(plan, Suggestion::new(change, why));
    };
    // With a pinned precision, the widest other precision that fits.
    if request.precision != PrecisionChoice::Auto {
        let widest = serving_candidates(PrecisionChoice::Auto, ask.model)
            .into_iter()
            .filter(|p| PrecisionChoice::from(*p) != request.precision)
            .find_map(|precision| {
                let change = Change::Precision { precision };
                ask.fits(fleet, &change).map(|hit| (change, hit))
            });
        if let Some((change, hit)) = widest {
            offer(plan, change, fits_at(fleet, &hit));
        }
    }
    if ask.target.kv_dtype != KvDtype::Fp8 {
        let change = Change::KvDtype {
            kv_dtype: KvDtype::Fp8,
        };
        if let Some(hit) = ask.fits(fleet, &change) {
            offer(plan, change, fits_at(fleet, &hit));
        }
    }
    let mut cap_is_enough = false;
    if request.max_nodes.is_some()
        && let Some((_, p)) = search(
            ask.model,
            fleet,
            request.precision,
            ask.target,
            ask.demand,
            None,
        )
        .best
    {
        let change = Change::MaxNodes { max_nodes: p.nodes };
        if let Some(hit) = ask.fits(fleet, &change) {
            cap_is_enough = true;
            offer(plan, change, fits_at(fleet, &hit));
        }
    }
    if let Some(asked) = request.replicas {
        let free = Demand {
            replicas: None,
            ..ask.demand
        };
        let found = search(
            ask.model,
            fleet,
            request.precision,
            ask.target,
            free,
            request.max_nodes,
        )
        .best;
        if let Some((c, _)) = found.filter(|(c, _)| c.replicas != asked) {
            let change = Change::Replicas {
                replicas: c.replicas,
            };
            if let Some(hit) = ask.fits(fleet, &change) {
                offer(plan, change, fits_at(fleet, &hit));
            }
        }
    }
    let kv_binds = bindings
        .iter()
        .any(|b| matches!(b, Binding::OneRequest { .. } | Binding::Concurrency { .. }));
    if kv_binds {
        let steps = context_steps(ask.target.context);
        let longest = largest_fitting(&steps, |context| {
            ask.fits(fleet, &Change::Context { context })
        });
        if let Some((context, hit)) = longest {
            offer(
                plan,
                Change::Context { context },
                format!(
                    "the longest context in {}-token steps; {}",
                    suggest::CONTEXT_STEP,
                    fits_at(fleet, &hit)
                ),
            );
        }
    }
    if bindings
        .iter()
        .any(|b| matches!(b, Binding::Concurrency { .. }))
    {
        let most = largest_below(ask.demand.concurrency, |concurrency| {
            ask.fits(fleet, &Change::Concurrency { concurrency })
        });
        if let Some((concurrency, hit)) = most {
            offer(
                plan,
                Change::Concurrency { concurrency },
                format!("the most concurrent requests; {}", fits_at(fleet, &hit)),
            );
        }
    }
    if !cap_is_enough {
        suggest_more_nodes(plan, ask, fleet, inventory);
    }
}

/// The smallest count in `1..=max` for which `attempt` succeeds.
///
/// Success is not monotone in the count: a replica spanning nodes must use a node count that
/// is a power of two or divides the class's node count, and every added node changes that
/// divisor (the demo's DeepSeek-V3 fits with 8 added MI300X nodes on 6 of them, but not with
/// 6 added). So doubling only finds *a* count that fits; every smaller count it skipped is
/// then tried in order. Doubling tried every power of two below the hit, and those failed.
fn fewest_nodes<T>(max: u32, attempt: impl Fn(u32) -> Option<T>) -> Option<(u32, T)> {
    let mut high = 1;
    let found = loop {
        if let Some(found) = attempt(high) {
            break found;
        }
        if high >= max {
            return None;
        }
        high = (high * 2).min(max);
    };
    (1..high)
        .filter(|count| !count.is_power_of_two())
        .find_map(|count| attempt(count).map(|hit| (count, hit)))
        .or(Some((high, found)))
}

/// Fewest nodes like the roomiest node of some class to add to the fleet, each copy holding
/// only that class's devices: tried on the class's own free devices plus the copies (a fit
/// there is a fit on the whole fleet plus the copies, since other classes only add choices).
fn suggest_more_nodes(
    plan: &mut Plan,
    ask: &Ask<'_>,
    fleet: &FreeDevices<'_>,
    (nodes, reserved): (&[NodeSpec], &Reservations),
) {
    let mut best: Option<(u64, Suggestion)> = None;
    for class in &fleet.classes {
        let same = |d: &crate::plan::inventory::DeviceSpec| {
            d.product == class.sample.product
                && d.memory == class.sample.memory
                && d.family == class.sample.family
                && d.vendor == class.sample.vendor
                && d.precisions == class.sample.precisions
        };
        let Some(template) = find_node(nodes, class.template_node) else {
            continue;
        };
        let copy = NodeSpec {
            name: template.name.clone(),
            devices: template
                .devices
                .iter()
                .filter(|d| same(d))
                .cloned()
                .collect(),
            fabric: template.fabric.clone(),
            labels: Default::default(),
        };
        let per_node = copy.devices.len().max(1);
        let most = u32::try_from(MAX_VIRTUAL_DEVICES / per_node)
            .unwrap_or(u32::MAX)
            .clamp(1, MAX_EXTRA_NODES);
        // The class's free devices as they are, then the copies.
        let mut virtual_nodes: Vec<NodeSpec> = nodes
            .iter()
            .filter_map(|n| {
                let devices: Vec<_> = n
                    .devices
                    .iter()
                    .filter(|d| same(d) && !reserved.contains(&n.name, &d.id))
                    .cloned()
                    .collect();
                (!devices.is_empty()).then(|| NodeSpec {
                    name: n.name.clone(),
                    devices,
                    fabric: n.fabric.clone(),
                    labels: Default::default(),
                })
            })
            .collect();
        let existing = virtual_nodes.len();
        virtual_nodes.extend((0..most).map(|i| NodeSpec {
            name: format!("{}#{i}", copy.name),
            ..copy.clone()
        }));
        let attempt = |max_nodes: Option<u32>| {
            let virtual_nodes = &virtual_nodes;
            move |count: u32| {
                let slice = &virtual_nodes[..existing + count as usize];
                let fleet = FreeDevices::new(slice, &Reservations::none());
                search(
                    ask.model,
                    &fleet,
                    ask.request.precision,
                    ask.target,
                    ask.demand,
                    max_nodes,
                )
                .best
                .map(|(c, p)| (c, p.nodes, class.sample.product.clone()))
            }
        };
        let capped = ask
            .request
            .max_nodes
            .and_then(|_| fewest_nodes(most, attempt(ask.request.max_nodes)));
        let (count, (c, used, product), max_nodes) = match capped {
            Some((count, hit)) => (count, hit, None),
            None => match fewest_nodes(most, attempt(None)) {
                Some((count, hit)) => {
                    let raise = ask.request.max_nodes.filter(|m| hit.1 > *m).map(|_| hit.1);
                    (count, hit, raise)
                }
                None => continue,
            },
        };
        let change = Change::AddNodes {
            like: template.name.clone(),
            product,
            devices: u32::try_from(copy.devices.len()).unwrap_or(u32::MAX),
            count,
            max_nodes,
        };
        let why = format!(
            "then {} with TP {} x PP {} x {} replica(s) fits on {used} node(s)",
            c.precision, c.tp, c.pp, c.replicas
        );
        let cost = c.devices();
        if best.as_ref().is_none_or(|(d, _)| cost < *d) {
            best = Some((cost, Suggestion::new(change, why)));
        }
    }
    if let Some((_, suggestion)) = best {
        suggest::push(plan, suggestion);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::fewest_nodes;

    #[test]
    fn fewest_nodes_finds_the_smallest_count_when_success_is_not_monotone() {
        // Fits at 3 and from 8 on, not at 4 to 7: doubling alone would answer 8.
        assert_eq!(
            fewest_nodes(64, |n| (n == 3 || n >= 8).then_some(n * 10)),
            Some((3, 30))
        );
        assert_eq!(fewest_nodes(64, |n| (n >= 6).then_some(n)), Some((6, 6)));
        assert_eq!(fewest_nodes(5, |n| (n == 5).then_some(n)), Some((5, 5)));
        assert_eq!(fewest_nodes(64, |_| None::<u32>), None);
    }

    #[test]
    fn fewest_nodes_tries_each_count_at_most_once_and_stops_early_when_nothing_fits() {
        let calls = Cell::new(0);
        let none = fewest_nodes(64, |_| {
            calls.set(calls.get() + 1);
            None::<()>
        });
        assert_eq!((none, calls.get()), (None, 7)); // 1, 2, 4, ..., 64
        calls.set(0);
        let hit = fewest_nodes(64, |n| {
            calls.set(calls.get() + 1);
            (n >= 20).then_some(())
        });
        // 1, 2, 4, 8, 16, 32 (hit), then 3, 5, 6, 7, 9, ..., 20.
        assert_eq!((hit, calls.get()), (Some((20, ())), 6 + 20 - 5));
    }
}
