//! Which parallel layouts are valid for a model, independent of memory, and which of them
//! people deploy.
//!
//! * TP must divide the attention heads (`vllm/config/model.py`,
//!   `verify_with_parallel_config`: "Total number of attention heads ... must be divisible by
//!   tensor parallel size"), and either divide the KV heads or be a multiple of them, in
//!   which case each KV head is replicated (`vllm/model_executor/models/llama.py`,
//!   `LlamaAttention.__init__`). Qwen2-7B (28 heads, 4 KV heads) allows TP 1, 2, 4 and 28.
//! * TP stays within one NVLink-class domain: a node, or a multi-node NVLink domain (GB200
//!   NVL72) where the inventory has one.
//! * PP splits the layers, so it is at most the layer count; stages get vLLM's split
//!   ([`crate::plan::layout::stage_layers`]).
//! * [`PipelineRule`]: a replica that spans nodes fills them (TP x PP = nodes x devices per
//!   node, the multi-node rule of vLLM's `parallelism_scaling.md` and TensorRT-LLM's sharding
//!   guide) and spans a node count people deploy: a power of two or a divisor of the fleet's
//!   nodes, so replicas tile the fleet (Llama-3.1-405B TP 8 x PP 2 on 2 x 8 H100, Kimi-K2
//!   TP 8 x PP 2 on 16 H800 — `vllm-project/recipes`).
//! * [`moe_variants`]: expert parallelism and data-parallel attention for MoE models, in the
//!   order the recipes use them, and the block-quantisation rule that rules TP-sliced experts
//!   out (`vllm-project/recipes` `Qwen/Qwen3-Coder-480B-A35B.md`: "The output_size of gate's
//!   and up's weight = 320 is not divisible by weight quantization block_n = 128", so the FP8
//!   checkpoint runs `--data-parallel-size 8 --enable-expert-parallel`).

use crate::hardware::Precision;
use crate::plan::kv::KvLayout;
use crate::plan::layout::Sharding;
use crate::plan::memory::{ServingDevice, ServingFit, ServingTarget, serving_fit};
use crate::plan::model::Attention;
use crate::plan::model::Model;
use crate::plan::units::Bytes;
use crate::plan::weights::WeightBytes;

/// Tensor-parallel sizes valid for `model` with at most `max_tp` devices per group, ascending.
pub fn valid_tensor_parallel_sizes(model: &Model, max_tp: u32) -> Vec<u32> {
    let heads = model.arch.heads.max(1);
    let kv_heads = model.arch.kv_heads.max(1);
    (1..=max_tp.min(heads))
        .filter(|&tp| {
            heads.is_multiple_of(tp) && (kv_heads.is_multiple_of(tp) || tp.is_multiple_of(kv_heads))
        })
        .collect()
}

/// Pipeline sizes valid for `model` with at most `max_devices` devices in total at `tp`.
pub fn valid_pipeline_sizes(
    model: &Model,
    tp: u32,
    max_devices: u32,
) -> std::ops::RangeInclusive<u32> {
    1..=model.arch.layers.min(max_devices / tp.max(1))
}

/// Width of the weight blocks of block-quantised FP8 checkpoints (`weight_block_size`
/// `[128, 128]` in DeepSeek-V3's, Kimi-K2's and Qwen3's FP8 releases; DeepSeek-V3
/// `README_WEIGHTS.md`).
const FP8_BLOCK: u64 = 128;

/// How strictly the search holds pipelines to the shapes people deploy; tried in order, the
/// first that yields a layout wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PipelineRule {
    /// A replica that spans nodes fills whole nodes and spans a deployable node count; where
    /// TP groups fit an NVLink-class domain, TP fills it and PP spans nodes.
    Deployable,
    /// Whole nodes, any node count.
    WholeNodes,
    /// Only the domain rule (TP fills the domain, PP spans nodes).
    Domain,
    /// Any split (vLLM's "edge case": TP 1, PP = devices, or stages inside one node).
    Any,
}

impl PipelineRule {
    /// Every rule, strictest first.
    pub const ALL: [Self; 4] = [Self::Deployable, Self::WholeNodes, Self::Domain, Self::Any];
}

/// What the pipeline rules need to know about a device class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassShape {
    /// Most free devices of the class on one node.
    pub node_devices: u32,
    /// Nodes with free devices of the class.
    pub nodes: u32,
    /// The widest valid TP that fits one NVLink-class domain, if the class has such domains.
    pub domain_tp: Option<u32>,
}

/// True when a node count is one people deploy a replica on: a power of two, or a divisor of
/// the fleet's node count (replicas then tile the fleet).
pub fn deployable_node_count(count: u32, fleet_nodes: u32) -> bool {
    count.is_power_of_two() || (count > 0 && fleet_nodes.is_multiple_of(count))
}

/// True when `tp` x `pp` is allowed under `rule` on a class shaped like `shape`.
pub fn pipeline_allowed(rule: PipelineRule, shape: &ClassShape, tp: u32, pp: u32) -> bool {
    let devices = tp.saturating_mul(pp);
    let node = shape.node_devices.max(1);
    let spans_nodes = devices > node;
    let domain_ok = match shape.domain_tp {
        Some(full) if rule <= PipelineRule::Domain => pp == 1 || (tp == full && spans_nodes),
        _ => true,
    };
    if !domain_ok {
        return false;
    }
    if !spans_nodes || rule >= PipelineRule::Domain {
        return true;
    }
    let whole = devices.is_multiple_of(node);
    match rule {
        PipelineRule::Deployable => whole && deployable_node_count(devices / node, shape.nodes),
        _ => whole,
    }
}

/// The MoE layouts worth trying for a group of `tp` devices at `precision`, in the order the
/// recipes prefer them. Dense models and single devices have one: plain TP.
///
/// * MLA models (DeepSeek-V3/R1, Kimi-K2): data-parallel attention with expert parallelism
///   first (SGLang `--tp 8 --enable-dp-attention`, vLLM `DP8 + EP`; the latent is otherwise
///   copied to every TP rank), then plain TP (Kimi-K2's `TP8 x PP2` recipe).
/// * Other MoE models (Qwen3-MoE, Mixtral, gpt-oss): plain TP first (gpt-oss and the BF16
///   Qwen3-Coder recipes), then data-parallel attention with expert parallelism.
/// * Plain TP slices every expert `tp` ways, so it is left out where block-quantised experts
///   cannot be sliced that finely — data-parallel attention with expert parallelism is then
///   the recipe (Qwen3-Coder-480B FP8: `--data-parallel-size 8 --enable-expert-parallel`).
/// * Data-parallel attention is for single-stage replicas only: no recipe combines it with
///   pipeline stages.
pub fn moe_variants(model: &Model, precision: Precision, tp: u32, pp: u32) -> Vec<Sharding> {
    let plain = Sharding::new(tp, pp);
    let Some(moe) = model.arch.moe.filter(|m| m.experts > 1) else {
        return vec![plain];
    };
    if tp <= 1 {
        return vec![plain];
    }
    let slices = experts_slice(model, precision, moe.expert_intermediate, tp);
    let dp_ep = (pp == 1).then(|| plain.with_moe(tp, true));
    let plain = slices.then_some(plain);
    match model.arch.attention {
        Attention::Mla(_) => dp_ep.into_iter().chain(plain).collect(),
        Attention::Standard => plain.into_iter().chain(dp_ep).collect(),
    }
}

/// True when each of `tp` ranks can hold a slice of every expert: the slice must be whole and,
/// for a block-quantised FP8 checkpoint, a multiple of the block (vLLM `fp8.py`
/// `create_weights`).
fn experts_slice(model: &Model, precision: Precision, intermediate: u64, tp: u32) -> bool {
    let tp = u64::from(tp.max(1));
    if !intermediate.is_multiple_of(tp) {
        return false;
    }
    let block_quantised = precision == Precision::Fp8 && model.native.precision == Precision::Fp8;
    !block_quantised || (intermediate / tp).is_multiple_of(FP8_BLOCK)
}

/// The memory of one replica laid out as `sharding`: [`serving_fit`] for the plain TP x PP
/// layout, with the weights and the KV cache replaced by `sharding`'s and the capacity counted
/// over every attention rank. Everything else (activations, overhead, budget) is taken as the
/// memory model computes it, so a change there carries over.
pub fn sharded_fit(
    model: &Model,
    weights: &WeightBytes,
    device: ServingDevice<'_>,
    sharding: &Sharding,
    target: &ServingTarget,
) -> ServingFit {
    let base = serving_fit(model, weights, device, sharding.tp, sharding.pp, target);
    if sharding.is_plain() {
        return base;
    }
    let memory = base.memory;
    let weights_here = weights.per_device_sharded(model, sharding);
    let plain_kv = KvLayout::new(model, target.kv_dtype, sharding.tp, sharding.pp);
    let sharded_kv = KvLayout::sharded(model, target.kv_dtype, sharding);
    let ratio = sharded_kv.bytes_per_token_layer() / plain_kv.bytes_per_token_layer().max(1e-9);
    let per_request = Bytes::from_f64(base.per_request.as_f64() * ratio);
    let non_kv = memory
        .total
        .saturating_sub(memory.kv_cache)
        .saturating_sub(memory.weights)
        + weights_here;
    let kv_free = memory.budget.saturating_sub(non_kv);
    let max_concurrency = kv_free
        .0
        .checked_div(per_request.0)
        .unwrap_or(0)
        .saturating_mul(u64::from(sharding.attention_dp.max(1)));
    let memory = crate::plan::memory::DeviceMemory {
        weights: weights_here,
        kv_cache: per_request,
        total: non_kv + per_request,
        ..memory
    };
    // Each attention rank keeps its own requests' cache: whole blocks per rank, all ranks.
    let block = sharded_kv
        .bytes_per_token()
        .0
        .saturating_mul(crate::plan::kv::BLOCK_TOKENS);
    let kv_tokens = kv_free
        .0
        .checked_div(block)
        .unwrap_or(0)
        .saturating_mul(crate::plan::kv::BLOCK_TOKENS)
        .saturating_mul(u64::from(sharding.attention_dp.max(1)));
    ServingFit {
        memory,
        kv_free,
        per_request,
        max_concurrency,
        kv_tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::model::presets;

    #[test]
    fn qwen2_7b_allows_tp_1_2_4_28() {
        // model-configs.json notes: 28 heads / 4 KV heads => valid TP {1,2,4,28}.
        let model = presets::find("qwen2-7b").unwrap().unwrap();
        assert_eq!(valid_tensor_parallel_sizes(&model, 64), [1, 2, 4, 28]);
    }

    #[test]
    fn llama_8b_has_no_tp3() {
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        assert_eq!(valid_tensor_parallel_sizes(&model, 8), [1, 2, 4, 8]);
        assert_eq!(valid_pipeline_sizes(&model, 8, 24), 1..=3);
    }

    #[test]
    fn multi_node_pipelines_fill_whole_nodes_of_a_deployable_count() {
        let nvswitch = ClassShape {
            node_devices: 8,
            nodes: 16,
            domain_tp: Some(8),
        };
        let strict = PipelineRule::Deployable;
        // TP 8 x PP k spans k nodes: powers of two and divisors of 16 only.
        assert!(pipeline_allowed(strict, &nvswitch, 8, 2));
        assert!(pipeline_allowed(strict, &nvswitch, 8, 4));
        assert!(!pipeline_allowed(strict, &nvswitch, 8, 3));
        assert!(!pipeline_allowed(strict, &nvswitch, 8, 7));
        assert!(pipeline_allowed(PipelineRule::WholeNodes, &nvswitch, 8, 7));
        // Inside a node with NVSwitch: no pipeline unless nothing else fits.
        assert!(!pipeline_allowed(strict, &nvswitch, 4, 2));
        assert!(pipeline_allowed(PipelineRule::Any, &nvswitch, 4, 2));
        // PCIe nodes: stages may share a node, but a multi-node replica fills its nodes.
        let pcie = ClassShape {
            node_devices: 8,
            nodes: 3,
            domain_tp: None,
        };
        assert!(pipeline_allowed(strict, &pcie, 2, 3));
        assert!(
            !pipeline_allowed(strict, &pcie, 4, 5),
            "20 devices leave 4 idle"
        );
        assert!(
            pipeline_allowed(strict, &pcie, 4, 6),
            "3 nodes divide the fleet of 3"
        );
        assert!(pipeline_allowed(PipelineRule::Domain, &pcie, 4, 5));
        assert!(deployable_node_count(3, 12) && !deployable_node_count(3, 16));
    }

    #[test]
    fn moe_variants_follow_the_recipes() {
        let dense = presets::find("llama-3.1-70b").unwrap().unwrap();
        assert_eq!(
            moe_variants(&dense, Precision::Bf16, 8, 1),
            [Sharding::new(8, 1)]
        );
        let deepseek = presets::find("deepseek-v3").unwrap().unwrap();
        let variants = moe_variants(&deepseek, Precision::Fp8, 8, 1);
        assert_eq!(
            (variants[0].attention_dp, variants[0].expert_parallel),
            (8, true)
        );
        assert!(variants[1].is_plain());
        assert_eq!(
            moe_variants(&deepseek, Precision::Fp8, 8, 2),
            [Sharding::new(8, 2)]
        );
        let qwen = presets::find("qwen3-235b-a22b").unwrap().unwrap();
        assert!(moe_variants(&qwen, Precision::Bf16, 8, 1)[0].is_plain());
        // A native block-FP8 checkpoint cannot slice 1536-wide experts 8 ways (192 % 128).
        let mut fp8 = qwen.clone();
        fp8.native.precision = Precision::Fp8;
        let only = moe_variants(&fp8, Precision::Fp8, 8, 1);
        assert_eq!(only.len(), 1);
        assert_eq!((only[0].attention_dp, only[0].expert_parallel), (8, true));
        assert!(
            moe_variants(&fp8, Precision::Fp8, 4, 1)[0].is_plain(),
            "384 = 3 x 128"
        );
    }

    #[test]
    fn dp_attention_multiplies_mla_capacity() {
        use crate::plan::kv::KvDtype;
        let model = presets::find("deepseek-v3").unwrap().unwrap();
        let weights = WeightBytes::of(&model, Precision::Fp8);
        let target = ServingTarget::new(32_768, KvDtype::Auto, 0.9);
        let device = ServingDevice::new(
            crate::hardware::Vendor::Nvidia,
            Bytes(143_771 * crate::hardware::MIB),
            "NVIDIA H200",
        )
        .with_fast_domain(8);
        let plain = sharded_fit(&model, &weights, device, &Sharding::new(8, 1), &target);
        let dp = sharded_fit(
            &model,
            &weights,
            device,
            &Sharding::new(8, 1).with_moe(8, true),
            &target,
        );
        assert!(plain.fits() && dp.fits());
        assert!(
            dp.memory.weights > plain.memory.weights,
            "attention replicated"
        );
        assert_eq!(
            dp.per_request, plain.per_request,
            "one latent per device either way"
        );
        assert!(
            dp.max_concurrency > plain.max_concurrency * 4,
            "{} vs {}",
            dp.max_concurrency,
            plain.max_concurrency
        );
        assert_eq!(
            dp.memory.total,
            dp.memory.weights + dp.memory.kv_cache + dp.memory.activations + dp.memory.overhead
        );
    }

    #[test]
    fn kv_heads_replicate_past_their_count() {
        let model = presets::find("qwen3-235b-a22b").unwrap().unwrap(); // 64 heads, 4 KV
        assert_eq!(valid_tensor_parallel_sizes(&model, 16), [1, 2, 4, 8, 16]);
    }
}
