{{/*
Values are a trust boundary: whoever writes them decides what the agent mounts from every
node and whether the admission policies fail open. values.schema.json refuses bad values
first; these checks repeat the security-relevant ones with clear messages, because
`helm install --skip-schema-validation` (and tools that render charts without the schema)
skip the schema. tests/chart.rs renders the refusals both ways.
*/}}

{{/* The agent's --interval grammar and bounds (src/duration.rs): 1s..24h, one unit. */}}
{{- define "hwaccel.intervalPattern" -}}
^(([1-9][0-9]{0,3}|[1-7][0-9]{4}|8[0-5][0-9]{3}|86[0-3][0-9]{2}|86400)s|([1-9][0-9]{0,2}|1[0-3][0-9]{2}|14[0-3][0-9]|1440)m|([1-9]|1[0-9]|2[0-4])h)$
{{- end -}}

{{/* Files of the host's /proc that detection reads (src/detect): nothing else of /proc. */}}
{{- define "hwaccel.allowedProcFiles" -}}
cpuinfo meminfo sys/kernel/osrelease sys/kernel/arch driver/nvidia/version
{{- end -}}

{{/*
Host paths an extra mount may expose, and why detection reads them: /etc/hwaccel (a saved
copy of the GCE tpu-env attribute, src/detect/backends/tpu.rs), /usr/lib/os-release (the
fallback of /etc/os-release) and /proc/driver/nvidia (driver version and per-GPU information,
src/detect/backends/nvidia/sysfs.rs). Path segments may not start with a dot, so `.` and `..`
cannot climb out.
*/}}
{{- define "hwaccel.extraHostPathPattern" -}}
^(/etc/hwaccel(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*|/usr/lib/os-release|/proc/driver/nvidia(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*)$
{{- end -}}

{{- define "hwaccel.validateValues" -}}
{{- $probePort := int ((.Values.probes | default dict).port | default 8081) -}}
{{- if eq $probePort (int .Values.metrics.port) -}}
{{- fail (printf "probes.port=%d: must differ from metrics.port, so that nothing holding the metrics port's connections can fail the probes" $probePort) -}}
{{- end -}}
{{- $taints := toString ((.Values.health | default dict).taints | default "none") -}}
{{- if not (has $taints (list "none" "dryRun" "enforce")) -}}
{{- fail (printf "health.taints=%q: must be none, dryRun or enforce" $taints) -}}
{{- end -}}
{{- $agent := .Values.agent -}}
{{- $interval := toString $agent.interval -}}
{{- if not (regexMatch (include "hwaccel.intervalPattern" .) $interval) -}}
{{- fail (printf "agent.interval=%q: the agent accepts a whole number and one unit (s, m or h) from 1s to 24h, e.g. 60s or 5m" $interval) -}}
{{- end -}}
{{- $allowedProc := splitList " " (include "hwaccel.allowedProcFiles" .) -}}
{{- range $agent.hostMounts.procFiles -}}
{{- if not (has (toString .) $allowedProc) -}}
{{- fail (printf "agent.hostMounts.procFiles: %q is not a /proc file detection reads; allowed: %s" (toString .) (join ", " $allowedProc)) -}}
{{- end -}}
{{- end -}}
{{- range $agent.hostMounts.extra -}}
{{- $hostPath := toString .hostPath -}}
{{- $mountName := toString .name -}}
{{- range $key, $_ := . -}}
{{- if not (has $key (list "name" "hostPath" "mountPath" "type")) -}}
{{- fail (printf "agent.hostMounts.extra %q: unknown key %q (every extra mount is read-only; only name, hostPath, mountPath and type may be set)" $mountName $key) -}}
{{- end -}}
{{- end -}}
{{- if contains "/." $hostPath -}}
{{- fail (printf "agent.hostMounts.extra: hostPath %q: path segments may not start with a dot (no . or ..)" $hostPath) -}}
{{- end -}}
{{- if not (regexMatch (include "hwaccel.extraHostPathPattern" $) $hostPath) -}}
{{- fail (printf "agent.hostMounts.extra: hostPath %q is not on the allowlist of host paths detection reads: /etc/hwaccel/..., /usr/lib/os-release, /proc/driver/nvidia/... (see docs/security.md#host-mounts)" $hostPath) -}}
{{- end -}}
{{- if and .mountPath (ne (toString .mountPath) (printf "/host%s" $hostPath)) -}}
{{- fail (printf "agent.hostMounts.extra: mountPath %q must be /host%s, where detection looks for it" (toString .mountPath) $hostPath) -}}
{{- end -}}
{{- if not (has (toString .type) (list "Directory" "File")) -}}
{{- fail (printf "agent.hostMounts.extra: hostPath %q needs type Directory or File (got %q)" $hostPath (toString .type)) -}}
{{- end -}}
{{- end -}}
{{- /* agent.nvml: the node split must be one the default agent can negate exactly (see
hwaccel.agentNodeTerms), or a node could run two agents or none. */ -}}
{{- $nvml := $agent.nvml | default dict -}}
{{- if $nvml.enabled -}}
{{- if not $nvml.nodes -}}
{{- fail "agent.nvml.nodes is empty: with agent.nvml.enabled the NVML agent needs at least one node label requirement (e.g. {key: nvidia.com/gpu.present, operator: In, values: [\"true\"]})" -}}
{{- end -}}
{{- range $nvml.nodes -}}
{{- $operator := toString .operator -}}
{{- if not (has $operator (list "In" "Exists")) -}}
{{- fail (printf "agent.nvml.nodes: %q has operator %q; only In (with values) and Exists can be negated exactly for the default agent" (toString .key) $operator) -}}
{{- end -}}
{{- if and (eq $operator "In") (not .values) -}}
{{- fail (printf "agent.nvml.nodes: %q with operator In needs values" (toString .key)) -}}
{{- end -}}
{{- if and (eq $operator "Exists") .values -}}
{{- fail (printf "agent.nvml.nodes: %q with operator Exists takes no values" (toString .key)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.cleanup.enabled (lt (int .Values.cleanup.activeDeadlineSeconds) (add (int .Values.cleanup.stopTimeoutSeconds) 60)) -}}
{{- fail (printf "cleanup.activeDeadlineSeconds=%v must be at least cleanup.stopTimeoutSeconds + 60 (%v): the Job must have time to remove the labels after the writers stopped" .Values.cleanup.activeDeadlineSeconds (add (int .Values.cleanup.stopTimeoutSeconds) 60)) -}}
{{- end -}}
{{- /* The alert durations go verbatim into PromQL (`for:` and a range selector): a value
the schema would refuse would make Prometheus reject the whole rule group. */ -}}
{{- $rule := .Values.metrics.prometheusRule -}}
{{- if $rule.enabled -}}
{{- range $key := list "devicesMissingFor" "unhealthyFor" "unschedulableFor" "agentNotReportingFor" "agentSilence" -}}
{{- $value := toString (index $rule $key) -}}
{{- if not (regexMatch "^([0-9]+(ms|[smhdwy]))+$" $value) -}}
{{- fail (printf "metrics.prometheusRule.%s=%q is not a Prometheus duration such as 10m or 1h30m" $key $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.metrics.dashboard.enabled (not .Values.metrics.dashboard.sidecarLabel) -}}
{{- fail "metrics.dashboard.sidecarLabel is empty: Grafana's sidecar finds the dashboard ConfigMap by that label" -}}
{{- end -}}
{{- $rro := toString ($agent.hostMounts.recursiveReadOnly | default "IfPossible") -}}
{{- if not (has $rro (list "IfPossible" "Enabled")) -}}
{{- fail (printf "agent.hostMounts.recursiveReadOnly=%q: must be IfPossible or Enabled (Disabled would leave every submount of the host mounts writable)" $rro) -}}
{{- end -}}
{{- if and $agent.runAsRoot (ne $rro "Enabled") (not $agent.hostMounts.acknowledgeWritableHostMounts) -}}
{{- fail "agent.runAsRoot=true with agent.hostMounts.recursiveReadOnly=IfPossible: on a runtime without recursive read-only mounts (containerd < 2.0) only the top of each host mount is read-only, so a root agent could write the host's cgroup files (/sys/fs/cgroup) and /dev/shm. Set agent.hostMounts.recursiveReadOnly=Enabled (needs containerd >= 2.0 or CRI-O >= 1.30), or also set agent.hostMounts.acknowledgeWritableHostMounts=true." -}}
{{- end -}}
{{- $policy := .Values.admissionPolicy -}}
{{- if and $policy.enabled (eq (toString $policy.failurePolicy) "Ignore") (not $policy.acknowledgeFailOpen) -}}
{{- fail "admissionPolicy.failurePolicy=Ignore fails open: whenever the API server cannot evaluate a policy (a CEL error, a cost-budget overrun an oversized request can provoke, a broken binding), the write is admitted with RBAC alone, so the agent of any node could rewrite any Node's labels, taints and annotations and any node's inventory. Keep Fail, or also set admissionPolicy.acknowledgeFailOpen=true." -}}
{{- end -}}
{{- end -}}
