"""What the scheduler and the eviction API check, as pure functions of API objects.

`gpuheal doctor` uses these to explain a Pending GPU pod or a stuck drain in
the scheduler's own terms: a pod's label constraints (nodeSelector, required
node affinity), taints against tolerations, GPU requests per resource, and the
label selectors of PodDisruptionBudgets. Only the parts that decide where GPU
pods can go are modelled; pod (anti-)affinity and topology spread are not.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuheal.config import Config
from gpuheal.kube.details import (
    LabelSelector,
    Node,
    NodeSelectorTerm,
    Pod,
    SelectorRequirement,
    Taint,
    Toleration,
)
from gpuheal.kube.projections import Resources
from gpuheal.ops.cluster import labels_of, name_of, quantity

# Taints that keep pods away; PreferNoSchedule only steers.
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
# The taint the node lifecycle controller mirrors from spec.unschedulable (cordon).
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def taints_of(node: Node) -> list[Taint]:
    return list(node.spec.taints or ())


def tolerates(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    """The scheduler's rule: one toleration matching the taint's key, value and effect."""
    for toleration in tolerations:
        if toleration.effect and toleration.effect != taint.effect:
            continue
        if (toleration.operator or "Equal") == "Exists":
            if not toleration.key or toleration.key == taint.key:
                return True
        elif toleration.key == taint.key and (toleration.value or "") == (taint.value or ""):
            return True
    return False


def untolerated_taints(pod: Pod, node: Node) -> list[Taint]:
    """The node's NoSchedule/NoExecute taints the pod does not tolerate."""
    tolerations = list(pod.spec.tolerations or ())
    return [
        t for t in taints_of(node) if t.effect in BLOCKING_EFFECTS and not tolerates(tolerations, t)
    ]


def taint_text(taint: Taint) -> str:
    """kubectl's form: key=value:Effect (key:Effect without a value)."""
    value = f"={taint.value}" if taint.value else ""
    return f"{taint.key}{value}:{taint.effect}"


def toleration_text(taint: Taint) -> str:
    """The toleration that lets a pod past this taint, as YAML flow text."""
    if taint.value:
        return (
            f"{{key: {taint.key}, operator: Equal, value: {taint.value}, effect: {taint.effect}}}"
        )
    return f"{{key: {taint.key}, operator: Exists, effect: {taint.effect}}}"


def _requirement_matches(req: SelectorRequirement, labels: Mapping[str, str]) -> bool:
    value = labels.get(req.key)
    values = list(req.values or ())
    if req.operator in ("Gt", "Lt"):
        try:
            have, bound = int(value or ""), int(values[0])
        except (ValueError, IndexError):
            return False
        return have > bound if req.operator == "Gt" else have < bound
    return _set_operator(req.operator, value, values)


def _set_operator(operator: str, value: str | None, values: Sequence[str]) -> bool:
    """In, NotIn, Exists, DoesNotExist: shared by node and label selectors."""
    return {
        "In": value is not None and value in values,
        "NotIn": value is None or value not in values,
        "Exists": value is not None,
        "DoesNotExist": value is None,
    }.get(operator, False)


def _term_matches(term: NodeSelectorTerm, labels: Mapping[str, str], name: str) -> bool:
    expressions = list(term.matchExpressions or ())
    fields = list(term.matchFields or ())
    if not expressions and not fields:
        return False  # an empty term selects no node
    return all(_requirement_matches(r, labels) for r in expressions) and all(
        _requirement_matches(r, {"metadata.name": name}) for r in fields
    )


def _required_terms(pod: Pod) -> list[NodeSelectorTerm] | None:
    affinity = pod.spec.affinity
    node_affinity = affinity.nodeAffinity if affinity else None
    if node_affinity is None:
        return None
    required = node_affinity.requiredDuringSchedulingIgnoredDuringExecution
    return None if required is None else list(required.nodeSelectorTerms or ())


def admits(pod: Pod, node: Node) -> bool:
    """The pod's label constraints (nodeSelector, required node affinity) allow the node.

    Taints, resources and readiness are separate questions (see the callers).
    """
    spec = pod.spec
    if spec.nodeName:
        return spec.nodeName == name_of(node)
    labels = labels_of(node)
    if any(labels.get(k) != v for k, v in (spec.nodeSelector or {}).items()):
        return False
    terms = _required_terms(pod)
    return terms is None or any(_term_matches(t, labels, name_of(node)) for t in terms)


def constraint_text(pod: Pod) -> str:
    """The pod's label constraints in words, for "matches no node" sentences."""
    spec = pod.spec
    parts = [f"{k}={v}" for k, v in sorted(((spec.nodeSelector if spec else None) or {}).items())]
    described = f"nodeSelector {', '.join(parts)}" if parts else ""
    terms = _required_terms(pod)
    if terms is not None:
        shown = " or ".join(_term_text(t) for t in terms) or "(no terms)"
        described = f"{described} and " if described else ""
        described += f"required node affinity {shown}"
    return described or "no node constraint"


def _term_text(term: NodeSelectorTerm) -> str:
    def one(r: SelectorRequirement) -> str:
        values = ",".join(r.values or ())
        return f"{r.key} {r.operator} ({values})" if values else f"{r.key} {r.operator}"

    return " and ".join(one(r) for r in [*(term.matchExpressions or ()), *(term.matchFields or ())])


def selector_matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector: None selects nothing, an empty one everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.matchLabels or {}).items()):
        return False
    for req in selector.matchExpressions or ():
        if not _set_operator(req.operator, labels.get(req.key), list(req.values or ())):
            return False
    return True


def gpu_resources(resources: Mapping[str, str] | None, config: Config) -> dict[str, int]:
    """The GPU resources (nvidia.com/gpu, each MIG profile) in a resource map, by name."""
    return {
        k: quantity(v) for k, v in sorted((resources or {}).items()) if config.is_gpu_resource(k)
    }


def gpu_requests(pod: Pod, config: Config) -> dict[str, int]:
    """Per GPU resource, what the scheduler reserves for the pod: the containers' sum
    or the largest init container's, whichever is larger (cluster.pod_gpus, by resource)."""
    spec = pod.spec
    main: dict[str, int] = defaultdict(int)
    init: dict[str, int] = defaultdict(int)
    for container in spec.containers:
        for name, count in _container_requests(container.resources, config).items():
            main[name] += count
    for container in spec.initContainers or ():
        for name, count in _container_requests(container.resources, config).items():
            init[name] = max(init[name], count)
    names = sorted(set(main) | set(init))
    return {n: max(main[n], init[n]) for n in names if max(main[n], init[n]) > 0}


def _container_requests(resources: Resources, config: Config) -> dict[str, int]:
    # Extended resources: a limit alone implies an equal request.
    return gpu_resources({**resources.limits, **resources.requests}, config)


def node_allocatable(node: Node, config: Config) -> dict[str, int]:
    return gpu_resources(node.status.allocatable, config)


def node_capacity(node: Node, config: Config) -> dict[str, int]:
    return gpu_resources(node.status.capacity, config)


@dataclass(frozen=True)
class Usage:
    """GPUs held on one node by the pods bound to it, by resource."""

    held: Mapping[str, int]

    def free(self, allocatable: Mapping[str, int], resource: str) -> int:
        return max(0, allocatable.get(resource, 0) - self.held.get(resource, 0))


def usage_by_node(pods: Sequence[Pod], config: Config) -> dict[str, Usage]:
    """What each node's bound, live pods hold (Terminating pods still hold theirs)."""
    held: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for pod in pods:
        node = pod.spec.nodeName
        phase = pod.status.phase
        if not node or phase in ("Succeeded", "Failed"):
            continue
        for name, count in gpu_requests(pod, config).items():
            held[node][name] += count
    return {node: Usage(dict(by_resource)) for node, by_resource in held.items()}
