{{/*
Shared helpers. The gateway's templates use the same names (toolyard.fullname,
toolyard.labels, toolyard.selectorLabels, toolyard.tokenKeySecretName, toolyard.image).
*/}}

{{- define "toolyard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "toolyard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "toolyard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. Call with (dict "ctx" . "component" "controller"). */}}
{{- define "toolyard.labels" -}}
helm.sh/chart: {{ include "toolyard.chart" .ctx }}
{{ include "toolyard.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: toolyard
{{- end }}

{{/* Selector labels. Call with (dict "ctx" . "component" "controller"). */}}
{{- define "toolyard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "toolyard.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* An image reference. Call with (dict "ctx" . "image" .Values.controller.image). */}}
{{- define "toolyard.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* Name of the Secret with the runner token signing key (key `key`). */}}
{{- define "toolyard.tokenKeySecretName" -}}
{{- default (printf "%s-token-key" (include "toolyard.fullname" .)) .Values.tokenKey.existingSecret }}
{{- end }}

{{/* URL of the gateway's internal API as run pods reach it. */}}
{{- define "toolyard.gateway.internalUrl" -}}
{{- default (printf "http://%s-gateway-internal.%s.svc:8081" (include "toolyard.fullname" .) .Release.Namespace) .Values.gateway.internalUrl }}
{{- end }}

{{- define "toolyard.controller.fullname" -}}
{{- printf "%s-controller" (include "toolyard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "toolyard.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create }}
{{- default (include "toolyard.controller.fullname" .) .Values.controller.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.controller.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
What the controller may do in a namespace it watches. Least privilege: it never reads
Secrets (it only creates the run token and pool key Secrets it owns), reads pods only to
map their state, and writes only the status of Toolyard objects.
*/}}
{{- define "toolyard.controller.rules" -}}
- apiGroups: ["toolyard.dev"]
  resources: ["mcptools", "mcpservers", "toolcalls", "codingtasks"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["toolyard.dev"]
  resources: ["toolcalls", "codingtasks"]
  verbs: ["delete"]
- apiGroups: ["toolyard.dev"]
  resources: ["mcptools/status", "mcpservers/status", "toolcalls/status", "codingtasks/status"]
  verbs: ["patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/*
The OTEL_* variables of every process (see values `tracing`), as container env entries.
*/}}
{{- define "toolyard.tracingEnv" -}}
{{- with .Values.tracing }}
{{- if .otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .otlpEndpoint | quote }}
{{- end }}
{{- range $name, $value := .env }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The namespaces the admission policies on runs and tools apply to: admission.namespaceSelector
when set, else the watched namespaces (so that two releases watching different namespaces do
not refuse each other's gateways), else every namespace.
*/}}
{{- define "toolyard.admission.matchResources" -}}
{{- if .Values.admission.namespaceSelector }}
matchResources:
  namespaceSelector:
    {{- toYaml .Values.admission.namespaceSelector | nindent 4 }}
{{- else if .Values.watchNamespaces }}
matchResources:
  namespaceSelector:
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: In
        values: {{ toJson .Values.watchNamespaces }}
{{- end }}
{{- end }}
