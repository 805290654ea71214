//! The search: for every class of free devices, every precision the device and the model
//! allow, every valid tensor-parallel size and the smallest pipeline depth that fits, how many
//! replicas the concurrency target needs; then the cheapest candidate that the fleet can
//! actually place.
//!
//! Order (`planner-formulas.md` §2 and §4, issue 14 item 6): fewest nodes, then the widest
//! precision, then fewest devices, then the layout the interconnect favours (TP inside an
//! NVLink-class domain, PP where there is only PCIe), then device class and sizes, so the
//! same input always yields the same plan.

#[cfg(test)]
mod checkpoint;
mod disaggregated;
mod fraction;
#[cfg(test)]
mod overflow;
mod parallel;
mod refusal;
mod serve;
mod serving;
mod suggest;
mod train;

use crate::hardware::Precision;

use super::capability::PrecisionChoice;
use super::engine::choice::EngineChoice;
use super::error::{PlanError, Result};
use super::inventory::{NodeSpec, Reservations};
use super::kv::KvDtype;
use super::memory::DEFAULT_GPU_UTIL;
use super::model::Model;
use super::packing::{FleetIndex, FreeDevices};
use super::report::Plan;
use super::training::TrainingTarget;

pub use disaggregated::{Disaggregation, MAX_PREFILL_REPLICAS, dense_tflops};
pub use parallel::{valid_pipeline_sizes, valid_tensor_parallel_sizes};
pub use suggest::{CONTEXT_STEP, Change, Suggestion, context_steps, is_meaningful_context};

/// The context used when neither the request nor the model states one.
pub const FALLBACK_CONTEXT: u64 = 4096;

/// What the model is to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Goal {
    /// Serve requests of `context` tokens (default: the model's maximum), `concurrency` of
    /// them at once.
    Serve {
        /// Tokens per request, prompt and output together.
        context: Option<u64>,
        /// Concurrent full-context requests.
        concurrency: u64,
    },
    /// Fine-tune.
    Train(TrainingTarget),
}

/// A planning request.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanRequest {
    /// The goal.
    pub goal: Goal,
    /// Weight precision.
    pub precision: PrecisionChoice,
    /// KV-cache type (serving).
    pub kv_dtype: KvDtype,
    /// Most nodes the plan may use.
    pub max_nodes: Option<u32>,
    /// Fraction of device memory the plan may use (serving default 0.90, like vLLM).
    pub gpu_util: f64,
    /// Serving replicas to place, each holding its share of the concurrency; `None` places
    /// as many as the concurrency needs. Training ignores it.
    pub replicas: Option<u32>,
    /// Serving only: plan a decode pool and a separate prefill pool
    /// (`disaggregated`); `None` plans one pool.
    pub disaggregation: Option<Disaggregation>,
    /// Serving: the engine and the settings of it that shape memory and its arguments.
    pub engine: EngineChoice,
    /// Plan whole devices even where a driver publishes them shareable (no share of one).
    pub whole_devices: bool,
}

impl PlanRequest {
    /// Serving `context` tokens, one request at a time, with defaults for the rest.
    pub fn serve(context: Option<u64>, concurrency: u64) -> Self {
        Self {
            goal: Goal::Serve {
                context,
                concurrency,
            },
            precision: PrecisionChoice::Auto,
            kv_dtype: KvDtype::Auto,
            max_nodes: None,
            gpu_util: DEFAULT_GPU_UTIL,
            replicas: None,
            disaggregation: None,
            engine: EngineChoice::default(),
            whole_devices: false,
        }
    }

    /// The same request with the precision pinned.
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = PrecisionChoice::from(precision);
        self
    }
}

/// Plans `model` on the free devices of `nodes`. Errors are for unanswerable input; a goal
/// that does not fit is a [`Plan`] with `fits: false`, reasons and suggestions.
pub fn plan(
    model: &Model,
    nodes: &[NodeSpec],
    reserved: &Reservations,
    request: &PlanRequest,
) -> Result<Plan> {
    plan_checked(model, (nodes, None), reserved, request, true)
}

/// [`plan`] with an index of `nodes` built beforehand ([`FleetIndex::new`]): the same plan,
/// but indexing the free devices costs only the nodes `reserved` names (one index serves every
/// plan on the same nodes: the controller keeps one per fleet view). An index of other nodes
/// is ignored.
pub fn plan_indexed(
    model: &Model,
    (nodes, index): (&[NodeSpec], &FleetIndex),
    reserved: &Reservations,
    request: &PlanRequest,
) -> Result<Plan> {
    plan_checked(model, (nodes, Some(index)), reserved, request, true)
}

/// [`plan`] of a disaggregated request; `verify` says whether its suggestions are checked
/// (a check re-plans without checking again).
fn plan_disaggregated(
    model: &Model,
    (nodes, reserved): (&[NodeSpec], &Reservations),
    request: &PlanRequest,
    disaggregation: Disaggregation,
    verify: bool,
) -> Result<Plan> {
    let mut request = request.clone();
    request.disaggregation = Some(disaggregation);
    plan_checked(model, (nodes, None), reserved, &request, verify)
}

fn plan_checked(
    model: &Model,
    (nodes, index): (&[NodeSpec], Option<&FleetIndex>),
    reserved: &Reservations,
    request: &PlanRequest,
    verify: bool,
) -> Result<Plan> {
    validate(request)?;
    let fleet = match index {
        Some(index) => FreeDevices::indexed(nodes, index, reserved),
        None => FreeDevices::new(nodes, reserved),
    };
    // Shares may plan where whole devices do not: only for serving, on shareable devices.
    let any_shareable = match index {
        Some(index) if index.indexes(nodes) => index.any_shareable(),
        _ => super::inventory::any_shareable(nodes),
    };
    let may_share =
        matches!(request.goal, Goal::Serve { .. }) && fraction::may_share(any_shareable, request);
    // And partitions may, of devices some of whose partitions others hold, or of devices
    // published only in partitions (which the whole-device fleet leaves out).
    let may_partition = || {
        matches!(request.goal, Goal::Serve { .. })
            && fraction::partition_view(nodes, reserved, request).is_some()
    };
    let any_partitions_only = || match index {
        Some(index) if index.indexes(nodes) => index.any_partitions_only(),
        _ => super::inventory::any_partitions_only(nodes),
    };
    if fleet.classes.is_empty() && !may_share && !may_partition() {
        let reason = if nodes.is_empty() {
            "the inventory has no nodes".to_string()
        } else {
            no_free_accelerator(nodes)
        };
        return Err(PlanError::NoDevices(reason));
    }
    match &request.goal {
        Goal::Serve {
            context,
            concurrency,
        } => {
            let (context, context_note) = resolve_context(model, *context)?;
            if let Some(disaggregation) = request.disaggregation {
                let mut plan = disaggregated::plan(
                    model,
                    (nodes, reserved),
                    request,
                    (context, *concurrency),
                    disaggregation,
                    verify,
                );
                fraction::choose(&mut plan, model, (nodes, reserved), request);
                attach_engine(&mut plan, &request.engine);
                plan.reasons.extend(context_note);
                plan.reasons.push(request.engine.assumption());
                return Ok(plan);
            }
            let serve_on = |view_fleet: &FreeDevices<'_>, view: (&[NodeSpec], &Reservations)| {
                let mut plan = serve::plan(model, view_fleet, request, context, *concurrency, view);
                sglang_default_fraction(&mut plan, request);
                // Fractions are chosen on the real view, whatever view the search saw.
                fraction::choose(&mut plan, model, (nodes, reserved), request);
                plan
            };
            let whole = (!fleet.classes.is_empty()).then(|| serve_on(&fleet, (nodes, reserved)));
            // Where no free whole device holds the goal, shares may: of devices that already
            // hold others' shares, or more replicas than devices. The view copies the nodes,
            // so it is built only then; a plan on it is kept only if it is one of shares.
            let shared = match &whole {
                Some(plan) if plan.fits => None,
                _ if may_share => fraction::share_view(nodes, reserved, request)
                    .map(|(view_nodes, view_reserved)| {
                        let view_fleet = FreeDevices::new(&view_nodes, &view_reserved);
                        serve_on(&view_fleet, (&view_nodes, &view_reserved))
                    })
                    .filter(|plan| {
                        plan.fits
                            && plan
                                .fraction
                                .as_ref()
                                .is_some_and(|f| f.kind == crate::plan::report::FractionKind::Share)
                    }),
                _ => None,
            };
            // Likewise partitions: of devices some of whose partitions others hold, and of
            // devices published only in partitions, which come first (the smallest fraction
            // that holds the plan) even where a whole device or a share would do.
            let is_partition = |plan: &Plan| {
                plan.fits
                    && plan
                        .fraction
                        .as_ref()
                        .is_some_and(|f| f.kind == crate::plan::report::FractionKind::Partition)
            };
            let try_partitions = match (&whole, &shared) {
                (Some(plan), _) if is_partition(plan) => false,
                (Some(plan), _) if plan.fits => any_partitions_only(),
                (_, Some(_)) => any_partitions_only(),
                _ => true,
            };
            // A plan the partition search refused: the answer when nothing else fits, since
            // it says why (a device published only in partitions, none of which holds it).
            let mut refused_on_partitions = None;
            let partitioned = if try_partitions {
                // The view holds only devices with a free partition, which may be too small
                // for this model: a device the search chose that gave no partition is left
                // out of the next try.
                let mut view = fraction::partition_view(nodes, reserved, request);
                let mut found = None;
                for _ in 0..fraction::MAX_PARTITION_TRIES {
                    let Some((view_nodes, view_reserved)) = view.take() else {
                        break;
                    };
                    let plan = serve_on(
                        &FreeDevices::for_partitions(&view_nodes, &view_reserved),
                        (&view_nodes, &view_reserved),
                    );
                    if is_partition(&plan) {
                        found = Some(plan);
                        break;
                    }
                    view = fraction::without_chosen(view_reserved, &plan)
                        .map(|reserved| (view_nodes, reserved));
                    if refused_on_partitions.is_none() && !plan.fits {
                        refused_on_partitions = Some(plan);
                    }
                }
                found
            } else {
                None
            };
            let Some(mut plan) = partitioned.or(shared).or(whole).or(refused_on_partitions) else {
                return Err(PlanError::NoDevices(no_free_accelerator(nodes)));
            };
            attach_engine(&mut plan, &request.engine);
            plan.reasons.extend(context_note);
            plan.reasons.push(request.engine.assumption());
            Ok(plan)
        }
        Goal::Train(target) => {
            let mut plan = train::plan(model, &fleet, request, target);
            fraction::choose(&mut plan, model, (nodes, reserved), request);
            Ok(plan)
        }
    }
}

/// The engines' arguments for a finished serving plan and its prefill pool, if any: the
/// search decides the layout and memory, and the arguments (and image) follow from them, here
/// and only here.
fn attach_engine(plan: &mut Plan, engine: &super::engine::choice::EngineChoice) {
    plan.engine = super::engine::settings_for(plan, engine);
    if let Some(mut prefill) = plan.prefill.take() {
        prefill.engine = super::engine::settings_for(&prefill, engine);
        super::engine::disaggregation::apply(plan, &mut prefill);
        plan.prefill = Some(prefill);
    }
}

/// An SGLang plan without a stated `mem_fraction_static` used SGLang's own default for the
/// device class and layout: report that fraction, not the request's placeholder, and say so.
fn sglang_default_fraction(plan: &mut Plan, request: &PlanRequest) {
    let engine = &request.engine;
    if engine.kind != super::engine::choice::EngineKind::Sglang
        || engine.mem_fraction_static.is_some()
    {
        return;
    }
    if let Some(memory) = plan.per_device.filter(|m| m.capacity.0 > 0) {
        let fraction = memory.budget.as_f64() / memory.capacity.as_f64();
        plan.gpu_memory_utilization = Some(fraction);
        plan.reasons.push(format!(
            "mem-fraction-static: {fraction:.3}, SGLang's default for this device and layout \
             (server_args.py); pass --mem-fraction-static to set it"
        ));
    }
}

/// Most node names a refusal lists; the rest are counted.
const MAX_NAMED_NODES: usize = 5;

/// Why `nodes` (not empty) give the planner no device: naming the nodes that have none, so a
/// CPU-only node is not mistaken for a missing one (issue 28).
fn no_free_accelerator(nodes: &[NodeSpec]) -> String {
    let mut reason = format!(
        "{} node(s) but no free accelerator with a known memory size",
        nodes.len()
    );
    let bare: Vec<&str> = nodes
        .iter()
        .filter(|node| node.devices.is_empty())
        .map(|node| node.name.as_str())
        .collect();
    if !bare.is_empty() {
        let shown: Vec<&str> = bare.iter().copied().take(MAX_NAMED_NODES).collect();
        reason.push_str(&format!("; without accelerators: {}", shown.join(", ")));
        if bare.len() > MAX_NAMED_NODES {
            reason.push_str(&format!(" and {} more", bare.len() - MAX_NAMED_NODES));
        }
    }
    reason
}

fn validate(request: &PlanRequest) -> Result<()> {
    request.engine.validate()?;
    if !(request.gpu_util > 0.0 && request.gpu_util <= 1.0) {
        return Err(PlanError::constraint(format!(
            "--gpu-util {} must be in (0, 1]",
            request.gpu_util
        )));
    }
    if request.max_nodes == Some(0) {
        return Err(PlanError::constraint("--max-nodes must be at least 1"));
    }
    match &request.goal {
        Goal::Serve {
            context,
            concurrency,
        } => {
            if *context == Some(0) {
                return Err(PlanError::constraint("--context must be at least 1 token"));
            }
            if *concurrency == 0 {
                return Err(PlanError::constraint("--concurrency must be at least 1"));
            }
            if let Some(d) = request.disaggregation
                && !(1..=MAX_PREFILL_REPLICAS).contains(&d.prefill_replicas)
            {
                return Err(PlanError::constraint(format!(
                    "--prefill-replicas must be between 1 and {MAX_PREFILL_REPLICAS}"
                )));
            }
        }
        Goal::Train(target) => {
            if target.seq_len == 0 || target.micro_batch == 0 {
                return Err(PlanError::constraint(
                    "--seq-len and --micro-batch must be at least 1",
                ));
            }
            if target.lora_rank == 0 {
                return Err(PlanError::constraint("--lora-rank must be at least 1"));
            }
            train::check_precision(target.method, request.precision)
                .map_err(PlanError::constraint)?;
        }
    }
    Ok(())
}

/// The context to plan for: the request's, else the model's maximum, else a fallback; never
/// more than the model supports (vLLM refuses a `max_model_len` beyond it). When the request
/// names none, the second value says which context was taken and why (issue 23: never a silent
/// default).
pub fn resolve_context(model: &Model, requested: Option<u64>) -> Result<(u64, Option<String>)> {
    match (requested, model.max_context) {
        (Some(context), Some(max)) if context > max => Err(PlanError::constraint(format!(
            "--context {context} exceeds {}'s maximum of {max} tokens",
            model.name
        ))),
        (Some(context), _) => Ok((context, None)),
        (None, Some(max)) => Ok((
            max,
            Some(format!(
                "context: {max} tokens, {}'s maximum (max_position_embeddings in its config); \
                 pass --context to plan a shorter one",
                model.name
            )),
        )),
        (None, None) => Ok((
            FALLBACK_CONTEXT,
            Some(format!(
                "context: assumed {FALLBACK_CONTEXT} tokens because {}'s config states no \
                 maximum (none of max_position_embeddings, max_sequence_length, seq_length, \
                 n_positions); pass --context for the context you serve",
                model.name
            )),
        )),
    }
}

#[cfg(test)]
mod refusal_tests {
    use super::*;

    fn bare(name: &str) -> NodeSpec {
        NodeSpec {
            name: name.to_string(),
            devices: Vec::new(),
            fabric: None,
            labels: std::collections::BTreeMap::new(),
        }
    }

    /// Issue 23: a plan names the context it took when the request named none.
    #[test]
    fn the_context_taken_is_named_with_its_reason() {
        let preset = crate::plan::model::presets::find("deepseek-v3")
            .unwrap()
            .unwrap();
        let (context, note) = resolve_context(&preset, None).unwrap();
        assert_eq!(context, 163_840);
        assert!(
            note.unwrap()
                .starts_with("context: 163840 tokens, deepseek-v3's maximum")
        );
        let mut bare = preset.clone();
        bare.max_context = None;
        let (context, note) = resolve_context(&bare, None).unwrap();
        assert_eq!(context, FALLBACK_CONTEXT);
        assert!(note.unwrap().contains("assumed 4096 tokens because"));
        assert_eq!(resolve_context(&bare, Some(1000)).unwrap(), (1000, None));
        assert!(resolve_context(&preset, Some(200_000)).is_err());
    }

    #[test]
    fn a_fleet_without_accelerators_names_its_nodes() {
        let model = crate::plan::model::presets::find("llama-3.2-1b")
            .unwrap()
            .unwrap();
        let request = PlanRequest::serve(Some(4096), 1);
        let one = plan(&model, &[bare("cpu-1")], &Reservations::default(), &request);
        let Err(PlanError::NoDevices(reason)) = one else {
            panic!("{one:?}");
        };
        assert!(reason.ends_with("without accelerators: cpu-1"), "{reason}");
        let many: Vec<NodeSpec> = (0..7).map(|i| bare(&format!("cpu-{i}"))).collect();
        let Err(PlanError::NoDevices(reason)) =
            plan(&model, &many, &Reservations::default(), &request)
        else {
            panic!("no devices");
        };
        assert!(
            reason.ends_with("cpu-0, cpu-1, cpu-2, cpu-3, cpu-4 and 2 more"),
            "{reason}"
        );
    }
}
