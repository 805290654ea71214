#!/usr/bin/env bash
# Scale run of the ModelPlacement controller: kwok fake Nodes with synthetic inventories and
# hundreds of ModelPlacements against a real control plane (tests/cluster_controller_scale.rs).
#
#   scripts/scale.sh                      # 1000 nodes, 300 placements
#   SCALE_NODES=200 SCALE_PLACEMENTS=50 scripts/scale.sh
#   SCALE_PROFILE=debug scripts/scale.sh  # a debug controller (default: release, as shipped)
#
# Starts the full test cluster when none is up; leaves it running (tests/cluster/down.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -f target/testcluster/env ]]; then
  tests/cluster/up.sh --full
fi
set -a
# shellcheck disable=SC1091
. target/testcluster/env
set +a
export SCALE_RUN=1 SCALE_NODES="${SCALE_NODES:-1000}" SCALE_PLACEMENTS="${SCALE_PLACEMENTS:-300}"
profile=()
[[ "${SCALE_PROFILE:-release}" == release ]] && profile=(--release)
cargo test "${profile[@]}" --test cluster_controller_scale -- --ignored --nocapture scale_run
