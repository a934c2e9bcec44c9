{{/*
An image reference from {repository, tag, digest}: repository@digest when a
digest is set (what the kubelet pulls is then fixed), else repository:tag.
*/}}
{{- define "gpu-driver.image" -}}
{{- if .digest -}}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" .digest) -}}
{{- fail (printf "image digest %q: want sha256:<64 hex digits>" .digest) -}}
{{- end -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- if not .tag -}}
{{- fail (printf "image %s: set a tag or a digest (no implicit :latest)" .repository) -}}
{{- end -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object: Helm's recommended ones. */}}
{{- define "gpu-driver.labels" -}}
app.kubernetes.io/part-of: gpu-driver
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/*
A CEL list literal of single-quoted strings, as deploy/admission-policy.yaml
writes its owner's lists. values.schema.json keeps quotes and backslashes
out of the entries, so nothing can break out of the literal.
*/}}
{{- define "gpu-driver.celList" -}}
[{{- range $i, $v := . -}}{{- if $i }}, {{ end -}}'{{ $v }}'{{- end -}}]
{{- end -}}
