#!/usr/bin/env bash
# Scale run of the ModelPlacement controller: kwok fake Nodes with synthetic inventories and
# hundreds of ModelPlacements against a real control plane (tests/cluster_controller_scale.rs).
#
#   scripts/scale.sh                      # 1000 nodes, 300 placements
#   SCALE_NODES=200 SCALE_PLACEMENTS=50 scripts/scale.sh
#   SCALE_PROFILE=debug scripts/scale.sh  # a debug controller (default: release, as shipped)
#   SCALE_WORKERS=1 scripts/scale.sh      # --placement-workers (default: the controller's, 4)
#
# Every run gets a fresh control plane (a cluster still up from tests is stopped first, and
# the run's own is stopped at the end): 1,000 kwok Nodes left by an earlier run would keep
# heartbeating and load the apiserver the run measures.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=()
[[ "${SCALE_PROFILE:-release}" == release ]] && profile=(--release)
# Build before the cluster starts, so the compiler does not compete with it.
cargo test "${profile[@]}" --test cluster_tier --no-run
tests/cluster/down.sh >/dev/null 2>&1 || true
trap 'tests/cluster/down.sh >/dev/null 2>&1 || true' EXIT
tests/cluster/up.sh --full
set -a
# shellcheck disable=SC1091
. target/testcluster/env
set +a
export SCALE_RUN=1 SCALE_NODES="${SCALE_NODES:-1000}" SCALE_PLACEMENTS="${SCALE_PLACEMENTS:-300}"
cargo test "${profile[@]}" --test cluster_tier -- --ignored --nocapture cluster_controller_scale::scale_run
