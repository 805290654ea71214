//! One serving plan, described: the serving search's best layout ([`super::serving`]) with
//! the memory and the choices behind it, or, when nothing fits, the refusal that explains why
//! ([`super::refusal`]). The search itself knows neither.

use super::PlanRequest;
use super::parallel::valid_tensor_parallel_sizes;
use super::refusal;
use super::serving::{Candidate, Demand, search, serving_target};
use super::suggest::{self, Change, Suggestion};
use crate::plan::capability::Execution;
use crate::plan::inventory::{NodeSpec, Reservations};
use crate::plan::kv::{KvDtype, KvLayout};
use crate::plan::memory::{ServingTarget, scheduler_defaults, serving_fit};
use crate::plan::model::Model;
use crate::plan::packing::{DeviceClass, FreeDevices, Placement};
use crate::plan::report::Plan;
use crate::plan::throughput;
use crate::plan::weights::WeightBytes;

/// Plans serving and explains the result.
pub(super) fn plan(
    model: &Model,
    fleet: &FreeDevices<'_>,
    request: &PlanRequest,
    context: u64,
    concurrency: u64,
    nodes: (&[NodeSpec], &Reservations),
) -> Plan {
    let target = serving_target(request, context);
    let demand = Demand {
        concurrency,
        replicas: request.replicas,
    };
    let outcome = search(
        model,
        fleet,
        request.precision,
        &target,
        demand,
        request.max_nodes,
    );
    let mut plan = Plan::new("serve", model);
    plan.context = Some(context);
    plan.concurrency = Some(concurrency);
    plan.kv_dtype = Some(request.kv_dtype.resolved_name());
    plan.gpu_memory_utilization = Some(request.gpu_util);
    plan.reasons.extend(model.notes.iter().cloned());
    match &outcome.best {
        Some((candidate, placement)) => {
            describe(
                &mut plan,
                model,
                fleet,
                candidate,
                placement,
                &target,
                concurrency,
            );
            describe_moe(&mut plan, candidate, concurrency);
            if let Some(narrower) = &outcome.narrower {
                explain_narrower(&mut plan, model, (candidate, placement), narrower);
            }
        }
        None => refusal::serving(&mut plan, model, fleet, request, &target, &outcome, nodes),
    }
    plan
}

/// Records expert parallelism and data-parallel attention when the plan uses them: the
/// fields, a per-device KV cache that holds only the device's attention rank's requests, and
/// a line saying why.
fn describe_moe(plan: &mut Plan, candidate: &Candidate, concurrency: u64) {
    let sharding = candidate.sharding();
    if sharding.is_plain() {
        return;
    }
    let dp = sharding.attention_dp.max(1);
    plan.expert_parallel = sharding.expert_parallel.then_some(sharding.tp);
    plan.attention_data_parallel = (dp > 1).then_some(dp);
    let per_replica = concurrency.div_ceil(u64::from(candidate.replicas.max(1)));
    let fit = candidate.fit;
    plan.per_device =
        Some(fit.with_concurrency(per_replica.min(fit.max_concurrency).div_ceil(u64::from(dp))));
    let mut line = String::new();
    if sharding.expert_parallel {
        line.push_str(&format!(
            "experts are expert-parallel over the {} devices of each group (whole experts per device)",
            sharding.tp
        ));
    }
    if dp > 1 {
        if !line.is_empty() {
            line.push_str("; ");
        }
        line.push_str(&format!(
            "attention is data-parallel: {dp} ranks of TP {}, each with its own requests' KV cache",
            sharding.attention_tp()
        ));
    }
    plan.reasons.push(line);
}

/// Fills in a successful plan and the reasoning behind it.
fn describe(
    plan: &mut Plan,
    model: &Model,
    fleet: &FreeDevices<'_>,
    candidate: &Candidate,
    placement: &Placement,
    target: &ServingTarget,
    concurrency: u64,
) {
    let class = &fleet.classes[candidate.class];
    let fit = candidate.fit;
    let per_replica = concurrency.div_ceil(u64::from(candidate.replicas.max(1)));
    plan.fits = true;
    plan.precision = Some(candidate.precision);
    plan.execution = Some(candidate.execution);
    plan.device = Some(class.sample.product.clone());
    plan.tp = Some(candidate.tp);
    plan.pp = Some(candidate.pp);
    plan.replicas = Some(candidate.replicas);
    plan.devices = u32::try_from(candidate.devices()).ok();
    plan.nodes = Some(placement.nodes);
    plan.per_device = Some(fit.with_concurrency(per_replica.min(fit.max_concurrency)));
    plan.max_concurrency = Some(
        fit.max_concurrency
            .saturating_mul(u64::from(candidate.replicas)),
    );
    plan.kv_tokens = Some(fit.kv_tokens);
    plan.assignments = placement.assignments.clone();
    plan.driver_version = fleet.oldest_driver(&plan.assignments);
    let weights = WeightBytes::of(model, candidate.precision);
    plan.throughput = class.sample.bandwidth_tbps.and_then(|bandwidth| {
        throughput::estimate(
            model,
            &weights,
            (candidate.tp, candidate.pp),
            fit.per_request,
            bandwidth,
            per_replica.min(fit.max_concurrency),
        )
    });
    plan.reasons.extend(explain_memory(
        model,
        candidate,
        &weights,
        target,
        &class.sample.product,
    ));
    plan.reasons.extend(explain_choice(
        model,
        fleet,
        candidate,
        placement,
        target,
        concurrency,
    ));
    if target.kv_dtype.bytes() > 1.0 && fit.max_concurrency < 4 {
        suggest::push(
            plan,
            Suggestion::new(
                Change::KvDtype {
                    kv_dtype: KvDtype::Fp8,
                },
                "halves the KV cache and roughly doubles the concurrency that fits",
            ),
        );
    }
}

/// Auto precision: why the winner's precision, and what the next narrower one that places
/// would save (fewer nodes or devices, or more KV room on the same ones).
fn explain_narrower(
    plan: &mut Plan,
    model: &Model,
    (winner, placement): (&Candidate, &Placement),
    (narrower, narrower_at): &(Candidate, Placement),
) {
    plan.reasons.push(format!(
        "{} is the widest precision that fits on the fewest nodes ({})",
        winner.precision, placement.nodes
    ));
    let layout = format!(
        "TP {} x PP {} x {} replica(s)",
        narrower.tp, narrower.pp, narrower.replicas
    );
    let why = if narrower_at.nodes < placement.nodes {
        format!(
            "{} would fit on {} node(s) instead of {} ({layout})",
            narrower.precision, narrower_at.nodes, placement.nodes
        )
    } else if narrower.devices() < winner.devices() {
        format!(
            "{} would fit on {} device(s) instead of {} ({layout})",
            narrower.precision,
            narrower.devices(),
            winner.devices()
        )
    } else {
        let held = |c: &Candidate| c.fit.max_concurrency.saturating_mul(u64::from(c.replicas));
        let weights = WeightBytes::of(model, winner.precision).total().as_f64();
        let narrow_weights = WeightBytes::of(model, narrower.precision).total().as_f64();
        format!(
            "{} would cut the weights to {:.2}x: {} full-context request(s) fit instead of {} on {} device(s) ({layout})",
            narrower.precision,
            narrow_weights / weights.max(1.0),
            held(narrower),
            held(winner),
            narrower.devices()
        )
    };
    suggest::push(
        plan,
        Suggestion::new(
            Change::Precision {
                precision: narrower.precision,
            },
            why,
        ),
    );
}

/// The arithmetic: weights, KV per token and per request, budget.
fn explain_memory(
    model: &Model,
    c: &Candidate,
    weights: &WeightBytes,
    target: &ServingTarget,
    product: &str,
) -> Vec<String> {
    let fit = c.fit;
    let mut lines = vec![format!(
        "weights: {:.2}B params in {} = {} in total, {} on each device with TP {} x PP {}",
        model.params.total() as f64 / 1e9,
        c.precision,
        weights.total(),
        fit.memory.weights,
        c.tp,
        c.pp
    )];
    if c.execution == Execution::WeightOnly {
        lines.push(format!(
            "{} weights run through weight-only kernels: the device does not compute in {}",
            c.precision, c.precision
        ));
    }
    if let Some(exact) = model.checkpoint_bytes {
        lines.push(format!(
            "weight bytes follow the given {exact} checkpoint in {}: scaled to {}, never below \
             the computed weights",
            model.native.precision, c.precision
        ));
    }
    let kv = KvLayout::new(model, target.kv_dtype, c.tp, c.pp);
    if let Some(window) = model.arch.sliding_window
        && !kv.with_window_caching(target.windows).windows_cached()
    {
        let kind = if window.chunked {
            "chunked local attention layers"
        } else {
            "sliding-window layers"
        };
        lines.push(format!(
            "{} {kind} cached for the full context: this engine version keeps them whole \
             (vLLM's hybrid KV cache manager keeps only the window: sliding windows from 0.9.1, \
             chunked local attention in 0.9.2-0.10.0 and from 0.19)",
            window.layers
        ));
    }
    lines.push(format!(
        "KV cache: {} per token on each device ({} KV; {} KV heads / TP {}); one {}-token request = {}",
        kv.bytes_per_token(),
        target.kv_dtype.resolved_name(),
        model.arch.kv_heads,
        c.tp,
        target.context,
        fit.per_request
    ));
    let (batched, sequences) = scheduler_defaults(fit.memory.capacity, product);
    lines.push(format!(
        "budget: {:.2} x {} = {}; activations {} (up to {batched} batched tokens, {sequences} sequences), overhead {}; {} left for KV = {} full-context request(s) per replica",
        target.gpu_util, fit.memory.capacity, fit.memory.budget, fit.memory.activations, fit.memory.overhead, fit.kv_free, fit.max_concurrency
    ));
    lines
}

/// Why this layout and not a cheaper one, and how it sits on the fleet.
fn explain_choice(
    model: &Model,
    fleet: &FreeDevices<'_>,
    c: &Candidate,
    placement: &Placement,
    target: &ServingTarget,
    concurrency: u64,
) -> Vec<String> {
    let class = &fleet.classes[c.class];
    let mut lines = Vec::new();
    if c.tp * c.pp > 1 {
        let smaller = smaller_layout_shortfall(model, class, c, target);
        if let Some(line) = smaller {
            lines.push(line);
        }
    }
    if c.replicas > 1 {
        lines.push(format!(
            "{} replicas: each holds {} full-context request(s), {concurrency} requested",
            c.replicas, c.fit.max_concurrency
        ));
    }
    if c.tp > 1 {
        lines.push(if placement.tp_in_fast_domain {
            format!(
                "each TP group of {} sits inside one NVLink-class domain",
                c.tp
            )
        } else {
            format!(
                "TP groups of {} communicate over PCIe (no NVLink-class domain that large)",
                c.tp
            )
        });
    }
    if placement.nodes > 1 && c.pp > 1 {
        lines.push(if placement.pipeline_on_fabric {
            "pipeline stages span nodes on one InfiniBand fabric".to_string()
        } else {
            "pipeline stages span nodes without a shared InfiniBand fabric: expect slow stage hand-offs".to_string()
        });
    }
    lines
}

/// Why one device fewer (the next smaller valid layout) would not do.
fn smaller_layout_shortfall(
    model: &Model,
    class: &DeviceClass<'_>,
    c: &Candidate,
    target: &ServingTarget,
) -> Option<String> {
    let weights = WeightBytes::of(model, c.precision);
    let device = class.serving_device();
    let (tp, pp) = if c.pp > 1 {
        (c.tp, c.pp - 1)
    } else {
        (*valid_tensor_parallel_sizes(model, c.tp - 1).last()?, 1)
    };
    let fit = serving_fit(model, &weights, device, tp, pp, target);
    if fit.fits() {
        return None;
    }
    let need = fit.memory.weights + fit.memory.activations + fit.memory.overhead + fit.per_request;
    Some(format!(
        "TP {tp} x PP {pp} would need {need} per device for one request (budget {})",
        fit.memory.budget
    ))
}
