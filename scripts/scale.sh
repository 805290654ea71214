#!/usr/bin/env bash
# Scale run of the ModelPlacement controller: kwok fake Nodes with synthetic inventories and
# hundreds of ModelPlacements against a real control plane (tests/cluster_controller_scale.rs).
#
#   scripts/scale.sh                      # 1000 nodes, 300 placements
#   SCALE_NODES=200 SCALE_PLACEMENTS=50 scripts/scale.sh
#   SCALE_PROFILE=debug scripts/scale.sh  # a debug controller (default: release, as shipped)
#   SCALE_WORKERS=1 scripts/scale.sh      # --placement-workers (default: the controller's, 4)
#   SCALE_PERF_OUT=/tmp/c.data scripts/scale.sh   # perf record the controller (flame graph:
#                                         # docs/benchmarks.md, "Round 2")
#   TC_APISERVER_PROFILING=1 SCALE_APISERVER_PROFILE=/tmp/a.pprof scripts/scale.sh
#                                         # the apiserver's CPU profile while placements are
#                                         # planned (SCALE_APISERVER_PROFILE_S seconds, 30):
#                                         # go tool pprof -top /tmp/a.pprof
#
# Every run gets a fresh control plane of its own: etcd and kube-apiserver only (no
# controller-manager, scheduler or kwok: the run's Nodes are plain objects that nothing
# heartbeats, so the apiserver's load is the operator's), with every request in its audit log
# (TC_AUDIT_READS=1) so the run can count each caller's requests. A cluster still up from
# tests is stopped first, and the run's own is stopped at the end.
#
#   SCALE_NODES=10000 SCALE_PLACEMENTS=3000 scripts/scale.sh   # the 10k size (docs/benchmarks.md)
set -euo pipefail
cd "$(dirname "$0")/.."
profile=()
[[ "${SCALE_PROFILE:-release}" == release ]] && profile=(--release)
# Build before the cluster starts, so the compiler does not compete with it.
cargo test "${profile[@]}" --test cluster_tier --no-run
tests/cluster/down.sh >/dev/null 2>&1 || true
trap 'tests/cluster/down.sh >/dev/null 2>&1 || true' EXIT
TC_AUDIT_READS=1 tests/cluster/up.sh
set -a
# shellcheck disable=SC1091
. target/testcluster/env
set +a
export SCALE_RUN=1 SCALE_NODES="${SCALE_NODES:-1000}" SCALE_PLACEMENTS="${SCALE_PLACEMENTS:-300}"
cargo test "${profile[@]}" --test cluster_tier -- --ignored --nocapture cluster_agent_cost::
cargo test "${profile[@]}" --test cluster_tier -- --ignored --nocapture cluster_controller_scale::scale_run
