//! Which parallel layouts are valid for a model, independent of memory.
//!
//! * TP must divide the attention heads (`vllm/config/model.py`,
//!   `verify_with_parallel_config`: "Total number of attention heads ... must be divisible by
//!   tensor parallel size"), and either divide the KV heads or be a multiple of them, in
//!   which case each KV head is replicated (`vllm/model_executor/models/llama.py`,
//!   `LlamaAttention.__init__`). Qwen2-7B (28 heads, 4 KV heads) allows TP 1, 2, 4 and 28.
//! * TP stays within a node, so it is at most the devices one node has free.
//! * PP splits the layers, so it is at most the layer count.

use crate::plan::model::Model;

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
    fn kv_heads_replicate_past_their_count() {
        let model = presets::find("qwen3-235b-a22b").unwrap().unwrap(); // 64 heads, 4 KV
        assert_eq!(valid_tensor_parallel_sizes(&model, 16), [1, 2, 4, 8, 16]);
    }
}
