//! How one replica lays a model out on its devices: the tensor-parallel group, the pipeline
//! stages and how the layers split among them, and, for mixture-of-experts models, whether
//! the experts are expert-parallel and the attention data-parallel.
//!
//! * Pipeline stages split the layers the way vLLM does (`vllm/distributed/utils.py`,
//!   `get_pp_indices`): `layers / pp` each, and the remainder one layer each to the stages
//!   just before the last, so the last stage (which also holds the output head) and, while
//!   the remainder allows, the first (which holds the embedding) stay light. 61 layers on
//!   PP 4: 15, 15, 16, 15.
//! * Expert parallelism (vLLM `--enable-expert-parallel`, SGLang `--ep`): the routed experts
//!   are placed whole, `ceil(experts / group)` per device, instead of every device holding a
//!   `1/group` slice of every expert (vLLM `docs/serving/expert_parallel_deployment.md`).
//! * Data-parallel attention (vLLM `--data-parallel-size` with EP, SGLang
//!   `--enable-dp-attention`): the group's devices form `attention_dp` attention ranks of
//!   `tp / attention_dp` devices each. Each rank keeps the non-expert weights at that
//!   narrower TP (vLLM runs one engine per data-parallel rank) and its own requests' KV
//!   cache, so an MLA latent is no longer copied to every device of the group
//!   (`docs/serving/data_parallel_deployment.md`).

use serde::Serialize;

/// The layout of one replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Sharding {
    /// Devices per pipeline stage: the tensor-parallel group (for MoE layers, the group
    /// their experts are spread over).
    pub tp: u32,
    /// Pipeline stages.
    pub pp: u32,
    /// Attention data-parallel ranks in the group (1: attention is split by TP too).
    pub attention_dp: u32,
    /// True when routed experts are placed whole across the group (EP = `tp`).
    pub expert_parallel: bool,
}

impl Sharding {
    /// Plain tensor and pipeline parallelism.
    pub fn new(tp: u32, pp: u32) -> Self {
        Self {
            tp: tp.max(1),
            pp: pp.max(1),
            attention_dp: 1,
            expert_parallel: false,
        }
    }

    /// The same layout with experts placed whole and `attention_dp` attention ranks (clamped
    /// to a divisor of the group).
    pub fn with_moe(self, attention_dp: u32, expert_parallel: bool) -> Self {
        let attention_dp = attention_dp.clamp(1, self.tp);
        let attention_dp = if self.tp.is_multiple_of(attention_dp) {
            attention_dp
        } else {
            1
        };
        Self {
            attention_dp,
            expert_parallel,
            ..self
        }
    }

    /// Tensor-parallel width of the attention (and every other non-expert weight).
    pub fn attention_tp(&self) -> u32 {
        (self.tp / self.attention_dp.max(1)).max(1)
    }

    /// True when neither expert parallelism nor data-parallel attention is used.
    pub fn is_plain(&self) -> bool {
        self.attention_dp <= 1 && !self.expert_parallel
    }
}

/// One pipeline stage: its layer count and whether it holds the embedding or the output head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stage {
    /// Decoder layers on the stage.
    pub layers: u32,
    /// The first stage holds the input embedding.
    pub first: bool,
    /// The last stage holds the final norm and the output head.
    pub last: bool,
}

/// Layers per stage, in stage order, as vLLM's `get_pp_indices` splits `layers` over `pp`
/// stages (`pp` is clamped to `1..=layers`). One entry per stage: for reports and tests;
/// the memory model uses [`distinct_stages`].
pub fn stage_layers(layers: u32, pp: u32) -> Vec<u32> {
    let layers = layers.max(1);
    let pp = pp.clamp(1, layers);
    let base = layers / pp;
    let remainder = layers % pp;
    // Stages pp-1-remainder ..= pp-2 get one more layer (`partitions[-i] += 1` for i in
    // 2..remainder+2).
    let extra_from = pp - 1 - remainder;
    (0..pp)
        .map(|i| {
            if remainder > 0 && i >= extra_from && i + 1 < pp {
                base + 1
            } else {
                base
            }
        })
        .collect()
}

/// The stages that can differ in memory: the first, the last and one of each middle size,
/// without repeats (at most four however deep the pipeline). Worked out from a handful of
/// stage indices, so an absurd `pp` costs nothing.
pub fn distinct_stages(layers: u32, pp: u32) -> Vec<Stage> {
    let layers = layers.max(1);
    let pp = pp.clamp(1, layers);
    let base = layers / pp;
    let remainder = layers % pp;
    let extra_from = pp - 1 - remainder;
    let count = |i: u32| {
        if remainder > 0 && i >= extra_from && i + 1 < pp {
            base + 1
        } else {
            base
        }
    };
    // Every kind of stage has one of these indices: the ends, the first middle stage, the
    // middle stages on either side of where the extra layers start, and the last middle one.
    let last = pp - 1;
    let indices = [
        0,
        1,
        extra_from.saturating_sub(1),
        extra_from,
        last.saturating_sub(1),
        last,
    ];
    let mut stages: Vec<Stage> = Vec::with_capacity(4);
    for i in indices.into_iter().filter(|&i| i < pp) {
        let stage = Stage {
            layers: count(i),
            first: i == 0,
            last: i == last,
        };
        if !stages.contains(&stage) {
            stages.push(stage);
        }
    }
    stages
}

/// True when `pp` stages get the same number of layers.
pub fn splits_evenly(layers: u32, pp: u32) -> bool {
    pp >= 1 && layers.is_multiple_of(pp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_split_like_vllm() {
        // vllm tests/distributed/test_utils.py-style cases: the remainder goes to the stages
        // before the last.
        assert_eq!(stage_layers(61, 2), [31, 30]);
        assert_eq!(stage_layers(61, 4), [15, 15, 16, 15]);
        assert_eq!(stage_layers(126, 2), [63, 63]);
        assert_eq!(stage_layers(10, 4), [2, 3, 3, 2]);
        assert_eq!(stage_layers(7, 4), [2, 2, 2, 1]);
        assert_eq!(
            stage_layers(3, 8),
            [1, 1, 1],
            "never more stages than layers"
        );
        for (layers, pp) in [(61, 7), (80, 3), (1, 1), (94, 8)] {
            assert_eq!(stage_layers(layers, pp).iter().sum::<u32>(), layers);
        }
    }

    #[test]
    fn distinct_stages_cover_first_last_and_middles() {
        let stages = distinct_stages(61, 4);
        assert_eq!(stages.len(), 4);
        assert!(stages[0].first && !stages[0].last && stages[0].layers == 15);
        assert!(stages.iter().any(|s| s.layers == 16 && !s.first && !s.last));
        assert!(stages.iter().any(|s| s.last && s.layers == 15));
        let one = distinct_stages(32, 1);
        assert_eq!(
            one,
            [Stage {
                layers: 32,
                first: true,
                last: true
            }]
        );
        assert!(distinct_stages(126, 64).len() <= 4);
        // The same set as walking every stage.
        for (layers, pp) in [(61, 7), (10, 4), (7, 4), (126, 64), (94, 8), (5, 5), (9, 2)] {
            let split = stage_layers(layers, pp);
            let last = split.len() - 1;
            for (i, &count) in split.iter().enumerate() {
                let stage = Stage {
                    layers: count,
                    first: i == 0,
                    last: i == last,
                };
                assert!(
                    distinct_stages(layers, pp).contains(&stage),
                    "{layers}/{pp}: {i}"
                );
            }
        }
        assert!(
            distinct_stages(u32::MAX, u32::MAX).len() <= 4,
            "no allocation per stage"
        );
    }

    #[test]
    fn moe_layouts_keep_the_attention_width_sane() {
        let s = Sharding::new(8, 1).with_moe(8, true);
        assert_eq!((s.attention_tp(), s.attention_dp), (1, 8));
        assert_eq!(Sharding::new(8, 1).with_moe(3, true).attention_dp, 1);
        assert_eq!(Sharding::new(2, 1).with_moe(16, false).attention_dp, 2);
        assert!(Sharding::new(4, 2).is_plain());
        assert!(splits_evenly(126, 2) && !splits_evenly(61, 2));
    }
}
