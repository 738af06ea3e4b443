{{/*
Names. Kubernetes names are DNS labels: at most 63 characters, no trailing dash.
*/}}
{{- define "tiered.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tiered.fullname" -}}
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

{{/*
The headless Service gives every broker a stable DNS name: <fullname>-<ordinal>.<headless>.<namespace>.svc.
Its name is cut so that the suffix always fits.
*/}}
{{- define "tiered.headlessName" -}}
{{- printf "%s-headless" (include "tiered.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{- define "tiered.migrationsName" -}}
{{- printf "%s-db-upgrade" (include "tiered.fullname" . | trunc 52 | trimSuffix "-") }}
{{- end }}

{{- define "tiered.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tiered.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tiered.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tiered.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
Labels. The selector labels never change after the first install (a StatefulSet's selector is immutable), and
they carry the component so that the migration Job's pod is never selected by the Services or the PDB.
*/}}
{{- define "tiered.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tiered.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tiered.brokerSelectorLabels" -}}
{{ include "tiered.selectorLabels" . }}
app.kubernetes.io/component: broker
{{- end }}

{{- define "tiered.labels" -}}
helm.sh/chart: {{ include "tiered.chart" . }}
{{ include "tiered.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | replace "+" "_" | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tiered
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The catalog's environment, shared by the brokers and the migration Job so that both reach the same database.
The password only ever travels as a reference to an existing Secret.
*/}}
{{- define "tiered.catalogEnv" -}}
- name: TIERED_CATALOG_URL
  value: {{ .Values.catalog.url | quote }}
{{- if include "tiered.catalogCA" . }}
# libpq checks the server's certificate against the mounted CA, and its name against the URL's host.
- name: PGSSLROOTCERT
  value: {{ printf "/etc/tiered-catalog-ca/%s" .Values.catalog.rootCA.key | quote }}
- name: PGSSLMODE
  value: verify-full
{{- end }}
{{- with .Values.catalog.existingSecret }}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ . | quote }}
      key: {{ $.Values.catalog.passwordKey | quote }}
{{- end }}
{{- end }}

{{/*
The catalog's CA (catalog.rootCA): "configMap" or "secret" when one is named, else empty; its volume and mount,
shared by the brokers and the migration Job.
*/}}
{{/*
The access rules file's ConfigMap (accessRules): the chart's own when the rules are inline, else the one named;
empty when there are none.
*/}}
{{- define "tiered.accessRules" -}}
{{- if .Values.accessRules.rules }}{{ include "tiered.fullname" . | trunc 59 | trimSuffix "-" }}-acl
{{- else if .Values.accessRules.existingConfigMap }}{{ .Values.accessRules.existingConfigMap }}{{ end }}
{{- end }}

{{- define "tiered.catalogCA" -}}
{{- if .Values.catalog.rootCA.configMap }}configMap{{ else if .Values.catalog.rootCA.secret }}secret{{ end }}
{{- end }}

{{- define "tiered.catalogCAVolume" -}}
{{- $ca := .Values.catalog.rootCA }}
{{- if $ca.configMap }}
- name: catalog-ca
  configMap:
    name: {{ $ca.configMap | quote }}
    items:
      - key: {{ $ca.key | quote }}
        path: {{ $ca.key | quote }}
{{- else if $ca.secret }}
- name: catalog-ca
  secret:
    secretName: {{ $ca.secret | quote }}
    items:
      - key: {{ $ca.key | quote }}
        path: {{ $ca.key | quote }}
{{- end }}
{{- end }}

{{- define "tiered.catalogCAMount" -}}
{{- if include "tiered.catalogCA" . }}
- name: catalog-ca
  mountPath: /etc/tiered-catalog-ca
  readOnly: true
{{- end }}
{{- end }}

{{/*
The labels that admit a pod to the TANK port (networkPolicy.clients.podLabels, else the chart's default).
*/}}
{{- define "tiered.clientPodLabels" -}}
{{- toYaml (.Values.networkPolicy.clients.podLabels | default (dict "tiered-client" "true")) }}
{{- end }}

{{/*
The object store's environment, read by the AWS SDK itself. Credentials are references to an existing Secret;
without one the SDK falls back to IRSA / web identity or the instance role.
*/}}
{{- define "tiered.storeEnv" -}}
{{- with .Values.store.region }}
- name: AWS_REGION
  value: {{ . | quote }}
{{- end }}
{{- with .Values.store.endpoint }}
- name: AWS_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.store.existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . | quote }}
      key: {{ $.Values.store.accessKeyIdKey | quote }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . | quote }}
      key: {{ $.Values.store.secretAccessKeyKey | quote }}
{{- if $.Values.store.sessionTokenKey }}
- name: AWS_SESSION_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . | quote }}
      key: {{ $.Values.store.sessionTokenKey | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
One TOML `"key" = value` line per entry, keys sorted. Keys are always quoted because TANK's keys contain dots,
which TOML would otherwise read as nested tables; toJson writes strings, numbers and booleans in forms TOML
reads identically (JSON string escapes are a subset of TOML basic-string escapes).
*/}}
{{- define "tiered.tomlPairs" -}}
{{- range $key, $value := . }}
{{ toJson $key }} = {{ toJson $value }}
{{- end }}
{{- end }}

{{/*
What values.schema.json cannot say, checked when the config file renders (every render includes it).
- The grace period exceeds the broker's shutdown budget by 5 s or more: within shutdownTimeoutSeconds the broker
  hands its partitions over and commits its open block, then it must still exit before the kubelet's SIGKILL.
- TLS needs the Secret it is read from, and client certificates need TLS.
- Several brokers need what lets them act as one: the PostgreSQL catalog they coordinate through (a SQLite one
  refuses a second broker) and one S3 bucket any of them reads. The schema already refuses anything else at any
  replica count; this says why, also to a render that skips the schema (--skip-schema-validation).
*/}}
{{- define "tiered.urlKind" -}}
{{- $scheme := regexFind "^[a-zA-Z][-+.a-zA-Z0-9]*:" . }}
{{- if not . }}empty{{ else if $scheme }}a {{ $scheme }} URL{{ else }}not a URL{{ end }}
{{- end }}

{{- define "tiered.checks" -}}
{{- $grace := int .Values.terminationGracePeriodSeconds }}
{{- $shutdown := int .Values.shutdownTimeoutSeconds }}
{{- if lt $grace (add $shutdown 5) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be at least shutdownTimeoutSeconds (%d) + 5: on SIGTERM the broker hands its partitions over within shutdownTimeoutSeconds, then exits, and the kubelet kills it when the grace period ends" $grace $shutdown) }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "tls.enabled is true but tls.secretName is empty: name the existing Secret holding the certificate and its key (cert-manager's Certificate writes one)" }}
{{- end }}
{{- if and .Values.tls.clientCA.enabled (not .Values.tls.enabled) }}
{{- fail "tls.clientCA.enabled needs tls.enabled: client certificates are asked for in the TLS handshake" }}
{{- end }}
{{- if and .Values.accessRules.rules .Values.accessRules.existingConfigMap }}
{{- fail "accessRules has both rules and existingConfigMap: give the rules in one place" }}
{{- end }}
{{- if and .Values.catalog.rootCA.configMap .Values.catalog.rootCA.secret }}
{{- fail "catalog.rootCA names both a configMap and a secret: name the one holding the CA" }}
{{- end }}
{{- $replicas := int .Values.replicaCount }}
{{- if gt $replicas 1 }}
{{- if not (regexMatch "^postgresql(\\+psycopg)?://" .Values.catalog.url) }}
{{- fail (printf "replicaCount is %d but catalog.url is %s, not PostgreSQL: several brokers coordinate (memberships, the leader of every partition) through one PostgreSQL catalog, postgresql+psycopg://USER@HOST:5432/DB, and a SQLite catalog refuses a second broker" $replicas (include "tiered.urlKind" .Values.catalog.url)) }}
{{- end }}
{{- if not (hasPrefix "s3://" .Values.store.url) }}
{{- fail (printf "replicaCount is %d but store.url is %s, not S3: several brokers share one bucket, s3://BUCKET/PREFIX, so that any of them can take over and serve any partition; a file store lives on one broker's volume" $replicas (include "tiered.urlKind" .Values.store.url)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The config file. Settings the chart owns come first; values.schema.json keeps them out of .Values.config.
*/}}
{{- define "tiered.configToml" -}}
{{- include "tiered.checks" . -}}
# Written by the tiered Helm chart (release {{ .Release.Name }}); see docs/configuration.md.
# The catalog URL comes from TIERED_CATALOG_URL and the credentials from PGPASSWORD and AWS_*.
{{- $owned := dict
  "data_dir" "/var/lib/tiered"
  "listen" (printf ":%d" (int .Values.ports.tank))
  "http_listen" (printf ":%d" (int .Values.ports.http))
  "store_url" .Values.store.url
  "s3_path_style" .Values.store.pathStyle
  "broker_id" "auto"
  "shutdown_timeout_s" (int .Values.shutdownTimeoutSeconds)
}}
{{- with .Values.store.serverSideEncryption }}
{{- $_ := set $owned "s3_sse" . }}
{{- end }}
{{- with .Values.store.kmsKeyId }}
{{- $_ := set $owned "s3_sse_kms_key_id" . }}
{{- end }}
{{- if include "tiered.accessRules" . }}
{{- $_ := set $owned "acl" (printf "/etc/tiered-acl/%s" .Values.accessRules.key) }}
{{- end }}
{{- if .Values.tls.enabled }}
{{- $_ := set $owned "tls_cert" (printf "%s/tls.crt" .Values.tls.mountPath) }}
{{- $_ := set $owned "tls_key" (printf "%s/tls.key" .Values.tls.mountPath) }}
{{- if .Values.tls.clientCA.enabled }}
{{- $_ := set $owned "tls_client_ca" (printf "%s/client-ca.crt" .Values.tls.mountPath) }}
{{- end }}
{{- end }}
{{- include "tiered.tomlPairs" $owned }}
{{- include "tiered.tomlPairs" .Values.config }}

[topic_defaults]
{{- include "tiered.tomlPairs" .Values.topicDefaults }}
{{- end }}
