#!/usr/bin/env bash
# (Re)generate tests/cluster/k8s/go.mod + go.sum for a Kubernetes release.
# The staging-module replace list is derived from k8s.io/kubernetes's own go.mod
# as served by the Go module proxy, so it never drifts from the release.
#
#   usage: tests/cluster/gen-gomod.sh v1.37.2            (tests/cluster/k8s: the tested release)
#          tests/cluster/gen-gomod.sh v1.35.4 compat     (tests/cluster/compat: the oldest
#                                                         supported minor, tests/cluster/compat.sh)
set -euo pipefail
K=${1:?usage: $0 v1.X.Y [k8s|compat]}
DIR=${2:-k8s}
case $DIR in k8s|compat) ;; *) echo "gen-gomod.sh: the module dir is k8s or compat, got '$DIR'" >&2; exit 2;; esac
case $K in v1.*.*) ;; *) echo "gen-gomod.sh: expected a version like v1.36.3, got '$K'" >&2; exit 2;; esac
S="v0.${K#v1.}"                                   # v1.36.3 -> v0.36.3
mkdir -p "$(dirname "$0")/$DIR"
cd "$(dirname "$0")/$DIR"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
rm -f go.mod go.sum
go mod init example.com/hwaccel-operator/testcluster/k8s >&2
kmod=$(go mod download -json "k8s.io/kubernetes@$K" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
[ -f "$kmod" ] || { echo "gen-gomod.sh: could not download go.mod of k8s.io/kubernetes@$K" >&2; exit 1; }
mods=$(sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => \./staging/src/.*#\1#p' "$kmod")
[ -n "$mods" ] || { echo "gen-gomod.sh: no staging replaces found in $kmod" >&2; exit 1; }
# Same go directive as Kubernetes itself.
go mod edit -go="$(sed -n 's/^go \(.*\)/\1/p' "$kmod")"
for m in $mods; do go mod edit -replace="$m=$m@$S"; done   # replaces BEFORE the require
go mod edit -require="k8s.io/kubernetes@$K"
for t in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
  go mod edit -tool="k8s.io/kubernetes/cmd/$t"
done
go mod tidy
echo "gen-gomod.sh: replaced $(echo "$mods" | wc -w) staging modules at $S" >&2
