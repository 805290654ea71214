#!/usr/bin/env bash
# Stop the cluster started by up.sh: kills each component's process group by its
# recorded pid, waits for it to exit, SIGKILLs stragglers. Safe to call twice
# or when nothing is running. Logs and data stay in WORKDIR for inspection.
#
#   tests/cluster/down.sh [WORKDIR]     (default ${TESTCLUSTER_WORK:-<repo>/target/testcluster})
set -euo pipefail
TC_SCRIPT=down.sh
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

WORK=
for a in "$@"; do
  case $a in
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    -*) tc_die "unknown option '$a'" ;;
    *) [ -z "$WORK" ] || tc_die "only one WORKDIR allowed"; WORK=$a ;;
  esac
done
WORK=${WORK:-$TC_DEFAULT_WORK}
[ -d "$WORK" ] || exit 0
WORK=$(cd "$WORK" && pwd)

exec 8>"$WORK/.lock"
flock 8

# shellcheck source=node.sh source-path=SCRIPTDIR
. "$TC_HERE/node.sh"
BIN=$(cat "$WORK/run/bin" 2>/dev/null || true)
rm -f "$WORK/env"
# The real node first (its pods are deleted through the apiserver, which must still run).
tc_node_down || true
[ "$(cat /run/hwaccel-testcluster-node 2>/dev/null)" != "$WORK" ] || rm -f /run/hwaccel-testcluster-node
for ((i = ${#TC_COMPONENTS[@]} - 1; i >= 0; i--)); do
  tc_stop "${TC_COMPONENTS[i]}" 30
done
left=()
for c in "${TC_COMPONENTS[@]}" "${TC_NODE_COMPONENTS[@]}"; do
  if pid=$(tc_pid "$c"); then left+=("$c:$pid"); fi
done
[ ${#left[@]} -eq 0 ] || tc_die "still running: ${left[*]}"
rm -f "$WORK/run/full"
