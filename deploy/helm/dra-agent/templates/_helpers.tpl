{{/* The release's full name: every object's name (dra-agent for a release named dra-agent). */}}
{{- define "dra-agent.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dra-agent.serviceAccountName" -}}
{{- default (include "dra-agent.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* Labels of every object: deploy/base's, then Helm's own. */}}
{{- define "dra-agent.labels" -}}
app.kubernetes.io/part-of: dra-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The DaemonSet's selector: immutable, so the same as deploy/base's (a cluster moves from
kustomize to the chart without deleting the DaemonSet); the full name keeps two releases
in one namespace apart. */}}
{{- define "dra-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-agent.fullname" . }}
{{- end -}}

{{- define "dra-agent.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The agent's own plugin directory: sockets, checkpoint and lock. */}}
{{- define "dra-agent.pluginDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletDir) .Values.driverName -}}
{{- end -}}
