//! The cluster tier in one test binary: one module per area, each test `#[ignore]`d with the
//! reason it needs a cluster (`needs cluster`: the control plane of `tests/cluster/up.sh`;
//! `needs real node`: `up.sh --node`).
//!
//! One binary links the library and the Kubernetes stack once instead of once per area.
//! `make cluster-test` runs it module by module (`cargo test --test cluster_tier -- --ignored
//! cluster_agent::`, ...), so tests of different areas never share the cluster at the same
//! time, as when each area was its own binary; the tests of one area run in parallel.

mod helm;
mod support;

mod cluster_agent;
mod cluster_agent_cost;
mod cluster_agent_dra;
mod cluster_agent_health;
mod cluster_agent_outage;
mod cluster_agent_phantoms;
mod cluster_api_connections;
mod cluster_basics;
mod cluster_compat_labels;
mod cluster_controller;
mod cluster_controller_holdings;
mod cluster_controller_scale;
mod cluster_controller_start;
mod cluster_disaggregated;
mod cluster_dra;
mod cluster_dra_audit;
mod cluster_dra_classes;
mod cluster_dra_counters;
mod cluster_dra_lint;
mod cluster_dra_pod_health;
mod cluster_fleet;
mod cluster_fleet_cli;
mod cluster_helm;
mod cluster_helm_nvml;
mod cluster_leader_hang;
mod cluster_plan_emit;
mod cluster_real_node;
mod cluster_security;
mod cluster_tenant_budget;
