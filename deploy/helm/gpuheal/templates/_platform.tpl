{{/*
Platform presets (`platform`): how the cluster hands the NVIDIA driver to a pod and
which labels its GPU nodes carry. Each helper returns the preset's part; the
templates apply the user's values over it. docs/deploy.md#platforms names the
upstream source of each fact.
*/}}

{{- define "gpuheal.platforms" -}}{{ toJson (list "gpu-operator" "gke" "eks" "generic") }}{{- end -}}

{{/* The platform, checked: a typo would otherwise fall through to no preset at all. */}}
{{- define "gpuheal.platform" -}}
{{- $known := include "gpuheal.platforms" . | fromJsonArray }}
{{- if not (has .Values.platform $known) }}
{{- fail (printf "platform: %q is not one of %s" (toString .Values.platform) (join ", " $known)) }}
{{- end }}
{{- .Values.platform }}
{{- end -}}

{{/* Node selector terms (OR'ed), one list per platform, as JSON. */}}
{{- define "gpuheal.agent.nodeTerms" -}}
{{- $platform := include "gpuheal.platform" . }}
{{- $gfd := dict "matchExpressions" (list (dict "key" "nvidia.com/gpu.present" "operator" "In" "values" (list "true"))) }}
{{- $nfd := dict "matchExpressions" (list (dict "key" "feature.node.kubernetes.io/pci-10de.present" "operator" "In" "values" (list "true"))) }}
{{- $terms := list }}
{{- if eq $platform "gpu-operator" }}
{{- /* GFD (part of the operator) labels every node whose GPUs it found. */}}
{{- $terms = list $gfd }}
{{- else if eq $platform "gke" }}
{{- /* GKE labels every GPU node with its accelerator type (nvidia-h100-80gb, nvidia-l4 ...). */}}
{{- $terms = list (dict "matchExpressions" (list (dict "key" "cloud.google.com/gke-accelerator" "operator" "Exists"))) }}
{{- else if eq $platform "eks" }}
{{- /* No one label covers every EKS provisioner: Karpenter, Auto Mode, the instance
  type (managed and self-managed node groups write nothing else), NFD, GFD. */}}
{{- $gpu := list "nvidia" }}
{{- $terms = list
  (dict "matchExpressions" (list (dict "key" "karpenter.k8s.aws/instance-gpu-manufacturer" "operator" "In" "values" $gpu)))
  (dict "matchExpressions" (list (dict "key" "eks.amazonaws.com/instance-gpu-manufacturer" "operator" "In" "values" $gpu)))
  (dict "matchExpressions" (list (dict "key" "k8s.amazonaws.com/accelerator" "operator" "Exists")))
  (dict "matchExpressions" (list (dict "key" "node.kubernetes.io/instance-type" "operator" "In" "values" .Values.eks.instanceTypes)))
  $nfd $gfd }}
{{- else }}
{{- $terms = list $gfd $nfd }}
{{- end }}
{{- toJson $terms }}
{{- end -}}

{{/* The agent's affinity: the user's `agent.affinity` whole, else the preset's required node affinity. */}}
{{- define "gpuheal.agent.affinity" -}}
{{- if .Values.agent.affinity }}
{{- toYaml .Values.agent.affinity }}
{{- else }}
{{- $terms := include "gpuheal.agent.nodeTerms" . | fromJsonArray }}
{{- toYaml (dict "nodeAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (dict "nodeSelectorTerms" $terms))) }}
{{- end }}
{{- end -}}

{{/* The agent's runtime class: the value, else the preset's (the GPU Operator's `nvidia`). */}}
{{- define "gpuheal.agent.runtimeClassName" -}}
{{- if .Values.agent.runtimeClassName }}{{ .Values.agent.runtimeClassName }}
{{- else if eq (include "gpuheal.platform" .) "gpu-operator" }}nvidia
{{- end }}
{{- end -}}

{{/* Whether GKE's device access applies: GKE hands /dev/nvidia* only to a pod that
  requests GPUs or runs privileged (as GKE's own device plugin and dcgm-exporter do). */}}
{{- define "gpuheal.agent.gkePrivileged" -}}
{{- if and (eq (include "gpuheal.platform" .) "gke") .Values.gke.privileged }}true{{ end }}
{{- end -}}

{{/* The preset's environment, as JSON: the NVIDIA container runtime reads the
  NVIDIA_* variables; on GKE the driver's libraries are a host directory. */}}
{{- define "gpuheal.agent.presetEnv" -}}
{{- if eq (include "gpuheal.platform" .) "gke" }}
{{- toJson (list (dict "name" "LD_LIBRARY_PATH" "value" "/usr/local/nvidia/lib64")) }}
{{- else }}
{{- toJson (list (dict "name" "NVIDIA_VISIBLE_DEVICES" "value" "all") (dict "name" "NVIDIA_DRIVER_CAPABILITIES" "value" "utility")) }}
{{- end }}
{{- end -}}

{{/* The agent config the preset implies (the user's `agent.config` wins): on GKE
  nvidia-smi is not on PATH but in the driver's directory. */}}
{{- define "gpuheal.agent.presetConfig" -}}
{{- $config := dict }}
{{- if eq (include "gpuheal.platform" .) "gke" }}
{{- $smi := list "/usr/local/nvidia/bin/nvidia-smi" }}
{{- $config = dict "smiCommand" $smi "repairResetCommand" $smi }}
{{- end }}
{{- if .Values.agent.hostReboot.enabled }}
{{- if and (hasKey .Values.agent.config "repairRebootMethod") (ne .Values.agent.config.repairRebootMethod "command") }}
{{- fail (printf "agent.hostReboot.enabled reboots through the node's systemd (repairRebootMethod command); agent.config.repairRebootMethod is %q: choose one" .Values.agent.config.repairRebootMethod) }}
{{- end }}
{{- $_ := set $config "repairRebootMethod" "command" }}
{{- $_ := set $config "repairRebootCommand" (include "gpuheal.agent.hostRebootCommand" . | fromJsonArray) }}
{{- end }}
{{- $reset := .Values.agent.gpuReset }}
{{- if $reset.enabled }}
{{- $_ := set $config "repairDaemonTimeoutSeconds" $reset.timeoutSeconds }}
{{- if or (eq $reset.daemons "gpu-operator") $reset.restartPods }}
{{- $_ := set $config "repairDaemonNamespace" $reset.namespace }}
{{- end }}
{{- if eq $reset.daemons "gpu-operator" }}
{{- $_ := set $config "repairPauseLabels" (include "gpuheal.gpuOperator.deployLabels" . | fromJsonArray) }}
{{- $_ := set $config "repairDaemonPods" (include "gpuheal.gpuOperator.daemonPods" . | fromJsonArray) }}
{{- else if ne $reset.daemons "none" }}
{{- fail (printf "agent.gpuReset.daemons: %q is neither gpu-operator nor none" $reset.daemons) }}
{{- end }}
{{- with $reset.restartPods }}{{ $_ := set $config "repairRestartPods" . }}{{ end }}
{{- end }}
{{- toJson $config }}
{{- end -}}

{{/* The node's own systemd, entered from the agent's pod (hostPID): its PID 1's mount
  namespace is the host's, where systemctl talks to the host's systemd. */}}
{{- define "gpuheal.agent.hostRebootCommand" -}}
{{- toJson (list "/usr/bin/nsenter" "--mount=/proc/1/ns/mnt" "--" "/bin/systemctl" "reboot") }}
{{- end -}}

{{/* The GPU Operator's components that hold the GPU open, by the node label its
  DaemonSet selects (nvidia.com/gpu.deploy.<component>=true) and its pods' app label. */}}
{{- define "gpuheal.gpuOperator.deployLabels" -}}
{{- toJson (list "nvidia.com/gpu.deploy.device-plugin" "nvidia.com/gpu.deploy.dcgm" "nvidia.com/gpu.deploy.dcgm-exporter" "nvidia.com/gpu.deploy.gpu-feature-discovery") }}
{{- end -}}
{{- define "gpuheal.gpuOperator.daemonPods" -}}
{{- toJson (list (dict "app" "nvidia-device-plugin-daemonset") (dict "app" "nvidia-dcgm") (dict "app" "nvidia-dcgm-exporter") (dict "app" "gpu-feature-discovery")) }}
{{- end -}}

{{/* The controller's nodeSelector (matchLabels): the value if given, else the
  preset's. Only GFD writes one label on every GPU node; elsewhere {} (GPU capacity). */}}
{{- define "gpuheal.controller.nodeSelector" -}}
{{- if hasKey .Values.controller.config "nodeSelector" }}
{{- toJson (.Values.controller.config.nodeSelector | default dict) }}
{{- else if eq (include "gpuheal.platform" .) "gpu-operator" }}
{{- toJson (dict "nvidia.com/gpu.present" "true") }}
{{- else }}{}
{{- end }}
{{- end -}}

{{/* imagePullSecrets from a list of names or of {name: ...}. */}}
{{- define "gpuheal.imagePullSecrets" -}}
{{- $out := list }}
{{- range .Values.imagePullSecrets }}
{{- $name := . }}
{{- if kindIs "map" . }}{{ $name = get . "name" }}{{ end }}
{{- if not $name }}{{ fail (printf "imagePullSecrets: %v has no name" .) }}{{ end }}
{{- $out = append $out (dict "name" $name) }}
{{- end }}
{{- toJson $out }}
{{- end -}}

{{/*
Checks one program's pass-through values; `.` is a dict: program (for messages),
values (its values), volumes and mounts (the chart's own names and mount paths),
env (the chart's own variable names that may not be overridden).
*/}}
{{- define "gpuheal.checkExtras" -}}
{{- $p := .program }}
{{- $volumes := .volumes }}
{{- range .values.extraVolumes | default list }}
{{- if not .name }}{{ fail (printf "%s.extraVolumes: a volume has no name: %v" $p .) }}{{ end }}
{{- if has .name $volumes }}{{ fail (printf "%s.extraVolumes: %q is already a volume of the chart (or named twice)" $p .name) }}{{ end }}
{{- $volumes = append $volumes .name }}
{{- end }}
{{- $paths := .mounts }}
{{- range .values.extraVolumeMounts | default list }}
{{- if not .name }}{{ fail (printf "%s.extraVolumeMounts: a mount has no name: %v" $p .) }}{{ end }}
{{- if not (has .name $volumes) }}{{ fail (printf "%s.extraVolumeMounts: %q mounts a volume that neither the chart nor %s.extraVolumes has" $p .name $p) }}{{ end }}
{{- if not .mountPath }}{{ fail (printf "%s.extraVolumeMounts: %q has no mountPath" $p .name) }}{{ end }}
{{- if has .mountPath $paths }}{{ fail (printf "%s.extraVolumeMounts: %q is mounted at %s, where something is already mounted" $p .name .mountPath) }}{{ end }}
{{- $paths = append $paths .mountPath }}
{{- end }}
{{- range .values.extraEnv | default list }}
{{- if not .name }}{{ fail (printf "%s.extraEnv: a variable has no name: %v" $p .) }}{{ end }}
{{- if has .name $.env }}{{ fail (printf "%s.extraEnv: %s is the chart's (the downward API's) and may not be replaced" $p .name) }}{{ end }}
{{- end }}
{{- end -}}
