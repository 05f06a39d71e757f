{{- define "toolyard.gateway.fullname" -}}
{{- printf "%s-gateway" (include "toolyard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "toolyard.gateway.serviceAccountName" -}}
{{- default (include "toolyard.gateway.fullname" .) .Values.gateway.serviceAccountName }}
{{- end }}

{{/*
What the gateway may do in a namespace it serves: read McpTools, McpServers and McpPrompts, create and
follow the runs it starts for callers, record results in their status and its own
connection in McpServers' status, and follow the warm pools' ready pods (EndpointSlices) to
send each pool call to a pod with room. It reads no Secret of the namespace but those listed
in gateway.upstreamCredentialSecrets (and sends one to a server only if it is labelled for
it), and never touches Jobs or pods.
*/}}
{{- define "toolyard.gateway.rules" -}}
- apiGroups: ["toolyard.dev"]
  resources: ["mcptools", "mcpservers", "mcpprompts"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["toolyard.dev"]
  resources: ["mcpservers/status"]
  verbs: ["patch"]
{{- with .Values.gateway.upstreamCredentialSecrets }}
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: {{ toJson . }}
  verbs: ["get"]
{{- end }}
- apiGroups: ["toolyard.dev"]
  resources: ["toolcalls", "codingtasks"]
  # delete: a user's delete_call and delete_task (of their own finished runs).
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["toolyard.dev"]
  resources: ["toolcalls/status", "codingtasks/status"]
  verbs: ["patch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{- define "toolyard.gateway.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "toolyard.gateway.fullname" .)) .Values.gateway.tls.existingSecret }}
{{- end }}

{{/* Non-empty when some model profile has an API key Secret. */}}
{{- define "toolyard.gateway.modelKeys" -}}
{{- range .Values.model.profiles }}{{ if .apiKeySecret }}yes{{ end }}{{ end }}
{{- end }}

{{/*
OIDC issuer prefixes as ISSUER=PREFIX,... (sorted by issuer) for TOOLYARD_AUTHZ_OIDC_ISSUER_PREFIXES.
*/}}
{{- define "toolyard.issuerPrefixes" -}}
{{- $entries := list -}}
{{- range $issuer, $prefix := . -}}
{{- $entries = append $entries (printf "%s=%s" $issuer $prefix) -}}
{{- end -}}
{{- join "," $entries -}}
{{- end }}
