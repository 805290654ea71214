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

{{- define "hwaccel.validateValues" -}}
{{- $agent := .Values.agent -}}
{{- $interval := toString $agent.interval -}}
{{- if not (regexMatch (include "hwaccel.intervalPattern" .) $interval) -}}
{{- fail (printf "agent.interval=%q: the agent accepts a whole number and one unit (s, m or h) from 1s to 24h, e.g. 60s or 5m" $interval) -}}
{{- end -}}
{{- end -}}
