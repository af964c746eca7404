{{/*
Shared by the ValidatingAdmissionPolicies that narrow what gpuheal's identities may
change on an object RBAC lets them patch. The key lists are the code's
(gpuheal/model.py); tests/integration/test_security_matrix.py checks they agree.
*/}}

{{/* The permission that marks a holder of the <release>-operator role (no such resource exists). */}}
{{- define "gpuheal.operator.marker" -}}maintenances{{- end -}}

{{/* Node annotations the operator role may write: the maintenance request the
  controller carries out, and a recorded diagnostics run. */}}
{{- define "gpuheal.operator.nodeAnnotations" -}}
{{- toJson (list "gpuheal.io/maintenance-request" "gpuheal.io/diagnostics") -}}
{{- end -}}

{{/* Node annotations the leader writes on a node it takes out and returns for a
  GPURollout or a maintenance request: maintenance's (no diagnostics run), and the
  request, which it removes once carried out. */}}
{{- define "gpuheal.controller.maintenanceAnnotations" -}}
{{- toJson (list "gpuheal.io/maintenance-reason" "gpuheal.io/maintenance-since" "gpuheal.io/maintenance-baseline" "gpuheal.io/maintenance-cordoned" "gpuheal.io/maintenance-rollout" "gpuheal.io/maintenance-request") -}}
{{- end -}}

{{/* Node annotations the controller writes (the repair request: only the controller;
  a maintenance request's progress and result),
  and the autoscalers' it sets for the disruption guard: any of the three it knows
  (model.DISRUPTION_KEYS), whatever autoscalers.doNotDisrupt says now, so that a
  guard set under an earlier config can still be taken back. */}}
{{- define "gpuheal.controller.nodeAnnotations" -}}
{{- toJson (concat (list "gpuheal.io/handled-fault-id" "gpuheal.io/handled-at" "gpuheal.io/last-process-time" "gpuheal.io/quarantined-devices" "gpuheal.io/suspect-devices" "gpuheal.io/unknown-devices" "gpuheal.io/repair-request" "gpuheal.io/disruption-guard" "gpuheal.io/maintenance-progress" "gpuheal.io/sweep") (include "gpuheal.disruptionKeys" . | fromJsonArray)) -}}
{{- end -}}

{{- define "gpuheal.disruptionKeys" -}}
{{- toJson (list "cluster-autoscaler.kubernetes.io/scale-down-disabled" "karpenter.sh/do-not-disrupt" "karpenter.sh/do-not-consolidate") -}}
{{- end -}}

{{/* Node annotations the agent writes: its verdict, its facts, a repair's result (only the agent). */}}
{{- define "gpuheal.agent.nodeAnnotations" -}}
{{- toJson (list "gpuheal.io/status" "gpuheal.io/fault-id" "gpuheal.io/fault-time" "gpuheal.io/fault-reason" "gpuheal.io/fault-devices" "gpuheal.io/fault-severity" "gpuheal.io/driver-version" "gpuheal.io/cuda-version" "gpuheal.io/vbios-version" "gpuheal.io/xid-errors" "gpuheal.io/ecc-errors" "gpuheal.io/counters-since" "gpuheal.io/last-gpu-error" "gpuheal.io/gpu-processes" "gpuheal.io/mig-layout" "gpuheal.io/agent-access" "gpuheal.io/node-environment" "gpuheal.io/repair-result") -}}
{{- end -}}

{{/* CEL variables comparing a node before and after an UPDATE. Absent and empty are the same. */}}
{{- define "gpuheal.nodeWrites.variables" -}}
- name: labels
  expression: "object.metadata.?labels.orValue({})"
- name: oldLabels
  expression: "oldObject.metadata.?labels.orValue({})"
- name: annotations
  expression: "object.metadata.?annotations.orValue({})"
- name: oldAnnotations
  expression: "oldObject.metadata.?annotations.orValue({})"
- name: taints
  expression: "object.spec.?taints.orValue([])"
- name: oldTaints
  expression: "oldObject.spec.?taints.orValue([])"
- name: sameSpecBesideTaintsAndCordon
  expression: >-
    object.spec.all(k, k in ['taints', 'unschedulable'] ||
    (k in oldObject.spec && object.spec[k] == oldObject.spec[k])) &&
    oldObject.spec.all(k, k in ['taints', 'unschedulable'] || k in object.spec)
- name: sameOwnership
  expression: >-
    object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([]) &&
    object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([])
{{- end -}}

{{/* CEL variables: is the node, as it was before the write, one the controller
  manages (gpuheal/policy/nodes.py::managed)? Its nodeSelector matches the node's
  labels (an empty one: the node has capacity of a GPU resource, config.gpuResources,
  a trailing * a prefix), and it is not opted out (gpuheal.io/managed=false). A
  node whose GPUs only DRA publishes needs a label the nodeSelector names, as for
  the controller. */}}
{{- define "gpuheal.controller.managedNode.variables" -}}
{{- $resources := .Values.controller.config.gpuResources | default (list "nvidia.com/gpu" "nvidia.com/mig-*") }}
{{- $names := list }}{{ $prefixes := list }}
{{- range $resources }}
{{- if hasSuffix "*" . }}{{ $prefixes = append $prefixes (trimSuffix "*" .) }}{{ else }}{{ $names = append $names . }}{{ end }}
{{- end }}
- name: nodeSelector
  expression: {{ include "gpuheal.controller.nodeSelector" . | squote }}
- name: gpuResourceNames
  expression: {{ $names | toJson | squote }}
- name: gpuResourcePrefixes
  expression: {{ $prefixes | toJson | squote }}
- name: oldCapacity
  expression: "oldObject.?status.?capacity.orValue({})"
- name: managedNode
  expression: >-
    variables.oldLabels[?'gpuheal.io/managed'].orValue('') != 'false' &&
    (variables.nodeSelector.size() > 0 ?
    variables.nodeSelector.all(k, variables.oldLabels[?k].orValue('') == variables.nodeSelector[k]) :
    variables.oldCapacity.exists(r, variables.oldCapacity[r] != '0' &&
    (r in variables.gpuResourceNames || variables.gpuResourcePrefixes.exists(p, r.startsWith(p)))))
{{- end -}}
