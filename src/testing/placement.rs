//! ModelPlacements for tests: a fluent [`PlacementBuilder`] that starts from a preset and a
//! goal with the CRD's defaults and sets only what a test is about.
//!
//! ```ignore
//! let spec = PlacementBuilder::serve("llama-3.1-70b")
//!     .concurrency(40)
//!     .precision(PrecisionChoice::Bf16)
//!     .spec();
//! let placement = PlacementBuilder::serve("llama-3.1-8b").name("llama").build();
//! ```

use crate::api::ModelPlacement;
use crate::api::placement::{
    Constraints, Goal, ModelPlacementSpec, ModelSource, OptimizerStates, PrecisionChoice,
    ServeGoal, TrainAdamw, TrainGoal, TrainKernels, TrainLoss, TrainMethod,
};

/// The name a built placement gets unless [`PlacementBuilder::name`] says otherwise.
pub const DEFAULT_NAME: &str = "placement";

/// Builds a [`ModelPlacementSpec`] or a whole [`ModelPlacement`].
///
/// Starts with the values the apiserver defaults to (serving: context 8192, concurrency 1;
/// training: seqLen 4096, microBatch 1, loraRank 16), no constraints and no replicas; a
/// constraint setter adds a `constraints` block holding only what was set.
#[derive(Debug, Clone)]
pub struct PlacementBuilder {
    spec: ModelPlacementSpec,
    name: String,
    namespace: Option<String>,
}

impl PlacementBuilder {
    /// Serve preset `preset` (`llama-3.1-8b`).
    pub fn serve(preset: &str) -> Self {
        Self::with_goal(
            preset,
            Goal {
                serve: Some(ServeGoal {
                    context: 8192,
                    concurrency: 1,
                    disaggregated: false,
                    prefill_replicas: None,
                }),
                train: None,
            },
        )
    }

    /// Fine-tune preset `preset` with `method`.
    pub fn train(preset: &str, method: TrainMethod) -> Self {
        Self::with_goal(
            preset,
            Goal {
                serve: None,
                train: Some(TrainGoal {
                    method,
                    seq_len: 4096,
                    micro_batch: 1,
                    lora_rank: 16,
                    optimizer_states: None,
                    loss: None,
                    adamw: None,
                    kernels: None,
                }),
            },
        )
    }

    fn with_goal(preset: &str, goal: Goal) -> Self {
        Self {
            spec: ModelPlacementSpec {
                model: ModelSource {
                    preset: Some(preset.to_string()),
                    ..ModelSource::default()
                },
                goal,
                constraints: None,
                replicas: None,
                allocation: None,
                engine: None,
            },
            name: DEFAULT_NAME.to_string(),
            namespace: None,
        }
    }

    /// Also a bare parameter count (`8B`). The preset stays, so the spec names two model
    /// sources, which is what a test of that refusal needs.
    #[must_use]
    pub fn parameters(mut self, count: &str) -> Self {
        self.spec.model.parameters = Some(count.to_string());
        self
    }

    /// The exact checkpoint size in bytes.
    #[must_use]
    pub fn checkpoint_bytes(mut self, bytes: u64) -> Self {
        self.spec.model.checkpoint_bytes = Some(bytes);
        self
    }

    /// Serving context length in tokens (ignored for training).
    #[must_use]
    pub fn context(mut self, tokens: u32) -> Self {
        if let Some(serve) = &mut self.spec.goal.serve {
            serve.context = tokens;
        }
        self
    }

    /// Disaggregated serving with `prefill_replicas` (ignored for training).
    #[must_use]
    pub fn disaggregated(mut self, prefill_replicas: Option<u32>) -> Self {
        if let Some(serve) = &mut self.spec.goal.serve {
            serve.disaggregated = true;
            serve.prefill_replicas = prefill_replicas;
        }
        self
    }

    /// Requests served at once (ignored for training).
    #[must_use]
    pub fn concurrency(mut self, requests: u32) -> Self {
        if let Some(serve) = &mut self.spec.goal.serve {
            serve.concurrency = requests;
        }
        self
    }

    /// Training sequence length (ignored for serving).
    #[must_use]
    pub fn seq_len(mut self, tokens: u32) -> Self {
        if let Some(train) = &mut self.spec.goal.train {
            train.seq_len = tokens;
        }
        self
    }

    /// Training sequences per device per step (ignored for serving).
    #[must_use]
    pub fn micro_batch(mut self, sequences: u32) -> Self {
        if let Some(train) = &mut self.spec.goal.train {
            train.micro_batch = sequences;
        }
        self
    }

    /// LoRA adapter rank (ignored for serving).
    #[must_use]
    pub fn lora_rank(mut self, rank: u32) -> Self {
        if let Some(train) = &mut self.spec.goal.train {
            train.lora_rank = rank;
        }
        self
    }

    /// How the training loss is computed (ignored for serving).
    #[must_use]
    pub fn loss(mut self, loss: TrainLoss) -> Self {
        if let Some(train) = &mut self.spec.goal.train {
            train.loss = Some(loss);
        }
        self
    }

    /// The optimizer states' precision (ignored for serving).
    #[must_use]
    pub fn optimizer_states(mut self, states: OptimizerStates) -> Self {
        if let Some(train) = &mut self.spec.goal.train {
            train.optimizer_states = Some(states);
        }
        self
    }

    /// How AdamW steps (ignored for serving).
    #[must_use]
    pub fn adamw(mut self, adamw: TrainAdamw) -> Self {
        if let Some(train) = &mut self.spec.goal.train {
            train.adamw = Some(adamw);
        }
        self
    }

    /// Which kernels run the layers (ignored for serving).
    #[must_use]
    pub fn kernels(mut self, kernels: TrainKernels) -> Self {
        if let Some(train) = &mut self.spec.goal.train {
            train.kernels = Some(kernels);
        }
        self
    }

    /// Serving replicas.
    #[must_use]
    pub fn replicas(mut self, replicas: u32) -> Self {
        self.spec.replicas = Some(replicas);
        self
    }

    /// Weight precision (`auto` too: it is written out, unlike leaving it unset).
    #[must_use]
    pub fn precision(mut self, precision: PrecisionChoice) -> Self {
        self.constraints().precision = Some(precision);
        self
    }

    /// KV-cache precision.
    #[must_use]
    pub fn kv_cache_precision(mut self, precision: PrecisionChoice) -> Self {
        self.constraints().kv_cache_precision = Some(precision);
        self
    }

    /// One more allowed accelerator family (`gpu`, `tpu`, `npu`, `asic`).
    #[must_use]
    pub fn family(mut self, family: &str) -> Self {
        self.constraints().families.push(family.to_string());
        self
    }

    /// One more allowed product, as its `hwaccel.io/product` slug.
    #[must_use]
    pub fn product(mut self, slug: &str) -> Self {
        self.constraints().products.push(slug.to_string());
        self
    }

    /// One more node label the chosen nodes must carry.
    #[must_use]
    pub fn node_selector(mut self, key: &str, value: &str) -> Self {
        self.constraints()
            .node_selector
            .insert(key.to_string(), value.to_string());
        self
    }

    /// At most this many nodes per replica.
    #[must_use]
    pub fn max_nodes(mut self, nodes: u32) -> Self {
        self.constraints().max_nodes = Some(nodes);
        self
    }

    /// Share of each device's memory the engine may use, in percent.
    #[must_use]
    pub fn memory_utilization_percent(mut self, percent: u32) -> Self {
        self.constraints().memory_utilization_percent = Some(percent);
        self
    }

    fn constraints(&mut self) -> &mut Constraints {
        self.spec
            .constraints
            .get_or_insert_with(Constraints::default)
    }

    /// The object's name (for [`build`](Self::build)).
    #[must_use]
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// The object's namespace (for [`build`](Self::build)); none by default, as
    /// `Api::namespaced` fills it in.
    #[must_use]
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_string());
        self
    }

    /// The spec alone.
    pub fn spec(self) -> ModelPlacementSpec {
        self.spec
    }

    /// The whole object, with no status.
    pub fn build(self) -> ModelPlacement {
        let mut placement = ModelPlacement::new(&self.name, self.spec);
        placement.metadata.namespace = self.namespace;
        placement
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_serving_spec_has_the_crd_defaults_and_no_constraints() {
        let spec = PlacementBuilder::serve("llama-3.1-8b").spec();
        let decoded: ModelPlacementSpec = serde_json::from_value(serde_json::json!({
            "model": {"preset": "llama-3.1-8b"},
            "goal": {"serve": {}},
        }))
        .expect("a valid spec");
        assert_eq!(spec, decoded);
    }

    #[test]
    fn a_training_spec_has_the_crd_defaults() {
        let spec = PlacementBuilder::train("llama-3.1-8b", TrainMethod::Lora)
            .lora_rank(64)
            .context(1)
            .spec();
        let decoded: ModelPlacementSpec = serde_json::from_value(serde_json::json!({
            "model": {"preset": "llama-3.1-8b"},
            "goal": {"train": {"method": "lora", "loraRank": 64}},
        }))
        .expect("a valid spec");
        assert_eq!(spec, decoded, "context is a serving setting");
    }

    #[test]
    fn setters_fill_only_what_they_name() {
        let placement = PlacementBuilder::serve("llama-3.1-70b")
            .context(4096)
            .concurrency(40)
            .precision(PrecisionChoice::Bf16)
            .node_selector("pool", "a")
            .family("gpu")
            .replicas(2)
            .name("llama")
            .namespace("ml")
            .build();
        assert_eq!(placement.metadata.name.as_deref(), Some("llama"));
        assert_eq!(placement.metadata.namespace.as_deref(), Some("ml"));
        let spec = placement.spec;
        assert_eq!(
            spec.goal.serve,
            Some(ServeGoal {
                context: 4096,
                concurrency: 40,
                disaggregated: false,
                prefill_replicas: None,
            })
        );
        assert_eq!(spec.replicas, Some(2));
        assert_eq!(
            spec.constraints,
            Some(Constraints {
                precision: Some(PrecisionChoice::Bf16),
                families: vec!["gpu".into()],
                node_selector: BTreeMap::from([("pool".into(), "a".into())]),
                ..Constraints::default()
            })
        );
    }

    #[test]
    fn parameters_keep_the_preset_for_the_two_sources_refusal() {
        let spec = PlacementBuilder::serve("llama-3.1-8b")
            .parameters("8B")
            .spec();
        assert_eq!(spec.model.preset.as_deref(), Some("llama-3.1-8b"));
        assert_eq!(spec.model.parameters.as_deref(), Some("8B"));
    }
}
