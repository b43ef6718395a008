{{/* The name of every object: the release name. */}}
{{- define "localproxy.name" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "localproxy.labels" -}}
app.kubernetes.io/name: {{ include "localproxy.name" . }}
{{- end -}}

{{- define "localproxy.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if eq $tag "latest" -}}
{{- fail "image.tag: latest is not allowed; want a release such as v0.1.0" -}}
{{- end -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
