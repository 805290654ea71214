#!/usr/bin/env bash
# Runs the cluster tier (tests/cluster_tier.rs, every test `#[ignore]`d) one area at a time:
# an area is a module of that binary (`cluster_agent`, `cluster_dra`, ...), and its tests run
# in parallel with each other but never beside another area's, as when each area was its own
# test binary. Every area runs even when an earlier one failed; the exit status is 1 if any did.
#
# Usage: scripts/run-cluster-tier.sh [--except AREA]... [AREA]...
#   With AREAs: only those. Without: every area the binary has, less the --except ones.
#   Needs the cluster's env in the environment (`set -a; . $TESTCLUSTER_WORK/env; set +a`).
#   CARGO (default cargo) and CLUSTER_TIER_ARGS (extra libtest arguments) are honoured.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}

only=() except=()
while (($#)); do
  case $1 in
    --except) except+=("$2"); shift 2 ;;
    -h | --help) sed -n '2,10p' "$0"; exit 0 ;;
    *) only+=("$1"); shift ;;
  esac
done

"$cargo" test --test cluster_tier --no-run
if ((${#only[@]})); then
  areas=("${only[@]}")
else
  mapfile -t areas < <("$cargo" test -q --test cluster_tier -- --ignored --list 2>/dev/null |
    sed -n 's/^\([a-z0-9_]*\)::.*: test$/\1/p' | sort -u)
fi
if ((${#areas[@]} == 0)); then
  echo "error: the cluster tier lists no tests" >&2
  exit 1
fi

failed=()
for area in "${areas[@]}"; do
  for skip in "${except[@]}"; do
    [[ $area == "$skip" ]] && continue 2
  done
  started=$SECONDS
  echo "== cluster tier: $area"
  # The trailing `::` keeps `cluster_agent` from also matching `cluster_agent_dra::...`.
  # shellcheck disable=SC2086 # CLUSTER_TIER_ARGS is a list of words on purpose
  if "$cargo" test --test cluster_tier -- --ignored ${CLUSTER_TIER_ARGS:-} "$area::"; then
    echo "== $area: passed in $((SECONDS - started)) s"
  else
    echo "== $area: FAILED after $((SECONDS - started)) s"
    failed+=("$area")
  fi
done
if ((${#failed[@]})); then
  echo "error: cluster tier areas failed: ${failed[*]}" >&2
  exit 1
fi
