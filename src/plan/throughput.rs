//! Decode-throughput estimate from the memory-bandwidth roofline: generating a token reads
//! every weight the token uses once, plus the sequence's KV cache, so a replica produces at
//! most `bandwidth / bytes read per step` steps per second. It is an upper bound and labelled
//! an estimate: compute, kernel efficiency (typically 60-80 % of peak bandwidth), prefill and
//! communication are not modelled.
//!
//! Pipeline stages run one after another for a given token, so the replica's step time is the
//! sum over stages; tensor-parallel ranks read their shares at the same time. Routed experts
//! are read only when some token in the batch is sent to them:
//! `experts * min(1, batch * experts_per_token / experts)`.

use serde::Serialize;

use super::model::Model;
use super::units::Bytes;
use super::weights::WeightBytes;

/// The estimate for one replica.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThroughputEstimate {
    /// Always "estimate": a bandwidth roofline, not a measurement.
    pub kind: &'static str,
    /// Peak memory bandwidth per device, TB/s.
    pub bandwidth_tbps: f64,
    /// Tokens per second for one sequence at the full context.
    pub single_stream_tokens_per_s: f64,
    /// Concurrent sequences in the batched figure.
    pub batch: u64,
    /// Tokens per second across `batch` sequences at the full context.
    pub batched_tokens_per_s: f64,
}

/// Decode tokens per second for one replica of `tp` x `pp` devices of `bandwidth_tbps`.
/// `kv_per_request` is one full-context request's KV bytes on one device.
pub fn estimate(
    model: &Model,
    weights: &WeightBytes,
    layout: (u32, u32),
    kv_per_request: Bytes,
    bandwidth_tbps: f64,
    batch: u64,
) -> Option<ThroughputEstimate> {
    if !(bandwidth_tbps.is_finite() && bandwidth_tbps > 0.0) {
        return None;
    }
    let (tp, pp) = (f64::from(layout.0.max(1)), f64::from(layout.1.max(1)));
    let batch = batch.max(1);
    let device_bandwidth = bandwidth_tbps * 1e12;
    let tokens_per_s = |sequences: u64| {
        // Bytes each device reads per step; stages run in turn, ranks in parallel.
        let weights_read = read_per_step(model, weights, sequences).as_f64() / (tp * pp);
        let kv_read = kv_per_request.as_f64() * sequences as f64;
        let step_seconds = pp * (weights_read + kv_read) / device_bandwidth;
        if step_seconds > 0.0 {
            sequences as f64 / step_seconds
        } else {
            0.0
        }
    };
    Some(ThroughputEstimate {
        kind: "estimate",
        bandwidth_tbps,
        single_stream_tokens_per_s: round(tokens_per_s(1)),
        batch,
        batched_tokens_per_s: round(tokens_per_s(batch)),
    })
}

/// Weight bytes one decode step of `sequences` sequences reads.
fn read_per_step(model: &Model, weights: &WeightBytes, sequences: u64) -> Bytes {
    let dense = weights.lm_head + weights.kv_projection + weights.other_layers;
    let Some(moe) = model.arch.moe else {
        return dense + weights.experts;
    };
    let touched = (sequences.saturating_mul(moe.experts_per_token) as f64
        / moe.experts.max(1) as f64)
        .min(1.0);
    dense + Bytes::from_f64(weights.experts.as_f64() * touched)
}

fn round(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Precision;
    use crate::plan::model::presets;

    #[test]
    fn dense_single_stream_is_bandwidth_over_weights() {
        // Llama-3.1-8B BF16 on one H100 (3.35 TB/s): ~15 GB per token -> ~200 tokens/s.
        let model = presets::find("llama-3.1-8b").unwrap().unwrap();
        let weights = WeightBytes::of(&model, Precision::Bf16);
        let e = estimate(&model, &weights, (1, 1), Bytes::ZERO, 3.35, 1).unwrap();
        assert!(
            (190.0..230.0).contains(&e.single_stream_tokens_per_s),
            "{e:?}"
        );
        assert_eq!(e.kind, "estimate");
    }

    #[test]
    fn moe_reads_only_active_experts_and_batching_helps() {
        let model = presets::find("mixtral-8x7b").unwrap().unwrap();
        let weights = WeightBytes::of(&model, Precision::Bf16);
        let e = estimate(&model, &weights, (2, 1), Bytes(1 << 20), 3.35, 64).unwrap();
        // Active 12.9B params = 25.8 GB read over 2 x 3.35 TB/s -> ~260 tokens/s.
        assert!(
            (200.0..300.0).contains(&e.single_stream_tokens_per_s),
            "{e:?}"
        );
        assert!(e.batched_tokens_per_s > e.single_stream_tokens_per_s * 10.0);
        assert!(estimate(&model, &weights, (2, 1), Bytes::ZERO, 0.0, 1).is_none());
    }
}
