//! The training search: the fewest data-parallel devices of one class, and the lowest ZeRO
//! stage, whose per-device memory fits; then the placement on the fewest nodes.

use super::PlanRequest;
use crate::hardware::Precision;
use crate::plan::capability::{PrecisionChoice, serving_support};
use crate::plan::model::Model;
use crate::plan::packing::{FreeDevices, Placement};
use crate::plan::report::{Plan, TrainingSummary};
use crate::plan::training::activations::SHARDED_CHECKPOINT_HALF_BYTES;
use crate::plan::training::{
    ALLOCATOR_RESERVE, ALLOCATOR_RESERVE_BYTES_PER_LOGIT, ALLOCATOR_RESERVE_FUSED_ACTIVATIONS,
    ALLOCATOR_RESERVE_SHARDED_WAITING, ALLOCATOR_RESERVE_TRAINED_BYTES_PER_LOGIT,
    ALLOCATOR_RESERVE_TRAINED_STATES_SHARE, Loss, Method, OptimizerStates, TrainingMemory,
    TrainingTarget, ZeroStage, expert_adapter_note, qlora_expert_bytes, qlora_unquantized_experts,
    shards_weights, training_memory,
};
use crate::plan::units::Bytes;

/// QLoRA is traced (bitsandbytes' NF4 ops on fake tensors, as TRL prepares a 4-bit model) but
/// measured on no GPU, and a published run of a 70B model reached shorter sequences than the
/// plan allows (docs/planner.md, "Published GPU figures"). The plan says so.
const QLORA_UNCHECKED: &str = "qlora: planned as TRL prepares a 4-bit model (FP32 norms and adapters, an FP32 residual stream, 16-bit under Liger's norms), traced on 6 cases, measured on none; for a 70B model on an 80 GB GPU this plan allows about 8,700 tokens where a model of PyTorch's caching allocator runs out near 7,900 and a published Hugging Face run stopped at 6,916, so treat a long-sequence QLoRA plan of a large model as optimistic (docs/planner.md, \"Published GPU figures\")";

/// ZeRO stages, cheapest communication first.
const STAGES: [ZeroStage; 4] = [0, 1, 2, 3];

/// A fitting (devices, stage) on one class.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    class: usize,
    precision: Precision,
    memory: TrainingMemory,
}

/// The precisions a method trains in: an NF4 base for QLoRA, mixed BF16/FP16 otherwise.
fn method_precisions(
    method: Method,
    choice: PrecisionChoice,
) -> Result<&'static [Precision], String> {
    match (method, choice) {
        (Method::Qlora, PrecisionChoice::Auto | PrecisionChoice::Nf4) => Ok(&[Precision::Nf4]),
        (Method::Qlora, _) => {
            Err("--train qlora trains on an NF4 base: use --precision nf4 or auto".to_string())
        }
        (_, PrecisionChoice::Auto) => Ok(&[Precision::Bf16, Precision::Fp16]),
        (_, PrecisionChoice::Bf16) => Ok(&[Precision::Bf16]),
        (_, PrecisionChoice::Fp16) => Ok(&[Precision::Fp16]),
        (_, _) => Err(format!(
            "--train {} trains in mixed precision: use --precision bf16, fp16 or auto",
            format!("{method:?}").to_lowercase()
        )),
    }
}

/// Rejects a precision the method cannot train in at all (bad input, not a misfit).
pub(super) fn check_precision(method: Method, choice: PrecisionChoice) -> Result<(), String> {
    method_precisions(method, choice).map(|_| ())
}

/// The precision the method trains in on a device, or why it cannot.
fn training_precision(
    model: &Model,
    fleet: &FreeDevices<'_>,
    class: usize,
    method: Method,
    choice: PrecisionChoice,
) -> Result<Precision, String> {
    let device = fleet.classes[class].sample;
    let mut last_error = String::new();
    for precision in method_precisions(method, choice)? {
        match serving_support(model, device, *precision) {
            Ok(_) => return Ok(*precision),
            Err(why) => last_error = why,
        }
    }
    Err(last_error)
}

/// The fewest devices (then the lowest stage) that fit on one class.
fn cheapest(
    model: &Model,
    target: &TrainingTarget,
    device: (Bytes, f64),
    free: u32,
) -> Option<TrainingMemory> {
    let fits = |devices: u32, stage: ZeroStage| {
        let memory = training_memory(model, target, devices, stage, device);
        memory.device.within_budget().then_some(memory)
    };
    let mut best: Option<TrainingMemory> = None;
    for stage in STAGES {
        // A single device has nothing to shard: only stage 0 applies.
        let found = if stage == 0 {
            fits(1, 0)
        } else if free >= 2 && fits(free, stage).is_some() {
            // Memory per device only shrinks as devices are added: binary search the fewest.
            let (mut too_few, mut enough) = (1u32, free);
            while enough - too_few > 1 {
                let mid = too_few + (enough - too_few) / 2;
                if fits(mid, stage).is_some() {
                    enough = mid
                } else {
                    too_few = mid
                }
            }
            fits(enough, stage)
        } else {
            None
        };
        if let Some(memory) = found
            && best.is_none_or(|b| memory.devices < b.devices)
        {
            best = Some(memory);
        }
    }
    best
}

/// Plans fine-tuning and explains it.
pub(super) fn plan(
    model: &Model,
    fleet: &FreeDevices<'_>,
    request: &PlanRequest,
    target: &TrainingTarget,
) -> Plan {
    let mut plan = Plan::new("train", model);
    plan.reasons.extend(model.notes.iter().cloned());
    plan.reasons
        .push(target.optimizer_states.describe().to_string());
    plan.reasons.push(target.loss.describe().to_string());
    plan.reasons
        .push(target.adamw.describe(target.optimizer_states).to_string());
    plan.reasons
        .push(target.kernels.describe(&model.arch.model_type));
    plan.reasons.extend(qlora_experts_note(model, target));
    let mut candidates = Vec::new();
    for (index, class) in fleet.classes.iter().enumerate() {
        match training_precision(model, fleet, index, target.method, request.precision) {
            Ok(precision) => {
                if let Some(memory) = cheapest(
                    model,
                    target,
                    (class.sample.runtime_memory(), request.gpu_util),
                    class.free,
                ) {
                    candidates.push(Candidate {
                        class: index,
                        precision,
                        memory,
                    });
                }
            }
            Err(why) => plan
                .reasons
                .push(format!("{}: {why}", class.sample.product)),
        }
    }
    candidates.sort_by_key(|c| (c.memory.devices, c.memory.zero_stage, c.class));
    let placed = candidates.iter().find_map(|c| {
        fleet
            .place_devices(c.class, c.memory.devices, request.max_nodes)
            .map(|p| (*c, p))
    });
    match placed {
        Some((candidate, placement)) => {
            describe(&mut plan, model, fleet, target, candidate, placement);
        }
        None => refuse(&mut plan, model, fleet, request, target),
    }
    plan
}

fn summary(target: &TrainingTarget, memory: &TrainingMemory) -> TrainingSummary {
    TrainingSummary {
        method: target.method,
        trainable_params: memory.trainable_params,
        zero_stage: memory.zero_stage,
        seq_len: target.seq_len,
        micro_batch: target.micro_batch,
        gradient_checkpointing: target.gradient_checkpointing,
        optimizer_states: target.optimizer_states,
        loss: target.loss,
        adamw: target.adamw,
        kernels: target.kernels,
        weights: memory.weights,
        gradients: memory.gradients,
        optimizer: memory.optimizer,
    }
}

fn describe(
    plan: &mut Plan,
    model: &Model,
    fleet: &FreeDevices<'_>,
    target: &TrainingTarget,
    c: Candidate,
    placement: Placement,
) {
    let m = c.memory;
    plan.fits = true;
    plan.precision = Some(c.precision);
    plan.device = Some(fleet.classes[c.class].sample.product.clone());
    plan.tp = Some(1);
    plan.pp = Some(1);
    plan.replicas = Some(m.devices);
    plan.devices = Some(m.devices);
    plan.nodes = Some(placement.nodes);
    plan.per_device = Some(m.device);
    plan.assignments = placement.assignments;
    plan.training = Some(summary(target, &m));
    plan.reasons.push(format!(
        "{:?}: {:.2}B trainable parameters; per device weights {}, gradients {}, optimizer {} (ZeRO-{} over {} device(s))",
        target.method, m.trainable_params as f64 / 1e9, m.weights, m.gradients, m.optimizer, m.zero_stage, m.devices
    ));
    plan.reasons.push(format!(
        "activations {} for {} x {} tokens{}; overhead {}; total {} of a {} budget",
        m.activations,
        target.micro_batch,
        target.seq_len,
        if target.gradient_checkpointing {
            " with gradient checkpointing"
        } else {
            " without gradient checkpointing"
        },
        m.overhead,
        m.device.total,
        m.device.budget
    ));
    plan.reasons.push(peak_moment(&m));
    plan.reasons.extend(expert_adapter_note(model, target));
    if target.method == Method::Qlora {
        plan.reasons.push(QLORA_UNCHECKED.to_string());
    }
    let (reserve_shape, checked_on) = match target.loss {
        Loss::Standard => (
            format!(
                "{ALLOCATOR_RESERVE} + {ALLOCATOR_RESERVE_BYTES_PER_LOGIT} bytes per logit (a full fine-tune with BF16 states up to {ALLOCATOR_RESERVE_TRAINED_BYTES_PER_LOGIT} more, at most {:.0} % of its optimizer states)",
                ALLOCATOR_RESERVE_TRAINED_STATES_SHARE * 100.0
            ),
            "within -8.0 to +9.2 % of what a model of PyTorch's caching allocator needs on 59 traced steps",
        ),
        Loss::Fused => (
            format!(
                "{ALLOCATOR_RESERVE} + {ALLOCATOR_RESERVE_BYTES_PER_LOGIT} bytes per logit of one chunk + {:.0} % of the activations",
                ALLOCATOR_RESERVE_FUSED_ACTIVATIONS * 100.0
            ),
            "fitted on 14 traced steps with a fused loss, within -7.7 to +8.8 % of what a model of PyTorch's caching allocator needs there",
        ),
    };
    plan.reasons.push(format!(
        "margin for the caching allocator beyond the step's allocations: {reserve_shape}, met by the {} of the device outside the budget{} ({checked_on}; GPU measurements still to confirm it, docs/planner.md)",
        m.device.capacity.saturating_sub(m.device.budget),
        if m.allocator_reserve > Bytes::ZERO {
            format!(" and {} more in the overhead", m.allocator_reserve)
        } else {
            String::new()
        }
    ));
    if let Some(note) = sharded_note(target, &m) {
        plan.reasons.push(note);
    }
    if placement.nodes > 1 && !placement.pipeline_on_fabric {
        plan.reasons.push(
            "data-parallel devices span nodes without a shared InfiniBand fabric".to_string(),
        );
    }
}

/// What a ZeRO-3 (FSDP `FULL_SHARD`) plan adds for its sharding, which only published
/// two-GPU runs have checked.
fn sharded_note(target: &TrainingTarget, m: &TrainingMemory) -> Option<String> {
    shards_weights(m.devices, m.zero_stage).then(|| {
        let frozen = if matches!(target.method, Method::Lora | Method::Qlora) {
            format!(
                "the frozen base's checkpointed layer inputs counted at {} bytes per hidden unit (2 on one device) and ",
                SHARDED_CHECKPOINT_HALF_BYTES as f64 / 2.0
            )
        } else {
            String::new()
        };
        format!(
            "zero-3: each layer gathered as stored, two at a time; {frozen}a caching-allocator reserve of {:.0} % of the checkpointed (or saved) activations, which the gathers on their own stream split, both fitted on fms-acceleration's two-GPU FSDP runs of Mistral 7B, Mixtral 8x7B and Llama 2 70B (docs/planner.md, \"Two GPUs under FSDP\"); no GPU of ours has run a sharded plan yet",
            ALLOCATOR_RESERVE_SHARDED_WAITING * 100.0
        )
    })
}

/// What a QLoRA plan of an MoE assumed about its routed experts, which a 4-bit load leaves
/// unquantized on transformers 5; a refused plan needs it most.
fn qlora_experts_note(model: &Model, target: &TrainingTarget) -> Option<String> {
    let experts = qlora_unquantized_experts(model);
    (target.method == Method::Qlora && experts > 0).then(|| {
        format!(
            "qlora on {}: its {:.1}B routed-expert parameters stay unquantized (transformers 5 keeps them as 3-D parameters, which bitsandbytes does not quantize) and PEFT's preparation makes them {}; transformers 4, whose experts were linear layers, quantized them. FP32 experts need experts_implementation=\"eager\" (transformers 5.24's default grouped matmul takes BF16 only)",
            model.arch.model_type,
            experts as f64 / 1e9,
            if qlora_expert_bytes(target.optimizer_states) == 2 {
                "16-bit (BF16 states)"
            } else {
                "FP32"
            }
        )
    })
}

/// When the step peaks, in words: the activations figure is the larger of the two moments
/// (`plan::training::activations`), and a user reading "activations 0.4 GiB" beside 3 GiB of
/// logits should see why.
fn peak_moment(m: &TrainingMemory) -> String {
    let peak = m.activation_peak;
    let loss_phase = peak.loss_phase.saturating_sub(m.gradients);
    let passes = loss_phase.max(peak.backward_phase);
    if m.optimizer_step > passes {
        format!(
            "the step peaks in the optimizer step: every gradient and state plus the foreach AdamW's copy of the moments ({}), more than the forward and backward passes hold ({})",
            m.optimizer_step, passes
        )
    } else if loss_phase >= peak.backward_phase {
        format!(
            "the step peaks when the backward pass starts: saved activations and the loss's logits {}, before the gradients ({}) exist",
            peak.loss_phase, m.gradients
        )
    } else {
        format!(
            "the step peaks while layers are differentiated: the gradients (up to {}) plus a layer's working set and the saved or checkpointed activations waiting (or, at the end, the embedding's gradient) {}",
            m.gradients, peak.backward_phase
        )
    }
}

fn refuse(
    plan: &mut Plan,
    model: &Model,
    fleet: &FreeDevices<'_>,
    request: &PlanRequest,
    target: &TrainingTarget,
) {
    let fleet: &FreeDevices<'_> = &super::refusal::explained(plan, fleet);
    let mut closest = None;
    for (index, class) in fleet.classes.iter().enumerate() {
        if training_precision(model, fleet, index, target.method, request.precision).is_err() {
            continue;
        }
        let device = (class.sample.runtime_memory(), request.gpu_util);
        // As the search does: one device has nothing to shard, so only stage 0 applies (a
        // ZeRO-3 figure there would count 16-bit compute that one device does not run).
        let all = if class.free >= 2 {
            let all = training_memory(model, target, class.free, 3, device);
            plan.reasons.push(format!(
                "{} x{}: even ZeRO-3 over all {} devices needs {} per device (budget {})",
                class.sample.product, class.free, class.free, all.device.total, all.device.budget
            ));
            all
        } else {
            let one = training_memory(model, target, 1, 0, device);
            plan.reasons.push(format!(
                "{} x1: one device, nothing to shard, needs {} (budget {})",
                class.sample.product, one.device.total, one.device.budget
            ));
            one
        };
        if closest.is_none_or(|(m, _): (TrainingMemory, u32)| all.device.total < m.device.total) {
            closest = Some((all, index as u32));
        }
        // The fewest devices of this class that would do, ignoring what is free.
        if let Some(needed) = cheapest(model, target, device, 1 << 16) {
            let per_node = class.largest_node.max(1);
            plan.suggestions.push(format!(
                "{} x {} at ZeRO-{} would fit: {} node(s) like {}",
                needed.devices,
                class.sample.product,
                needed.zero_stage,
                needed.devices.div_ceil(per_node),
                class.template_node
            ));
        }
    }
    plan.per_device = closest.map(|(m, _)| m.device);
    if matches!(target.method, Method::Full | Method::Dpo)
        && target.optimizer_states == OptimizerStates::Fp32
    {
        plan.suggestions.push(
            "--optimizer-states bf16 keeps 8 bytes per parameter instead of 16 (8bit: 10)"
                .to_string(),
        );
    }
    if matches!(target.method, Method::Full | Method::Dpo | Method::Lora) {
        plan.suggestions.push(
            "--train qlora keeps the frozen base in NF4 (about a quarter of 16-bit memory)"
                .to_string(),
        );
    }
    if target.loss == Loss::Standard {
        // What the whole logits cost, so the suggestion says what it would save.
        let logits = Bytes(
            target
                .seq_len
                .saturating_mul(target.micro_batch)
                .saturating_mul(model.arch.vocab)
                .saturating_mul(12),
        );
        plan.suggestions.push(format!(
            "--loss fused (a fused linear cross-entropy such as Liger Kernel's, `use_liger_kernel=True`) never makes the whole logits: about {logits} less per device"
        ));
    }
    if target.seq_len > 512 {
        plan.suggestions.push(format!(
            "a shorter --seq-len than {} cuts activation memory",
            target.seq_len
        ));
    }
}
