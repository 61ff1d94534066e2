{{/*
The name of every object: the release name if it says sluice, else
RELEASE-sluice. `helm install sluice` (and deploy/sluice.yaml) give "sluice".
*/}}
{{- define "sluice.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sluice.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
{{- end -}}

{{/*
The ConfigMap's data, as JSON: the API server's address and the agent's
flags. The ConfigMap renders it, and the pod template carries its SHA-256
(of exactly this JSON: keys sorted, as encoding/json writes a map), so any
change rolls the pods.
*/}}
{{- define "sluice.configData" -}}
{{- $data := dict
    "KUBERNETES_SERVICE_HOST" (required "apiServer.host: set the API server's real address (an IP, or a name the nodes' resolver knows); see deploy/README.md" .Values.apiServer.host | toString)
    "KUBERNETES_SERVICE_PORT" (.Values.apiServer.port | toString) -}}
{{- range $flag, $value := include "sluice.flags" . | fromJson -}}
{{- $_ := set $data $flag $value -}}
{{- end -}}
{{- toJson $data -}}
{{- end -}}

{{/*
The agent flags the ConfigMap carries and the command line passes, as JSON
(name -> value): .Values.config, and cluster-cidr from .Values.clusterCIDR
if set (over a config.cluster-cidr). A flag the DaemonSet sets itself is
refused in config: given twice, the last would win, and the probes, mounts
or node identity would no longer match it.
*/}}
{{- define "sluice.flags" -}}
{{- $flags := dict -}}
{{- $owned := dict
    "in-cluster" "the agent runs in the cluster"
    "node-name" "the pod's spec.nodeName"
    "node-ip" "the pod's status.hostIPs"
    "bpffs" "set hostPaths.bpffs"
    "cgroup" "set hostPaths.cgroup"
    "proc-sys-net" "the node's /proc/sys/net, mounted"
    "health-addr" "set ports.health"
    "metrics-addr" "set metricsBindAddress and ports.metrics" -}}
{{- range $flag, $value := .Values.config -}}
{{- if hasKey $owned $flag -}}
{{- fail (printf "config.%s: set by the chart (%s); remove it from config" $flag (get $owned $flag)) -}}
{{- end -}}
{{- $_ := set $flags $flag (toString $value) -}}
{{- end -}}
{{- with .Values.clusterCIDR -}}
{{- $_ := set $flags "cluster-cidr" (toString .) -}}
{{- end -}}
{{- toJson $flags -}}
{{- end -}}

{{/* The environment variable that carries a flag's value: log-level -> SLUICE_LOG_LEVEL. */}}
{{- define "sluice.flagEnv" -}}
{{- printf "SLUICE_%s" (. | replace "-" "_" | upper) -}}
{{- end -}}
