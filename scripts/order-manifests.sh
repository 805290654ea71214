#!/usr/bin/env bash
# Reorders a `helm template` stream (stdin) for `kubectl apply`, which creates objects in file
# order. Helm sorts by its own kind list, in which ValidatingAdmissionPolicy and its binding
# are unknown and therefore last, after the DaemonSet. Here the CRDs come first, then the
# admission policies and bindings, then NetworkPolicies and RBAC, then everything else, and
# the workloads (DaemonSet, Deployment, Job) last: no agent can write before the policies
# that confine it exist. Stable within a rank; lines before the first `---` stay on top.
# Used by `make manifests`; tests/chart.rs checks the order of manifests/hwaccel-operator.yaml.
set -euo pipefail
awk '
function rank(kind) {
  if (kind == "CustomResourceDefinition") return 0
  if (kind == "ValidatingAdmissionPolicy") return 1
  if (kind == "ValidatingAdmissionPolicyBinding") return 2
  if (kind == "NetworkPolicy") return 3
  if (kind == "ServiceAccount") return 4
  if (kind == "ClusterRole") return 5
  if (kind == "ClusterRoleBinding") return 6
  if (kind == "Role") return 7
  if (kind == "RoleBinding") return 8
  if (kind == "DaemonSet") return 10
  if (kind == "Deployment") return 11
  if (kind == "Job") return 12
  return 9
}
function flush() {
  if (n > 0 || doc != "") { docs[n] = doc; kinds[n] = kind; n++ }
  doc = ""; kind = ""
}
BEGIN { n = 0; doc = ""; kind = ""; started = 0 }
/^---[ \t]*$/ { if (started) flush(); started = 1; doc = $0 "\n"; next }
{
  if (!started) { header = header $0 "\n"; next }
  if (kind == "" && $0 ~ /^kind:[ \t]*[A-Za-z]+[ \t]*$/) { kind = $2 }
  doc = doc $0 "\n"
}
END {
  if (started) flush()
  printf "%s", header
  for (r = 0; r <= 12; r++)
    for (i = 0; i < n; i++)
      if (rank(kinds[i]) == r) printf "%s", docs[i]
}
'
