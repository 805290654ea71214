//! The engines' role arguments for disaggregated serving: what turns the two pools' ordinary
//! arguments into a prefill and a decode instance that hand KV caches over.
//!
//! - vLLM (docs.vllm.ai, "NixlConnector Usage Guide"; `docs/features/disagg_prefill.md`):
//!   each instance takes `--kv-transfer-config` with `"kv_connector":"NixlConnector"`; the
//!   guide starts the prefiller and the decoder alike with `"kv_role":"kv_both"` and lets the
//!   proxy decide which does what, so both pools get the same value.
//! - SGLang (docs.sglang.io, "PD Disaggregation"): `--disaggregation-mode prefill|decode` and
//!   `--disaggregation-transfer-backend` (Mooncake, the default, or NIXL); NIXL is chosen to
//!   match vLLM's connector.
//!
//! Neither engine routes a request from prefill to decode by itself: a router or proxy
//! (vLLM's example proxy, SGLang's router) does, and the plan does not deploy one.

use crate::plan::report::Plan;

/// vLLM's `--kv-transfer-config` value for both roles.
pub const VLLM_KV_TRANSFER_CONFIG: &str = r#"{"kv_connector":"NixlConnector","kv_role":"kv_both"}"#;

/// The SGLang transfer backend the plan names.
pub const SGLANG_TRANSFER_BACKEND: &str = "nixl";

/// The note both pools carry.
pub const ROUTER_NOTE: &str = "disaggregated: a router/proxy that sends each request to a prefill instance and then a decode instance (vLLM's disaggregated proxy, SGLang's router) is needed and not planned here";

/// Adds the role arguments to both pools' engine settings (those that have settings).
pub fn apply(decode: &mut Plan, prefill: &mut Plan) {
    for (plan, role) in [(decode, "decode"), (prefill, "prefill")] {
        let Some(engine) = plan.engine.as_mut() else {
            continue;
        };
        engine.vllm.push("--kv-transfer-config".to_string());
        engine.vllm.push(VLLM_KV_TRANSFER_CONFIG.to_string());
        engine.sglang.push("--disaggregation-mode".to_string());
        engine.sglang.push(role.to_string());
        engine
            .sglang
            .push("--disaggregation-transfer-backend".to_string());
        engine.sglang.push(SGLANG_TRANSFER_BACKEND.to_string());
        engine.notes.push(ROUTER_NOTE.to_string());
    }
}
