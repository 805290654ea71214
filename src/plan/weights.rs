//! Weight memory for a precision, and each device's share of it under tensor and pipeline
//! parallelism.
//!
//! Quantisation never touches every weight: the published schemes (llm-compressor, AWQ, GPTQ,
//! ModelOpt, DeepSeek's FP8) narrow the linear layers of the decoder blocks and keep the
//! embedding, the output head, the norms and the MoE routers in 16 bits; gpt-oss narrows only
//! its experts. Counting those at 16 bits is what makes "FP8 405B" 410 GB rather than the
//! nominal 405 GB (`planner-formulas.md` §1.1 rule 1).
//!
//! An exact checkpoint size, when given, counts at every precision, not only the checkpoint's
//! own: it says how much the computed total undercounts (tensors the architecture does not
//! describe: vision towers, MTP heads, scales, padding), and that part does not vanish when the
//! weights are converted. So the weights in any precision are the computed ones scaled by
//! `checkpoint / computed-at-native`, never below the computed ones. Ignoring it elsewhere once
//! planned a 70B model with a 180 GB checkpoint on 2 x H100 in FP16 (the computed 141 GB)
//! while BF16, the same 2 bytes, needed 180 GB.

use serde::Serialize;

use crate::hardware::Precision;

use super::layout::{self, Sharding, Stage};
use super::model::{Model, QuantScope};
use super::units::Bytes;

/// Bytes per value of the weights that stay unquantised.
const SIXTEEN_BIT: f64 = 2.0;

/// Weight bytes by role, for the whole model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WeightBytes {
    /// Input embedding.
    pub embedding: Bytes,
    /// Output head (zero when tied).
    pub lm_head: Bytes,
    /// K and V projections (replicated per rank once TP exceeds the KV heads).
    pub kv_projection: Bytes,
    /// Routed experts.
    pub experts: Bytes,
    /// Every other decoder weight: Q/O projections, dense and shared MLPs, routers, norms.
    pub other_layers: Bytes,
}

impl WeightBytes {
    /// The weights of `model` stored in `precision`: the computed ones, grown by the
    /// checkpoint size when one is given (see the module docs).
    pub fn of(model: &Model, precision: Precision) -> Self {
        let computed = Self::computed(model, precision);
        match model.checkpoint_bytes {
            Some(exact) => computed.scaled_by(checkpoint_ratio(model, exact)),
            None => computed,
        }
    }

    /// The weights of `model` in `precision` as the architecture counts them, ignoring any
    /// checkpoint size.
    pub fn computed(model: &Model, precision: Precision) -> Self {
        let p = &model.params;
        let width = precision.bytes_per_param();
        let (linear, experts) = if width >= SIXTEEN_BIT {
            (width, width)
        } else {
            let scope = if precision == model.native.precision {
                model.native.scope
            } else {
                QuantScope::AllLinear
            };
            match scope {
                QuantScope::AllLinear => (width, width),
                QuantScope::ExpertsOnly => (SIXTEEN_BIT, width),
            }
        };
        let kept = if width >= SIXTEEN_BIT {
            width
        } else {
            SIXTEEN_BIT
        };
        let bytes = |count: u64, per: f64| Bytes::from_f64(count as f64 * per);
        let other_linear = p
            .attention
            .saturating_sub(p.kv_projection)
            .saturating_add(p.dense_mlp)
            .saturating_add(p.shared_experts);
        Self {
            embedding: bytes(p.embedding, kept),
            lm_head: bytes(p.lm_head, kept),
            kv_projection: bytes(p.kv_projection, linear),
            experts: bytes(p.experts, experts),
            other_layers: bytes(other_linear, linear)
                + bytes(p.router.saturating_add(p.norms), kept),
        }
    }

    /// All weights.
    pub fn total(&self) -> Bytes {
        self.embedding + self.lm_head + self.layers()
    }

    /// The decoder blocks' weights.
    pub fn layers(&self) -> Bytes {
        self.kv_projection + self.experts + self.other_layers
    }

    /// The bytes one decoded token reads: everything but the embedding table (one row is read)
    /// and the routed experts it is not sent to.
    pub fn read_per_token(&self, model: &Model) -> Bytes {
        let p = &model.params;
        let active_experts = if p.experts == 0 {
            Bytes::ZERO
        } else {
            Bytes::from_f64(self.experts.as_f64() * p.active_experts as f64 / p.experts as f64)
        };
        self.lm_head + self.kv_projection + self.other_layers + active_experts
    }

    /// The heaviest device's share with `tp`-way tensor and `pp`-way pipeline parallelism.
    pub fn per_device(&self, model: &Model, tp: u32, pp: u32) -> Bytes {
        self.per_device_sharded(model, &Sharding::new(tp, pp))
    }

    /// The heaviest device's share under `sharding`: the most loaded of its pipeline stages.
    ///
    /// Stages hold the layers vLLM gives them ([`layout::stage_layers`]); the first also holds
    /// the embedding and the last the output head (both vocabulary-parallel, so split by the
    /// attention's TP). Non-expert weights are split by the attention's TP (`tp` unless the
    /// attention is data-parallel); a rank keeps `max(1, kv_heads / attention_tp)` KV heads,
    /// so beyond TP = KV heads the K/V projections stop shrinking (vLLM `QKVParallelLinear`
    /// replicates them). Routed experts are spread over the whole group: a `1/tp` slice of
    /// each, or with expert parallelism `ceil(experts / tp)` whole experts.
    pub fn per_device_sharded(&self, model: &Model, sharding: &Sharding) -> Bytes {
        layout::distinct_stages(model.arch.layers, sharding.pp)
            .into_iter()
            .map(|stage| self.stage_device(model, sharding, stage))
            .max()
            .unwrap_or(Bytes::ZERO)
    }

    /// One device's weights on `stage`.
    fn stage_device(&self, model: &Model, sharding: &Sharding, stage: Stage) -> Bytes {
        let layers = u64::from(model.arch.layers.max(1));
        let stage_layers = u64::from(stage.layers).min(layers);
        let stage_share =
            |bytes: Bytes| Bytes::from_f64(bytes.as_f64() * stage_layers as f64 / layers as f64);
        let attention_tp = u64::from(sharding.attention_tp());
        let kv_heads = u64::from(model.arch.kv_heads.max(1));
        let kv_heads_per_rank = (kv_heads / attention_tp).max(1);
        let kv = Bytes::from_f64(
            stage_share(self.kv_projection).as_f64() * kv_heads_per_rank as f64 / kv_heads as f64,
        );
        let dense = stage_share(self.other_layers).div_ceil(attention_tp);
        let experts = self.experts_per_device(model, sharding, stage_share(self.experts));
        let embedding = if stage.first {
            self.embedding
        } else {
            Bytes::ZERO
        };
        let head = if stage.last {
            self.lm_head
        } else {
            Bytes::ZERO
        };
        let ends = embedding + head;
        dense + kv + experts + ends.div_ceil(attention_tp)
    }

    /// One device's share of `experts` bytes (one stage's routed experts).
    fn experts_per_device(&self, model: &Model, sharding: &Sharding, experts: Bytes) -> Bytes {
        let group = u64::from(sharding.tp.max(1));
        match model.arch.moe {
            Some(moe) if sharding.expert_parallel && moe.experts > 0 => {
                // Whole experts: the fullest rank holds ceil(experts / group) of them.
                let per_rank = moe.experts.div_ceil(group).min(moe.experts);
                Bytes::from_f64(experts.as_f64() * per_rank as f64 / moe.experts as f64)
            }
            _ => experts.div_ceil(group),
        }
    }

    /// Every role scaled by `ratio` (at least 1, so never below the computed bytes).
    fn scaled_by(self, ratio: f64) -> Self {
        if !ratio.is_finite() || ratio <= 1.0 {
            return self;
        }
        let scale = |bytes: Bytes| Bytes::from_f64(bytes.as_f64() * ratio).max(bytes);
        Self {
            embedding: scale(self.embedding),
            lm_head: scale(self.lm_head),
            kv_projection: scale(self.kv_projection),
            experts: scale(self.experts),
            other_layers: scale(self.other_layers),
        }
    }
}

/// How much larger the checkpoint is than the weights computed at its own precision; at least
/// 1: a checkpoint smaller than its computed weights (a wrong figure, or a partial download)
/// must not make a plan fit on fewer devices than the architecture needs.
fn checkpoint_ratio(model: &Model, exact: Bytes) -> f64 {
    let native = WeightBytes::computed(model, model.native.precision)
        .total()
        .as_f64();
    if native <= 0.0 {
        return 1.0;
    }
    (exact.as_f64() / native).max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::model::presets;

    fn gb(bytes: Bytes) -> f64 {
        bytes.as_f64() / 1e9
    }

    #[test]
    fn sixteen_bit_weights_are_two_bytes_per_parameter() {
        // HF Llama 3.1 blog table: 8B 16 GB, 70B 140 GB, 405B 810 GB in BF16.
        for (key, expected) in [
            ("llama-3.1-8b", 16.06),
            ("llama-3.1-70b", 141.1),
            ("llama-3.1-405b", 811.7),
        ] {
            let model = presets::find(key).unwrap().unwrap();
            let total = gb(WeightBytes::of(&model, Precision::Bf16).total());
            assert!((total - expected).abs() / expected < 0.01, "{key}: {total}");
        }
    }

    #[test]
    fn fp8_keeps_embeddings_and_head_in_sixteen_bits() {
        let model = presets::find("llama-3.1-405b").unwrap().unwrap();
        let fp8 = WeightBytes::of(&model, Precision::Fp8);
        // 401.6B linear at 1 byte + 2 x 2.1B embedding/head at 2 bytes = 410 GB, above the
        // nominal 405 GB of the HF blog table.
        assert!((gb(fp8.total()) - 410.0).abs() < 1.5, "{}", gb(fp8.total()));
        assert_eq!(fp8.embedding, Bytes(model.params.embedding * 2));
    }

    #[test]
    fn gpt_oss_quantises_only_its_experts() {
        // openai/gpt-oss README: the 117B model fits one 80 GB GPU thanks to MXFP4 experts.
        let model = presets::find("gpt-oss-120b").unwrap().unwrap();
        let native = WeightBytes::of(&model, Precision::Mxfp4);
        assert!(
            gb(native.total()) > 60.0 && gb(native.total()) < 68.0,
            "{}",
            gb(native.total())
        );
        assert_eq!(native.kv_projection, Bytes(model.params.kv_projection * 2));
    }

    #[test]
    fn checkpoint_size_sets_the_native_precision_and_scales_the_others() {
        // vLLM issue #6746: Meta's FP8 405B loads 57.75 GB per GPU x 8 = 462 GB.
        let mut model = presets::find("llama-3.1-405b").unwrap().unwrap();
        model.native.precision = Precision::Fp8;
        let model = model.with_checkpoint_bytes(Some(Bytes(462_000_000_000)));
        assert_eq!(
            WeightBytes::of(&model, Precision::Fp8).total().0 / 1_000_000,
            462_000
        );
        // 462 / 410 of the computed 812 GB in BF16: the checkpoint's extra 13 % is counted
        // in every precision.
        let bf16 = gb(WeightBytes::of(&model, Precision::Bf16).total());
        assert!(bf16 > 900.0 && bf16 < 930.0, "{bf16}");
    }

    #[test]
    fn kv_projections_stop_shrinking_past_the_kv_heads() {
        let model = presets::find("qwen3-235b-a22b").unwrap().unwrap(); // 4 KV heads
        let weights = WeightBytes::of(&model, Precision::Bf16);
        let at = |tp| weights.per_device(&model, tp, 1);
        assert!(at(8) > weights.total().div_ceil(8));
        assert!(at(2) < at(1) && at(4) < at(2) && at(8) < at(4));
    }

    #[test]
    fn expert_parallel_places_whole_experts_and_dp_attention_replicates_the_rest() {
        // DeepSeek-V3: 256 routed experts over 8 ranks = 32 whole experts each, the same bytes
        // as a 1/8 slice of each; with data-parallel attention every rank keeps the attention,
        // dense and shared-expert weights and the embedding itself (vLLM runs one engine per
        // data-parallel rank).
        let model = presets::find("deepseek-v3").unwrap().unwrap();
        let weights = WeightBytes::of(&model, Precision::Fp8);
        let plain = Sharding::new(8, 1);
        let ep = plain.with_moe(1, true);
        let dp = plain.with_moe(8, true);
        let at = |s: &Sharding| weights.per_device_sharded(&model, s);
        let diff = (at(&ep).as_f64() - at(&plain).as_f64()).abs();
        assert!(diff < 1e6, "{} vs {}", at(&ep), at(&plain));
        let replicated = weights.total().as_f64() - weights.experts.as_f64();
        let extra = at(&dp).as_f64() - at(&ep).as_f64();
        assert!(
            (extra - replicated * 7.0 / 8.0).abs() / replicated < 0.01,
            "{extra} vs {replicated}"
        );
        // 160 experts over 48 ranks: the fullest rank holds 4, not 160/48 = 3.33.
        let mut model = model;
        if let Some(moe) = model.arch.moe.as_mut() {
            moe.experts = 160;
        }
        let s = Sharding::new(48, 1).with_moe(1, true);
        let slice = weights.experts.as_f64() / 48.0;
        let whole = weights.per_device_sharded(&model, &s).as_f64()
            - weights
                .per_device_sharded(&model, &Sharding::new(48, 1))
                .as_f64();
        assert!((whole - (weights.experts.as_f64() * 4.0 / 160.0 - slice)).abs() < 1e6);
    }

    #[test]
    fn uneven_pipelines_weigh_the_heaviest_stage() {
        // 61 layers on PP 2: vLLM gives the first stage 31 layers and the embedding.
        let model = presets::find("deepseek-v3").unwrap().unwrap();
        let weights = WeightBytes::of(&model, Precision::Bf16);
        let layers = weights.layers().as_f64();
        let first = layers * 31.0 / 61.0 + weights.embedding.as_f64();
        let got = weights.per_device(&model, 8, 2).as_f64() * 8.0;
        assert!((got - first).abs() / first < 0.001, "{got} vs {first}");
    }

    #[test]
    fn pipeline_stages_split_layers() {
        let model = presets::find("llama-3.1-405b").unwrap().unwrap();
        let weights = WeightBytes::of(&model, Precision::Bf16);
        let one_stage = weights.per_device(&model, 8, 1);
        let two_stages = weights.per_device(&model, 8, 2);
        assert!(
            two_stages.as_f64() < one_stage.as_f64() * 0.52,
            "{two_stages} vs {one_stage}"
        );
    }
}
