{{/* An image reference from {repository, tag}. */}}
{{- define "gpu-remediator.image" -}}
{{ .repository }}:{{ .tag }}
{{- end }}

{{/* The labels every object of a component carries (the same as manifests/). */}}
{{- define "gpu-remediator.labels" -}}
app.kubernetes.io/name: {{ . }}
app.kubernetes.io/part-of: gpu-remediator
{{- end }}
