{{/*
Shared names, labels and snippets. Object names stay short and readable: `helm install hwaccel`
gives hwaccel-agent, hwaccel-controller, ...; any other release name R gives R-hwaccel-agent.
*/}}

{{- define "hwaccel.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hwaccel.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if hasPrefix "hwaccel" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-hwaccel" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "hwaccel.agentName" -}}{{ include "hwaccel.fullname" . }}-agent{{- end -}}
{{- define "hwaccel.controllerName" -}}{{ include "hwaccel.fullname" . }}-controller{{- end -}}
{{- define "hwaccel.cleanupName" -}}{{ include "hwaccel.fullname" . }}-cleanup{{- end -}}

{{/* The user name the API server gives a ServiceAccount's tokens; args: (list . "agent") */}}
{{- define "hwaccel.saUser" -}}
{{- $ctx := index . 0 -}}
{{- printf "system:serviceaccount:%s:%s-%s" $ctx.Release.Namespace (include "hwaccel.fullname" $ctx) (index . 1) -}}
{{- end -}}

{{- define "hwaccel.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "hwaccel.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hwaccel-operator
{{- end -}}

{{/* Selector labels of one component; args: (list . "agent") */}}
{{- define "hwaccel.selectorLabels" -}}
{{- $ctx := index . 0 -}}
app.kubernetes.io/name: {{ include "hwaccel.name" $ctx }}
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "hwaccel.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Pod-level security context; args: (list runAsRoot uid gid supplementalGroups) */}}
{{- define "hwaccel.podSecurityContext" -}}
{{- $root := index . 0 -}}
{{- if $root }}
runAsNonRoot: false
runAsUser: 0
runAsGroup: 0
{{- else }}
runAsNonRoot: true
runAsUser: {{ index . 1 }}
runAsGroup: {{ index . 2 }}
{{- end }}
{{- with index . 3 }}
supplementalGroups:
  {{- toYaml . | nindent 2 }}
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container security context shared by every container of the chart. */}}
{{- define "hwaccel.containerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "hwaccel.commonEnv" -}}
- name: RUST_LOG
  value: {{ .Values.logLevel | quote }}
{{- end -}}

{{- define "hwaccel.probes" -}}
{{- /*
Both probes use the health port, which no Service exposes and no NetworkPolicy rule admits
(the node is always admitted): a scraper or peer holding the metrics port's connections cannot
fail them (issue 27 item 3). /readyz holds a request that comes before the first cycle for up
to 8 s (src/server/readiness.rs READY_HOLD) and answers as soon as the process is ready, so the
readiness timeoutSeconds stays above that hold and a normal start fails no probe and causes no
Warning Event (issue 28); the process binds its ports before anything else, within the 1 s
initialDelaySeconds.
*/ -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: health
  initialDelaySeconds: 10
  periodSeconds: 20
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: health
  initialDelaySeconds: 1
  periodSeconds: 10
  timeoutSeconds: 10
  failureThreshold: 3
{{- end -}}

{{/*
Which nodes run which agent (agent.nvml.nodes): YAML {include: [...], exclude: [...]}, each a
list of nodeSelectorTerms' matchExpressions. include (the NVML agent) holds one term per
requirement, so any one of them selects a node; exclude (the default agent) holds one term
with the negation of every requirement (In -> NotIn, Exists -> DoesNotExist), so it selects
exactly the other nodes: the two sets are disjoint and together cover every node. Empty when
agent.nvml is off.
*/}}
{{- define "hwaccel.agentNodeTerms" -}}
{{- if .Values.agent.nvml.enabled -}}
{{- $include := list -}}
{{- $exclude := list -}}
{{- range .Values.agent.nvml.nodes -}}
{{- if eq (toString .operator) "Exists" -}}
{{- $include = append $include (list (dict "key" .key "operator" "Exists")) -}}
{{- $exclude = append $exclude (dict "key" .key "operator" "DoesNotExist") -}}
{{- else -}}
{{- $include = append $include (list (dict "key" .key "operator" "In" "values" .values)) -}}
{{- $exclude = append $exclude (dict "key" .key "operator" "NotIn" "values" .values) -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "include" $include "exclude" (list $exclude)) -}}
{{- end -}}
{{- end -}}

{{/*
An agent's affinity: the user's (agent.affinity) with the agent's own node terms ANDed into
its required node affinity. Node selector terms are ORed, so every user term is combined with
every own term: (U1 or U2) and (T1 or T2) = U1T1 or U1T2 or U2T1 or U2T2. Args: (list
affinity terms), terms a list of matchExpressions lists; no terms: the affinity unchanged.
*/}}
{{- define "hwaccel.agentAffinity" -}}
{{- $affinity := deepCopy (index . 0 | default dict) -}}
{{- $own := index . 1 | default list -}}
{{- if $own -}}
{{- $node := get $affinity "nodeAffinity" | default dict -}}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $userTerms := get $required "nodeSelectorTerms" | default list -}}
{{- $terms := list -}}
{{- range $user := $userTerms -}}
{{- range $term := $own -}}
{{- $combined := deepCopy $user -}}
{{- $_ := set $combined "matchExpressions" (concat (get $user "matchExpressions" | default list) $term) -}}
{{- $terms = append $terms $combined -}}
{{- end -}}
{{- end -}}
{{- if not $userTerms -}}
{{- range $term := $own -}}
{{- $terms = append $terms (dict "matchExpressions" $term) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $terms -}}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $node -}}
{{- end -}}
{{- toYaml $affinity -}}
{{- end -}}

{{/* The label that sets the NVML agent's pods apart; args: an agent variant (agent-daemonset.yaml). */}}
{{- define "hwaccel.agentVariantLabel" -}}
{{- if .variant -}}
hwaccel.io/agent-variant: {{ .variant }}
{{- end -}}
{{- end -}}

{{/*
The glibc image of the NVML agents: agent.nvml.image, else the chart's image repository with
"-glibc" appended to its tag (the Dockerfile's `glibc` target). A digest of the static image
says nothing about the glibc one, so only agent.nvml.image.digest pins it.
*/}}
{{- define "hwaccel.nvmlImage" -}}
{{- $image := .Values.agent.nvml.image -}}
{{- $repository := default .Values.image.repository $image.repository -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default (printf "%s-glibc" (default .Chart.AppVersion .Values.image.tag)) $image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
Environment of the NVML agents, the way NVIDIA's GPU feature discovery asks the NVIDIA
container runtime for the driver (its image sets NVIDIA_VISIBLE_DEVICES=all and
NVIDIA_DRIVER_CAPABILITIES=compute,utility: NVIDIA/k8s-device-plugin,
deployments/container/Dockerfile). "all" makes the runtime inject every GPU's device node;
the capabilities pick the driver libraries (utility: libnvidia-ml and nvidia-smi, all NVML
needs). HWACCEL_NVML=container tells detection that the library on its own path is the
host's (src/detect/backends/accelerators/nvidia.rs).
*/}}
{{- define "hwaccel.nvmlEnv" -}}
- name: NVIDIA_VISIBLE_DEVICES
  value: all
- name: NVIDIA_DRIVER_CAPABILITIES
  value: {{ .Values.agent.nvml.driverCapabilities | quote }}
- name: HWACCEL_NVML
  value: container
{{- end -}}
