{{/* The namespace the queue and the daemon run in. */}}
{{- define "nymph.namespace" -}}
{{- .Values.namespace.name -}}
{{- end -}}

{{/*
Labels of an object's metadata: those of manifests/base (name, component, part-of), Helm's
own, and extraLabels. Call with (dict "root" $ "component" "daemon"); component may be empty.
*/}}
{{- define "nymph.labels" -}}
app.kubernetes.io/name: nymph
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
app.kubernetes.io/part-of: nymph
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- with .root.Values.extraLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The selector (and pod template) labels of a component, as in manifests/base. */}}
{{- define "nymph.selector" -}}
app.kubernetes.io/name: nymph
app.kubernetes.io/component: {{ . }}
{{- end -}}

{{/*
An object's metadata: name, namespace (when given), the labels above plus (extraLabels) any
given ones, and extraAnnotations plus the given ones. Call with (dict "root" $ "name" N
"namespace" NS "component" C "labels" (dict ...) "annotations" (dict ...)).
*/}}
{{- define "nymph.meta" -}}
name: {{ .name }}
{{- with .namespace }}
namespace: {{ . }}
{{- end }}
labels:
  {{- include "nymph.labels" . | nindent 2 }}
  {{- with .labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- $all := merge (deepCopy (.annotations | default dict)) (deepCopy (.root.Values.extraAnnotations | default dict)) }}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The pod template's metadata of a component. */}}
{{- define "nymph.podMetadata" -}}
metadata:
  labels:
    {{- include "nymph.selector" .component | nindent 4 }}
    {{- with .root.Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .root.Values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{- define "nymph.image" -}}
{{- printf "%s:%s" .Values.image.repository (toString .Values.image.tag) -}}
{{- end -}}

{{/* The Secret holding the daemon token (key: token). */}}
{{- define "nymph.daemonTokenSecret" -}}
{{- .Values.daemonToken.existingSecret | default "nymph-daemon-token" -}}
{{- end -}}

{{- define "nymph.queueURL" -}}
{{- .Values.daemon.queueURL | default (printf "http://nymph-queue.%s.svc:%d" (include "nymph.namespace" .) (int .Values.queue.port)) -}}
{{- end -}}
