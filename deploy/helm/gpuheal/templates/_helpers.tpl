{{- define "gpuheal.name" -}}{{ .Release.Name }}{{- end -}}
{{- define "gpuheal.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}
{{- define "gpuheal.labels" -}}
app.kubernetes.io/name: gpuheal
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
{{- define "gpuheal.controller.sa" -}}{{ include "gpuheal.name" . }}-controller{{- end -}}
{{- define "gpuheal.agent.sa" -}}{{ include "gpuheal.name" . }}-agent{{- end -}}
{{- define "gpuheal.tokenSecret" -}}{{ .Values.controller.existingTokenSecret | default (printf "%s-api-token" (include "gpuheal.name" .)) }}{{- end -}}
