//! Disaggregated serving (issue 14 item 3): a decode pool and a prefill pool, planned one
//! after the other on disjoint devices.
//!
//! - The **decode pool** is the ordinary serving plan: the whole `concurrency` at `context`.
//! - The **prefill pool** is the same search run again on the devices the decode pool left
//!   free (its devices are added to the [`Reservations`], the mechanism that keeps placements
//!   off each other's devices), with the decode pool's weight precision and KV-cache type
//!   pinned (prefill ships its KV cache to decode, so both sides must store it alike), sized
//!   for `prefill_replicas` replicas that each hold one full-context request plus the
//!   profile-run activation peak (the serving memory model already counts the latter).
//! - **Class rule for prefill**: prefill is compute-bound, decode bandwidth-bound (vLLM docs,
//!   "Disaggregated Prefilling"; SGLang docs, "PD Disaggregation"). Among the device classes
//!   left free, the prefill pool goes to the class with the most dense 16-bit tensor compute
//!   per device ([`dense_tflops`]); classes of equal compute are searched together in the
//!   ordinary order (fewest nodes, fewest devices...), and a class of unknown compute comes
//!   last. A class that cannot hold the pool gives way to the next.
//!
//! Either pool not fitting makes the plan not fit; every reason then names the pool, and the
//! only suggestions are those checked by planning the disaggregated request again with the
//! change applied (or without `--disaggregated`, which is the decode pool alone).
//!
//! `max_nodes` caps each pool on its own. The router that sends a request to a prefill
//! replica and then to a decode replica is not planned here.

use std::collections::BTreeSet;

use crate::hardware::Precision;
use crate::plan::capability::PrecisionChoice;
use crate::plan::inventory::{NodeSpec, Reservations};
use crate::plan::model::Model;
use crate::plan::packing::FreeDevices;
use crate::plan::products;
use crate::plan::report::Plan;

use super::PlanRequest;
use super::suggest::Change;

/// The largest `prefill_replicas` a request may ask for (the CRD caps it the same).
pub const MAX_PREFILL_REPLICAS: u32 = 64;

/// What a disaggregated request adds to an ordinary serving request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disaggregation {
    /// Prefill replicas, each holding one full-context request at a time.
    pub prefill_replicas: u32,
}

impl Default for Disaggregation {
    fn default() -> Self {
        Self {
            prefill_replicas: 1,
        }
    }
}

/// Peak dense (no sparsity) 16-bit tensor TFLOPS per device, from the vendors' datasheets
/// (NVIDIA H100/H200/H20/A100/L40S/L4/A10/A10G/A40/RTX A6000/T4/V100/RTX 4090/B200 product
/// datasheets: the "BF16/FP16 Tensor Core" row halved where the sheet quotes sparsity; AMD
/// Instinct MI300X/MI325X/MI355X datasheets, "peak BF16"; the GB200 NVL72 spec sheet's 360
/// PFLOPS sparse FP16/BF16 over its 72 GPUs, halved; the H800 has the H100's compute, SXM and
/// PCIe). Only an ordering is drawn from it, so a few percent of error does not matter.
const DENSE_TFLOPS: &[(&str, f64)] = &[
    ("NVIDIA GB200", 2500.0),
    ("NVIDIA B200", 2250.0),
    ("AMD Instinct MI355X", 2500.0),
    ("AMD Instinct MI325X", 1307.0),
    ("AMD Instinct MI300X", 1307.0),
    ("NVIDIA H200", 989.0),
    ("NVIDIA H100 80GB HBM3", 989.0),
    ("NVIDIA H800", 989.0),
    ("NVIDIA H100 NVL", 835.0),
    ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA H800 PCIe", 756.0),
    ("NVIDIA L40S", 362.0),
    ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA A100-SXM4-40GB", 312.0),
    ("NVIDIA A100 80GB PCIe", 312.0),
    ("NVIDIA GeForce RTX 4090", 165.0),
    ("NVIDIA RTX A6000", 155.0),
    ("NVIDIA A40", 150.0),
    ("NVIDIA H20", 148.0),
    ("NVIDIA V100", 125.0),
    ("NVIDIA A10", 125.0),
    ("NVIDIA L4", 121.0),
    ("NVIDIA A10G", 70.0),
    ("NVIDIA T4", 65.0),
];

/// Dense 16-bit TFLOPS of a device product as reported, when the table knows it.
pub fn dense_tflops(product: &str, memory_gb: f64) -> Option<f64> {
    let name = products::lookup(product, Some(memory_gb)).map_or(product, |p| p.name);
    DENSE_TFLOPS
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, tflops)| *tflops)
}

/// Plans both pools. `plain` is the serving plan of the whole request (the decode pool).
pub(super) fn plan(
    model: &Model,
    (nodes, reserved): (&[NodeSpec], &Reservations),
    request: &PlanRequest,
    (context, concurrency): (u64, u64),
    disaggregation: Disaggregation,
    verify_suggestions: bool,
) -> Plan {
    let fleet = FreeDevices::new(nodes, reserved);
    let mut decode = super::serve::plan(
        model,
        &fleet,
        request,
        context,
        concurrency,
        (nodes, reserved),
    );
    let offered = std::mem::take(&mut decode.suggested_changes);
    decode.suggestions.clear();
    if !decode.fits {
        decode.reasons.insert(
            0,
            format!(
                "decode pool: {concurrency} concurrent {context}-token request(s) do not fit (the prefill pool is planned on what the decode pool leaves)"
            ),
        );
        if verify_suggestions {
            keep_verified(&mut decode, model, (nodes, reserved), request, offered);
        }
        return decode;
    }
    let before = fleet.free_devices();
    let mut held = reserved.clone();
    for a in &decode.assignments {
        for device in &a.devices {
            held.insert(a.node.clone(), device.clone());
        }
    }
    let prefill = prefill_pool(
        model,
        nodes,
        &held,
        request,
        (context, decode.precision),
        disaggregation.prefill_replicas,
    );
    match prefill {
        Ok(pool) => {
            decode.reasons.push(format!(
                "disaggregated: this plan is the decode pool; the prefill pool ({} x {}, TP {} x PP {} x {} replica(s)) is in `prefill`, on other devices",
                pool.devices.unwrap_or(0),
                pool.device.as_deref().unwrap_or("?"),
                pool.tp.unwrap_or(0),
                pool.pp.unwrap_or(0),
                pool.replicas.unwrap_or(0),
            ));
            decode.prefill = Some(Box::new(pool));
            if verify_suggestions {
                keep_verified(&mut decode, model, (nodes, reserved), request, offered);
            }
        }
        Err(reasons) => {
            decode.fits = false;
            let taken = decode.devices.unwrap_or(0);
            if reasons.is_empty() {
                decode.reasons.push(format!(
                    "prefill pool: no free devices left after the decode pool took {taken} of {before}"
                ));
            } else {
                decode.reasons.push(format!(
                    "prefill pool: {} replica(s) of one {context}-token request at {} with {} KV do not fit on the {} device(s) the decode pool left ({taken} of {before} taken)",
                    disaggregation.prefill_replicas,
                    decode.precision.map_or_else(|| "?".to_string(), |p| p.to_string()),
                    request.kv_dtype.resolved_name(),
                    before.saturating_sub(taken),
                ));
                decode
                    .reasons
                    .extend(reasons.into_iter().map(|r| format!("prefill pool: {r}")));
            }
            if verify_suggestions {
                suggest_for_prefill(
                    &mut decode,
                    model,
                    (nodes, reserved),
                    request,
                    disaggregation,
                    offered,
                );
            }
        }
    }
    decode
}

/// The prefill pool on the devices `held` leaves free: the best-computing class group that
/// holds it, as a plan; otherwise the reasons it fits nowhere (empty: no free device at all).
fn prefill_pool(
    model: &Model,
    nodes: &[NodeSpec],
    held: &Reservations,
    request: &PlanRequest,
    (context, precision): (u64, Option<Precision>),
    replicas: u32,
) -> Result<Plan, Vec<String>> {
    let fleet = FreeDevices::new(nodes, held);
    if fleet.classes.is_empty() {
        return Err(Vec::new());
    }
    let replicas = replicas.clamp(1, MAX_PREFILL_REPLICAS);
    let mut asked = request.clone();
    asked.replicas = Some(replicas);
    let concurrency = u64::from(replicas);
    // The decode pool's precision, pinned (its KV type is the request's, unchanged).
    if let Some(precision) = precision {
        asked.precision = PrecisionChoice::from(precision);
    }
    // Compute groups, most compute first; unknown compute last.
    let compute = |node: &NodeSpec, i: usize| {
        let d = &node.devices[i];
        dense_tflops(&d.product, d.memory.as_f64() / 1e9).map(|t| (t * 10.0).round() as i64)
    };
    let mut groups: BTreeSet<std::cmp::Reverse<Option<i64>>> = BTreeSet::new();
    for node in nodes {
        for i in 0..node.devices.len() {
            if !held.contains(&node.name, &node.devices[i].id) {
                groups.insert(std::cmp::Reverse(compute(node, i)));
            }
        }
    }
    // `Reverse(None)` sorts after every `Reverse(Some)`: unknown compute comes last.
    let mut order: Vec<Option<i64>> = groups.into_iter().map(|r| r.0).collect();
    order.sort_by_key(|g| (g.is_none(), std::cmp::Reverse(*g)));
    for group in order {
        let mut only = held.clone();
        for node in nodes {
            for i in 0..node.devices.len() {
                if compute(node, i) != group {
                    only.insert(node.name.clone(), node.devices[i].id.clone());
                }
            }
        }
        let group_fleet = FreeDevices::new(nodes, &only);
        if group_fleet.classes.is_empty() {
            continue;
        }
        let pool = super::serve::plan(
            model,
            &group_fleet,
            &asked,
            context,
            concurrency,
            (nodes, &only),
        );
        if pool.fits {
            return Ok(prefill_only(pool, model));
        }
    }
    // Nowhere: the whole remaining fleet's refusal says why.
    let refusal = super::serve::plan(model, &fleet, &asked, context, concurrency, (nodes, held));
    let notes = model.notes.len().min(refusal.reasons.len());
    let reasons: Vec<String> = refusal.reasons[notes..].to_vec();
    Err(if reasons.is_empty() {
        vec!["no layout fits".to_string()]
    } else {
        reasons
    })
}

/// A prefill pool's plan without what belongs to the whole request: the model's notes and
/// the suggestions (they were checked for the prefill request, not the disaggregated one).
fn prefill_only(mut pool: Plan, model: &Model) -> Plan {
    // A decode-throughput roofline says nothing about a pool that only prefills.
    pool.throughput = None;
    let notes = model.notes.len().min(pool.reasons.len());
    pool.reasons.drain(..notes);
    pool.suggestions.clear();
    pool.suggested_changes.clear();
    pool
}

/// Plans the disaggregated request again with `change`; true when both pools fit.
fn fits_with(
    model: &Model,
    inventory: (&[NodeSpec], &Reservations),
    request: &PlanRequest,
    disaggregation: Disaggregation,
    change: &Change,
) -> bool {
    let Some(changed) = apply(request, change) else {
        return false;
    };
    super::plan_disaggregated(model, inventory, &changed, disaggregation, false)
        .is_ok_and(|p| p.fits)
}

/// `request` with `change` applied; `None` for changes to the fleet (not checked here).
fn apply(request: &PlanRequest, change: &Change) -> Option<PlanRequest> {
    let mut changed = request.clone();
    match change {
        Change::Context { context } => {
            if let super::Goal::Serve { context: c, .. } = &mut changed.goal {
                *c = Some(*context);
            }
        }
        Change::Concurrency { concurrency } => {
            if let super::Goal::Serve { concurrency: c, .. } = &mut changed.goal {
                *c = *concurrency;
            }
        }
        Change::Precision { precision } => changed.precision = PrecisionChoice::from(*precision),
        Change::KvDtype { kv_dtype } => changed.kv_dtype = *kv_dtype,
        Change::MaxNodes { max_nodes } => changed.max_nodes = Some(*max_nodes),
        Change::Replicas { replicas } => changed.replicas = Some(*replicas),
        Change::AddNodes { .. } => return None,
    }
    Some(changed)
}

/// Keeps the decode pool's suggestions that make the disaggregated request fit.
fn keep_verified(
    plan: &mut Plan,
    model: &Model,
    inventory: (&[NodeSpec], &Reservations),
    request: &PlanRequest,
    offered: Vec<super::Suggestion>,
) {
    let disaggregation = Disaggregation {
        prefill_replicas: plan.prefill.as_ref().and_then(|p| p.replicas).unwrap_or(1),
    };
    for suggestion in offered {
        if fits_with(
            model,
            inventory,
            request,
            disaggregation,
            &suggestion.change,
        ) {
            super::suggest::push(plan, suggestion);
        }
    }
}

/// Suggestions when only the prefill pool does not fit: fewer prefill replicas, the decode
/// pool's own changes, or serving without disaggregation (the decode pool fits alone).
fn suggest_for_prefill(
    plan: &mut Plan,
    model: &Model,
    inventory: (&[NodeSpec], &Reservations),
    request: &PlanRequest,
    disaggregation: Disaggregation,
    offered: Vec<super::Suggestion>,
) {
    let fewer = (1..disaggregation.prefill_replicas).rev().find(|&r| {
        super::plan_disaggregated(
            model,
            inventory,
            request,
            Disaggregation {
                prefill_replicas: r,
            },
            false,
        )
        .is_ok_and(|p| p.fits)
    });
    if let Some(r) = fewer {
        plan.suggestions.push(format!(
            "--prefill-replicas {r}: the prefill pool of {r} replica(s) fits beside the decode pool"
        ));
    }
    for suggestion in offered {
        if fits_with(
            model,
            inventory,
            request,
            disaggregation,
            &suggestion.change,
        ) {
            super::suggest::push(plan, suggestion);
        }
    }
    plan.suggestions.push(
        "drop --disaggregated: the decode pool alone fits (prefill and decode then share its devices)"
            .to_string(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::model::presets;
    use crate::plan::shorthand::parse_hardware;

    #[test]
    fn every_compute_figure_names_a_product_the_planner_knows() {
        for (name, _) in DENSE_TFLOPS {
            assert!(
                crate::plan::products::PRODUCTS
                    .iter()
                    .any(|p| p.name == *name),
                "{name} is not a product name: a renamed product would silently lose its figure"
            );
        }
    }

    fn ask(
        preset: &str,
        hardware: &str,
        reserved: &Reservations,
        (context, concurrency): (u64, u64),
        prefill_replicas: u32,
    ) -> Plan {
        let model = presets::find(preset).unwrap().unwrap();
        let nodes = parse_hardware(hardware).unwrap();
        let mut request = PlanRequest::serve(Some(context), concurrency);
        request.disaggregation = Some(Disaggregation { prefill_replicas });
        super::super::plan(&model, &nodes, reserved, &request).unwrap()
    }

    fn devices(plan: &Plan) -> BTreeSet<(String, String)> {
        plan.assignments
            .iter()
            .flat_map(|a| a.devices.iter().map(|d| (a.node.clone(), d.clone())))
            .collect()
    }

    /// Both pools fit, on disjoint devices, storing weights and KV alike.
    fn pools(plan: &Plan) -> &Plan {
        assert!(plan.fits, "{}", plan.to_table());
        let prefill = plan.prefill.as_deref().expect("a prefill pool");
        assert!(prefill.fits);
        assert!(devices(plan).is_disjoint(&devices(prefill)));
        assert_eq!(plan.precision, prefill.precision);
        assert_eq!(plan.kv_dtype, prefill.kv_dtype);
        assert_eq!(prefill.replicas, Some(1));
        prefill
    }

    #[test]
    fn prefill_goes_to_the_other_class_with_its_own_layout_when_decode_takes_the_best() {
        // 70B bf16 for 32 requests takes all four H100s; the prefill replica lands on the
        // L40S node with a layout of its own.
        let plan = ask(
            "llama-3.1-70b",
            "1x4xH100+nvswitch,1x4xL40S",
            &Reservations::none(),
            (8192, 32),
            1,
        );
        let prefill = pools(&plan);
        assert!(plan.device.as_deref().unwrap().contains("H100"));
        assert_eq!(prefill.device.as_deref(), Some("NVIDIA L40S"));
        assert_ne!((plan.tp, plan.pp), (prefill.tp, prefill.pp));
        let memory = prefill.per_device.unwrap();
        assert!(memory.total <= memory.budget);
        assert!(prefill.kv_tokens.unwrap() >= 8192);
    }

    #[test]
    fn prefill_prefers_the_class_with_more_compute() {
        // The decode pool leaves H100s and all L40S free; prefill is compute-bound and takes
        // the H100s (989 vs 362 dense TFLOPS), though the L40S node is untouched.
        let plan = ask(
            "llama-3.1-70b",
            "1x8xH100+nvswitch,1x8xL40S",
            &Reservations::none(),
            (8192, 8),
            1,
        );
        let prefill = pools(&plan);
        assert!(prefill.device.as_deref().unwrap().contains("H100"));
        assert!(dense_tflops("NVIDIA H100 80GB HBM3", 80.0) > dense_tflops("NVIDIA L40S", 48.0));
    }

    #[test]
    fn neither_pool_uses_a_reserved_device() {
        let mut reserved = Reservations::none();
        for gpu in ["gpu0", "gpu1", "gpu2"] {
            reserved.insert("h100-0-0", gpu);
        }
        let plan = ask("llama-3.1-8b", "1x8xH100+nvswitch", &reserved, (8192, 4), 2);
        assert!(plan.fits, "{}", plan.to_table());
        let prefill = plan.prefill.as_deref().unwrap();
        assert!(devices(&plan).is_disjoint(&devices(prefill)));
        for (node, device) in devices(&plan).iter().chain(devices(prefill).iter()) {
            assert!(!reserved.contains(node, device), "{node}/{device}");
        }
        assert_eq!(prefill.replicas, Some(2));
    }

    #[test]
    fn a_fleet_too_small_refuses_naming_the_prefill_pool() {
        let plan = ask(
            "llama-3.1-8b",
            "1x1xH100",
            &Reservations::none(),
            (8192, 1),
            1,
        );
        assert!(!plan.fits);
        assert!(plan.prefill.is_none() && plan.engine.is_none());
        assert!(
            plan.reasons.iter().any(
                |r| r == "prefill pool: no free devices left after the decode pool took 1 of 1"
            ),
            "{:?}",
            plan.reasons
        );
        assert!(
            plan.suggestions
                .iter()
                .any(|s| s.starts_with("drop --disaggregated")),
            "{:?}",
            plan.suggestions
        );
    }

    #[test]
    fn too_many_prefill_replicas_suggest_a_count_that_fits() {
        let plan = ask(
            "llama-3.1-8b",
            "1x2xH100",
            &Reservations::none(),
            (8192, 1),
            2,
        );
        assert!(!plan.fits);
        assert!(
            plan.reasons
                .iter()
                .any(|r| r.starts_with("prefill pool: 2 replica(s)")),
            "{:?}",
            plan.reasons
        );
        assert!(
            plan.suggestions
                .iter()
                .any(|s| s.starts_with("--prefill-replicas 1:")),
            "{:?}",
            plan.suggestions
        );
        // The suggestion is true.
        let fewer = ask(
            "llama-3.1-8b",
            "1x2xH100",
            &Reservations::none(),
            (8192, 1),
            1,
        );
        pools(&fewer);
    }

    #[test]
    fn each_pool_gets_its_role_arguments() {
        let plan = ask(
            "llama-3.1-8b",
            "1x8xH100+nvswitch",
            &Reservations::none(),
            (8192, 4),
            1,
        );
        let prefill = pools(&plan);
        let role = |p: &Plan| {
            let sglang = &p.engine.as_ref().unwrap().sglang;
            let at = sglang
                .iter()
                .position(|a| a == "--disaggregation-mode")
                .unwrap();
            sglang[at + 1].clone()
        };
        assert_eq!(role(&plan), "decode");
        assert_eq!(role(prefill), "prefill");
        for p in [&plan, prefill] {
            let vllm = &p.engine.as_ref().unwrap().vllm;
            let at = vllm
                .iter()
                .position(|a| a == "--kv-transfer-config")
                .unwrap();
            let config: serde_json::Value = serde_json::from_str(&vllm[at + 1]).unwrap();
            assert_eq!(config["kv_connector"], "NixlConnector");
        }
        assert!(prefill.throughput.is_none());
    }

    #[test]
    fn an_unknown_product_has_no_compute_figure() {
        assert_eq!(dense_tflops("Acme Widget 9000", 64.0), None);
        assert_eq!(dense_tflops("NVIDIA L40S", 48.0), Some(362.0));
    }
}
