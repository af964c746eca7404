"""Doctor's second question: does the scheduler see the node's GPUs?

Allocatable against capacity and against the count the node should offer, the
agent's fault report, the device-plugin pod, the labels workloads select on,
and every taint with who put it there — including taints gpuheal left behind.
"""

from __future__ import annotations

import re

from gpuheal.clock import duration, parse_time
from gpuheal.config import Config
from gpuheal.kube.details import Node, Pod, Taint
from gpuheal.model import (
    AGENT_ACCESS,
    FAULT_DEVICES,
    FAULT_ID,
    FAULT_REASON,
    FAULT_TIME,
    GPU_HEALTHY_CONDITION,
    MAINTENANCE_SINCE,
    QUARANTINED_DEVICES,
    STATE_LABEL,
    STATE_MAINTENANCE,
    STATUS,
    STATUS_FAULTY,
    TAINT_KEY,
)
from gpuheal.ops.cluster import annotations_of, labels_of, name_of
from gpuheal.ops.dravisibility import dra_node, question_dra
from gpuheal.ops.findings import (
    BAD,
    INFO,
    OK,
    WARN,
    Facts,
    Finding,
    condition_of,
    plural,
    pod_key,
    said,
    when,
)
from gpuheal.ops.fleet import gpu_node, pod_gpus, pod_live
from gpuheal.ops.scheduling import (
    UNSCHEDULABLE_TAINT,
    node_allocatable,
    node_capacity,
    taint_text,
    taints_of,
    toleration_text,
)
from gpuheal.policy import access
from gpuheal.policy.nodes import in_maintenance
from gpuheal.policy.pools import NO_POOL, expected_gpus, pool_config, pool_of
from gpuheal.values import taint_value

# A maintenance older than this many drain timeouts was probably forgotten.
MAINTENANCE_OVERDUE_FACTOR = 4
# Restarts of the device-plugin pod worth a warning.
DEVICE_PLUGIN_RESTARTS = 3
# GPU feature discovery's label that workloads select a GPU model with.
GFD_PRODUCT = "nvidia.com/gpu.product"


def question_gpus(node: Node, facts: Facts, config: Config) -> list[Finding]:
    if dra_node(node, facts, config):
        return [
            *question_dra(node, facts, config),
            *_agent_report(node, facts),
            *_labels(node, facts, config),
            *_taints(node, facts, config),
        ]
    labels = labels_of(node)
    capacity, allocatable = node_capacity(node, config), node_allocatable(node, config)
    expected = expected_gpus(labels, config)
    if not gpu_node(node, config) and not sum(capacity.values()) and not expected:
        selector = ", ".join(f"{k}={v}" for k, v in config.node_selector.items())
        return [
            Finding(
                WARN,
                "not-gpu-node",
                f"Node {facts.name} offers no GPU resource and does not carry {selector}: "
                "it is not a GPU node. If it should be, check its driver, the NVIDIA device "
                "plugin and GPU feature discovery.",
            ),
            *_taints(node, facts, config),
        ]
    findings = _gpu_counts(
        node, facts, config, capacity=capacity, allocatable=allocatable, expected=expected
    )
    findings += _agent_report(node, facts)
    findings += _device_plugin(facts, config, sum(allocatable.values()))
    findings += _labels(node, facts, config)
    findings += _taints(node, facts, config)
    return findings


def _gpu_counts(
    node: Node,
    facts: Facts,
    config: Config,
    *,
    capacity: dict[str, int],
    allocatable: dict[str, int],
    expected: int | None,
) -> list[Finding]:
    labels = labels_of(node)
    pool = pool_of(labels, config)
    offered, present = sum(allocatable.values()), sum(capacity.values())
    if pool_config(pool, config).gpus_per_node is not None:
        source = f"gpusPerNode of pool {pool}"
    else:
        source = f"label {config.pools.expected_gpus_label}"
    names = sorted(set(capacity) | set(allocatable))
    resource = names[0] if len(names) == 1 else pool_config(pool, config).resource
    detail = "; ".join(
        f"{r}: {allocatable.get(r, 0)} allocatable of {capacity.get(r, 0)} capacity" for r in names
    )
    if offered == 0:
        should = expected if expected else present
        if present:
            cause = (
                f"capacity is {present}, so the device plugin registered the GPUs but reports "
                "none healthy. Check `nvidia-smi` on the host and the device-plugin pod's log"
            )
        else:
            cause = (
                "the device plugin has not registered the GPUs. Check that the device-plugin "
                "pod runs on the node and that the driver loads (`nvidia-smi` on the host)"
            )
        offer = f"should offer {should}" if should else "is labelled a GPU node"
        return [
            Finding(
                BAD,
                "zero-allocatable",
                f"allocatable {resource} is 0 while the node {offer}: {cause}. Until then "
                "no GPU pod can be scheduled here.",
            )
        ]
    held = [p for p in facts.pods_on_node if pod_live(p) and pod_gpus(p, config) > 0]
    in_use = sum(pod_gpus(p, config) for p in held)
    use = f"{in_use} in use by {plural(len(held), 'pod')}" if held else "none in use"
    if expected is not None and offered < expected:
        missing = expected - offered
        if present > offered:
            why = (
                f"capacity is {present}, so the device plugin reports {present - offered} "
                "unhealthy: check `nvidia-smi` and the kernel log (Xid) on the host"
            )
        else:
            why = (
                "the device plugin does not see them: a GPU may have fallen off the bus "
                "(`nvidia-smi`, `dmesg | grep -i xid` on the host)"
            )
        return [
            Finding(
                BAD,
                "gpus-missing",
                f"The node offers {offered} allocatable GPUs but should offer {expected} "
                f"({source}): {missing} missing; {why}. ({detail})",
            )
        ]
    if expected is not None and offered > expected:
        return [
            Finding(
                WARN,
                "gpus-unexpected",
                f"The node offers {offered} allocatable GPUs, more than the {expected} expected "
                f"({source}): correct the pool's gpusPerNode or the label. ({detail}; {use})",
            )
        ]
    as_expected = f", as expected ({source})" if expected is not None else ""
    return [
        Finding(
            OK,
            "gpus-visible",
            f"The scheduler sees {offered} allocatable GPUs{as_expected}; {use}. ({detail})",
        )
    ]


def _agent_report(node: Node, facts: Facts) -> list[Finding]:
    annotations = annotations_of(node)
    findings = []
    if annotations.get(STATUS) == STATUS_FAULTY:
        devices = annotations.get(FAULT_DEVICES)
        on = f" on {devices}" if devices else ""
        findings.append(
            Finding(
                BAD,
                "gpu-fault-reported",
                f"The gpuheal agent reports a GPU fault{on}: "
                f"{annotations.get(FAULT_REASON) or 'no reason given'} (fault "
                f"{annotations.get(FAULT_ID) or '?'}, since "
                f"{when(parse_time(annotations.get(FAULT_TIME)), facts.now)}).",
            )
        )
    health = condition_of(node, GPU_HEALTHY_CONDITION)
    if health is not None and health.status == "False" and not findings:
        findings.append(
            Finding(
                BAD,
                "gpu-unhealthy",
                f"Condition {GPU_HEALTHY_CONDITION} is False since "
                f"{when(health.lastTransitionTime, facts.now)} ({said(health)}).",
            )
        )
    elif (
        health is not None
        and health.status == "Unknown"
        and health.reason not in access.REASONS  # the agent's access says why, below
    ):
        findings.append(
            Finding(
                WARN,
                "gpu-health-unknown",
                f"Condition {GPU_HEALTHY_CONDITION} is Unknown since "
                f"{when(health.lastTransitionTime, facts.now)} ({said(health)}): the agent's "
                "probes could not run; check the gpuheal agent pod on the node.",
            )
        )
    findings += _agent_access(annotations)
    quarantined = annotations.get(QUARANTINED_DEVICES)
    if quarantined:
        findings.append(
            Finding(
                WARN,
                "devices-quarantined",
                f"gpuheal quarantined GPU devices {quarantined}: pods holding them were moved, "
                "the rest of the node still serves.",
            )
        )
    return findings


_KEBAB = re.compile(r"(?<!^)(?=[A-Z])")
# What each problem of the agent's access means for the node (policy/access.py).
_ACCESS_LEVEL = {
    access.NVML_LIBRARY_NOT_FOUND: BAD,
    access.NVML_DRIVER_NOT_LOADED: BAD,
    access.NVML_NO_PERMISSION_REASON: BAD,
    access.NVML_UNAVAILABLE: BAD,
    access.NO_GPUS_VISIBLE: BAD,
    access.KERNEL_LOG_UNREADABLE: WARN,
}


def _agent_access(annotations: dict[str, str]) -> list[Finding]:
    """What the agent reaches on the node, as it last said (gpuheal.io/agent-access)."""
    value = annotations.get(AGENT_ACCESS)
    if value is None:
        return []
    reach = access.decode(value)
    if reach is None:
        return [Finding(WARN, "agent-access-unreadable", f"{AGENT_ACCESS} is {value!r}.")]
    problems = access.problems(reach)
    if not problems:
        reaches = access.describe(reach)
        return [Finding(OK, "agent-access", f"The gpuheal agent reaches: {reaches}.")]
    return [
        Finding(
            _ACCESS_LEVEL[p.reason],
            "agent-" + _KEBAB.sub("-", p.reason).lower(),  # agent-nvml-library-not-found
            f"The gpuheal agent cannot see everything ({p.reason}): {p.message}. It reaches: "
            f"{access.describe(reach)}. docs/deploy.md: the chart's platform values.",
        )
        for p in problems
    ]


def _device_plugin(facts: Facts, config: Config, offered: int) -> list[Finding]:
    gate = config.health_gate
    selector = ", ".join(f"{k}={v}" for k, v in sorted(gate.device_plugin_selector.items()))
    pods = [
        p
        for p in facts.pods_on_node
        if pod_live(p)
        and (not gate.device_plugin_namespaces or _namespace(p) in gate.device_plugin_namespaces)
        and gate.device_plugin_selector
        and all(labels_of(p).get(k) == v for k, v in gate.device_plugin_selector.items())
    ]
    if not pods:
        if gate.device_plugin_required or offered == 0:
            return [
                Finding(
                    BAD,
                    "device-plugin-missing",
                    f"No device-plugin pod ({selector}) runs on the node: without it the "
                    "kubelet offers no GPUs. Check the DaemonSet's nodeSelector and "
                    "tolerations against this node's labels and taints "
                    f"(`kubectl get ds -A -l {selector.replace(' ', '')}`).",
                )
            ]
        return [
            Finding(
                INFO,
                "device-plugin-not-found",
                f"No device-plugin pod labelled {selector} was found on the node; the GPUs are "
                "registered, so it may run under other labels (healthGate.devicePluginSelector).",
            )
        ]
    findings = []
    for pod in pods:
        statuses = list(pod.status.containerStatuses or ())
        restarts = sum(s.restartCount for s in statuses)
        ready = all(s.ready for s in statuses) and bool(statuses)
        if not ready:
            waiting = [
                s.state.waiting.reason
                for s in statuses
                if s.state and s.state.waiting and s.state.waiting.reason
            ]
            state = ", ".join(waiting) or pod.status.phase or "unknown"
            findings.append(
                Finding(
                    BAD,
                    "device-plugin-not-ready",
                    f"The device-plugin pod {pod_key(pod)} is not Ready ({state}): the GPUs it "
                    f"serves can vanish from allocatable. Read its log: `kubectl -n "
                    f"{_namespace(pod)} logs {name_of(pod)}`.",
                )
            )
        elif restarts >= DEVICE_PLUGIN_RESTARTS:
            last = [
                s.lastState.terminated.reason
                for s in statuses
                if s.lastState and s.lastState.terminated and s.lastState.terminated.reason
            ]
            why = f" (last: {', '.join(last)})" if last else ""
            findings.append(
                Finding(
                    WARN,
                    "device-plugin-restarting",
                    f"The device-plugin pod {pod_key(pod)} has restarted {restarts} times{why}: "
                    f"`kubectl -n {_namespace(pod)} logs {name_of(pod)} --previous`.",
                )
            )
        else:
            findings.append(
                Finding(OK, "device-plugin-ready", f"Device-plugin pod {pod_key(pod)} is Ready.")
            )
    return findings


def _namespace(pod: Pod) -> str:
    return pod.metadata.namespace or ""


def _labels(node: Node, facts: Facts, config: Config) -> list[Finding]:
    labels = labels_of(node)
    name = facts.name
    findings = []
    for key, value in sorted(config.node_selector.items()):
        if labels.get(key) != value:
            now = f" (it is {labels[key]!r})" if key in labels else ""
            findings.append(
                Finding(
                    WARN,
                    "missing-label",
                    f"Label {key}={value} is missing{now}: gpuheal does not manage this node, "
                    f"and workloads that select {key}={value} do not land here. GPU feature "
                    f"discovery sets it, or `kubectl label node {name} {key}={value}`.",
                )
            )
    gfd = [k for k in (GFD_PRODUCT, config.pools.expected_gpus_label) if k not in labels]
    if gfd:
        findings.append(
            Finding(
                WARN,
                "missing-label",
                f"GPU feature discovery's {plural(len(gfd), 'label')} {', '.join(gfd)} "
                f"{'is' if len(gfd) == 1 else 'are'} missing: workloads that select a GPU "
                "model do not land here, and the expected GPU count is unknown. Check the "
                "gpu-feature-discovery pod on the node.",
            )
        )
    pool = pool_of(labels, config)
    if pool == NO_POOL:
        keys = ", ".join((config.pools.label, *config.pools.fallback_labels))
        findings.append(
            Finding(
                WARN,
                "no-pool",
                f"The node belongs to no pool (none of the labels {keys}): its pool's GPU "
                "count and driver cannot be checked.",
            )
        )
    elif config.pools.label not in labels:
        findings.append(
            Finding(
                INFO,
                "pool",
                f"Pool {pool}, from a fallback label ({config.pools.label} is not set).",
            )
        )
    if not findings:
        findings.append(
            Finding(
                OK,
                "labels",
                f"The labels the scheduler and gpuheal rely on are set (pool {pool}, "
                f"{labels.get(GFD_PRODUCT)}, {labels.get(config.pools.expected_gpus_label)} "
                "GPUs).",
            )
        )
    return findings


def _taints(node: Node, facts: Facts, config: Config) -> list[Finding]:
    name, now = facts.name, facts.now
    labelled = in_maintenance(labels_of(node))
    findings = []
    taints = [t for t in taints_of(node) if t.key != UNSCHEDULABLE_TAINT]  # the cordon: Q1
    for taint in taints:
        text = taint_text(taint)
        if taint.key == TAINT_KEY:
            findings.append(_fault_taint(taint, facts))
        elif taint.key == config.maintenance.taint_key:
            since = parse_time(annotations_of(node).get(MAINTENANCE_SINCE))
            overdue = MAINTENANCE_OVERDUE_FACTOR * config.maintenance.drain_timeout_seconds
            if not labelled:
                findings.append(
                    Finding(
                        BAD,
                        "stale-maintenance-taint",
                        f"Taint {text}: a maintenance taint was left behind, the node is not "
                        f"labelled {STATE_LABEL}={STATE_MAINTENANCE}. Run `gpuheal maintenance "
                        f"finish {name}`: it checks the node and removes the taint.",
                    )
                )
            elif since is not None and (now - since).total_seconds() > overdue:
                findings.append(
                    Finding(
                        WARN,
                        "maintenance-overdue",
                        f"Taint {text}: the node has been in maintenance for "
                        f"{duration((now - since).total_seconds())}, more than "
                        f"{MAINTENANCE_OVERDUE_FACTOR} times the drain timeout: forgotten? Run "
                        f"`gpuheal maintenance finish {name}`.",
                    )
                )
            else:
                findings.append(
                    Finding(
                        INFO,
                        "maintenance-taint",
                        f"Taint {text}: set by `gpuheal maintenance start`; `gpuheal "
                        f"maintenance finish {name}` removes it.",
                    )
                )
        elif taint.key.startswith("node.kubernetes.io/"):
            findings.append(
                Finding(
                    INFO,
                    "system-taint",
                    f"Taint {text}: set by Kubernetes for a node condition; it goes when the "
                    "condition clears.",
                )
            )
        else:
            findings.append(
                Finding(
                    INFO,
                    "taint",
                    f"Taint {text}: not gpuheal's; only pods with the toleration "
                    f"{toleration_text(taint)} land here.",
                )
            )
    keys = {t.key for t in taints}
    cordoned = bool(node.spec.unschedulable)
    if labelled and config.maintenance.taint_key not in keys and not cordoned:
        findings.append(
            Finding(
                WARN,
                "maintenance-incomplete",
                f"The node is labelled {STATE_LABEL}={STATE_MAINTENANCE} but has neither the "
                f"{config.maintenance.taint_key} taint nor a cordon: new pods can land on it. "
                f"Re-run `gpuheal maintenance start {name} --reason ...` or finish it.",
            )
        )
    if not taints:
        findings.append(Finding(OK, "no-taints", "The node has no taints."))
    return findings


def _fault_taint(taint: Taint, facts: Facts) -> Finding:
    text, name = taint_text(taint), facts.name
    if facts.faults is None:
        return Finding(
            BAD,
            "quarantined",
            f"Taint {text}: the gpuheal controller quarantined the node for fault "
            f"{taint.value or '?'} (its GPUFault records could not be read).",
        )
    open_ = [r for r in facts.faults if r.open and not r.device_scope]
    record = next((r for r in open_ if taint_value(r.fault_id) == taint.value), None) or next(
        iter(open_), None
    )
    if record is None:
        return Finding(
            BAD,
            "stale-fault-taint",
            f"Taint {text}: gpuheal's fault taint, but no open GPUFault record exists for "
            f"the node: it was left behind. If the GPUs are fine, remove it with `kubectl "
            f"taint node {name} {taint.key}-`.",
        )
    return Finding(
        BAD,
        "quarantined",
        f"Taint {text}: the gpuheal controller quarantined the node for fault "
        f"{record.fault_id} ({record.reason or 'no reason'}, phase {record.phase.value}) since "
        f"{when(parse_time(record.detected_at or record.created_at), facts.now)}; see `kubectl "
        f"get gpufault {record.name}`. The controller returns the node itself once the fault "
        "clears and the health gate passes.",
    )
