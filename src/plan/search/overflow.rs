//! Arithmetic safety of the whole planning path: extreme numbers from a `config.json` (a
//! ModelPlacement's `huggingFaceConfig`), from the request (`--seq-len`, `--micro-batch`,
//! `--context`, `--lora-rank`...) and from an inventory (device memory) end in a clear error or
//! a refusal, never in a panic (debug) or a wrapped figure that fits (release).

use proptest::prelude::*;

use super::{Goal, PlanRequest, plan};
use crate::plan::inventory::{NodeSpec, Reservations};
use crate::plan::kv::KvDtype;
use crate::plan::memory::{ServingDevice, ServingTarget, activation_peak, serving_fit};
use crate::plan::model::config::{MAX_CONTEXT, MAX_DIM, parse_config_text};
use crate::plan::model::{
    Architecture, Attention, Model, ModelSource, Moe, NativeFormat, QuantScope, SlidingWindow,
    presets,
};
use crate::plan::report::Plan;
use crate::plan::shorthand::parse_hardware;
use crate::plan::training::activations::{Layers, Step, step_activations};
use crate::plan::training::{LoraTarget, Loss, Method, TrainingTarget};
use crate::plan::units::Bytes;
use crate::plan::weights::WeightBytes;

fn train(seq_len: u64, micro_batch: u64, method: Method, lora_rank: u64) -> PlanRequest {
    let mut request = PlanRequest::serve(None, 1);
    request.goal = Goal::Train(TrainingTarget {
        method,
        seq_len,
        micro_batch,
        gradient_checkpointing: false,
        lora_rank,
        lora_targets: LoraTarget::ALL.to_vec(),
        optimizer_states: crate::plan::training::OptimizerStates::Fp32,
        loss: Default::default(),
        adamw: Default::default(),
        kernels: Default::default(),
    });
    request
}

/// A plan that fits stays inside its budget with a total that did not saturate.
fn assert_sound(plan: &Plan) {
    if plan.fits {
        let memory = plan.per_device.expect("a fitting plan reports its memory");
        assert!(memory.total <= memory.budget, "{memory:?}");
        assert!(!memory.total.is_saturated(), "{memory:?}");
    }
}

#[test]
fn seq_len_times_micro_batch_beyond_64_bits_is_refused() {
    // u64::MAX x u64::MAX tokens times the layer width overflowed 128 bits: a panic in debug
    // builds, a wrapped (possibly small) activation figure in release.
    let model = presets::find("llama-3.2-1b").unwrap().unwrap();
    let nodes = parse_hardware("1x8xH100").unwrap();
    for (seq_len, micro_batch) in [
        (u64::MAX, u64::MAX),
        (u64::from(u32::MAX), u64::from(u32::MAX)),
        (u64::MAX, 1),
    ] {
        for method in [Method::Full, Method::Lora, Method::Qlora, Method::Dpo] {
            for loss in [Loss::Standard, Loss::Fused] {
                let mut request = train(seq_len, micro_batch, method, 16);
                if let Goal::Train(target) = &mut request.goal {
                    target.loss = loss;
                }
                let plan = plan(&model, &nodes, &Reservations::none(), &request).unwrap();
                assert!(!plan.fits, "{seq_len} x {micro_batch} {method:?} {loss}");
            }
        }
    }
    let frozen = Layers::Frozen {
        adapter_bytes_per_token: u64::MAX,
        fp32_residual: false,
        quantized_base: true,
        down_adapter: true,
    };
    let trained = Layers::Trained {
        fp32_residual: true,
    };
    for (fused_loss, liger_layers) in [(false, false), (true, false), (false, true), (true, true)] {
        for (layers, sharded_frozen_base) in [(trained, false), (frozen, false), (frozen, true)] {
            let step = Step {
                seq_len: u64::MAX,
                batch: u64::MAX,
                checkpointing: true,
                layers,
                embedding_gradient_bytes: 4,
                reference_model: true,
                fused_loss,
                liger_layers,
                sharded_frozen_base,
            };
            let peak = step_activations(&model, &step);
            assert!(
                peak.loss_phase.is_saturated(),
                "fused {fused_loss} {layers:?} sharded {sharded_frozen_base}"
            );
            assert!(
                peak.backward_phase.is_saturated(),
                "fused {fused_loss} {layers:?} sharded {sharded_frozen_base}"
            );
        }
    }
}

#[test]
fn an_absurd_lora_rank_is_refused() {
    let model = presets::find("llama-3.2-1b").unwrap().unwrap();
    let nodes = parse_hardware("1x8xH100").unwrap();
    let plan = plan(
        &model,
        &nodes,
        &Reservations::none(),
        &train(512, 1, Method::Lora, u64::MAX),
    )
    .unwrap();
    assert!(!plan.fits);
}

#[test]
fn config_fields_beyond_their_bounds_are_errors_naming_the_field() {
    let base = r#""num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100"#;
    let moe = r#""num_experts":8,"num_experts_per_tok":2,"moe_intermediate_size":64"#;
    let cases = [
        // Used to overflow `3 * intermediate` in the activation estimate (plan/memory.rs): a
        // debug panic while planning, a wrapped figure in release.
        (
            format!(
                r#"{{{base},"hidden_size":64,{moe},"shared_expert_intermediate_size":9000000000000000000}}"#
            ),
            "shared_expert_intermediate_size = 9000000000000000000 is out of range (0..=4194304)",
        ),
        (
            format!(r#"{{{base},"hidden_size":64,{moe},"n_shared_experts":4294967295}}"#),
            "n_shared_experts = 4294967295 is out of range (0..=65536)",
        ),
        (
            format!(r#"{{{base},"hidden_size":2147483648}}"#),
            "hidden_size = 2147483648 is out of range (1..=4194304)",
        ),
        (
            format!(
                r#"{{{base},"hidden_size":64,"num_experts":4294967295,"num_experts_per_tok":2,"moe_intermediate_size":64}}"#
            ),
            "num_experts = 4294967295 is out of range (1..=65536)",
        ),
        (
            format!(
                r#"{{{base},"hidden_size":64,"max_position_embeddings":18446744073709551615}}"#
            ),
            "max_position_embeddings = 18446744073709551615 is out of range (0..=4294967296)",
        ),
        (
            format!(r#"{{{base},"hidden_size":64,"sliding_window":18446744073709551615}}"#),
            "sliding_window = 18446744073709551615 is out of range",
        ),
        (
            format!(
                r#"{{{base},"hidden_size":64,"kv_lora_rank":512,"q_lora_rank":18446744073709551615,
                   "qk_nope_head_dim":128,"qk_rope_head_dim":64,"v_head_dim":128}}"#
            ),
            "q_lora_rank = 18446744073709551615 is out of range",
        ),
    ];
    for (text, expected) in cases {
        let err = parse_config_text("cfg.json", &text)
            .expect_err(expected)
            .to_string();
        assert!(err.contains(expected) && err.contains("cfg.json"), "{err}");
    }
    // The bounds themselves are accepted.
    let at_bounds = format!(
        r#"{{{base},"hidden_size":64,{moe},"shared_expert_intermediate_size":{MAX_DIM},"max_position_embeddings":{MAX_CONTEXT}}}"#
    );
    parse_config_text("cfg.json", &at_bounds).unwrap();
}

/// The largest value of every field, as only code (not a parser) can build.
fn extreme_architecture() -> Architecture {
    Architecture {
        model_type: "extreme".into(),
        layers: u32::MAX,
        hidden: u64::MAX,
        heads: u32::MAX,
        kv_heads: u32::MAX,
        head_dim: u64::MAX,
        intermediate: u64::MAX,
        vocab: u64::MAX,
        tied_embeddings: false,
        qkv_bias: true,
        attention: Attention::Standard,
        moe: Some(Moe {
            experts: u64::MAX,
            experts_per_token: u64::MAX,
            expert_intermediate: u64::MAX,
            shared_intermediate: u64::MAX,
            moe_layers: u32::MAX,
        }),
        sliding_window: Some(SlidingWindow {
            window: u64::MAX,
            layers: u32::MAX,
            chunked: false,
        }),
    }
}

#[test]
fn an_architecture_with_extreme_values_saturates_and_never_fits() {
    // Counting parameters overflowed 128 bits (`3 * h * I`) and the activation estimate 64.
    let native = NativeFormat {
        precision: crate::hardware::Precision::Bf16,
        scope: QuantScope::AllLinear,
    };
    let model = Model::new(
        "extreme",
        ModelSource::ParamCount,
        extreme_architecture(),
        native,
    );
    assert_eq!(model.params.total(), u64::MAX);
    assert!(activation_peak(&model, 1, 8192, 1024).is_saturated());
    let weights = WeightBytes::of(&model, crate::hardware::Precision::Bf16);
    let target = ServingTarget {
        context: u64::MAX,
        kv_dtype: KvDtype::Auto,
        gpu_util: 1.0,
        ..ServingTarget::default()
    };
    // Even a device claiming every byte there is does not fit a saturated total.
    let fit = serving_fit(
        &model,
        &weights,
        ServingDevice::new(crate::hardware::Vendor::Nvidia, Bytes(u64::MAX), "x")
            .with_fast_domain(u32::MAX),
        u32::MAX,
        u32::MAX,
        &target,
    );
    assert!(!fit.fits());
    let nodes = parse_hardware("2x8xH100").unwrap();
    for request in [
        PlanRequest::serve(Some(u64::MAX), u64::MAX),
        PlanRequest::serve(None, 1),
        train(u64::MAX, u64::MAX, Method::Qlora, u64::MAX),
    ] {
        let plan = plan(&model, &nodes, &Reservations::none(), &request).unwrap();
        assert!(!plan.fits);
    }
}

/// Numbers around the edges: mostly small real ones (so most configs parse and the extremes
/// reach the arithmetic), then the bounds, just past them, the type maxima.
fn number() -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => 1u64..4096,
        1 => Just(MAX_DIM),
        1 => Just(MAX_DIM + 1),
        1 => Just(u64::from(u32::MAX)),
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ]
}

/// A config built from `numbers` (layers, hidden, heads, intermediate, vocab, experts,
/// experts per token, shared size, window, max positions).
fn config_text(n: &[u64]) -> String {
    format!(
        r#"{{"num_hidden_layers":{},"hidden_size":{},"num_attention_heads":{},"intermediate_size":{},
           "vocab_size":{},"num_experts":{},"num_experts_per_tok":{},"moe_intermediate_size":{},
           "shared_expert_intermediate_size":{},"sliding_window":{},"max_position_embeddings":{}}}"#,
        n[0] % 200_000,
        n[1],
        n[2] % 100_000,
        n[3],
        n[4],
        n[5],
        n[6],
        n[3],
        n[7],
        n[8],
        n[9]
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// From config text, request numbers and device memory to a plan: no panic, and a plan
    /// that fits never rests on a saturated figure.
    #[test]
    fn planning_never_panics_on_large_numbers(
        numbers in prop::collection::vec(number(), 10),
        context in prop::option::of(number()),
        concurrency in number(),
        replicas in prop::option::of(prop_oneof![1u32..8, Just(u32::MAX)]),
        training in prop::option::of((number(), number(), number(), 0usize..4)),
        memory in prop_oneof![Just(None), Just(Some(u64::MAX)), any::<u64>().prop_map(Some)],
        checkpoint in prop::option::of(any::<u64>()),
    ) {
        let Ok(parsed) = parse_config_text("p", &config_text(&numbers)) else {
            return Ok(());
        };
        let mut model = Model::new("p", ModelSource::ParamCount, parsed.arch, parsed.native)
            .with_checkpoint_bytes(checkpoint.map(Bytes));
        model.max_context = parsed.max_context;
        let mut nodes: Vec<NodeSpec> = parse_hardware("2x4xH100+ib").unwrap();
        if let Some(memory) = memory {
            for device in nodes.iter_mut().flat_map(|n| n.devices.iter_mut()) {
                device.memory = Bytes(memory);
            }
        }
        let request = match training {
            Some((seq_len, micro_batch, rank, method)) => {
                let method = [Method::Full, Method::Lora, Method::Qlora, Method::Dpo][method];
                train(seq_len, micro_batch, method, rank)
            }
            None => {
                let mut request = PlanRequest::serve(context, concurrency);
                request.replicas = replicas;
                request
            }
        };
        if let Ok(plan) = plan(&model, &nodes, &Reservations::none(), &request) {
            assert_sound(&plan);
        }
    }
}
