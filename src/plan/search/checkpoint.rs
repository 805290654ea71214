//! The search with a given checkpoint size (issue 27 item 5): the size counts at every
//! precision the search tries, so a plan never fits on fewer devices than the checkpoint
//! needs. These are the cases that were planned on too few devices before.

use crate::hardware::Precision;
use crate::plan::inventory::Reservations;
use crate::plan::model::presets;
use crate::plan::report::Plan;
use crate::plan::shorthand::parse_hardware;
use crate::plan::units::Bytes;
use crate::plan::weights::WeightBytes;

use super::{PlanRequest, plan};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn with_checkpoint(key: &str, gb: u64) -> crate::plan::Model {
    presets::find(key)
        .expect("presets load")
        .expect("preset exists")
        .with_checkpoint_bytes(Some(Bytes(gb * 1_000_000_000)))
}

fn plan_on(model: &crate::plan::Model, hardware: &str, request: &PlanRequest) -> Plan {
    let nodes = parse_hardware(hardware).expect("fleet shorthand");
    plan(model, &nodes, &Reservations::none(), request).expect("plannable input")
}

/// The plan's weights over all its devices hold at least the checkpoint-sized weights at its
/// precision.
fn holds_the_checkpoint(model: &crate::plan::Model, result: &Plan) {
    assert!(result.fits, "{:?}", result.reasons);
    let precision = result.precision.expect("a fitting plan has a precision");
    let shards = f64::from(result.tp.unwrap_or(1) * result.pp.unwrap_or(1));
    let per_device = result
        .per_device
        .expect("per-device memory")
        .weights
        .as_f64();
    let whole = WeightBytes::of(model, precision).total().as_f64();
    assert!(
        per_device * shards >= whole * 0.999,
        "{precision}: {per_device} x {shards} < {whole}"
    );
}

#[test]
fn a_70b_model_with_a_180_gb_checkpoint_needs_84_gib_per_h100_at_16_bits() {
    let model = with_checkpoint("llama-3.1-70b", 180);
    for precision in [Precision::Bf16, Precision::Fp16] {
        let request = PlanRequest::serve(Some(4096), 1).with_precision(precision);
        let result = plan_on(&model, "1x2xH100", &request);
        assert!(!result.fits, "{precision} fitted 180 GB on 2 x H100");
        let per_device = WeightBytes::of(&model, precision).per_device(&model, 2, 1);
        assert!(
            per_device.as_f64() / GIB > 83.7,
            "{precision}: {per_device} per device"
        );
    }
    // Automatic precision may still use two H100s, but only by narrowing the weights, never by
    // calling FP16 smaller than BF16.
    let auto = plan_on(&model, "1x2xH100", &PlanRequest::serve(Some(4096), 1));
    if auto.fits {
        assert!(
            !matches!(auto.precision, Some(Precision::Bf16 | Precision::Fp16)),
            "{:?}",
            auto.precision
        );
        holds_the_checkpoint(&model, &auto);
    }
    let wide = plan_on(&model, "1x8xH100", &PlanRequest::serve(Some(4096), 1));
    assert_eq!(wide.precision, Some(Precision::Bf16));
    assert!(wide.devices.unwrap_or(0) >= 4, "{:?}", wide.devices);
    holds_the_checkpoint(&model, &wide);
}

#[test]
fn an_8b_model_with_a_200_or_500_gb_checkpoint_is_not_planned_on_one_device() {
    for (gb, at_least) in [(200, 3), (500, 7)] {
        let model = with_checkpoint("llama-3.1-8b", gb);
        for precision in [Precision::Bf16, Precision::Fp16] {
            let request = PlanRequest::serve(Some(4096), 1).with_precision(precision);
            let result = plan_on(&model, "1x8xH100", &request);
            holds_the_checkpoint(&model, &result);
            assert!(
                result.devices.unwrap_or(0) >= at_least,
                "{gb} GB in {precision} on {:?} devices",
                result.devices
            );
        }
        let auto = plan_on(&model, "1x8xH100", &PlanRequest::serve(Some(4096), 1));
        holds_the_checkpoint(&model, &auto);
        assert!(auto.devices.unwrap_or(0) > 1, "{gb} GB on one device");
    }
}

#[test]
fn bf16_and_fp16_weigh_the_same_and_never_less_than_computed() {
    let model = with_checkpoint("llama-3.1-70b", 180);
    let bf16 = WeightBytes::of(&model, Precision::Bf16);
    assert_eq!(bf16, WeightBytes::of(&model, Precision::Fp16));
    assert_eq!(bf16.total().0 / 1_000_000_000, 180);
    // Narrower precisions keep the checkpoint's share of what the architecture undercounts.
    let fp8 = WeightBytes::of(&model, Precision::Fp8).total().as_f64();
    let computed_fp8 = WeightBytes::computed(&model, Precision::Fp8)
        .total()
        .as_f64();
    assert!(fp8 > computed_fp8 * 1.2, "{fp8} vs {computed_fp8}");
    // A checkpoint smaller than the computed weights is no licence to plan on less.
    let small = with_checkpoint("llama-3.1-70b", 1);
    for precision in [Precision::Bf16, Precision::Fp8, Precision::Int4] {
        assert_eq!(
            WeightBytes::of(&small, precision),
            WeightBytes::computed(&small, precision)
        );
    }
}
