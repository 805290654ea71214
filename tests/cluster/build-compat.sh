#!/usr/bin/env bash
# Build the control plane of the oldest supported Kubernetes minor (docs/install.md) for the
# compatibility tier: kube-apiserver, kube-controller-manager and kube-scheduler from the
# release pinned in tests/cluster/compat/go.mod (regenerate with
# `tests/cluster/gen-gomod.sh v1.35.X compat`). etcd, kubectl, helm and kwok are the tested
# release's (tests/cluster/build.sh --full): they talk to any supported apiserver, and
# building them twice would double the cold build for nothing.
#
#   tests/cluster/build-compat.sh    prints the bin dir on stdout; logs go to stderr
#
# Cached like build.sh, in ${TESTCLUSTER_CACHE:-$HOME/.cache/hwaccel-testcluster}/compat-<hash>/,
# where <hash> covers compat/go.mod, compat/go.sum, this script, `go version` and the bin dir
# of the tested release (whose etcd/kubectl/kwok are linked in). Its own cache key, so
# changing the oldest minor never rebuilds the tested release, and the other way round.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { echo "build-compat.sh: $*" >&2; }

# The tested release's tools first: this also finds Go the way build.sh does.
MAIN=$("$HERE/build.sh" --full)
if ! command -v go >/dev/null 2>&1; then
  for d in /usr/local/go/bin "$HOME/go/bin" "$HOME/sdk/go/bin"; do
    if [ -x "$d/go" ]; then PATH="$d:$PATH"; break; fi
  done
fi
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath -buildvcs=false"

GOVER=$(go env GOVERSION)
KEY=$( { cat "$HERE/compat/go.mod" "$HERE/compat/go.sum" "$HERE/build-compat.sh"
         echo "$GOVER $(go env GOOS GOARCH) $MAIN"; } | sha256sum | cut -c1-16)
CACHE=${TESTCLUSTER_CACHE:-$HOME/.cache/hwaccel-testcluster}
OUT=$CACHE/compat-$KEY
if [ -f "$OUT/.full" ]; then echo "$OUT"; exit 0; fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock-compat"
if command -v flock >/dev/null 2>&1; then
  flock -n 9 || { log "another build holds $CACHE/.lock-compat, waiting"; flock 9; }
fi
if [ -f "$OUT/.full" ]; then echo "$OUT"; exit 0; fi

KV=$(cd "$HERE/compat" && go list -m -f '{{.Version}}' k8s.io/kubernetes)   # e.g. v1.35.4
MAJOR=${KV#v}; MAJOR=${MAJOR%%.*}
MINOR=${KV#v*.}; MINOR=${MINOR%%.*}
LDF="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDF+=" -X $p.gitVersion=$KV -X $p.gitMajor=$MAJOR -X $p.gitMinor=$MINOR"
  LDF+=" -X $p.gitCommit=0000000000000000000000000000000000000000 -X $p.gitTreeState=clean"
  LDF+=" -X $p.buildDate=1970-01-01T00:00:00Z"
done

rm -rf "$CACHE"/.build-compat.* 2>/dev/null || true   # leftovers of killed builds (we hold the lock)
TMP=$(mktemp -d "$CACHE/.build-compat.$KEY.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
log "building kube-apiserver, kube-controller-manager, kube-scheduler ($KV, $GOVER) into $OUT; cold: 10-30 min on 2 cores"
t0=$(date +%s)
(cd "$HERE/compat" && go build -ldflags "$LDF" -o "$TMP/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler)
log "built in $(( $(date +%s) - t0 ))s"
got=$("$TMP/kube-apiserver" --version)
case $got in *"$KV"*) log "kube-apiserver --version: $got" ;;
  *) log "ERROR: version stamping failed (expected $KV, got '$got')"; exit 1 ;; esac
for t in etcd kubectl helm kwok kwokctl; do
  [ -x "$MAIN/$t" ] || { log "ERROR: $MAIN/$t missing (build.sh --full)"; exit 1; }
  ln -s "$MAIN/$t" "$TMP/$t"
done
touch "$TMP/.minimal" "$TMP/.full"
chmod 755 "$TMP"
rm -rf "$OUT"
mv "$TMP" "$OUT"
trap - EXIT
log "done: $(du -shL "$OUT" | cut -f1) in $OUT"
echo "$OUT"
