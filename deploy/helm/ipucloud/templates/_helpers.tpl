{{- define "ipucloud.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ipucloud.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ipucloud.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ipucloud.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "ipucloud.secretName" -}}
{{- .Values.existingSecret | default (printf "%s-secrets" (include "ipucloud.fullname" .)) -}}
{{- end -}}

{{/* The keys and URLs; `required` stops an install that forgot one, naming it. */}}
{{- define "ipucloud.secretData" -}}
IPUCLOUD_SECRET_KEY: {{ required "secrets.secretKey is required (or set existingSecret)" .Values.secrets.secretKey | b64enc | quote }}
IPUCLOUD_DATABASE_URL: {{ required "secrets.databaseUrl is required (or set existingSecret)" .Values.secrets.databaseUrl | b64enc | quote }}
IPUCLOUD_REDIS_URL: {{ required "secrets.redisUrl is required (or set existingSecret)" .Values.secrets.redisUrl | b64enc | quote }}
{{- end -}}

{{/* Every ipucloud container reads its settings from the ConfigMap and the Secret. */}}
{{- define "ipucloud.envFrom" -}}
- configMapRef:
    name: {{ include "ipucloud.fullname" . }}-config
- secretRef:
    name: {{ include "ipucloud.secretName" . }}
{{- end -}}

{{- define "ipucloud.podSpecCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/* A read-only root filesystem still needs a scratch directory (uvicorn metrics, worker flags). */}}
{{- define "ipucloud.tmpVolume" -}}
- name: tmp
  emptyDir: {}
{{- end -}}

{{- define "ipucloud.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/* Healthy while it reaches PostgreSQL and Redis and the schema is current (start-up checks). */}}
{{- define "ipucloud.reachesServices" -}}
exec:
  command:
    - sh
    - -c
    - >-
      IPUCLOUD_STARTUP_WAIT_S=3 exec python -c "from ipucloud.preflight import check_all;
      from scheduler.settings import get_settings; check_all(get_settings())"
{{- end -}}
