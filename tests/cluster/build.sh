#!/usr/bin/env bash
# Build the test control plane binaries from the Go module proxy (pinned by the
# committed go.mod/go.sum in tests/cluster/k8s and tests/cluster/tools).
#
#   tests/cluster/build.sh          etcd, kube-apiserver, kubectl        (minimal tier)
#   tests/cluster/build.sh --full   + kube-controller-manager, kube-scheduler,
#                                     helm, kwok, kwokctl                (full tier)
#   tests/cluster/build.sh --node   + kubelet, kube-proxy (same Kubernetes module),
#                                     containerd, containerd-shim-runc-v2, ctr
#                                     (tests/cluster/node)               (real-node tier;
#                                     implies --full)
#
# Prints the bin dir on stdout; everything else goes to stderr.
# Binaries are cached in ${TESTCLUSTER_CACHE:-$HOME/.cache/hwaccel-testcluster}/<hash>/
# where <hash> covers the go.mod/go.sum files, cmd/etcd, this script and `go version`.
# A warm run does no Go work at all (it only hashes a few files).
set -euo pipefail

FULL=0; NODE=0
for a in "$@"; do
  case $a in
    --full) FULL=1 ;;
    --node) FULL=1; NODE=1 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    *) echo "build.sh: unknown argument '$a'" >&2; exit 2 ;;
  esac
done

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { echo "build.sh: $*" >&2; }

if ! command -v go >/dev/null 2>&1; then
  for d in /usr/local/go/bin "$HOME/go/bin" "$HOME/sdk/go/bin"; do
    if [ -x "$d/go" ]; then PATH="$d:$PATH"; break; fi
  done
fi
if ! command -v go >/dev/null 2>&1; then
  if [ "${CI:-}" = true ]; then
    log "ERROR: 'go' not found on PATH (nor in /usr/local/go/bin). The cluster test tier needs Go >= 1.26 to build kube-apiserver/etcd; install it or put it on PATH."
  else
    log "ERROR: 'go' not found on PATH; install Go >= 1.26 to build the test cluster."
  fi
  exit 1
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath -buildvcs=false"

GOVER=$(go env GOVERSION)
KEY=$( { cat "$HERE/k8s/go.mod" "$HERE/k8s/go.sum" "$HERE/k8s/cmd/etcd/main.go" \
             "$HERE/tools/go.mod" "$HERE/tools/go.sum" "$HERE/node/go.mod" "$HERE/node/go.sum" \
             "$HERE/build.sh"
         echo "$GOVER $(go env GOOS GOARCH)"; } | sha256sum | cut -c1-16)
CACHE=${TESTCLUSTER_CACHE:-$HOME/.cache/hwaccel-testcluster}
OUT=$CACHE/$KEY

MARK=.minimal; [ $FULL = 1 ] && MARK=.full; [ $NODE = 1 ] && MARK=.node
if [ -f "$OUT/$MARK" ]; then echo "$OUT"; exit 0; fi

mkdir -p "$CACHE"
# One builder at a time per cache (concurrent up.sh calls wait instead of racing).
exec 9>"$CACHE/.lock"
if command -v flock >/dev/null 2>&1; then
  flock -n 9 || { log "another build holds $CACHE/.lock, waiting"; flock 9; }
fi
if [ -f "$OUT/$MARK" ]; then echo "$OUT"; exit 0; fi

KV=$(cd "$HERE/k8s" && go list -m -f '{{.Version}}' k8s.io/kubernetes)      # e.g. v1.36.3
MAJOR=${KV#v}; MAJOR=${MAJOR%%.*}
MINOR=${KV#v*.}; MINOR=${MINOR%%.*}
LDF="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDF+=" -X $p.gitVersion=$KV -X $p.gitMajor=$MAJOR -X $p.gitMinor=$MINOR"
  LDF+=" -X $p.gitCommit=0000000000000000000000000000000000000000 -X $p.gitTreeState=clean"
  LDF+=" -X $p.buildDate=1970-01-01T00:00:00Z"
done

# Build into a temp dir next to the target, then rename into place: a dir that
# exists is complete for the tier its marker names (.minimal / .full). --full
# after a minimal build only builds the missing binaries.
rm -rf "$CACHE"/.build.* 2>/dev/null || true      # leftovers of killed builds (we hold the lock)
TMP=$(mktemp -d "$CACHE/.build.$KEY.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
have() { [ -x "$OUT/$1" ]; }

want_k8s=()
have etcd || want_k8s+=(./cmd/etcd)
have kube-apiserver || want_k8s+=(k8s.io/kubernetes/cmd/kube-apiserver)
have kubectl || want_k8s+=(k8s.io/kubernetes/cmd/kubectl)
want_tools=()
if [ $FULL = 1 ]; then
  have kube-controller-manager || want_k8s+=(k8s.io/kubernetes/cmd/kube-controller-manager)
  have kube-scheduler || want_k8s+=(k8s.io/kubernetes/cmd/kube-scheduler)
  have helm || want_tools+=(helm.sh/helm/v4/cmd/helm)
  have kwok || want_tools+=(sigs.k8s.io/kwok/cmd/kwok)
  have kwokctl || want_tools+=(sigs.k8s.io/kwok/cmd/kwokctl)
fi
want_node=()
if [ $NODE = 1 ]; then
  have kubelet || want_k8s+=(k8s.io/kubernetes/cmd/kubelet)
  have kube-proxy || want_k8s+=(k8s.io/kubernetes/cmd/kube-proxy)
  for t in containerd containerd-shim-runc-v2 ctr; do
    have $t || want_node+=(github.com/containerd/containerd/v2/cmd/$t)
  done
fi

now() { date +%s; }
if [ ${#want_k8s[@]} -gt 0 ]; then
  log "building ${want_k8s[*]##*/} ($KV, $GOVER) into $OUT; cold: ~5 min minimal, 10-35 min full on 2 cores, depending on load"
  t0=$(now)
  (cd "$HERE/k8s" && go build -ldflags "$LDF" -o "$TMP/" "${want_k8s[@]}")
  log "k8s module built in $(( $(now) - t0 ))s"
fi
if [ ${#want_tools[@]} -gt 0 ]; then
  HV=$(cd "$HERE/tools" && go list -m -f '{{.Version}}' helm.sh/helm/v4)
  KWV=$(cd "$HERE/tools" && go list -m -f '{{.Version}}' sigs.k8s.io/kwok)
  TLDF="-s -w -X helm.sh/helm/v4/internal/version.version=$HV"
  # kwok's own Version default already matches its tag; point its default
  # Kubernetes version (used by kwokctl) at the control plane we build.
  TLDF+=" -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${KV#v}"
  log "building ${want_tools[*]##*/} (helm $HV, kwok $KWV)"
  t0=$(now)
  (cd "$HERE/tools" && go build -ldflags "$TLDF" -o "$TMP/" "${want_tools[@]}")
  log "tools module built in $(( $(now) - t0 ))s"
fi

if [ ${#want_node[@]} -gt 0 ]; then
  CV=$(cd "$HERE/node" && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
  # The same flags containerd's own Makefile stamps; no_btrfs/no_devmapper/no_zfs: those
  # snapshotters need cgo and host tools this tier does not use (overlayfs only).
  CLDF="-s -w -X github.com/containerd/containerd/v2/version.Version=$CV"
  CLDF+=" -X github.com/containerd/containerd/v2/version.Revision=0000000000000000000000000000000000000000"
  CLDF+=" -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
  log "building ${want_node[*]##*/} (containerd $CV)"
  t0=$(now)
  (cd "$HERE/node" && go build -tags "no_btrfs no_devmapper no_zfs no_aufs" -ldflags "$CLDF" -o "$TMP/" "${want_node[@]}")
  log "node module built in $(( $(now) - t0 ))s"
fi

api=$TMP/kube-apiserver; [ -x "$api" ] || api=$OUT/kube-apiserver
got=$("$api" --version)
log "kube-apiserver --version: $got"
case $got in *"$KV"*) ;; *) log "ERROR: version stamping failed (expected $KV)"; exit 1 ;; esac

touch "$TMP/.minimal"
[ $FULL = 1 ] && touch "$TMP/.full"
[ $NODE = 1 ] && touch "$TMP/.node"
chmod 755 "$TMP"
if [ -d "$OUT" ]; then
  # Each rename is atomic; markers go last so a reader never sees a marker
  # without its binaries.
  for f in "$TMP"/*; do [ -e "$f" ] && mv -f "$f" "$OUT/"; done
  mv -f "$TMP/.minimal" "$OUT/"
  if [ $FULL = 1 ]; then mv -f "$TMP/.full" "$OUT/"; fi
  if [ $NODE = 1 ]; then mv -f "$TMP/.node" "$OUT/"; fi
  rm -rf "$TMP"
else
  mv "$TMP" "$OUT"
fi
trap - EXIT
log "done: $(du -sh "$OUT" | cut -f1) in $OUT"
echo "$OUT"
