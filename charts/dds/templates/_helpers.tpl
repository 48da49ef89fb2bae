{{/* Names: the release name (or fullnameOverride), cut to the 63 characters a label value allows. */}}
{{- define "dds.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dds.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "dds.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "dds.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "dds.autoscalerName" -}}
{{- default (printf "%s-cluster-autoscaler" (include "dds.fullname" .)) .Values.clusterAutoscaler.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries: manifests/' two plus Helm's usual four. */}}
{{- define "dds.commonLabels" -}}
app.kubernetes.io/part-of: dds
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "dds.labels" -}}
app.kubernetes.io/name: {{ include "dds.name" . }}
{{ include "dds.commonLabels" . }}
{{- end }}

{{- define "dds.autoscalerLabels" -}}
app.kubernetes.io/name: cluster-autoscaler
{{ include "dds.commonLabels" . }}
{{- end }}

{{/* Selectors: the name only, as manifests/ selects (a selector cannot change after install). */}}
{{- define "dds.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dds.name" . }}
{{- end }}

{{- define "dds.autoscalerSelectorLabels" -}}
app.kubernetes.io/name: cluster-autoscaler
{{- end }}

{{- define "dds.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The Secret holding DDS's server pair and client CA. */}}
{{- define "dds.tlsSecret" -}}
{{- if .Values.tls.certManager.enabled }}
{{- printf "%s-tls" (include "dds.fullname" .) }}
{{- else }}
{{- required "tls.existingSecret: name the Secret holding tls.crt, tls.key, ca.crt and client-ca.crt (made by `dds certs`), or set tls.certManager.enabled" .Values.tls.existingSecret }}
{{- end }}
{{- end }}

{{/* With cert-manager: the Secret whose ca.crt is the client CA DDS verifies callers with (not the server's CA). */}}
{{- define "dds.clientCaSecret" -}}
{{- if .Values.clusterAutoscaler.enabled }}
{{- printf "%s-client-tls" (include "dds.autoscalerName" .) }}
{{- else }}
{{- required "tls.certManager.clientCaSecret: name the Secret holding the CA (key ca.crt) of cluster-autoscaler's client certificates; with cert-manager DDS does not verify callers with its own server CA" .Values.tls.certManager.clientCaSecret }}
{{- end }}
{{- end }}

{{/* The Service's DNS name: the server certificate's SAN and cluster-autoscaler's cloud-config address. */}}
{{- define "dds.serviceHost" -}}
{{- printf "%s.%s.svc" (include "dds.fullname" .) .Release.Namespace }}
{{- end }}

{{- define "dds.leaseName" -}}
{{- printf "%s-leader" (include "dds.fullname" .) }}
{{- end }}

{{/* The settings section each fabric backend reads (dds/config.py). */}}
{{- define "dds.fabricSection" -}}
{{- $sections := dict "composability-request" "composability" "redfish" "redfish" "simulated" "simulated_fabric" }}
{{- $backend := required "fabric.backend is required (DDS refuses to start without a fabric): composability-request, redfish or simulated" .Values.fabric.backend }}
{{- if not (hasKey $sections $backend) }}
{{- fail (printf "fabric.backend %q is not a DDS fabric: one of composability-request, redfish, simulated" $backend) }}
{{- end }}
{{- get $sections $backend }}
{{- end }}

{{/* settings.yaml: the user's settings, the fabric section, then what the chart decides (listen, TLS, namespace). */}}
{{- define "dds.settings" -}}
{{- $reserved := list "listen" "tls_cert" "tls_key" "tls_ca" "in_cluster" "namespace" "metrics_listen" "fabric" "lease_name" "insecure" }}
{{- range $key := $reserved }}
{{- if hasKey $.Values.settings $key }}
{{- fail (printf "settings.%s is set by the chart (see values.yaml): remove it from settings" $key) }}
{{- end }}
{{- end }}
{{- $section := include "dds.fabricSection" . }}
{{- $settings := deepCopy .Values.settings }}
{{- $fabricSettings := deepCopy .Values.fabric.settings }}
{{- if eq .Values.fabric.backend "redfish" }}
{{- if .Values.fabric.redfish.passwordSecret }}
{{- $_ := set $fabricSettings "password_file" "/etc/dds/redfish/password/password" }}
{{- end }}
{{- if .Values.fabric.redfish.caSecret }}
{{- $_ := set $fabricSettings "ca_file" "/etc/dds/redfish/ca/ca.crt" }}
{{- end }}
{{- end }}
{{- if $fabricSettings }}
{{- $_ := set $settings $section $fabricSettings }}
{{- end }}
{{- $_ := set $settings "fabric" .Values.fabric.backend }}
{{- $_ := set $settings "listen" (printf "0.0.0.0:%d" (int .Values.service.grpcPort)) }}
{{- $_ := set $settings "tls_cert" "/etc/dds/tls/tls.crt" }}
{{- $_ := set $settings "tls_key" "/etc/dds/tls/tls.key" }}
{{- $_ := set $settings "tls_ca" (ternary "/etc/dds/client-ca/ca.crt" "/etc/dds/tls/client-ca.crt" .Values.tls.certManager.enabled) }}
{{- $_ := set $settings "in_cluster" true }}
{{- $_ := set $settings "namespace" .Release.Namespace }}
{{- $_ := set $settings "metrics_listen" (printf "0.0.0.0:%d" (int .Values.service.metricsPort)) }}
{{- $_ := set $settings "lease_name" (include "dds.leaseName" .) }}
{{- include "dds.refusals" (dict "settings" $settings "Values" .Values) }}
{{- toYaml $settings }}
{{- end }}

{{/* What `dds serve` refuses at start across several settings (values.schema.json, generated from dds/config.py,
     refuses each setting alone), refused here with DDS's reason: tests/integration/chart/test_settings_refusals.py
     renders each. */}}
{{- define "dds.refusals" -}}
{{- $s := .settings }}
{{- /* dds/ops/http.py check_metrics_settings: the chart binds metrics_listen to the pod's address. */}}
{{- if ne (toString (get $s "metrics_secure")) "true" }}
{{- fail (printf "settings.metrics_secure must be true: the chart serves /metrics on the pod's address (%s) for the probes and scrapes, and DDS refuses a metrics_listen that is not a loopback address without metrics_secure (/metrics and /decisions would be open to anyone who can reach it; docs/operations.md \"Who may scrape\")" (get $s "metrics_listen")) }}
{{- end }}
{{- if ne (empty (get $s "metrics_tls_cert")) (empty (get $s "metrics_tls_key")) }}
{{- fail "settings.metrics_tls_cert and settings.metrics_tls_key go together: set both, or neither to serve with the gRPC server's tls_cert and tls_key" }}
{{- end }}
{{- /* dds/config.py Settings._pools_of_the_simulated_fabric and dds/fabric/factory.py require_pools. */}}
{{- $simulated := dig "simulated_fabric" "pools" nil $s }}
{{- $declared := not (kindIs "invalid" (get $s "pools" | default nil)) }}
{{- if eq (get $s "fabric") "simulated" }}
{{- if $declared }}
{{- fail "settings.pools is for a real fabric (composability-request, redfish); the simulated fabric's pools are fabric.settings.pools (simulated_fabric.pools)" }}
{{- end }}
{{- else if and (not $declared) (kindIs "invalid" $simulated) }}
{{- fail (printf "fabric %s: declare the GPU pools the fabric holds in settings.pools, e.g. --set-json 'settings.pools=[{\"name\":\"pool-a\",\"devices\":{\"A100\":16}}]' (docs/install.md \"Declare the pools\")" (get $s "fabric")) }}
{{- end }}
{{- $pools := ternary (get $s "pools") $simulated $declared | default list }}
{{- /* dds/fabric/simulated.py _validate_pools; dds/fabric/composability.py _capacity_from. */}}
{{- $names := dict }}
{{- $poolOfModel := dict }}
{{- range $index, $pool := $pools }}
{{- if and (eq (get $s "fabric") "simulated") (hasKey $names $pool.name) }}
{{- fail (printf "simulated_fabric.pools[%d] (%q): pool name used twice" $index $pool.name) }}
{{- end }}
{{- $_ := set $names $pool.name true }}
{{- if eq (get $s "fabric") "composability-request" }}
{{- range $model, $count := $pool.devices }}
{{- if hasKey $poolOfModel $model }}
{{- fail (printf "pools[%d] (%q): model %s is already in pool %q; the ComposabilityRequest API cannot tell pools apart, so a model must be in one pool only" $index $pool.name $model (get $poolOfModel $model)) }}
{{- end }}
{{- $_ := set $poolOfModel $model $pool.name }}
{{- end }}
{{- end }}
{{- end }}
{{- /* dds/config.py Settings._granted_namespaces_are_read. */}}
{{- $read := get $s "machineset_namespaces" | default list }}
{{- if $read }}
{{- range $namespace, $_ := (get $s "node_group_namespaces" | default dict) }}
{{- if not (has $namespace $read) }}
{{- fail (printf "settings.node_group_namespaces names %s, which settings.machineset_namespaces leaves unread: add it there too, or remove it here" $namespace) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* metrics_secure serves the operations port over TLS (DDS's default is plain HTTP on localhost). */}}
{{- define "dds.metricsScheme" -}}
{{- ternary "HTTPS" "HTTP" (eq (toString .Values.settings.metrics_secure) "true") }}
{{- end }}

{{/* The cert-manager issuer of the server ("server") or of cluster-autoscaler's client certificate ("client"): the
     chart's own CA Issuer with tls.certManager.issuerMode selfSigned, else the one named in values. */}}
{{- define "dds.issuerRef" -}}
{{- $cm := .root.Values.tls.certManager }}
{{- if eq $cm.issuerMode "selfSigned" }}
name: {{ printf "%s-%s-ca" (include "dds.fullname" .root) .role }}
kind: Issuer
group: cert-manager.io
{{- else if eq .role "server" }}
name: {{ required "tls.certManager.issuerRef.name: name the cert-manager Issuer or ClusterIssuer (a CA issuer, so ca.crt is written), or set tls.certManager.issuerMode=selfSigned" $cm.issuerRef.name }}
kind: {{ $cm.issuerRef.kind }}
group: {{ $cm.issuerRef.group }}
{{- else }}
name: {{ required "tls.certManager.clientIssuerRef.name: name a second CA issuer for cluster-autoscaler's client certificate (DDS verifies callers with its CA only), or set tls.certManager.issuerMode=selfSigned" $cm.clientIssuerRef.name }}
kind: {{ $cm.clientIssuerRef.kind }}
group: {{ $cm.clientIssuerRef.group }}
{{- end }}
{{- end }}
