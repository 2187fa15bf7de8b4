{{/*
Names. The picker's objects are called `<release>-epp` and the pool after the
release, as the reference chart calls them, so gateways and dashboards that
name them keep working after the swap.
*/}}
{{- define "epp.fullname" -}}
{{- printf "%s-epp" (.Release.Name | lower | trim | trunc 40) -}}
{{- end -}}

{{- define "epp.poolName" -}}
{{- .Release.Name -}}
{{- end -}}

{{/* Cluster-scoped objects carry the namespace too: one release per namespace may share a name. */}}
{{- define "epp.clusterName" -}}
{{- printf "%s-%s-epp" (.Release.Name | lower | trim | trunc 40) (.Release.Namespace | lower | trim | trunc 40) -}}
{{- end -}}

{{- define "epp.metricsReaderName" -}}
{{- printf "%s-metrics-reader" (include "epp.fullname" .) -}}
{{- end -}}

{{/* Selects the picker's pods. The reference's label: a Deployment's selector cannot change, so `helm upgrade` from the reference chart works. */}}
{{- define "epp.selectorLabels" -}}
inferencepool: {{ include "epp.fullname" . }}
{{- end -}}

{{- define "epp.labels" -}}
app.kubernetes.io/name: epp
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: endpoint-picker
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The pool's API group and version, from inferencePool.apiVersion. */}}
{{- define "epp.poolGroup" -}}
{{- (split "/" .Values.inferencePool.apiVersion)._0 -}}
{{- end -}}

{{- define "epp.leaderElection" -}}
{{- $ie := .Values.inferenceExtension -}}
{{- $sync := and $ie.peerSync $ie.peerSync.enabled -}}
{{- if or (and (gt (int $ie.replicas) 1) (not $sync)) $ie.enableLeaderElection -}}true{{- end -}}
{{- end -}}

{{/* The headless Service naming every replica, for peer sync. */}}
{{- define "epp.peersService" -}}
{{- printf "%s-peers" (include "epp.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "epp.image" -}}
{{- $img := .Values.inferenceExtension.image -}}
{{- $tag := $img.tag | default .Chart.AppVersion -}}
{{- if $img.registry -}}
{{- printf "%s/%s:%s" $img.registry $img.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $img.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The generated default EndpointPickerConfig (epp's format is the reference's). */}}
{{- define "epp.defaultConfig" -}}
{{- $ds := .Values.inferenceExtension.metricsDataSource -}}
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
  parameters:
    scheme: {{ $ds.scheme | quote }}
    path: {{ $ds.path | quote }}
    insecureSkipVerify: {{ $ds.insecureSkipVerify }}
- type: core-metrics-extractor
  parameters:
    defaultEngine: {{ .Values.inferencePool.modelServerType | quote }}
{{- with .Values.inferencePool.parser }}
- type: {{ . }}
{{- end }}
{{- $sync := .Values.inferenceExtension.peerSync }}
{{- if and $sync $sync.enabled }}
- type: udp-peer-syncer
  parameters:
    address: {{ printf "0.0.0.0:%d" (int $sync.port) | quote }}
- type: static-peer-discovery
  parameters:
    peers:
    - {{ printf "%s.%s.svc:%d" (include "epp.peersService" .) .Release.Namespace (int $sync.port) | quote }}
{{- end }}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
{{- if and $sync $sync.enabled }}
dataLayer:
  peerDiscovery:
    pluginRef: static-peer-discovery
  crossReplicaSyncerPluginRef: udp-peer-syncer
  crossReplicaSyncInterval: {{ $sync.interval | quote }}
{{- end }}
{{- end -}}

{{/* Every ConfigMap entry: the default config and pluginsCustomConfig. */}}
{{- define "epp.configData" -}}
{{- $data := dict "default-plugins.yaml" (include "epp.defaultConfig" .) -}}
{{- range $file, $text := .Values.inferenceExtension.pluginsCustomConfig -}}
{{- $_ := set $data $file $text -}}
{{- end -}}
{{- toYaml $data -}}
{{- end -}}

{{/*
Refuses values epp cannot honour, with the reason, instead of rendering
something that would not work.
*/}}
{{- define "epp.validate" -}}
{{- $ie := .Values.inferenceExtension -}}
{{- $pool := .Values.inferencePool -}}
{{- if not (and $pool.modelServers $pool.modelServers.matchLabels) -}}
{{- fail "inferencePool.modelServers.matchLabels is required: the labels of the model server pods (e.g. --set inferencePool.modelServers.matchLabels.app=vllm-llama3-8b)" -}}
{{- end -}}
{{- if not (has $pool.apiVersion (list "inference.networking.k8s.io/v1" "inference.networking.x-k8s.io/v1alpha2")) -}}
{{- fail (printf "inferencePool.apiVersion %q: use inference.networking.k8s.io/v1 or inference.networking.x-k8s.io/v1alpha2" $pool.apiVersion) -}}
{{- end -}}
{{- $ports := len $pool.targetPorts -}}
{{- if or (lt $ports 1) (gt $ports 8) -}}
{{- fail (printf "inferencePool.targetPorts: 1 to 8 ports, got %d" $ports) -}}
{{- end -}}
{{- if and (eq $pool.apiVersion "inference.networking.x-k8s.io/v1alpha2") (gt $ports 1) -}}
{{- fail "inferencePool.targetPorts: the v1alpha2 pool has one port (targetPortNumber); use apiVersion inference.networking.k8s.io/v1 for several" -}}
{{- end -}}
{{- if not (has $pool.modelServerType (list "vllm" "sglang" "triton-tensorrt-llm" "trtllm-serve")) -}}
{{- fail (printf "inferencePool.modelServerType %q: epp knows the metrics of vllm, sglang, triton-tensorrt-llm and trtllm-serve (others: declare an engineConfigs entry in pluginsCustomConfig)" $pool.modelServerType) -}}
{{- end -}}
{{- if ne ($pool.modelServerProtocol | default "http") "http" -}}
{{- fail (printf "inferencePool.modelServerProtocol %q: epp parses HTTP (OpenAI-compatible) requests only" $pool.modelServerProtocol) -}}
{{- end -}}
{{- if not (has ($pool.parser | default "") (list "" "openai-parser")) -}}
{{- fail (printf "inferencePool.parser %q: epp has openai-parser (also the default when empty)" $pool.parser) -}}
{{- end -}}
{{- if not (has $ie.failureMode (list "FailOpen" "FailClose")) -}}
{{- fail (printf "inferenceExtension.failureMode %q: FailOpen or FailClose" $ie.failureMode) -}}
{{- end -}}
{{- if and $ie.latencyPredictor $ie.latencyPredictor.enabled -}}
{{- fail "inferenceExtension.latencyPredictor.enabled: epp predicts latency in-process and needs no predictor sidecars; set it to false and declare predicted-latency-producer and latency-scorer in the plugins config (docs/plugins.md)" -}}
{{- end -}}
{{- if not (has (.Values.provider.name | default "none" | lower) (list "none" "istio")) -}}
{{- fail (printf "provider.name %q: this chart creates Istio's DestinationRule (istio) or nothing (none); create other providers' objects beside the release (docs/install.md)" .Values.provider.name) -}}
{{- end -}}
{{- $data := include "epp.configData" . | fromYaml -}}
{{- if not (hasKey $data $ie.pluginsConfigFile) -}}
{{- fail (printf "inferenceExtension.pluginsConfigFile %q is neither default-plugins.yaml nor a key of pluginsCustomConfig" $ie.pluginsConfigFile) -}}
{{- end -}}
{{- if and $ie.monitoring.prometheus.enabled $ie.monitoring.prometheus.auth.enabled (not $ie.monitoring.prometheus.auth.secretName) -}}
{{- fail "inferenceExtension.monitoring.prometheus.auth.secretName is required when the ServiceMonitor authenticates" -}}
{{- end -}}
{{- end -}}
