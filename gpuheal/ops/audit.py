"""`gpuheal audit`: what is wrong across the GPU fleet, found in one snapshot.

Each finding names a node, its pool, a kind, and one actionable sentence:

- leak: GPUs held by pods that will not give them back (stuck Terminating, or
  on a node that is not Ready), or more GPUs allocated than the node offers;
- zombie-process: a GPU compute process of a pod that is no longer live on the
  node (the agent's gpuheal.io/gpu-processes report);
- host-process (warning): a GPU compute process outside any pod, which the
  scheduler's accounting does not see;
- zero-allocatable: a node labelled as a GPU node that offers no GPU;
- driver-skew / cuda-skew: a version other than the pool's (configured, else
  the one most of the pool's nodes run);
- missing-label / missing-taint: a GPU node without the labels or taints the
  config expects (pools.expectedLabels / expectedTaints, fleet-wide and per pool);
- unmanaged: a node with GPUs that the controller's nodeSelector does not match
  (and not opted out with gpuheal.io/managed=false): its faults are not acted on.

The analysis is pure (a Snapshot in, findings out); only the command reads the
cluster (kube/snapshot.py: every node and the live bound pods, decoded into slim
projections).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.text import Text

from gpuheal.clock import parse_time
from gpuheal.config import Config
from gpuheal.kube.projections import NodeJson, PodJson
from gpuheal.kube.snapshot import Snapshot, read_snapshot
from gpuheal.model import GPU_PROCESSES, MANAGED_LABEL, Taint
from gpuheal.ops import exitcodes
from gpuheal.ops.findings import duration
from gpuheal.ops.fleet import gpu_node, gpu_total, node_ready, pod_gpus, pod_live, pod_name
from gpuheal.ops.output import Notes, Table, render
from gpuheal.ops.selector import Requirement, SelectorError, parse_selector, selected
from gpuheal.policy.nodes import in_maintenance
from gpuheal.policy.pools import (
    NO_POOL,
    cuda_version,
    driver_version,
    expected_cuda,
    expected_driver,
    pool_config,
    pool_of,
)

if TYPE_CHECKING:
    from gpuheal.ops.context import Context

LEAK = "leak"
ZOMBIE_PROCESS = "zombie-process"
HOST_PROCESS = "host-process"
ZERO_ALLOCATABLE = "zero-allocatable"
DRIVER_SKEW = "driver-skew"
CUDA_SKEW = "cuda-skew"
MISSING_LABEL = "missing-label"
MISSING_TAINT = "missing-taint"
UNMANAGED = "unmanaged"
KINDS = (
    UNMANAGED,
    LEAK,
    ZOMBIE_PROCESS,
    HOST_PROCESS,
    ZERO_ALLOCATABLE,
    DRIVER_SKEW,
    CUDA_SKEW,
    MISSING_LABEL,
    MISSING_TAINT,
)
ERROR = "error"
WARNING = "warning"  # worth a look, may be intended (a host process such as dcgmi diag)

# A GPU pod still Terminating this long after its grace period ended is stuck (--stuck-after).
STUCK_AFTER_S = 60.0
ANY_VALUE = "*"  # an expected label whose value does not matter
_LISTED = 5  # pods or processes named in one sentence


@dataclass(frozen=True)
class AuditFinding:
    kind: str
    node: str
    pool: str
    detail: str
    severity: str = ERROR

    def data(self) -> dict[str, str]:
        return {
            "kind": self.kind,
            "node": self.node,
            "pool": self.pool,
            "severity": self.severity,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class AuditReport:
    findings: tuple[AuditFinding, ...]
    nodes: int  # GPU nodes audited
    warnings: tuple[str, ...] = ()  # unreadable agent reports: printed on stderr

    def counts(self) -> dict[str, int]:
        counts = Counter(f.kind for f in self.findings)
        return {kind: counts[kind] for kind in KINDS if counts[kind]}

    def data(self) -> dict[str, Any]:
        return {
            "findings": [f.data() for f in self.findings],
            "counts": self.counts(),
            "nodes": self.nodes,
        }

    def views(self) -> Sequence[Table | Notes]:
        if not self.findings:
            return (Notes("Audit", [("ok", f"no findings on {self.nodes} GPU node(s)")]),)
        views: list[Table | Notes] = []
        for kind, count in self.counts().items():
            rows = [(f.node, f.pool, f.detail) for f in self.findings if f.kind == kind]
            views.append(Table(f"{kind} ({count})", ("NODE", "POOL", "DETAIL"), rows))
        affected = len({f.node for f in self.findings})
        summary = ", ".join(f"{n} {kind}" for kind, n in self.counts().items())
        style = "bad" if any(f.severity == ERROR for f in self.findings) else "warn"
        views.append(
            Notes(
                "Audit",
                [
                    (
                        style,
                        f"{len(self.findings)} finding(s) on {affected} of {self.nodes} "
                        f"GPU node(s): {summary}",
                    )
                ],
            )
        )
        return views


# -- which nodes ---------------------------------------------------------------


def gpu_labelled(node: NodeJson, config: Config) -> bool:
    """A GPU node by the controller's selector, by its GPU capacity, or by GPU
    feature discovery's labels (a node whose device plugin never came up has no
    capacity, and still is a GPU node)."""
    if gpu_node(node, config):
        return True
    if gpu_total(node.status.capacity, config) > 0:
        return True  # GPUs whatever the labels say: a node the selector may be missing
    labels = node.metadata.labels
    if labels.get("nvidia.com/gpu.present") == "true":
        return True
    count = labels.get(config.pools.expected_gpus_label, "")
    return count.isdigit() and int(count) > 0


def _listed(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_LISTED])
    return f"{shown} and {len(items) - _LISTED} more" if len(items) > _LISTED else shown


# -- outside the controller's reach ----------------------------------------------


def _unmanaged(node: NodeJson, pool: str, config: Config) -> list[AuditFinding]:
    """A GPU node the controller's nodeSelector does not match: nothing it reports is
    acted on. Opting out (gpuheal.io/managed=false) says that is meant."""
    labels = node.metadata.labels
    if gpu_node(node, config) or labels.get(MANAGED_LABEL) == "false":
        return []
    name = node.metadata.name
    gpus = gpu_total(node.status.capacity, config)
    missing = sorted((k, v) for k, v in config.node_selector.items() if labels.get(k) != v)
    wanted = " ".join(f"{k}={v}" for k, v in missing)
    offers = f"has {gpus} GPU(s)" if gpus else "is labelled as a GPU node"
    return [
        AuditFinding(
            UNMANAGED,
            name,
            pool,
            f"{offers} but the controller's nodeSelector does not match it (lacks {wanted}): "
            f"gpuheal ignores its faults; label it (kubectl label node --overwrite {name} "
            f"{wanted}) or exclude it knowingly (kubectl label node {name} "
            f"{MANAGED_LABEL}=false).",
        )
    ]


# -- leaks ------------------------------------------------------------------------


def _stuck_terminating(pod: PodJson, now: dt.datetime, stuck_after_s: float) -> float | None:
    """Seconds the pod has been Terminating past its grace period, or None while
    it is within the grace period (+ `stuck_after_s` for a slow kubelet)."""
    deleted = parse_time(pod.metadata.deletionTimestamp)
    if deleted is None:
        return None
    # The API server sets deletionTimestamp to the end of the grace period.
    overdue = (now - deleted).total_seconds()
    return overdue if overdue > stuck_after_s else None


def _leaks(
    node: NodeJson,
    pods: Sequence[PodJson],
    pool: str,
    config: Config,
    *,
    now: dt.datetime,
    stuck_after_s: float,
) -> list[AuditFinding]:
    name = node.metadata.name
    found: list[AuditFinding] = []
    holding = [(p, pod_gpus(p, config)) for p in pods if pod_live(p)]
    holding = [(p, n) for p, n in holding if n > 0]
    for pod, gpus in holding:
        overdue = _stuck_terminating(pod, now, stuck_after_s)
        if overdue is None:
            continue
        finalizers = pod.metadata.finalizers
        why = (
            f"finalizer {', '.join(finalizers)} keeps it: fix or remove the finalizer"
            if finalizers
            else "the kubelet has not confirmed its end: check the node, then force-delete it"
        )
        found.append(
            AuditFinding(
                LEAK,
                name,
                pool,
                f"pod {pod_name(pod)} holds {gpus} GPU(s) and is stuck Terminating "
                f"{duration(overdue)} past its grace period; {why}.",
            )
        )
    ready = node_ready(node)
    if ready is not True and holding:
        pods_named = [f"{pod_name(p)} ({n})" for p, n in holding]
        total = sum(n for _, n in holding)
        condition = "NotReady" if ready is False else "Unknown"
        found.append(
            AuditFinding(
                LEAK,
                name,
                pool,
                f"node is {condition} and still counts {total} GPU(s) for "
                f"{_listed(pods_named)}; bring the node back or delete those pods so "
                "their controllers place them elsewhere.",
            )
        )
    allocatable = gpu_total(node.status.allocatable, config)
    allocated = sum(n for _, n in holding)
    if allocated > allocatable:
        found.append(
            AuditFinding(
                LEAK,
                name,
                pool,
                f"{allocated} GPU(s) allocated to live pods but only {allocatable} allocatable: "
                "GPUs were withdrawn under running pods; check the device plugin, "
                "then move those pods.",
            )
        )
    return found


# -- GPU processes -------------------------------------------------------------------


def _parse_processes(value: str) -> tuple[list[tuple[int, str]], int]:
    """GPU_PROCESSES into (pid, pod UID) pairs, and the count of malformed entries."""
    entries, bad = [], 0
    for raw in value.split(","):
        item = raw.strip()
        if not item:
            continue
        pid, sep, uid = item.partition("@")
        if sep and pid.isdigit():
            entries.append((int(pid), uid))
        else:
            bad += 1
    return entries, bad


def _processes(
    node: NodeJson, pods: Sequence[PodJson], pool: str, warnings: list[str]
) -> list[AuditFinding]:
    name = node.metadata.name
    value = node.metadata.annotations.get(GPU_PROCESSES, "")
    entries, bad = _parse_processes(value)
    if bad:
        warnings.append(
            f"node {name}: {bad} malformed entr{'y' if bad == 1 else 'ies'} in {GPU_PROCESSES} "
            f"(want pid@podUID,...): {value[:120]!r}"
        )
    if not entries:
        return []
    live = {p.metadata.uid for p in pods if pod_live(p) and p.metadata.uid}
    by_uid: dict[str, list[str]] = defaultdict(list)
    for pid, uid in entries:
        if uid == "?":  # the agent could not tell (the process exited, or no host /proc)
            continue
        if not uid or uid not in live:
            by_uid[uid].append(str(pid))
    found = []
    for uid, pids in sorted(by_uid.items()):
        one = len(pids) == 1
        what = f"GPU {'process' if one else 'processes'} {_listed(pids)}"
        hold, run, them = ("holds", "runs", "it") if one else ("hold", "run", "them")
        if uid:
            found.append(
                AuditFinding(
                    ZOMBIE_PROCESS,
                    name,
                    pool,
                    f"{what} of pod UID {uid}, which is no longer live on this node, still "
                    f"{hold} GPU memory; kill {them} (the container runtime left {them} behind) "
                    "or drain and reset the GPUs.",
                )
            )
        else:
            found.append(
                AuditFinding(
                    HOST_PROCESS,
                    name,
                    pool,
                    f"{what} {run} outside any pod, unseen by the scheduler's GPU accounting; "
                    f"stop {them} unless meant to be there (diagnostics, a monitoring agent).",
                    WARNING,
                )
            )
    return found


# -- labels, taints, versions ---------------------------------------------------------


def _expected_labels(pool: str, config: Config) -> dict[str, str]:
    pools = config.pools
    wanted = {**pools.expected_labels, **pool_config(pool, config).expected_labels}
    if pools.by_name:  # pools are configured: every GPU node must say which it is in
        wanted.setdefault(pools.label, ANY_VALUE)
    return wanted


def _missing_labels(node: NodeJson, pool: str, config: Config) -> list[AuditFinding]:
    labels, name = node.metadata.labels, node.metadata.name
    found = []
    for key, want in sorted(_expected_labels(pool, config).items()):
        have = labels.get(key)
        if have is None:
            expected = "" if want == ANY_VALUE else f" (expected {want!r})"
            value = "<value>" if want == ANY_VALUE else want
            detail = (
                f"label {key} is missing{expected}; "
                f"add it: kubectl label node {name} {key}={value}."
            )
        elif want not in (ANY_VALUE, have):
            detail = (
                f"label {key} is {have!r}, expected {want!r}; "
                f"fix it: kubectl label node --overwrite {name} {key}={want}."
            )
        else:
            continue
        found.append(AuditFinding(MISSING_LABEL, name, pool, detail))
    return found


def _taint_text(taint: Taint) -> str:
    return f"{taint.key}{'=' + taint.value if taint.value else ''}:{taint.effect}"


def _missing_taints(node: NodeJson, pool: str, config: Config) -> list[AuditFinding]:
    wanted = (*config.pools.expected_taints, *pool_config(pool, config).expected_taints)
    have, name = node.spec.taints, node.metadata.name
    found = []
    for taint in wanted:
        if any(
            t.key == taint.key
            and t.effect == taint.effect
            and (not taint.value or t.value == taint.value)
            for t in have
        ):
            continue
        text = _taint_text(taint)
        found.append(
            AuditFinding(
                MISSING_TAINT,
                name,
                pool,
                f"taint {text} is missing; add it: kubectl taint node {name} {text}.",
            )
        )
    return found


_VERSIONS: tuple[tuple[str, str, Callable[..., str], Callable[..., str], str], ...] = (
    (DRIVER_SKEW, "driver", driver_version, expected_driver, "driver_version"),
    (CUDA_SKEW, "CUDA", cuda_version, expected_cuda, "cuda_version"),
)


def _skew(pool: str, nodes: Sequence[NodeJson], config: Config) -> list[AuditFinding]:
    """Nodes of one pool whose driver or CUDA version is not the pool's."""
    found = []
    for kind, what, version_of, expected, setting in _VERSIONS:
        versions = {
            n.metadata.name: version_of(n.metadata.labels, n.metadata.annotations) for n in nodes
        }
        want = expected(pool, versions.values(), config)
        if not want:
            continue
        known = [v for v in versions.values() if v]
        why = (
            "the pool's configured version"
            if getattr(pool_config(pool, config), setting)
            else f"the version {known.count(want)} of {len(known)} nodes in the pool run"
        )
        found += [
            AuditFinding(
                kind,
                node,
                pool,
                f"{what} {have} differs from {want} ({why}); upgrade the node in "
                "maintenance (gpuheal maintenance start) or fix the pool's config.",
            )
            for node, have in sorted(versions.items())
            if have and have != want
        ]
    return found


# -- the audit -------------------------------------------------------------------------


def audit(
    snap: Snapshot,
    config: Config,
    now: dt.datetime,
    *,
    selector: tuple[Requirement, ...] = (),
    stuck_after_s: float = STUCK_AFTER_S,
) -> AuditReport:
    """Every finding of `gpuheal audit`, from a snapshot (pure)."""
    nodes = sorted(
        (
            n
            for n in snap.nodes
            if gpu_labelled(n, config) and selected(n.metadata.labels, selector)
        ),
        key=lambda n: n.metadata.name,
    )
    findings: list[AuditFinding] = []
    warnings: list[str] = []
    by_pool: dict[str, list[NodeJson]] = defaultdict(list)
    for node in nodes:
        name = node.metadata.name
        pool = pool_of(node.metadata.labels, config)
        by_pool[pool].append(node)
        pods = snap.pods_by_node.get(name, [])
        findings += _unmanaged(node, pool, config)
        findings += _leaks(node, pods, pool, config, now=now, stuck_after_s=stuck_after_s)
        findings += _processes(node, pods, pool, warnings)
        if gpu_total(node.status.allocatable, config) == 0 and not in_maintenance(
            node.metadata.labels
        ):
            capacity = gpu_total(node.status.capacity, config)
            findings.append(
                AuditFinding(
                    ZERO_ALLOCATABLE,
                    name,
                    pool,
                    f"labelled as a GPU node but offers 0 allocatable GPUs (capacity {capacity}); "
                    f"check its device-plugin pod and driver: gpuheal doctor {name}.",
                )
            )
        findings += _missing_labels(node, pool, config)
        findings += _missing_taints(node, pool, config)
    for pool, members in sorted(by_pool.items()):
        findings += _skew(pool, members, config)
    order = {kind: i for i, kind in enumerate(KINDS)}
    findings.sort(key=lambda f: (order[f.kind], f.pool == NO_POOL, f.pool, f.node))
    return AuditReport(tuple(findings), len(nodes), tuple(warnings))


async def run_audit(
    ctx: Context, *, selector: str = "", stuck_after_s: float = STUCK_AFTER_S
) -> int:
    """Print the audit; 3 (FINDINGS) when there is anything to fix, else 0."""
    try:
        wanted = parse_selector(selector)
        if stuck_after_s < 0:
            raise SelectorError(f"--stuck-after must be >= 0, got {stuck_after_s:g}")
    except SelectorError as err:
        ctx.err.print(Text(f"gpuheal audit: {err}", style="red"))
        return exitcodes.USAGE
    # Every node: a GPU node the controller's nodeSelector misses is a finding.
    snap = await read_snapshot(ctx.api, faults=False)
    report = audit(snap, ctx.config, ctx.now(), selector=wanted, stuck_after_s=stuck_after_s)
    for warning in report.warnings:
        ctx.err.print(Text(f"warning: {warning}", style="yellow"))
    render(report, ctx.output, ctx.out)
    return exitcodes.FINDINGS if report.findings else exitcodes.OK
