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
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  initialDelaySeconds: 10
  periodSeconds: 20
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
{{- end -}}
