# shellcheck shell=bash
# The real-node tier: this machine joins the test control plane as one real Kubernetes node
# (containerd 2.x + runc + the CNI bridge plugin + kubelet + kube-proxy), next to the kwok
# nodes. Sourced by up.sh (`--node`) and down.sh after lib.sh; not executed.
#
# What it changes on the host, and undoes in tc_node_down (recorded under $WORK/node/run):
#   - a bridge, $TC_NODE_BRIDGE with $TC_NODE_BRIDGE_IP/24: the apiserver listens on it (and
#     nowhere else but loopback), pods live behind it;
#   - sysctls: ip_forward and bridge-nf-call-iptables (pods reach Services through
#     kube-proxy's DNAT), and the ones the kubelet sets itself (vm.overcommit_memory,
#     kernel.panic...): their values before are recorded and written back;
#   - an iptables chain HWACCEL-NODE in FORWARD that drops anything from the bridge to any
#     other interface: pod traffic never leaves this machine (and the CNI config never
#     masquerades); kube-proxy's, the kubelet's and the CNI plugin's own chains;
#   - processes (containerd, kubelet, kube-proxy, the shims), mounts under the work dir and
#     /run/containerd, /run/netns/cni-*, the kubepods cgroups, and the few host paths the
#     kubelet and libcni hard-code (/var/lib/kubelet/device-plugins, /var/log/containers,
#     /var/lib/cni).
# Only one real-node cluster can run on a machine at a time (fixed ports 10250/10248 and
# the paths above); up.sh refuses a second one.

TC_NODE_BRIDGE=hwaccel0
TC_NODE_BRIDGE_IP=10.89.0.1
TC_NODE_POD_CIDR=10.89.0.0/24
# Differs from the kwok-only tier's 10.0.0.0/24: kube-proxy's DNAT applies to every
# connection from this host to the range.
TC_NODE_SERVICE_CIDR=10.96.0.0/24
TC_NODE_SERVICE_IP=10.96.0.1
TC_NODE_NAME=${TESTCLUSTER_NODE_NAME:-hwaccel-real-node}
TC_NODE_PAUSE_IMAGE=localhost/hwaccel-test/pause:1
TC_NODE_BUSYBOX_IMAGE=localhost/hwaccel-test/busybox:1
# The sysctls this tier or the kubelet writes (the kubelet sets the vm./kernel. ones itself).
TC_NODE_SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables
  net.bridge.bridge-nf-call-ip6tables net.ipv4.conf.all.route_localnet vm.overcommit_memory
  vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys
  kernel.keys.root_maxbytes)
TC_NODE_COMPONENTS=(containerd kubelet kube-proxy)
TC_NODE_APT=(runc containernetworking-plugins iptables conntrack musl-tools busybox-static)

# tc_node_supported: why this machine cannot run a real node (on stdout), or nothing.
tc_node_supported() {
  local why; why=$(tc_node_host_supported)
  [ -z "$why" ] || { echo "$why"; return; }
  command -v ip >/dev/null || { echo "no 'ip' command (iproute2)"; return; }
}

# tc_node_host_supported: the part of tc_node_supported no package fixes (scripts/setup.sh
# installs iproute2 with the node's packages where this says nothing).
tc_node_host_supported() {
  [ "$(uname -s)" = Linux ] || { echo "not Linux"; return; }
  [ "$(id -u)" = 0 ] || { echo "not root (the kubelet and containerd need root)"; return; }
  [ -d /proc/sys/net/bridge ] || modprobe br_netfilter 2>/dev/null || true
  [ -d /proc/sys/net/bridge ] || { echo "no br_netfilter (net.bridge sysctls)"; return; }
}

# tc_node_deps: the Debian packages the tier needs are installed. scripts/setup.sh installs
# them (`make setup`, run first by `make demo` and `make test`): by the time this tier starts,
# `make image-static` has needed musl-tools already, so installing here would be too late.
tc_node_deps() {
  local missing=() p
  for p in "${TC_NODE_APT[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] || tc_die "missing packages ${missing[*]}: run scripts/setup.sh (make setup)"
}

# The interfaces the machine reaches the outside through (default routes).
tc_node_uplinks() { ip -o route show default 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p' | sort -u; }

# tc_node_host_up: bridge, sysctls (recorded first), the FORWARD guard. Before the apiserver.
tc_node_host_up() {
  local N=$WORK/node s
  mkdir -p "$N/run"
  if [ ! -f "$N/run/sysctl.orig" ]; then
    for s in "${TC_NODE_SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s" 2>/dev/null)"; done >"$N/run/sysctl.orig.tmp"
    mv "$N/run/sysctl.orig.tmp" "$N/run/sysctl.orig"
  fi
  if ! ip link show "$TC_NODE_BRIDGE" >/dev/null 2>&1; then
    ip link add "$TC_NODE_BRIDGE" type bridge || tc_die "cannot create bridge $TC_NODE_BRIDGE"
  fi
  # Ours either way: up.sh holds the one-real-node lock, so a bridge of this name already
  # there is one an earlier run failed to remove (a killed run, a deleted work dir), and
  # it goes at tc_node_down like one created here instead of outliving every later run.
  echo ours >"$N/run/bridge"
  ip addr replace "$TC_NODE_BRIDGE_IP/24" dev "$TC_NODE_BRIDGE"
  ip link set "$TC_NODE_BRIDGE" up
  # Pods reach the apiserver through the kubernetes Service (DNAT on this host), and one
  # pod reaches another through a Service across the bridge (bridge-nf-call-iptables).
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
  # Nothing from the bridge leaves through another interface: the machine forwards only
  # between pods on the bridge.
  iptables -N HWACCEL-NODE 2>/dev/null || iptables -F HWACCEL-NODE
  iptables -A HWACCEL-NODE -i "$TC_NODE_BRIDGE" ! -o "$TC_NODE_BRIDGE" -j DROP
  local up; for up in $(tc_node_uplinks); do iptables -A HWACCEL-NODE -o "$up" -j DROP; done
  iptables -C FORWARD -j HWACCEL-NODE 2>/dev/null || iptables -I FORWARD 1 -j HWACCEL-NODE
}

# tc_node_pki: the kubelet's client and serving certs, kube-proxy's client cert, and the
# apiserver's client cert towards kubelets. Needs $P (the cluster's pki dir).
tc_node_pki() {
  local N=$WORK/node
  mkdir -p "$N/pki"
  tc_node_sign() { # out subject eku [san]
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null
    openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
    { echo "basicConstraints=critical,CA:FALSE"; echo "keyUsage=critical,digitalSignature,keyEncipherment"
      echo "extendedKeyUsage=$3"; if [ -n "${4:-}" ]; then echo "subjectAltName=$4"; fi; } >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 3650 \
      -sha256 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
    rm -f "$1.csr" "$1.ext"; chmod 600 "$1.key"
  }
  tc_node_sign "$N/pki/kubelet-client" "/O=system:nodes/CN=system:node:$TC_NODE_NAME" clientAuth
  tc_node_sign "$N/pki/kubelet-serving" "/O=system:nodes/CN=system:node:$TC_NODE_NAME" serverAuth \
    "IP:$TC_NODE_BRIDGE_IP,DNS:$TC_NODE_NAME"
  tc_node_sign "$N/pki/kube-proxy" "/CN=system:kube-proxy" clientAuth
  tc_node_sign "$P/apiserver-kubelet-client" "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
}

tc_node_kubeconfig() { # out user cert-prefix
  cat >"$1" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: testcluster
  cluster: {server: "https://$TC_NODE_BRIDGE_IP:$API_PORT", certificate-authority: "$P/ca.crt"}
users:
- name: $2
  user: {client-certificate: "$3.crt", client-key: "$3.key"}
contexts:
- name: testcluster
  context: {cluster: testcluster, user: $2}
current-context: testcluster
YAML
  chmod 600 "$1"
}

# tc_node_containerd: containerd 2.x (from $BIN) with the CRI plugin on runc, the CNI bridge
# on $TC_NODE_BRIDGE, and the locally built pause image.
tc_node_containerd() {
  local N=$WORK/node runc cni
  runc=$(command -v runc) || tc_die "no runc on PATH"
  cni=/usr/lib/cni; [ -x "$cni/bridge" ] || cni=/opt/cni/bin
  [ -x "$cni/bridge" ] && [ -x "$cni/host-local" ] && [ -x "$cni/loopback" ] \
    || tc_die "the CNI bridge/host-local/loopback plugins are missing (containernetworking-plugins)"
  mkdir -p "$N/containerd/root" "$N/containerd/state" "$N/cni/conf" "$N/cni/data" "$N/images"
  cat >"$N/cni/conf/10-hwaccel.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "hwaccel-pods",
  "plugins": [
    {"type": "bridge", "bridge": "$TC_NODE_BRIDGE", "isGateway": true, "ipMasq": false,
     "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$N/cni/data",
              "ranges": [[{"subnet": "$TC_NODE_POD_CIDR", "rangeStart": "10.89.0.10",
                           "rangeEnd": "10.89.0.250", "gateway": "$TC_NODE_BRIDGE_IP"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"}
  ]
}
JSON
  cat >"$N/containerd/config.toml" <<TOML
version = 3
root = "$N/containerd/root"
state = "$N/containerd/state"
[grpc]
  address = "$N/run/containerd.sock"
[ttrpc]
  address = "$N/run/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$TC_NODE_PAUSE_IMAGE"
[plugins.'io.containerd.cri.v1.runtime']
  # Root on this machine kind has no CAP_SYS_RESOURCE: a sandbox's oom_score_adj of -998
  # would fail every pod ("can't get final child's PID from pipe").
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$cni"]
    conf_dir = "$N/cni/conf"
    max_conf_num = 1
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
TOML
  # The shim is found on PATH.
  tc_launch containerd env PATH="$BIN:$PATH" "$BIN/containerd" --config "$N/containerd/config.toml" \
    || return 1
  TC_WAIT_FOR=containerd tc_wait 60 "containerd socket" \
    "$BIN/ctr" --address "$N/run/containerd.sock" version || return 1
  # The pause image: a static C program, no registry needed.
  local cc; cc=$(command -v musl-gcc || command -v gcc) || tc_die "no C compiler for the pause binary"
  "$cc" -static -Os -s -o "$N/images/pause" "$TC_HERE/node/pause.c" || tc_die "cannot build pause"
  python3 "$TC_REPO/scripts/oci-image.py" --stage pause --binary "$N/images/pause" \
    --name "$TC_NODE_PAUSE_IMAGE" --out "$N/images/pause.oci.tar" >&2 || return 1
  tc_node_import "$N/images/pause.oci.tar" || return 1
  # busybox for tests' client pods (wget a Service from inside the pod network).
  python3 "$TC_REPO/scripts/oci-image.py" --stage busybox --binary /bin/busybox \
    --name "$TC_NODE_BUSYBOX_IMAGE" --out "$N/images/busybox.oci.tar" >&2 || return 1
  tc_node_import "$N/images/busybox.oci.tar"
}

# tc_node_import ARCHIVE: make an OCI archive's image available to the kubelet.
tc_node_import() {
  "$BIN/ctr" --address "$WORK/node/run/containerd.sock" -n k8s.io images import --local "$1" >&2
}

# tc_node_kubelet: kubelet + kube-proxy; waits until the node is Ready.
tc_node_kubelet() {
  local N=$WORK/node
  mkdir -p "$N/kubelet" "$N/pod-logs"
  tc_node_kubeconfig "$N/kubelet.kubeconfig" "system:node:$TC_NODE_NAME" "$N/pki/kubelet-client"
  tc_node_kubeconfig "$N/kube-proxy.kubeconfig" system:kube-proxy "$N/pki/kube-proxy"
  cat >"$N/kubelet-config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine kind is cgroup v1 only; the kubelet refuses v1 unless told (1.35+).
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$N/run/containerd.sock
address: $TC_NODE_BRIDGE_IP
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
tlsCertFile: $N/pki/kubelet-serving.crt
tlsPrivateKeyFile: $N/pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $P/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
# No DNS server runs (nothing here resolves names), but a cluster without one warns on
# every pod (MissingClusterDNS); pods get this address in resolv.conf.
clusterDNS: [10.96.0.10]
resolvConf: /etc/resolv.conf
failSwapOn: false
podLogsDir: $N/pod-logs
serializeImagePulls: false
maxPods: 30
# A small test machine, its disk shared with builds: evict only when really short (absolute,
# not a share of a big disk). No imagefs thresholds: with containerd's
# root in the work dir the kubelet's cadvisor finds no image filesystem ("invalid capacity 0
# on image filesystem"), reads 0 bytes free, and would reclaim by deleting every exited
# container (and its logs) at once.
evictionHard: {memory.available: "200Mi", nodefs.available: "512Mi", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 98
imageGCLowThresholdPercent: 97
YAML
  tc_launch kubelet "$BIN/kubelet" --config="$N/kubelet-config.yaml" --kubeconfig="$N/kubelet.kubeconfig" \
    --root-dir="$N/kubelet" --hostname-override="$TC_NODE_NAME" --node-ip="$TC_NODE_BRIDGE_IP" \
    --node-labels=hwaccel.test/real-node=true --v=1 || return 1
  cat >"$N/kube-proxy-config.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $N/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $TC_NODE_POD_CIDR
hostnameOverride: $TC_NODE_NAME
bindAddress: $TC_NODE_BRIDGE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Leave the host's conntrack sysctls and route_localnet alone.
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false}
nodePortAddresses: ["$TC_NODE_BRIDGE_IP/32"]
YAML
  tc_launch kube-proxy "$BIN/kube-proxy" --config="$N/kube-proxy-config.yaml" --v=1 || return 1
  TC_WAIT_FOR=kubelet tc_wait 120 "node $TC_NODE_NAME Ready" tc_node_ready || return 1
}

tc_node_ready() {
  tc_api_get "/api/v1/nodes/$TC_NODE_NAME" | python3 -c '
import json, sys
node = json.load(sys.stdin)
ready = [c for c in node.get("status", {}).get("conditions", []) if c.get("type") == "Ready"]
sys.exit(0 if ready and ready[0].get("status") == "True" else 1)'
}

# tc_node_down: stop the node's processes and undo every host change. Safe to call twice.
tc_node_down() {
  local N=$WORK/node ctr=(env) sock
  [ -d "$N" ] || return 0
  sock=$N/run/containerd.sock
  # 1. Pods first, through the kubelet, so CNI DEL releases addresses and rules.
  if tc_pid kubelet >/dev/null && [ -f "$WORK/admin.kubeconfig" ] && [ -x "${BIN:-}/kubectl" ]; then
    timeout 60 "$BIN/kubectl" --kubeconfig="$WORK/admin.kubeconfig" delete pods --all -A \
      --grace-period=2 --wait=true >/dev/null 2>&1 || true
  fi
  tc_stop kubelet 20
  tc_stop kube-proxy 10
  # 2. Whatever containerd still runs.
  if [ -S "$sock" ] && [ -x "${BIN:-}/ctr" ]; then
    ctr=("$BIN/ctr" --address "$sock" -n k8s.io)
    local t c
    for t in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks kill -s KILL "$t" >/dev/null 2>&1; done
    sleep 1
    for t in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks rm -f "$t" >/dev/null 2>&1; done
    for c in $("${ctr[@]}" containers ls -q 2>/dev/null); do "${ctr[@]}" containers rm "$c" >/dev/null 2>&1; done
  fi
  tc_stop containerd 20
  # The shims (re-parented away from containerd) of this containerd only.
  local p
  for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  # 3. Host state.
  if [ -x "${BIN:-}/kube-proxy" ]; then "$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true; fi
  local m
  for m in $(awk '{print $5}' /proc/self/mountinfo | grep -E "^($N/|/run/containerd/|/run/netns/cni-)" | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
  done
  rm -f /run/netns/cni-* 2>/dev/null
  local ch r
  for ch in $(iptables -t nat -S 2>/dev/null | awk '/^-N CNI-/{print $2}'); do
    iptables -t nat -S POSTROUTING | grep -- "-j $ch" | sed 's/^-A/-D/' | while read -r r; do
      # shellcheck disable=SC2086 # a rule spec is words
      iptables -t nat $r; done
    iptables -t nat -F "$ch"; iptables -t nat -X "$ch"
  done
  for ch in $(iptables -S 2>/dev/null | awk '/^-N CNI-/{print $2}'); do
    iptables -S FORWARD | grep -- "-j $ch" | sed 's/^-A/-D/' | while read -r r; do
      # shellcheck disable=SC2086
      iptables $r; done
    iptables -F "$ch"; iptables -X "$ch"
  done
  local ipt tb
  for ipt in iptables ip6tables; do
    for tb in filter nat mangle; do
      $ipt -t $tb -S 2>/dev/null | grep -E -- "-j KUBE-(FIREWALL|KUBELET-CANARY|IPTABLES-HINT)" | sed 's/^-A/-D/' \
        | while read -r r; do
          # shellcheck disable=SC2086
          $ipt -t $tb $r; done
      for ch in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT KUBE-PROXY-CANARY; do
        $ipt -t $tb -F $ch 2>/dev/null; $ipt -t $tb -X $ch 2>/dev/null
      done
    done
  done
  while iptables -D FORWARD -j HWACCEL-NODE 2>/dev/null; do :; done
  iptables -F HWACCEL-NODE 2>/dev/null; iptables -X HWACCEL-NODE 2>/dev/null
  if [ -f "$N/run/bridge" ]; then ip link del "$TC_NODE_BRIDGE" 2>/dev/null; rm -f "$N/run/bridge"; fi
  # The kubelet's pod cgroups (cgroupfs driver), deepest first.
  local cg
  for cg in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/kubepods.slice; do
    [ -d "$cg" ] && find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  # Host paths the kubelet and libcni use whatever their root dirs are.
  find /var/log/containers -maxdepth 1 -lname "$N/*" -delete 2>/dev/null
  rm -rf /var/lib/cni/results/hwaccel-pods-* /var/lib/cni/networks/hwaccel-pods 2>/dev/null
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet /var/log/containers 2>/dev/null
  if [ -f "$N/run/sysctl.orig" ]; then
    local line
    while IFS= read -r line; do
      [ -n "${line#*=}" ] && sysctl -qw "$line" 2>/dev/null
    done <"$N/run/sysctl.orig"
    rm -f "$N/run/sysctl.orig"
  fi
  return 0
}
