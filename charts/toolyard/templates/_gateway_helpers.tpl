{{- define "toolyard.gateway.fullname" -}}
{{- printf "%s-gateway" (include "toolyard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "toolyard.gateway.serviceAccountName" -}}
{{- default (include "toolyard.gateway.fullname" .) .Values.gateway.serviceAccountName }}
{{- end }}
