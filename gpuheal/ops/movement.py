"""Doctor's third question: why did the workloads not move?

Two directions. Pods that should leave the node (it is cordoned, quarantined
or in maintenance) and did not: stuck Terminating, held by a
PodDisruptionBudget, or simply never evicted. And GPU pods that wait for a
place this node could offer (Pending, their nodeSelector and node affinity
admit it): for each, the scheduler's own last word and our reading of the
cluster, one sentence per cause — a taint none of their nodes lets them past,
a request larger than any node, no free GPUs, every candidate down.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from gpuheal.config import Config
from gpuheal.kube.details import Node, Pod, PodDisruptionBudget, Taint
from gpuheal.model import TAINT_KEY
from gpuheal.ops.cluster import (
    is_mirror_pod,
    labels_of,
    name_of,
    owner_kind,
    quantity,
)
from gpuheal.ops.findings import (
    BAD,
    INFO,
    OK,
    WARN,
    Facts,
    Finding,
    listed,
    plural,
    pod_key,
    when,
)
from gpuheal.ops.fleet import node_ready, pod_gpus, pod_live
from gpuheal.ops.scheduling import (
    UNSCHEDULABLE_TAINT,
    Usage,
    admits,
    constraint_text,
    gpu_requests,
    node_allocatable,
    selector_matches,
    taint_text,
    taints_of,
    tolerates,
    toleration_text,
    untolerated_taints,
    usage_by_node,
)
from gpuheal.policy.nodes import in_maintenance

# Pending pods explained one by one; the rest are counted.
PENDING_SHOWN = 20
# A pod still there this long after its grace period ended is stuck.
STUCK_AFTER = dt.timedelta(seconds=60)


def gpu_pending(pending: Sequence[Pod], config: Config) -> list[Pod]:
    """Pending GPU pods that are not being deleted, oldest first."""
    pods = [
        p
        for p in pending
        if p.status is not None
        and p.status.phase == "Pending"
        and not (p.metadata and p.metadata.deletionTimestamp)
        and pod_gpus(p, config) > 0
    ]
    return sorted(pods, key=_created)


def relevant_pending(node: Node, pending: Sequence[Pod], config: Config) -> list[Pod]:
    """The Pending GPU pods whose label constraints let them onto this node."""
    return [p for p in gpu_pending(pending, config) if admits(p, node)]


def _created(pod: Pod) -> dt.datetime:
    created = pod.metadata.creationTimestamp
    return created or dt.datetime.min.replace(tzinfo=dt.UTC)


def evictable(pods: Sequence[Pod]) -> list[Pod]:
    """What a drain moves: live pods that no DaemonSet or kubelet manifest pins here."""
    return [
        p for p in pods if pod_live(p) and owner_kind(p) != "DaemonSet" and not is_mirror_pod(p)
    ]


def leaving_reasons(node: Node, config: Config) -> list[str]:
    """Why the node's pods should go elsewhere ([] when they may stay)."""
    reasons = []
    if node.spec.unschedulable:
        reasons.append("cordoned")
    keys = {t.key: t for t in taints_of(node)}
    maintenance = in_maintenance(labels_of(node))
    if maintenance or config.maintenance.taint_key in keys:
        reasons.append("in maintenance")
    if TAINT_KEY in keys:
        reasons.append("quarantined by gpuheal")
    return reasons


def question_workloads(node: Node, facts: Facts, config: Config) -> list[Finding]:
    findings: list[Finding] = []
    reasons = leaving_reasons(node, config)
    movable = evictable(facts.pods_on_node)
    findings += _stuck_terminating(movable, node, facts.now, config)
    blocked, pdb_findings = _budgets(movable, facts.pdbs, leaving=bool(reasons))
    findings += pdb_findings
    if reasons:
        held = bool(findings)  # stuck or blocked pods: the node is not drained
        findings += _remaining(movable, blocked, reasons, facts.name, config, held=held)
    findings += _pending(node, facts, config)
    findings += _quotas(facts, config)
    if not any(f.problem for f in findings):
        stay = "" if reasons else ", and nothing has to leave it"
        findings.insert(
            0,
            Finding(
                OK,
                "nothing-waiting",
                f"No GPU workload is waiting: no Pending GPU pod may use the node{stay}.",
            ),
        )
    return findings


def _deleting_since(pod: Pod) -> dt.datetime | None:
    return pod.metadata.deletionTimestamp


def _stuck_terminating(
    pods: Sequence[Pod], node: Node, now: dt.datetime, config: Config
) -> list[Finding]:
    findings = []
    for pod in pods:
        # deletionTimestamp is the end of the grace period, not the delete request.
        deadline = _deleting_since(pod)
        if deadline is None or now < deadline:
            continue
        finalizers = list(pod.metadata.finalizers or ())
        gpus = pod_gpus(pod, config)
        holds = f"; its {plural(gpus, 'GPU')} stay allocated until then" if gpus else ""
        if finalizers:
            findings.append(
                Finding(
                    BAD,
                    "stuck-terminating",
                    f"Pod {pod_key(pod)} has been Terminating since {when(deadline, now)}, "
                    f"held by finalizer {', '.join(finalizers)}: the controller that owns the "
                    f"finalizer must remove it{holds}.",
                )
            )
        elif now - deadline > STUCK_AFTER:
            down = "; the node is not Ready" if node_ready(node) is not True else ""
            namespace = pod.metadata.namespace or ""
            findings.append(
                Finding(
                    BAD,
                    "stuck-terminating",
                    f"Pod {pod_key(pod)} has been Terminating since {when(deadline, now)}: "
                    f"the kubelet has not confirmed that it stopped{down}. Once the host is "
                    f"known to be down, `kubectl delete pod -n {namespace} {name_of(pod)} "
                    f"--force --grace-period=0` releases it{holds}.",
                )
            )
    return findings


def _budgets(
    pods: Sequence[Pod],
    pdbs: Sequence[PodDisruptionBudget],
    *,
    leaving: bool,
) -> tuple[set[str], list[Finding]]:
    """PDBs that allow no disruption now and cover pods here: what an eviction waits on."""
    blocked: set[str] = set()
    findings = []
    staying = [p for p in pods if _deleting_since(p) is None]
    for pdb in pdbs:
        status, meta = pdb.status, pdb.metadata
        if status is None or status.disruptionsAllowed > 0:
            continue
        covered = [
            p
            for p in staying
            if p.metadata.namespace == meta.namespace
            and selector_matches(pdb.spec.selector, labels_of(p))
        ]
        if not covered:
            continue
        keys = [pod_key(p) for p in covered]
        blocked.update(keys)
        health = (
            f"{status.currentHealthy} healthy, {status.desiredHealthy} required, "
            f"{status.expectedPods} expected"
        )
        name = f"{meta.namespace}/{meta.name}"
        if leaving:
            findings.append(
                Finding(
                    BAD,
                    "pdb-blocks",
                    f"PodDisruptionBudget {name} allows 0 disruptions now ({health}): the "
                    f"eviction of {listed(keys)} waits until more of its replicas are Ready "
                    "elsewhere. Scale the workload up, or relax the budget if a short outage "
                    "is acceptable.",
                )
            )
        else:
            findings.append(
                Finding(
                    INFO,
                    "pdb-would-block",
                    f"PodDisruptionBudget {name} allows 0 disruptions now ({health}): a drain "
                    f"of this node would wait on {listed(keys)}.",
                )
            )
    return blocked, findings


def _remaining(
    pods: Sequence[Pod],
    blocked: set[str],
    reasons: Sequence[str],
    node: str,
    config: Config,
    *,
    held: bool,
) -> list[Finding]:
    remain = [
        pod_key(p)
        for p in pods
        if pod_gpus(p, config) > 0 and _deleting_since(p) is None and pod_key(p) not in blocked
    ]
    state = " and ".join(reasons)
    if not remain:
        if held:
            return []
        return [Finding(OK, "drained", f"No GPU pod is left to move off the node ({state}).")]
    controller = (
        " The controller evicts GPU pods of a quarantined node only in mode full."
        if "quarantined by gpuheal" in reasons
        else ""
    )
    return [
        Finding(
            WARN,
            "pods-remain",
            f"{plural(len(remain), 'GPU pod')} still run on the node although it is {state}: "
            f"{listed(remain)}. A cordon or a NoSchedule taint keeps new pods away but evicts "
            f"nothing: drain it with `gpuheal maintenance start {node} --reason ...`."
            f"{controller}",
        )
    ]


@dataclass(frozen=True)
class _Exclusion:
    """Why the scheduler passes over one candidate node, in our words."""

    kind: str
    what: str  # the sentence's subject: a taint, "cordoned", ...
    taint: Taint | None = None


def _exclusions(
    pod: Pod, node: Node, requests: dict[str, int], usage: dict[str, Usage] | None, config: Config
) -> list[_Exclusion]:
    out = []
    if node_ready(node) is not True:
        out.append(_Exclusion("candidates-not-ready", "not Ready"))
    tolerations = list(pod.spec.tolerations or ())
    cordon = Taint(key=UNSCHEDULABLE_TAINT, effect="NoSchedule")
    if node.spec.unschedulable and not tolerates(tolerations, cordon):
        out.append(_Exclusion("candidates-cordoned", "cordoned"))
    for taint in untolerated_taints(pod, node):
        if taint.key == UNSCHEDULABLE_TAINT:
            continue  # said as "cordoned"
        if taint.key == TAINT_KEY:
            out.append(_Exclusion("candidates-quarantined", "quarantined by gpuheal"))
        elif taint.key == config.maintenance.taint_key:
            out.append(_Exclusion("candidates-in-maintenance", "in maintenance"))
        elif taint.key.startswith("node.kubernetes.io/") and node_ready(node) is not True:
            continue  # not-ready / unreachable taints: said as "not Ready"
        else:
            out.append(_Exclusion("missing-toleration", taint_text(taint), taint))
    if usage is not None:
        held = usage.get(name_of(node), Usage({}))
        allocatable = node_allocatable(node, config)
        if any(held.free(allocatable, r) < n for r, n in requests.items()):
            out.append(_Exclusion("insufficient-gpus", "short of free GPUs"))
    return out


def _pending(node: Node, facts: Facts, config: Config) -> list[Finding]:
    every = gpu_pending(facts.pending, config)
    relevant = [p for p in every if admits(p, node)]
    findings: list[Finding] = []
    usage = None if facts.bound_pods is None else usage_by_node(facts.bound_pods, config)
    for pods in workloads_of(relevant[:PENDING_SHOWN]):
        findings += pending_causes(pods, facts, config, usage)
    if len(relevant) > PENDING_SHOWN:
        findings.append(
            Finding(
                WARN,
                "more-pending",
                f"{plural(len(relevant) - PENDING_SHOWN, 'more Pending GPU pod')} may use "
                "this node and are not shown.",
            )
        )
    others = [p for p in every if p not in relevant]
    if others:
        findings.append(
            Finding(
                INFO,
                "other-pending",
                f"{plural(len(others), 'other Pending GPU pod')} in the cluster cannot use "
                f"this node (their nodeSelector or node affinity exclude it): "
                f"{listed(pod_key(p) for p in others)}. Run `gpuheal doctor` on a node of "
                "their pool.",
            )
        )
    return findings


def _controller(pod: Pod) -> tuple[str, str, str]:
    """(kind, name, uid) of the pod's controller; ("", "", "") for a bare pod."""
    for owner in pod.metadata.ownerReferences or ():
        if owner.controller:
            return owner.kind, owner.name, owner.uid
    return "", "", ""


def workloads_of(pods: Sequence[Pod]) -> list[list[Pod]]:
    """Pods grouped by their controller (replicas share one diagnosis), in first-seen order."""
    groups: dict[str, list[Pod]] = {}
    for pod in pods:
        uid = _controller(pod)[2] or pod.metadata.uid or pod_key(pod)
        groups.setdefault(uid, []).append(pod)
    return list(groups.values())


@dataclass(frozen=True)
class _Subject:
    """Who a sentence is about: one pod, or the replicas of one workload."""

    text: str
    one: bool

    def verb(self, singular: str, plural_: str) -> str:
        return singular if self.one else plural_

    @property
    def its(self) -> str:
        return self.verb("its", "their")

    @property
    def it(self) -> str:
        return self.verb("it", "they")


def _subject(pods: Sequence[Pod]) -> _Subject:
    first = pods[0]
    if len(pods) == 1:
        return _Subject(f"Pod {pod_key(first)}", one=True)
    kind, name, _ = _controller(first)
    template_hash = labels_of(first).get("pod-template-hash", "")
    if kind == "ReplicaSet" and template_hash and name.endswith(f"-{template_hash}"):
        kind, name = "Deployment", name.removesuffix(f"-{template_hash}")
    namespace = first.metadata.namespace or ""
    names = listed(pod_key(p) for p in pods)
    return _Subject(f"{len(pods)} pods of {kind} {namespace}/{name} ({names})", one=False)


def pending_causes(
    pods: Sequence[Pod], facts: Facts, config: Config, usage: dict[str, Usage] | None
) -> list[Finding]:
    """One sentence on a Pending workload, then one per cause that keeps it Pending.

    Replicas share a template: the first (oldest) pod stands for all of them.
    """
    pod = pods[0]
    who = _subject(pods)
    requests = gpu_requests(pod, config)
    asked = ", ".join(f"{n} {r}" for r, n in requests.items())
    said = [
        facts.scheduler_says[uid]
        for p in pods
        if (uid := p.metadata.uid or "") in facts.scheduler_says
    ]
    heard = (
        f"; the scheduler says: {said[0].rstrip('.')}"
        if said
        else f"; the scheduler has not reported on {who.verb('it', 'them')}"
    )
    created = pod.metadata.creationTimestamp
    findings = [
        Finding(
            INFO,
            "pending",
            f"{who.text} (requests {asked}{'' if who.one else ' each'}) "
            f"{who.verb('has', 'have')} been Pending since {when(created, facts.now)}{heard}.",
        )
    ]
    candidates = [n for n in facts.nodes if admits(pod, n)]
    if not candidates:
        findings.append(
            Finding(
                BAD,
                "no-matching-node",
                f"{who.text}: {who.its} {constraint_text(pod)} matches no node. Fix the "
                "selector, or label the nodes meant for them.",
            )
        )
        return findings
    too_large = _too_large(who, requests, candidates, config)
    if too_large:
        return findings + too_large
    grouped: dict[tuple[str, str], list[str]] = defaultdict(list)
    taints: dict[str, Taint] = {}
    fits = []
    for node in candidates:
        exclusions = _exclusions(pod, node, requests, usage, config)
        if not exclusions:
            fits.append(name_of(node))
        for ex in exclusions:
            grouped[(ex.kind, ex.what)].append(name_of(node))
            if ex.taint is not None:
                taints[ex.what] = ex.taint
    total = len(candidates)
    for (kind, what), names in sorted(grouped.items(), key=_cause_order):
        share = f"{len(names)} of the {plural(total, 'node')} {who.it} may use"
        findings.append(
            Finding(
                BAD,
                kind,
                _cause_text(
                    kind, what, who, share=share, names=names, taints=taints, requests=requests
                ),
            )
        )
    if fits:
        affinity = pod.spec.affinity
        rules = (
            f"{who.its} pod affinity or anti-affinity may exclude them (doctor does not "
            "evaluate those); "
            if affinity is not None and (affinity.podAffinity or affinity.podAntiAffinity)
            else ""
        )
        findings.append(
            Finding(
                WARN,
                "pending-unexplained",
                f"{plural(len(fits), 'node')} ({listed(fits)}) accept {who.text} by labels, "
                f"taints{'' if usage is None else ' and free GPUs'}: {rules}the scheduler's "
                f"message says what else {who.it} {who.verb('lacks', 'lack')} (CPU, memory, "
                "volumes, ports), or it has not retried yet.",
            )
        )
    return findings


# Causes in the order an operator acts on them: the pod's own spec first.
_CAUSES = (
    "missing-toleration",
    "insufficient-gpus",
    "candidates-quarantined",
    "candidates-in-maintenance",
    "candidates-cordoned",
    "candidates-not-ready",
)


def _cause_order(item: tuple[tuple[str, str], list[str]]) -> tuple[int, str]:
    (kind, what), _ = item
    return (_CAUSES.index(kind) if kind in _CAUSES else len(_CAUSES), what)


def _too_large(
    who: _Subject, requests: dict[str, int], candidates: Sequence[Node], config: Config
) -> list[Finding]:
    findings = []
    for resource, wanted in requests.items():
        largest = max(node_allocatable(n, config).get(resource, 0) for n in candidates)
        if wanted <= largest:
            continue
        each = "" if who.one else " each"
        if largest == 0:
            findings.append(
                Finding(
                    BAD,
                    "no-gpus-offered",
                    f"{who.text} {who.verb('requests', 'request')} {wanted} {resource}{each}, "
                    f"but none of the {plural(len(candidates), 'node')} {who.it} may use "
                    f"offers any ({listed(name_of(n) for n in candidates)}): see `gpuheal "
                    "doctor` on one of them for why their GPUs are not allocatable.",
                )
            )
        else:
            findings.append(
                Finding(
                    BAD,
                    "request-too-large",
                    f"{who.text} {who.verb('requests', 'request')} {wanted} {resource}{each} "
                    f"but the largest node {who.it} may use offers {largest}: a pod cannot "
                    f"span nodes. Split the job into pods of at most {largest} GPUs (a "
                    "multi-node launcher), or target a pool with bigger nodes.",
                )
            )
    return findings


def _cause_text(
    kind: str,
    what: str,
    who: _Subject,
    *,
    share: str,
    names: Sequence[str],
    taints: dict[str, Taint],
    requests: dict[str, int],
) -> str:
    nodes = listed(names)
    one = len(names) == 1
    are, have, carry = ("is", "has", "carries") if one else ("are", "have", "carry")
    waits = who.verb("waits", "wait")
    match kind:
        case "missing-toleration":
            return (
                f"{who.text} {who.verb('does', 'do')} not tolerate taint {what}, which {share} "
                f"{carry} ({nodes}): add the toleration {toleration_text(taints[what])} to "
                f"{who.its} pod template if {who.it} {who.verb('is', 'are')} meant to run there."
            )
        case "candidates-quarantined":
            return (
                f"{share.capitalize()} {are} quarantined by gpuheal for GPU faults ({nodes}): "
                f"{who.text} {waits} for them to recover or for room elsewhere."
            )
        case "candidates-in-maintenance":
            return (
                f"{share.capitalize()} {are} in maintenance ({nodes}): {who.text} {waits} for "
                "`gpuheal maintenance finish` on them, or for room elsewhere."
            )
        case "candidates-cordoned":
            return (
                f"{share.capitalize()} {are} cordoned ({nodes}): `kubectl uncordon` the fit "
                f"ones, or {who.text} {waits}."
            )
        case "candidates-not-ready":
            return (
                f"{share.capitalize()} {are} not Ready ({nodes}): {who.text} cannot start "
                "there until their kubelets report Ready."
            )
        case _:
            asked = ", ".join(f"{n} {r}" for r, n in requests.items())
            return (
                f"{share.capitalize()} {have} fewer free GPUs than {who.text} "
                f"{who.verb('requests', 'request')} ({asked}{'' if who.one else ' each'}; "
                f"{nodes}): {who.it} {waits} for running GPU pods to finish. Add nodes to "
                "the pool or lower the request."
            )


def _quotas(facts: Facts, config: Config) -> list[Finding]:
    findings = []
    for quota in facts.quotas:
        meta = quota.metadata
        status = quota.status
        if status is None:
            continue
        used = status.used
        for key, hard in sorted(status.hard.items()):
            resource = key.removeprefix("requests.").removeprefix("limits.")
            if not (config.is_gpu_resource(resource) or key in ("pods", "count/pods")):
                continue
            if quantity(used.get(key)) < quantity(hard):
                continue
            findings.append(
                Finding(
                    WARN,
                    "quota-exhausted",
                    f"ResourceQuota {meta.namespace}/{meta.name} is used up for {key} "
                    f"({quantity(used.get(key))} of {quantity(hard)}): new GPU pods in "
                    f"namespace {meta.namespace}, replacements of moved pods included, are "
                    "refused when they are created. Raise the quota or free GPUs there.",
                )
            )
    return findings
