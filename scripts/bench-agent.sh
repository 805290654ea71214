#!/usr/bin/env bash
# Agent footprint: peak RSS and CPU time per detection cycle of the release `hwaccel agent`
# against a real local control plane, on a fixture host, over a fixed number of cycles.
#
#   scripts/bench-agent.sh [SCENARIO] [SECONDS]     (defaults: h100-8x-nvswitch 60)
#
# The agent runs with a 1 s interval, so it detects about once a second; on an unchanged host it
# writes nothing after the first cycle (checked from its own metrics). Prints one line of
# figures for docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SCENARIO=${1:-h100-8x-nvswitch}
SECONDS_TO_RUN=${2:-60}
WORK=${BENCH_WORK:-$PWD/target/bench-agent}
HOST=fixtures/hosts/$SCENARIO
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')

cargo build --release --quiet --bin hwaccel
mkdir -p "$WORK"
tests/cluster/up.sh "$WORK/cluster" >/dev/null
trap 'kill "${AGENT:-}" 2>/dev/null || true; tests/cluster/down.sh "$WORK/cluster" >/dev/null 2>&1 || true' EXIT
set -a; . "$WORK/cluster/env"; set +a
kubectl() { "$TESTCLUSTER_BIN/kubectl" "$@"; }
kubectl apply --server-side -f crds/ >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
printf 'apiVersion: v1\nkind: Node\nmetadata: {name: bench-node}\n' | kubectl apply -f - >/dev/null

./target/release/hwaccel agent --node-name bench-node --host-root "$HOST" --tool-path "$HOST/commands" \
  --backends all,-vulkan --interval 1s --metrics-addr "127.0.0.1:$PORT" --health-addr 127.0.0.1:0 --log-format json \
  >"$WORK/agent.log" 2>&1 &
AGENT=$!
sleep 3 # first cycle and its writes
metric() { curl -fsS "http://127.0.0.1:$PORT/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
ticks() { awk '{print $14 + $15}' "/proc/$AGENT/stat"; }
cycles0=$(metric hwaccel_agent_detections_total); writes0=$(curl -fsS "http://127.0.0.1:$PORT/metrics" | awk '/^hwaccel_agent_api_writes_total/ {s += $2} END {print s + 0}')
ticks0=$(ticks)
sleep "$SECONDS_TO_RUN"
cycles1=$(metric hwaccel_agent_detections_total); writes1=$(curl -fsS "http://127.0.0.1:$PORT/metrics" | awk '/^hwaccel_agent_api_writes_total/ {s += $2} END {print s + 0}')
ticks1=$(ticks)
hz=$(getconf CLK_TCK)
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$AGENT/status")
rss=$(awk '/VmRSS/ {print $2}' "/proc/$AGENT/status")
python3 - "$SCENARIO" "$cycles0" "$cycles1" "$ticks0" "$ticks1" "$hz" "$hwm" "$rss" "$writes0" "$writes1" <<'EOF'
import sys
scenario, c0, c1, t0, t1, hz, hwm, rss, w0, w1 = sys.argv[1:]
cycles = float(c1) - float(c0)
cpu_ms = (float(t1) - float(t0)) * 1000 / float(hz)
print(f"scenario={scenario} steady_cycles={cycles:.0f} cpu_per_cycle_ms={cpu_ms / max(cycles, 1):.2f} "
      f"peak_rss_mib={int(hwm) / 1024:.1f} rss_mib={int(rss) / 1024:.1f} "
      f"api_writes_during_steady_state={float(w1) - float(w0):.0f}")
EOF
