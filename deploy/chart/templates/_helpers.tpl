{{/* The name of every object, as in deploy/daemonset.yaml. */}}
{{- define "nld.name" -}}nodelocaldns{{- end -}}

{{/* Labels of every object: the manifest's selector label, and commonLabels. */}}
{{- define "nld.labels" -}}
k8s-app: {{ include "nld.name" . }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The image reference: repository, :tag (appVersion by default), @digest. */}}
{{- define "nld.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- .Values.image.repository -}}
{{- if $tag }}:{{ $tag }}{{ end -}}
{{- with .Values.image.digest }}@{{ . }}{{ end -}}
{{- end -}}

{{/* -localip: the link-local addresses, and in iptables mode the kube-dns
ClusterIP (or the kubelet's $(KUBE_DNS_SERVICE_HOST) for kubeDNS.service). */}}
{{- define "nld.localip" -}}
{{- $ips := .Values.localIPs -}}
{{- if eq .Values.mode "iptables" -}}
{{- $env := printf "$(%s_SERVICE_HOST)" (.Values.kubeDNS.service | upper | replace "-" "_") -}}
{{- $ips = append $ips (.Values.kubeDNS.clusterIP | default $env) -}}
{{- end -}}
{{- join "," $ips -}}
{{- end -}}

{{/* GOMEMLIMIT: the value, or the mode's default. */}}
{{- define "nld.goMemLimit" -}}
{{- if .Values.goMemLimit }}{{ .Values.goMemLimit }}{{ else if eq .Values.mode "lrp" }}160MiB{{ else }}168MiB{{ end -}}
{{- end -}}

{{/* Whether the daemon runs from a Corefile (a ConfigMap). */}}
{{- define "nld.corefile" -}}
{{- if or (eq .Values.mode "lrp") .Values.corefile.extraBlocks .Values.corefile.override }}true{{ end -}}
{{- end -}}

{{/* Whether the pods mount the service account token: the endpoint watch
(not in lrp mode, as deploy/lrp) and -autopath's pod watch need it. */}}
{{- define "nld.token" -}}
{{- if or .Values.autopath.enabled (and (ne .Values.mode "lrp") .Values.rbac.endpointSlices) }}true{{ end -}}
{{- end -}}

{{/* Whether the pods carry prometheus.io annotations. */}}
{{- define "nld.scrapeAnnotations" -}}
{{- if and .Values.metrics.podAnnotations (not .Values.metrics.serviceMonitor.enabled) (not .Values.metrics.podMonitor.enabled) }}true{{ end -}}
{{- end -}}

{{/* What the schema cannot say, with the reason. */}}
{{- define "nld.validate" -}}
{{- if not .Values.image.repository -}}
{{- fail "image.repository is required: the image built from the repository's Dockerfile, e.g. --set image.repository=registry.example.com/nodelocaldns (docs/deploy.md, \"Build the image\")" -}}
{{- end -}}
{{- if ne .Release.Namespace .Values.kubeDNS.namespace -}}
{{- fail (printf "namespace %q: install into kube-dns' namespace, kubeDNS.namespace %q (helm install -n %s): %s selects the kube-dns pods, and a Service selects pods of its own namespace only" .Release.Namespace .Values.kubeDNS.namespace .Values.kubeDNS.namespace .Values.upstreamService.name) -}}
{{- end -}}
{{- range .Values.localIPs -}}
{{- if regexMatch "^[fF][eE][89aAbB]" . -}}
{{- fail (printf "localIPs: %s is an IPv6 link-local address, which needs a zone that resolv.conf and -localip do not take; pick an unused unique-local address such as fd00::10 (docs/deploy.md, section 7)" .) -}}
{{- end -}}
{{- end -}}
{{- if eq (int .Values.metrics.port) 53 -}}
{{- fail "metrics.port 53 is the DNS port" -}}
{{- end -}}
{{- if and .Values.corefile.extraBlocks .Values.corefile.override -}}
{{- fail "corefile.extraBlocks and corefile.override: set one (override is the whole Corefile)" -}}
{{- end -}}
{{- if and (ne .Values.mode "iptables") .Values.kubeDNS.clusterIP -}}
{{- fail (printf "kubeDNS.clusterIP is served in iptables mode only; mode %s serves %s" .Values.mode (ternary "the pod's own addresses (Cilium redirects the ClusterIP)" "the link-local addresses only" (eq .Values.mode "lrp"))) -}}
{{- end -}}
{{- end -}}

{{/* The cache snapshot's volume (-cache-snapshot-dir): the pod's own tmpfs,
which a restarted container finds again and no other pod reads, sized for
-cache-snapshot-max-bytes' 8 MiB twice (the old file and the new one while it
replaces it), charged to the pod's memory (deploy/daemonset.yaml). */}}
{{- define "nld.snapshotVolume" -}}
- name: cache-snapshot
  emptyDir:
    medium: Memory
    sizeLimit: 16Mi
{{- end -}}
