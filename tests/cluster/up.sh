#!/usr/bin/env bash
# Start a local Kubernetes control plane for the cluster test tier.
#
#   tests/cluster/up.sh [--full] [--node] [--compat] [WORKDIR]
#
#   minimal: etcd + kube-apiserver (127.0.0.1, random ports, client-cert auth,
#            Node,RBAC authorization, admission incl. ValidatingAdmissionPolicy,
#            ServiceAccount admission off because nothing creates SAs)
#   --full:  + kube-controller-manager, kube-scheduler and kwok (fake nodes:
#            Nodes annotated kwok.x-k8s.io/node=fake become Ready, node IP 127.0.0.1)
#   --node:  --full + this machine as one real node (containerd 2.x, runc, CNI bridge,
#            kubelet, kube-proxy; tests/cluster/node.sh): needs root on Linux. The apiserver
#            then listens on the node's bridge address (10.89.0.1), not on loopback, so pods
#            can reach it; nothing listens on the machine's own interfaces.
#   --compat: --full with the control plane (kube-apiserver, kube-controller-manager,
#            kube-scheduler) of the oldest supported minor (tests/cluster/build-compat.sh);
#            not with --node.
#
# WORKDIR defaults to ${TESTCLUSTER_WORK:-<repo>/target/testcluster}. Writes
# WORKDIR/admin.kubeconfig and WORKDIR/env (source it), logs in WORKDIR/logs.
# Prints the env file path on stdout. Idempotent: a healthy cluster of the
# requested tier is reused; stale state from a crash is cleaned up first.
# Stop with tests/cluster/down.sh [WORKDIR].
set -euo pipefail
TC_SCRIPT=up.sh
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FULL=0; NODE=0; COMPAT=0; WORK=
for a in "$@"; do
  case $a in
    --full) FULL=1 ;;
    --node) FULL=1; NODE=1 ;;
    --compat) FULL=1; COMPAT=1 ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    -*) tc_die "unknown option '$a'" ;;
    *) [ -z "$WORK" ] || tc_die "only one WORKDIR allowed"; WORK=$a ;;
  esac
done
WORK=${WORK:-$TC_DEFAULT_WORK}
mkdir -p "$WORK"; WORK=$(cd "$WORK" && pwd)

for c in curl openssl setsid python3; do
  command -v "$c" >/dev/null || tc_die "'$c' is required"
done

# shellcheck source=node.sh source-path=SCRIPTDIR
. "$TC_HERE/node.sh"
if [ $NODE = 1 ]; then
  why=$(tc_node_supported)
  [ -z "$why" ] || tc_die "this machine cannot run a real node: $why"
  mkdir -p "$WORK/logs"
  tc_node_deps
fi
[ $COMPAT = 1 ] && [ $NODE = 1 ] && tc_die "--compat and --node do not go together (the real node runs the tested release)"
BUILD_ARGS=(); [ $FULL = 1 ] && BUILD_ARGS=(--full); [ $NODE = 1 ] && BUILD_ARGS=(--node)
if [ $COMPAT = 1 ]; then
  BIN=$("$TC_HERE/build-compat.sh")
else
  BIN=$("$TC_HERE/build.sh" "${BUILD_ARGS[@]}")
fi
[ -x "$BIN/kube-apiserver" ] || tc_die "build.sh did not produce binaries in '$BIN'"

# Serialise up/down on one WORKDIR.
exec 8>"$WORK/.lock"
flock 8

# ---------------------------------------------------------------- reuse?
healthy() {
  [ -f "$WORK/env" ] && [ -f "$WORK/run/full" ] || return 1
  [ "$(cat "$WORK/run/bin" 2>/dev/null)" = "$BIN" ] || return 1
  local running_full; running_full=$(cat "$WORK/run/full")
  [ $FULL = 0 ] || [ "$running_full" = 1 ] || return 1
  [ "$(cat "$WORK/run/node" 2>/dev/null || echo 0)" = $NODE ] || return 1
  local comps=(etcd kube-apiserver)
  [ "$running_full" = 1 ] && comps+=(kube-controller-manager kube-scheduler kwok)
  [ $NODE = 1 ] && comps+=("${TC_NODE_COMPONENTS[@]}")
  local c; for c in "${comps[@]}"; do tc_pid "$c" >/dev/null || return 1; done
  tc_api_get /readyz >/dev/null 2>&1
}
if healthy; then
  tc_log "cluster in $WORK is already up (full=$(cat "$WORK/run/full")), reusing it"
  echo "$WORK/env"
  exit 0
fi

# ---------------------------------------------------------------- clean slate
if [ -d "$WORK/run" ] || [ -f "$WORK/env" ]; then
  tc_log "cleaning up previous cluster state in $WORK"
fi
rm -f "$WORK/env"
tc_node_down || true
for ((i = ${#TC_COMPONENTS[@]} - 1; i >= 0; i--)); do tc_stop "${TC_COMPONENTS[i]}" 5; done
rm -rf "$WORK/node" "$WORK/run" "$WORK/pki" "$WORK/etcd-data" "$WORK/logs" "$WORK/kwok" "$WORK/certs" \
       "$WORK/admin.kubeconfig"
mkdir -p "$WORK/run" "$WORK/logs" "$WORK/pki" "$WORK/certs"
echo "$BIN" >"$WORK/run/bin"
echo "$NODE" >"$WORK/run/node"
API_HOST=127.0.0.1
if [ $NODE = 1 ]; then
  # One real node per machine: the kubelet's ports and host paths are fixed.
  other=$(cat /run/hwaccel-testcluster-node 2>/dev/null || true)
  if [ -n "$other" ] && [ "$other" != "$WORK" ] && [ -d "$other/node" ] \
     && WORK=$other tc_pid kubelet >/dev/null; then
    tc_die "a real-node cluster already runs from $other (tests/cluster/down.sh $other)"
  fi
  echo "$WORK" >/run/hwaccel-testcluster-node
  tc_node_host_up
  API_HOST=$TC_NODE_BRIDGE_IP
fi
echo "$API_HOST" >"$WORK/run/apiserver.host"

fail() {
  tc_log "ERROR: $*"
  tc_tails
  tc_log "stopping what was started; logs kept in $WORK/logs"
  tc_node_down || true
  for ((i = ${#TC_COMPONENTS[@]} - 1; i >= 0; i--)); do tc_stop "${TC_COMPONENTS[i]}" 10; done
  exit 1
}
trap 'fail "interrupted"' INT TERM
T0=$(date +%s.%N)
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}s')" "$T0" "$(date +%s.%N)"; }

# ---------------------------------------------------------------- PKI
# One CA signs the apiserver serving cert and all client certs (tests can mint
# more client certs with ca.crt/ca.key, e.g. for system:node:<name>).
P=$WORK/pki
(
  cd "$P"
  ec() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
  ec ca.key
  openssl req -x509 -new -key ca.key -sha256 -days 3650 -subj "/CN=hwaccel-testcluster-ca" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" -out ca.crt
  sign() { # name subject eku [san]
    ec "$1.key"
    openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
    { echo "basicConstraints=critical,CA:FALSE"
      echo "keyUsage=critical,digitalSignature,keyEncipherment"
      echo "extendedKeyUsage=$3"
      if [ -n "${4:-}" ]; then echo "subjectAltName=$4"; fi; } >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -sha256 \
      -extfile "$1.ext" -out "$1.crt" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
  }
  sign apiserver "/CN=kube-apiserver" serverAuth \
    "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:10.0.0.1,IP:$TC_NODE_BRIDGE_IP,IP:$TC_NODE_SERVICE_IP"
  sign admin "/O=system:masters/CN=testcluster-admin" clientAuth
  # Aggregation layer (front proxy): its own CA, so a client cert from ca.crt can
  # never pose as the front proxy. Also lets kcm/scheduler delegate authentication
  # without complaining about a missing requestheader CA.
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout front-proxy-ca.key \
    -sha256 -days 3650 -subj "/CN=hwaccel-testcluster-front-proxy-ca" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" -out front-proxy-ca.crt 2>/dev/null
  ec front-proxy-client.key
  openssl req -new -key front-proxy-client.key -subj "/CN=front-proxy-client" -out fp.csr
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >fp.ext
  openssl x509 -req -in fp.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key -CAcreateserial \
    -days 3650 -sha256 -extfile fp.ext -out front-proxy-client.crt 2>/dev/null
  rm -f fp.csr fp.ext
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
  openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
  chmod 600 ./*.key
) || fail "PKI generation failed"
[ $NODE = 0 ] || (tc_node_pki) || fail "node PKI generation failed"

# ---------------------------------------------------------------- ports
SERVICE_CIDR=10.0.0.0/24; [ $NODE = 1 ] && SERVICE_CIDR=$TC_NODE_SERVICE_CIDR
tc_free_port ETCD_PORT; tc_free_port ETCD_PEER_PORT; tc_free_port API_PORT
echo "$API_PORT" >"$WORK/run/apiserver.port"
echo "$ETCD_PORT" >"$WORK/run/etcd.port"
SERVER=https://$API_HOST:$API_PORT

# ---------------------------------------------------------------- kubeconfig
KC=$WORK/admin.kubeconfig
b64() { base64 -w0 <"$1"; }
cat >"$KC.tmp" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: testcluster
  cluster:
    server: $SERVER
    certificate-authority-data: $(b64 "$P/ca.crt")
users:
- name: admin
  user:
    client-certificate-data: $(b64 "$P/admin.crt")
    client-key-data: $(b64 "$P/admin.key")
contexts:
- name: testcluster
  context:
    cluster: testcluster
    user: admin
    namespace: default
current-context: testcluster
YAML
chmod 600 "$KC.tmp"; mv "$KC.tmp" "$KC"

# ---------------------------------------------------------------- etcd
tc_log "starting etcd on 127.0.0.1:$ETCD_PORT"
tc_launch etcd "$BIN/etcd" --name=testcluster --data-dir="$WORK/etcd-data" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="testcluster=http://127.0.0.1:$ETCD_PEER_PORT" --initial-cluster-state=new \
  --unsafe-no-fsync=true --log-level=info \
  || fail "could not start etcd"
TC_WAIT_FOR=etcd tc_wait 60 "etcd /health" curl -fsS --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" \
  || fail "etcd did not become healthy"

# ---------------------------------------------------------------- kube-apiserver
# shellcheck disable=SC2054 # the commas are part of flag values
APISERVER_CMD=("$BIN/kube-apiserver"
  --etcd-servers="http://127.0.0.1:$ETCD_PORT"
  --bind-address="$API_HOST" --secure-port="$API_PORT"
  --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key"
  --client-ca-file="$P/ca.crt"
  --requestheader-client-ca-file="$P/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client
  --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group
  --requestheader-extra-headers-prefix=X-Remote-Extra-
  --proxy-client-cert-file="$P/front-proxy-client.crt" --proxy-client-key-file="$P/front-proxy-client.key"
  --service-account-issuer=https://kubernetes.default.svc.cluster.local
  --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key"
  --service-cluster-ip-range="$SERVICE_CIDR"
  --authorization-mode=Node,RBAC
  --enable-admission-plugins=NodeRestriction,ValidatingAdmissionPolicy
  # No DRA feature gates or runtime-config: 1.37 serves DeviceTaintRule in resource.k8s.io/v1
  # (GA, on by default), and the tests prove the controller works on a stock apiserver.
  # TC_APISERVER_PROFILING=1 serves /debug/pprof (for an admin only): the agents' watch memory
  # benchmark asks a heap profile with gc=1 to measure what is live after a collection.
  --allow-privileged=true --profiling="$( [ "${TC_APISERVER_PROFILING:-0}" = 1 ] && echo true || echo false )"
  # Every write, by user (metadata only, no bodies): tests count who wrote what (a steady
  # agent writes nothing) from this log.
  --audit-policy-file="$WORK/run/audit-policy.yaml" --audit-log-path="$WORK/logs/audit.log"
  --audit-log-maxsize="$( [ "${TC_AUDIT_READS:-0}" = 1 ] && echo 4000 || echo 200 )" --audit-log-maxbackup=1
  # Never resolve node host names; kwok nodes report InternalIP 127.0.0.1.
  --kubelet-preferred-address-types=InternalIP
)
if [ $NODE = 1 ]; then
  # Pods reach the apiserver at the bridge address through the kubernetes Service, whose
  # endpoint the default (lease) reconciler publishes; the apiserver reaches the kubelet
  # (logs, exec) with its own client certificate.
  APISERVER_CMD+=(--advertise-address="$API_HOST"
    --kubelet-client-certificate="$P/apiserver-kubelet-client.crt"
    --kubelet-client-key="$P/apiserver-kubelet-client.key")
else
  # Loopback advertise address needs the 'none' endpoint reconciler (lease/master-count
  # reject loopback); nothing in the kwok tier uses the in-cluster kubernetes Service.
  APISERVER_CMD+=(--advertise-address=127.0.0.1 --endpoint-reconciler-type=none)
fi
# Without kube-controller-manager nothing creates the 'default' ServiceAccount,
# so the ServiceAccount admission plugin would reject every Pod.
[ $FULL = 1 ] || APISERVER_CMD+=(--disable-admission-plugins=ServiceAccount)
# TC_AUDIT_READS=1 (the scale harness, scripts/scale.sh): reads and watches too, so a run can
# count every component's requests by verb from the log (the User-Agent says who).
if [ "${TC_AUDIT_READS:-0}" = 1 ]; then AUDITED_VERBS=""; else
  AUDITED_VERBS="
    verbs: [create, update, patch, delete, deletecollection]"; fi
cat >"$WORK/run/audit-policy.yaml" <<YAML
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata$AUDITED_VERBS
  - level: None
YAML
printf '%q ' "${APISERVER_CMD[@]}" >"$WORK/run/kube-apiserver.cmd"
echo >>"$WORK/run/kube-apiserver.cmd"

tc_log "starting kube-apiserver on $SERVER"
tc_launch kube-apiserver "${APISERVER_CMD[@]}" \
  || fail "could not start kube-apiserver"
TC_WAIT_FOR=kube-apiserver tc_wait 240 "kube-apiserver /readyz" tc_api_get /readyz \
  || fail "kube-apiserver did not become ready"
tc_log "kube-apiserver ready after $(elapsed)"

# ---------------------------------------------------------------- full tier
if [ $FULL = 1 ]; then
  tc_free_port KCM_PORT; tc_free_port SCHED_PORT; tc_free_port KWOK_PORT
  mkdir -p "$WORK/certs/kcm" "$WORK/certs/scheduler" "$WORK/kwok"

  tc_log "starting kube-controller-manager (127.0.0.1:$KCM_PORT)"
  tc_launch kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$KC" --authentication-kubeconfig="$KC" --authorization-kubeconfig="$KC" \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
    --cert-dir="$WORK/certs/kcm" \
    --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
    --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
    --use-service-account-credentials=false --profiling=false \
    || fail "could not start kube-controller-manager"

  tc_log "starting kube-scheduler (127.0.0.1:$SCHED_PORT)"
  tc_launch kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig="$KC" --authentication-kubeconfig="$KC" --authorization-kubeconfig="$KC" \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" \
    --cert-dir="$WORK/certs/scheduler" --profiling=false \
    || fail "could not start kube-scheduler"

  # kwok's stock stages, read from the kwok module in the Go module cache.
  KWOK_DIR=$(cd "$TC_HERE/tools" && GOFLAGS=-mod=readonly GOTOOLCHAIN=local go list -m -f '{{.Dir}}' sigs.k8s.io/kwok) \
    || fail "cannot locate the sigs.k8s.io/kwok module (go list -m in tests/cluster/tools)"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    [ -f "$KWOK_DIR/kustomize/stage/$f" ] || fail "kwok stage $f missing in $KWOK_DIR"
    echo "---"; cat "$KWOK_DIR/kustomize/stage/$f"
  done >"$WORK/kwok/stages.yaml"

  tc_log "starting kwok (127.0.0.1:$KWOK_PORT, manages Nodes annotated kwok.x-k8s.io/node=fake)"
  # KWOK_WORKDIR keeps kwok away from ~/.kwok (it would load ~/.kwok/kwok.yaml).
  tc_launch kwok env KWOK_WORKDIR="$WORK/kwok" "$BIN/kwok" \
    --kubeconfig="$KC" --config="$WORK/kwok/stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-ip=127.0.0.1 --node-port="$KWOK_PORT" --server-address="127.0.0.1:$KWOK_PORT" \
    --cidr=10.244.0.0/16 --node-lease-duration-seconds=40 \
    || fail "could not start kwok"

  TC_WAIT_FOR=kube-controller-manager tc_wait 180 "kube-controller-manager /healthz" \
    curl -fsSk --max-time 2 "https://127.0.0.1:$KCM_PORT/healthz" || fail "kube-controller-manager not healthy"
  TC_WAIT_FOR=kube-scheduler tc_wait 180 "kube-scheduler /healthz" \
    curl -fsSk --max-time 2 "https://127.0.0.1:$SCHED_PORT/healthz" || fail "kube-scheduler not healthy"
  TC_WAIT_FOR=kwok tc_wait 120 "kwok /healthz" \
    curl -fsS --max-time 2 "http://127.0.0.1:$KWOK_PORT/healthz" || fail "kwok not healthy"
  # The ServiceAccount controller has run once the default SA exists; Pods need it.
  TC_WAIT_FOR=kube-controller-manager tc_wait 180 "ServiceAccount default/default" \
    tc_api_get /api/v1/namespaces/default/serviceaccounts/default || fail "kcm did not create default SA"
fi
echo "$FULL" >"$WORK/run/full"

# ---------------------------------------------------------------- real node
if [ $NODE = 1 ]; then
  tc_log "starting containerd ($("$BIN/containerd" --version | awk '{print $3}')), then kubelet and kube-proxy as node $TC_NODE_NAME"
  tc_node_containerd || fail "containerd did not start"
  tc_node_kubelet || fail "node $TC_NODE_NAME did not become Ready"
  tc_log "node $TC_NODE_NAME Ready after $(elapsed)"
fi

# ---------------------------------------------------------------- env file
q() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
{
  echo "# written by tests/cluster/up.sh on $(date -u +%FT%TZ); source this file"
  echo "export KUBECONFIG=$(q "$KC")"
  echo "export TESTCLUSTER_WORK=$(q "$WORK")"
  echo "export TESTCLUSTER_BIN=$(q "$BIN")"
  echo "export TESTCLUSTER_FULL=$FULL"
  echo "export TESTCLUSTER_APISERVER=$(q "$SERVER")"
  echo "export TESTCLUSTER_CA_CRT=$(q "$P/ca.crt")"
  echo "export TESTCLUSTER_CA_KEY=$(q "$P/ca.key")"
  echo "export TESTCLUSTER_ETCD=$(q "http://127.0.0.1:$ETCD_PORT")"
  if [ $NODE = 1 ]; then
    echo "export TESTCLUSTER_NODE=$(q "$TC_NODE_NAME")"
    echo "export TESTCLUSTER_CONTAINERD_SOCK=$(q "$WORK/node/run/containerd.sock")"
    echo "export TESTCLUSTER_BUSYBOX_IMAGE=$(q "$TC_NODE_BUSYBOX_IMAGE")"
  fi
  echo "export TESTCLUSTER_K8S_VERSION=$(q "$("$BIN/kube-apiserver" --version | awk '{print $2}')")"
} >"$WORK/env.tmp"
mv "$WORK/env.tmp" "$WORK/env"
tc_log "cluster up (full=$FULL) in $(elapsed): source $WORK/env"
echo "$WORK/env"
