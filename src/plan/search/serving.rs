//! The serving search: the candidate layouts per device class, and the best placement among them. Describing the result (or refusing) is [`super::serve`].

use std::collections::HashMap;

use crate::hardware::Precision;

use super::PlanRequest;
use super::parallel::{
    ClassShape, PipelineRule, moe_variants, pipeline_allowed, sharded_fit, valid_pipeline_sizes,
    valid_tensor_parallel_sizes,
};
use crate::plan::capability::{Execution, PrecisionChoice, serving_candidates, serving_support};
use crate::plan::layout::Sharding;
use crate::plan::memory::{ServingFit, ServingTarget};
use crate::plan::model::Model;
use crate::plan::packing::{DeviceClass, FreeDevices, Placement, Shape};
use crate::plan::weights::WeightBytes;

/// Pipeline depth beyond which the search stops looking: deeper pipelines only add latency.
const MAX_PIPELINE: u32 = 64;

/// One memory-feasible layout on one device class.
#[derive(Debug, Clone, Copy)]
pub(super) struct Candidate {
    pub class: usize,
    pub precision: Precision,
    /// Position of `precision` in the ladder: lower is preferred.
    pub precision_rank: usize,
    pub execution: Execution,
    pub tp: u32,
    pub pp: u32,
    /// Attention data-parallel ranks per TP group (1: none).
    pub attention_dp: u32,
    /// Routed experts placed whole across the TP group.
    pub expert_parallel: bool,
    pub replicas: u32,
    pub fit: ServingFit,
    /// How many [`PipelineRule`]s past its class's strictest rule with any layout this one
    /// needs (0: that rule's own). Fallbacks are placed only when nothing stricter places.
    pub fallback: u8,
}

impl Candidate {
    /// The replica's layout.
    pub fn sharding(&self) -> Sharding {
        Sharding::new(self.tp, self.pp).with_moe(self.attention_dp, self.expert_parallel)
    }

    pub fn devices(&self) -> u64 {
        (u64::from(self.tp) * u64::from(self.pp)).saturating_mul(u64::from(self.replicas))
    }

    /// Ranking after nodes, precision and devices: the layout the interconnect favours, then
    /// class and sizes for determinism.
    fn preference(&self, fleet: &FreeDevices<'_>) -> (u32, usize, u32, u32) {
        let fast_tp = fleet.classes[self.class].largest_fast_domain >= self.tp;
        // With an NVLink-class domain, TP beats PP; over PCIe, PP beats TP (vLLM docs).
        let layout = if fast_tp { self.pp } else { self.tp };
        (layout, self.class, self.tp, self.pp)
    }

    /// The fewest nodes the candidate could occupy: its devices over the most free devices of
    /// its class on one node.
    fn fewest_nodes(&self, fleet: &FreeDevices<'_>) -> u64 {
        let per_node = u64::from(fleet.classes[self.class].largest_node.max(1));
        self.devices().div_ceil(per_node).max(1)
    }

    /// The search order (item 6 of issue 14): layouts of the strictest pipeline rule first
    /// (see [`layouts`]), then fewest nodes, then the widest precision, then fewest devices,
    /// then [`Self::preference`]. `nodes` is the placement's count, or before
    /// placing, [`Self::fewest_nodes`] (a lower bound, so a sorted list can stop early).
    fn rank(&self, fleet: &FreeDevices<'_>, nodes: u64) -> Rank {
        (
            self.fallback,
            nodes,
            self.precision_rank,
            self.devices(),
            self.preference(fleet),
        )
    }
}

/// See [`Candidate::rank`].
type Rank = (u8, u64, usize, u64, (u32, usize, u32, u32));

/// How much serving is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Demand {
    /// Full-context requests held at once, across all replicas.
    pub concurrency: u64,
    /// Replicas to place (each holds its share of `concurrency`); `None`: as many as the
    /// concurrency needs.
    pub replicas: Option<u32>,
}

/// The winner and what it took to find it.
#[derive(Debug, Clone)]
pub(super) struct Outcome {
    pub best: Option<(Candidate, Placement)>,
    /// Why precisions were ruled out, per class.
    pub refusals: Vec<String>,
    /// With a precision left to the planner: the best placed candidate at a narrower
    /// precision than the winner's, to say what narrowing would save.
    pub narrower: Option<(Candidate, Placement)>,
}

/// The precision ladder of `choice` with each rung's weights (they depend on the model only).
pub(super) fn ladder(model: &Model, choice: PrecisionChoice) -> Vec<(Precision, WeightBytes)> {
    serving_candidates(choice, model)
        .into_iter()
        .map(|precision| (precision, WeightBytes::of(model, precision)))
        .collect()
}

/// Memory-feasible layouts of one class for `demand`, at every rung of `ladder` the device
/// supports; the reasons a rung is unsupported go to `refusals` when given.
pub(super) fn class_candidates(
    model: &Model,
    (fleet, index): (&FreeDevices<'_>, usize),
    ladder: &[(Precision, WeightBytes)],
    choice: PrecisionChoice,
    target: &ServingTarget,
    demand: Demand,
    mut refusals: Option<&mut Vec<String>>,
) -> Vec<Candidate> {
    let class = &fleet.classes[index];
    let mut candidates = Vec::new();
    for (precision_rank, (precision, weights)) in ladder.iter().enumerate() {
        let precision = *precision;
        match serving_support(model, class.sample, precision) {
            Ok(execution) => {
                let ctx = ClassContext {
                    index,
                    class,
                    precision,
                    precision_rank,
                    execution,
                    weights,
                };
                candidates.extend(layouts(model, &ctx, target, demand));
            }
            Err(why) if !matches!(choice, PrecisionChoice::Auto) || is_notable(precision) => {
                if let Some(refusals) = refusals.as_deref_mut() {
                    refusals.push(format!("{} x{}: {why}", class.sample.product, class.free));
                }
            }
            Err(_) => {}
        }
    }
    candidates
}

/// Searches `fleet` for the cheapest plan.
pub(super) fn search(
    model: &Model,
    fleet: &FreeDevices<'_>,
    choice: PrecisionChoice,
    target: &ServingTarget,
    demand: Demand,
    max_nodes: Option<u32>,
) -> Outcome {
    let mut refusals = Vec::new();
    let ladder = ladder(model, choice);
    let mut candidates = Vec::new();
    for index in 0..fleet.classes.len() {
        candidates.extend(class_candidates(
            model,
            (fleet, index),
            &ladder,
            choice,
            target,
            demand,
            Some(&mut refusals),
        ));
    }
    sort_candidates(fleet, &mut candidates);
    let best = place_best(fleet, &candidates, max_nodes);
    // What the next narrower precision would take, in the same order.
    let narrower = match (&best, choice) {
        (Some((winner, _)), PrecisionChoice::Auto) => candidates
            .iter()
            .filter(|c| c.precision.bits_per_param() < winner.precision.bits_per_param())
            .take(16)
            .find_map(|c| Some((*c, fleet.place(c.class, shape_of(c), max_nodes)?))),
        _ => None,
    };
    Outcome {
        best,
        refusals,
        narrower,
    }
}

/// The best-ranked candidate of `sorted` (in [`Candidate::rank`] order of its lower bound)
/// that the fleet can place.
pub(super) fn place_best(
    fleet: &FreeDevices<'_>,
    sorted: &[Candidate],
    max_nodes: Option<u32>,
) -> Option<(Candidate, Placement)> {
    let mut best: Option<(Rank, Candidate, Placement)> = None;
    for c in sorted {
        // Sorted by a lower bound of the rank: once it reaches the best placed rank, nothing
        // later can beat it (a fleet of thousands of classes is not placed thousands of times).
        if best
            .as_ref()
            .is_some_and(|(rank, ..)| c.rank(fleet, c.fewest_nodes(fleet)) >= *rank)
        {
            break;
        }
        if let Some(placement) = fleet.place(c.class, shape_of(c), max_nodes) {
            let rank = c.rank(fleet, u64::from(placement.nodes));
            if best.as_ref().is_none_or(|(b, ..)| rank < *b) {
                best = Some((rank, *c, placement));
            }
        }
    }
    best.map(|(_, c, p)| (c, p))
}

/// Sorts candidates into the order [`place_best`] expects.
pub(super) fn sort_candidates(fleet: &FreeDevices<'_>, candidates: &mut [Candidate]) {
    candidates.sort_by_cached_key(|c| c.rank(fleet, c.fewest_nodes(fleet)));
}

/// The placement shape of a candidate.
pub(super) fn shape_of(c: &Candidate) -> Shape {
    Shape {
        tp: c.tp,
        pp: c.pp,
        replicas: c.replicas,
    }
}

/// In auto mode only the refusal of 16-bit weights is worth reporting (FP4 and FP8 gaps are
/// routine); an explicit precision's refusal always is.
fn is_notable(precision: Precision) -> bool {
    matches!(precision, Precision::Bf16)
}

struct ClassContext<'c, 'a> {
    index: usize,
    class: &'c DeviceClass<'a>,
    precision: Precision,
    precision_rank: usize,
    execution: Execution,
    weights: &'c WeightBytes,
}

/// Memory-feasible layouts for one class and precision: per valid TP, the shallowest pipeline
/// that fits, and deeper ones only while they cut the replicas needed. Pipelines follow
/// [`PipelineRule`]s, strictest first: a replica that spans nodes fills whole nodes of a
/// deployable count, and where TP groups can sit in an NVLink-class domain TP fills it and PP
/// spans nodes; a pipeline inside one node is the last resort (vLLM's "edge case"). Per
/// layout, the MoE variant (expert parallelism, data-parallel attention) that needs the fewest
/// replicas, the recipes' order breaking ties.
fn layouts(
    model: &Model,
    ctx: &ClassContext<'_, '_>,
    target: &ServingTarget,
    demand: Demand,
) -> Vec<Candidate> {
    // The rules only filter layouts, so each layout's memory is worked out once.
    let mut fits = HashMap::new();
    let mut rules = PipelineRule::ALL
        .into_iter()
        .map(|rule| {
            (
                rule,
                layouts_where(model, ctx, target, demand, rule, &mut fits),
            )
        })
        .skip_while(|(_, found)| found.is_empty());
    let Some((_, mut found)) = rules.next() else {
        return Vec::new();
    };
    // The rules see only the class's shape, not which devices are free, so the strictest
    // rule's layouts may all fail to place where whole nodes of another count would (3-node
    // replicas on a class of 8 nodes, one of them half taken: 3 does not divide 8, and two
    // 4-node replicas find only 7 whole nodes). Whole-node layouts stay as fallbacks; looser
    // ones (a pipeline cut inside a node) only ever as the strictest rule with any layout.
    let fallbacks = rules.take_while(|(rule, _)| *rule <= PipelineRule::WholeNodes);
    for (depth, (_, looser)) in (1u8..).zip(fallbacks) {
        for mut candidate in looser {
            let key = (candidate.sharding(), candidate.replicas);
            if !found.iter().any(|c| (c.sharding(), c.replicas) == key) {
                candidate.fallback = depth;
                found.push(candidate);
            }
        }
    }
    found
}

fn layouts_where(
    model: &Model,
    ctx: &ClassContext<'_, '_>,
    target: &ServingTarget,
    demand: Demand,
    rule: PipelineRule,
    fits: &mut HashMap<Sharding, ServingFit>,
) -> Vec<Candidate> {
    let device = ctx.class.serving_device();
    let tps = valid_tensor_parallel_sizes(model, ctx.class.largest_tp_group());
    let shape = ClassShape {
        node_devices: ctx.class.largest_node,
        nodes: ctx.class.nodes,
        domain_tp: tps
            .iter()
            .copied()
            .filter(|&tp| tp <= ctx.class.largest_fast_domain)
            .max(),
    };
    let mut found = Vec::new();
    for tp in tps {
        let mut fewest = u64::MAX;
        // Before the last rule, a layout no free devices could hold even once gives way to the
        // next rule's (one reserved device must not turn a fitting fleet into a refusal).
        let groups = ctx.class.group_capacity(tp);
        for pp in valid_pipeline_sizes(model, tp, ctx.class.free).take(MAX_PIPELINE as usize) {
            if !pipeline_allowed(rule, &shape, tp, pp)
                || (rule < PipelineRule::Any && groups < u64::from(pp))
            {
                continue;
            }
            // The variant that needs the fewest replicas; ties keep the recipes' order.
            let best = moe_variants(model, ctx.precision, tp, pp)
                .into_iter()
                .filter_map(|sharding| {
                    let fit = *fits.entry(sharding).or_insert_with(|| {
                        sharded_fit(model, ctx.weights, device, &sharding, target)
                    });
                    replicas_needed(&fit, demand).map(|replicas| (replicas, sharding, fit))
                })
                .min_by_key(|(replicas, _, _)| *replicas);
            let Some((replicas, sharding, fit)) = best else {
                continue;
            };
            // A deeper pipeline is kept only when it needs fewer devices in all, but the search
            // goes on past one that does not: stages hold whole layers, so the layers per stage
            // (and with them the requests a replica holds) fall in steps, not smoothly. 48
            // layers are 4 per stage at PP 12 and PP 15 but 3 at PP 18, where one replica
            // holds what two needed before.
            let devices = (u64::from(tp) * u64::from(pp)).saturating_mul(replicas);
            if devices >= fewest {
                continue;
            }
            fewest = devices;
            found.push(Candidate {
                class: ctx.index,
                precision: ctx.precision,
                precision_rank: ctx.precision_rank,
                execution: ctx.execution,
                tp,
                pp,
                attention_dp: sharding.attention_dp,
                expert_parallel: sharding.expert_parallel,
                replicas: u32::try_from(replicas).unwrap_or(u32::MAX),
                fit,
                fallback: 0,
            });
            // Deeper pipelines only pay off by needing fewer replicas.
            if replicas == 1 || demand.replicas.is_some() {
                break;
            }
        }
    }
    found
}

/// Replicas a layout needs: those asked for, each holding its share, or as many as the
/// concurrency needs; `None` when the layout does not fit.
fn replicas_needed(fit: &ServingFit, demand: Demand) -> Option<u64> {
    if !fit.fits() {
        return None;
    }
    match demand.replicas {
        Some(asked) => {
            let share = demand.concurrency.div_ceil(u64::from(asked.max(1)));
            (fit.max_concurrency >= share).then_some(u64::from(asked))
        }
        None => Some(demand.concurrency.div_ceil(fit.max_concurrency)),
    }
}

/// The memory model's view of a serving request: its context and cache type, and the engine
/// settings the request states (today's vLLM with its defaults otherwise).
pub(crate) fn serving_target(request: &PlanRequest, context: u64) -> ServingTarget {
    let engine = &request.engine;
    ServingTarget {
        context,
        kv_dtype: request.kv_dtype,
        gpu_util: request.gpu_util,
        engine: engine.memory_engine(),
        max_num_batched_tokens: engine.max_num_batched_tokens,
        max_num_seqs: engine.max_num_seqs,
        enforce_eager: engine.enforce_eager,
        engine_default_util: engine.mem_fraction_static.is_none(),
        windows: engine.window_caching(),
    }
}
