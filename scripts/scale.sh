#!/usr/bin/env bash
# `make scale`: the controller at fleet scale on the local control plane (full tier, kwok fake
# nodes). Arguments pass through to scripts/scale.py (`--nodes 1000 --placements 300`).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${SCALE_WORK:-$PWD/target/scale}
cargo build --release --quiet --bin hwaccel
tests/cluster/up.sh --full "$WORK/cluster" >/dev/null
trap 'tests/cluster/down.sh "$WORK/cluster" >/dev/null 2>&1 || true' EXIT
set -a; . "$WORK/cluster/env"; set +a
python3 scripts/scale.py "$@"
