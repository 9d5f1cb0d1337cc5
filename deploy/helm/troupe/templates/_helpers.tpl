{{/* The chart's name, and the release's full name (≤ 63 characters). */}}
{{- define "troupe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "troupe.fullname" -}}
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

{{- define "troupe.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "troupe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of the nodes; the worker adds component=worker. */}}
{{- define "troupe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "troupe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node
{{- end -}}

{{- define "troupe.workerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "troupe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: worker
{{- end -}}

{{- define "troupe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "troupe.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "troupe.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Secret holding the API keys, and the key in it. */}}
{{- define "troupe.apiKeysSecret" -}}
{{- default (printf "%s-secrets" (include "troupe.fullname" .)) .Values.apiKeys.existingSecret -}}
{{- end -}}
{{- define "troupe.apiKeysKey" -}}
{{- if .Values.apiKeys.existingSecret -}}{{ .Values.apiKeys.existingSecretKey }}{{- else -}}api-keys{{- end -}}
{{- end -}}

{{- define "troupe.signingSecret" -}}
{{- default (printf "%s-secrets" (include "troupe.fullname" .)) .Values.signing.existingSecret -}}
{{- end -}}

{{/* Whether a Redis password is configured, and its Secret and key. */}}
{{- define "troupe.redisPassword" -}}
{{- if or .Values.redis.existingSecret .Values.redis.password -}}true{{- end -}}
{{- end -}}
{{- define "troupe.redisSecret" -}}
{{- default (printf "%s-secrets" (include "troupe.fullname" .)) .Values.redis.existingSecret -}}
{{- end -}}
{{- define "troupe.redisSecretKey" -}}
{{- if .Values.redis.existingSecret -}}{{ .Values.redis.existingSecretPasswordKey }}{{- else -}}redis-password{{- end -}}
{{- end -}}

{{- define "troupe.natsAuth" -}}
{{- $a := .Values.nats.auth -}}
{{- if and $a.existingSecret (or $a.tokenKey $a.credsKey $a.passwordKey) -}}true{{- end -}}
{{- end -}}

{{/* The NATS connection flags, shared by the node and the worker. */}}
{{- define "troupe.natsArgs" -}}
{{- if not .Values.nats.urls }}{{ fail "nats.urls: at least one NATS URL" }}{{- end }}
- {{ printf "--nats=%v" (join "," .Values.nats.urls) | quote }}
{{- with .Values.nats.subjectPrefix }}
- {{ printf "--subject-prefix=%v" (.) | quote }}
{{- end }}
{{- $a := .Values.nats.auth }}
{{- if include "troupe.natsAuth" . }}
{{- if $a.tokenKey }}
- --nats-token-file=/etc/troupe/nats/token
{{- end }}
{{- if $a.credsKey }}
- --nats-creds=/etc/troupe/nats/creds
{{- end }}
{{- if $a.passwordKey }}
- {{ printf "--nats-user=%v" (required "nats.auth.user: with nats.auth.passwordKey" $a.user) | quote }}
- --nats-password-file=/etc/troupe/nats/password
{{- end }}
{{- end }}
{{- end -}}

{{- define "troupe.natsVolume" -}}
{{- $a := .Values.nats.auth }}
{{- if include "troupe.natsAuth" . }}
- name: nats-auth
  secret:
    secretName: {{ $a.existingSecret }}
    defaultMode: 0440
    items:
      {{- with $a.tokenKey }}
      - key: {{ . }}
        path: token
      {{- end }}
      {{- with $a.credsKey }}
      - key: {{ . }}
        path: creds
      {{- end }}
      {{- with $a.passwordKey }}
      - key: {{ . }}
        path: password
      {{- end }}
{{- end }}
{{- end -}}

{{- define "troupe.natsMount" -}}
{{- if include "troupe.natsAuth" . }}
- name: nats-auth
  mountPath: /etc/troupe/nats
  readOnly: true
{{- end }}
{{- end -}}
