#!/usr/bin/env bash
# `make demo`: the operator's main job end to end on a local control plane.
#
#   1. builds (or reuses) the local control plane from tests/cluster and starts it, with this
#      machine joined as a real node (kubelet, containerd 2.x: `up.sh --node`);
#   2. builds the image without Docker (`make image-static`), imports it on the real node and
#      installs the chart with `helm install`: the controller and the real node's agent run
#      as pods, as on any cluster;
#   3. creates three fake Nodes (kwok) and runs one agent process per fake node against a
#      fixture host: an 8x H100 NVSwitch node, an 8x MI300X node and a CPU-only node;
#   4. applies the example ModelPlacements, which the in-cluster controller plans;
#   5. prints `kubectl get accinv`, `kubectl get mp -o wide`, and a nodeSelector to use;
#   6. prints `hwaccel fleet` (sick or missing, the degraded H100 among them, what fits now),
#      the same question for one model (the same answer, with the same stated assumptions)
#      and, for the placement that does not fit, which nodes to add;
#   7. stops everything it started.
#
# Where no real node can run (not root, not Linux, DEMO_REAL_NODE=0), it says so and falls
# back to the controller as a local process next to the fake nodes, without the chart's pods.
#
# Nothing here dials anything but 127.0.0.1 and the bridge the real node creates (pod traffic
# never leaves the machine). Set DEMO_KEEP=1 to leave the cluster running.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${DEMO_WORK:-$ROOT/target/demo}
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug/hwaccel
PIDS=()

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

cleanup() {
  local status=$?
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "${DEMO_KEEP:-0}" != 1 ]; then
    tests/cluster/down.sh "$WORK/cluster" >/dev/null 2>&1 || true
  else
    echo "cluster left running: source $WORK/cluster/env"
  fi
  if [ $status -ne 0 ]; then
    echo "demo failed; process logs:" >&2
    tail -n 20 "$WORK"/*.log 2>/dev/null >&2 || true
  fi
}
trap cleanup EXIT

say "Building hwaccel"
cargo build --quiet --bin hwaccel

REAL=0
if [ "${DEMO_REAL_NODE:-1}" = 1 ]; then
  why=$(bash -c '. tests/cluster/lib.sh; . tests/cluster/node.sh; tc_node_supported')
  if [ -z "$why" ]; then REAL=1; else
    echo "note: this machine cannot run a real node ($why): the controller runs as a local"
    echo "      process and no pod of the chart starts (set up a root Linux machine for that)"
  fi
fi
mkdir -p "$WORK"
if [ $REAL = 1 ]; then
  say "Building the image without Docker (make image-static: the static musl binary as an OCI archive)"
  make --no-print-directory image-static >"$WORK/image.log" 2>&1 || { tail -n 20 "$WORK/image.log" >&2; exit 1; }
  tail -n 1 "$WORK/image.log"
  say "Starting the local control plane with this machine as a real node (kubelet, containerd) and kwok"
  tests/cluster/up.sh --node "$WORK/cluster" >/dev/null
else
  say "Starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)"
  tests/cluster/up.sh --full "$WORK/cluster" >/dev/null
fi
set -a; . "$WORK/cluster/env"; set +a
kubectl() { "$TESTCLUSTER_BIN/kubectl" "$@"; }

if [ $REAL = 1 ]; then
  say "helm install hwaccel charts/hwaccel-operator (the image imported on the real node)"
  "$TESTCLUSTER_BIN/ctr" --address "$TESTCLUSTER_CONTAINERD_SOCK" -n k8s.io images import --local \
    target/image/hwaccel-static.oci.tar >/dev/null
  # The chart's pods on the real node only: the fake nodes run no containers, their agents
  # are the local processes below.
  on_real_node="{\"kubernetes.io/hostname\":\"$TESTCLUSTER_NODE\"}"
  "$TESTCLUSTER_BIN/helm" install hwaccel charts/hwaccel-operator --namespace hwaccel-system \
    --create-namespace --set image.pullPolicy=Never --set logFormat=text \
    --set-json "agent.nodeSelector=$on_real_node" --set-json "controller.nodeSelector=$on_real_node" \
    --wait --timeout 180s >/dev/null
  kubectl -n hwaccel-system get pods -o wide | sed 's/^/  /'
else
  say "Installing the CRDs and the admission policy"
  kubectl apply --server-side -f crds/ >/dev/null
  kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
  kubectl create namespace hwaccel-system --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  "$TESTCLUSTER_BIN/helm" template hwaccel charts/hwaccel-operator --namespace hwaccel-system \
    --show-only templates/serviceaccounts.yaml --show-only templates/agent-rbac.yaml \
    --show-only templates/controller-rbac.yaml --show-only templates/admission-policy.yaml \
    | kubectl apply --server-side -f - >/dev/null
  kubectl get crd -o custom-columns=CRD:.metadata.name --no-headers | sed 's/^/  /'
fi

# node name -> fixture host
declare -A HOSTS=(
  [dgx-h100-01]=h100-8x-nvswitch
  [mi300x-01]=mi300x-8x
  [cpu-01]=cpu-only-vm
)

say "Creating fake Nodes and starting one agent per node"
for node in "${!HOSTS[@]}"; do
  cat <<YAML | kubectl apply -f - >/dev/null
apiVersion: v1
kind: Node
metadata:
  name: $node
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {kubernetes.io/hostname: $node, kubernetes.io/os: linux, type: kwok}
YAML
done
for node in $(printf '%s\n' "${!HOSTS[@]}" | sort); do
  host=fixtures/hosts/${HOSTS[$node]}
  "$BIN" agent --node-name "$node" --host-root "$host" --tool-path "$host/commands" \
    --backends all,-vulkan --interval 30s --metrics-addr 127.0.0.1:0 --health-addr 127.0.0.1:0 --log-format text \
    >"$WORK/agent-$node.log" 2>&1 &
  PIDS+=($!)
  echo "  agent for $node reads $host"
done

for node in "${!HOSTS[@]}"; do
  for _ in $(seq 120); do
    kubectl get accinv "$node" >/dev/null 2>&1 && break
    sleep 0.5
  done
done

say "kubectl get acceleratorinventories"
kubectl get accinv

say "Node labels written by the agents (hwaccel.io/*)"
kubectl get nodes -l type=kwok -o json \
  | python3 -c '
import json, sys
keep = ["present", "product", "count", "memory-gib", "interconnect", "precision.fp8"]
for node in json.load(sys.stdin)["items"]:
    labels = node["metadata"]["labels"]
    shown = [k + "=" + labels["hwaccel.io/" + k] for k in keep if "hwaccel.io/" + k in labels]
    print("  %-12s %s" % (node["metadata"]["name"], ", ".join(shown)))
'

if "$BIN" controller --help >/dev/null 2>&1; then
  if [ $REAL = 1 ]; then
    say "Applying example ModelPlacements (the controller runs as the chart's Deployment)"
    kubectl -n hwaccel-system get lease hwaccel-controller -o jsonpath='  Lease held by {.spec.holderIdentity}{"\n"}'
  else
    say "Starting the controller and applying example ModelPlacements"
    "$BIN" controller --metrics-addr 127.0.0.1:0 --health-addr 127.0.0.1:0 --leader-election-namespace hwaccel-system \
      --log-format text >"$WORK/controller.log" 2>&1 &
    PIDS+=($!)
  fi
  kubectl apply -f manifests/examples/serve-llama-3.1-8b.yaml -f manifests/examples/serve-llama-3.1-70b.yaml >/dev/null
  cat <<'YAML' | kubectl apply -f - >/dev/null
apiVersion: hwaccel.io/v1alpha1
kind: ModelPlacement
metadata: {name: serve-deepseek-v3, namespace: default}
spec:
  model: {preset: deepseek-v3}
  goal: {serve: {context: 131072, concurrency: 64}}
  constraints: {precision: bf16, maxNodes: 1}
YAML
  for _ in $(seq 120); do
    pending=$(kubectl get mp -A -o jsonpath='{range .items[*]}{.status.state}{"\n"}{end}' | grep -c '^$' || true)
    [ "$pending" = 0 ] && break
    sleep 0.5
  done
  say "kubectl get modelplacements -o wide"
  kubectl get mp -o wide
  say "Where to run serve-llama-3-1-70b: put this nodeSelector on its pods"
  kubectl get mp serve-llama-3-1-70b -o jsonpath='{.status.nodeSelector}'; echo
  say "Why serve-deepseek-v3 does not fit"
  kubectl get mp serve-deepseek-v3 -o jsonpath='{range .status.reasons[*]}  - {@}{"\n"}{end}{range .status.suggestions[*]}  + {@}{"\n"}{end}'
  say "hwaccel fleet: sick or missing, and what fits now on the free devices"
  "$BIN" fleet --context 8192
  say "hwaccel fleet --model deepseek-v3 --context 8192: the table's question for one model, the table's answer"
  "$BIN" fleet --model deepseek-v3 --context 8192 | sed -n '/^What fits now/,/^$/p'
  say "hwaccel fleet --model deepseek-v3 --precision bf16 --context 131072: what to add to run it at BF16 with a 128k context"
  "$BIN" fleet --model deepseek-v3 --precision bf16 --context 131072 \
    | sed -n '/^What fits now/,$p'
else
  say "No controller in this build; planning against the published inventories instead"
  kubectl get accinv -o yaml >"$WORK/inventories.yaml"
  "$BIN" plan --model llama-3.1-70b --inventory "$WORK/inventories.yaml" --serve --context 32768 --concurrency 16 || true
fi

say "Done; stopping the agents and the control plane"
