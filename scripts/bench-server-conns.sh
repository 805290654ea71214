#!/usr/bin/env bash
# Memory of `hwaccel agent` while a peer holds thousands of half-sent requests on its
# metrics/health port (issue 11: 5,000 idle half-sent requests took the agent from 14 to 99 MB).
#
# Usage: scripts/bench-server-conns.sh [BINARY] [CONNECTIONS] [HOLD_SECONDS]
#   BINARY       default target/release/hwaccel
#   CONNECTIONS  default 5000
#   HOLD_SECONDS how long the connections are held before the figures are read (default 3,
#                under the server's 5 s header timeout, so all of them are still open)
#
# The agent runs against a fake apiserver on 127.0.0.1 that never answers (its loop is idle
# between failing cycles) and the cpu-only-vm fixture; everything binds 127.0.0.1. Prints RSS
# before, RSS while the connections are held, the peak (VmHWM), and how many connections the
# server kept open.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/hwaccel}
connections=${2:-5000}
hold=${3:-3}
ulimit -n "$((connections + 1024))"

work=$(mktemp -d)
trap 'kill "${agent:-}" "${api:-}" 2>/dev/null || true; rm -rf "$work"' EXIT

# A hung apiserver: accepts, never answers.
python3 - "$work/api.port" <<'EOF' &
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(128)
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
held = []
while True:
    held.append(s.accept()[0])
EOF
api=$!
until [ -s "$work/api.port" ]; do sleep 0.1; done
cat >"$work/kubeconfig" <<EOF
apiVersion: v1
kind: Config
current-context: hung
clusters: [{name: hung, cluster: {server: 'http://127.0.0.1:$(cat "$work/api.port")'}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: hung, context: {cluster: hung, user: u}}]
EOF
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# Binaries from before issue 11 have no --api-timeout (their calls to this apiserver hang).
extra=()
if "$bin" agent --help | grep -q -- --api-timeout; then extra=(--api-timeout 1s); fi
# Binaries from before issue 27 serve the probes on the metrics port; newer ones on their own.
if "$bin" agent --help | grep -q -- --health-addr; then extra+=(--health-addr 127.0.0.1:0); fi
KUBECONFIG=$work/kubeconfig NODE_NAME=bench RUST_LOG=error "$bin" agent \
  --host-root fixtures/hosts/cpu-only-vm --backends all,-vulkan \
  --metrics-addr "127.0.0.1:$port" "${extra[@]}" 2>"$work/agent.log" &
agent=$!
until curl -fsS "http://127.0.0.1:$port/metrics" >/dev/null 2>&1; do sleep 0.1; done
sleep 2

rss() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$agent/status"; }
before=$(rss VmRSS)
python3 - "$port" "$connections" "$hold" "$agent" <<'EOF'
import socket, sys, time
port, n, hold, pid = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
held, refused = [], 0
for _ in range(n):
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        s.send(b"GET /healthz HTTP/1.1\r\nHost: a\r\n")  # never finished
        held.append(s)
    except OSError:
        refused += 1
        s.close()
time.sleep(hold)
open_now = 0
for s in held:
    s.setblocking(False)
    try:
        open_now += s.recv(1) != b""
    except BlockingIOError:
        open_now += 1
    except OSError:
        pass
status = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status"))
print(f"held    {status['VmRSS'].strip()} (connections opened {len(held)}, refused {refused}, still open after {hold}s: {open_now})")
EOF
echo "before  ${before} kB"
echo "peak    $(rss VmHWM) kB"
sleep 1
echo "after   $(rss VmRSS) kB"
