"""Fleet hygiene: what is wrong across the GPU fleet, judged from one view of it.

`gpuheal audit` reads a snapshot and the controller reads its informer caches
(controller/hygiene.py, every `hygiene.intervalSeconds`); both hand the same
NodeViews and PodViews to `examine`, so the command and the metric agree.

Each finding names a node, its pool, a kind, and one actionable sentence:

- leak: GPUs held by pods that will not give them back (stuck Terminating, or
  on a node that is not Ready), or more GPUs allocated than the node offers;
- zombie-process: a GPU compute process of a pod that is no longer live on the
  node (the agent's gpuheal.io/gpu-processes report);
- host-process (warning): a GPU compute process outside any pod, which the
  scheduler's accounting does not see;
- zero-allocatable: a node labelled as a GPU node that offers no GPU;
- allocatable-drop: a node that offers fewer GPUs than it has (the device plugin
  withdrew the ones it found unhealthy), or has fewer than its pool expects;
- device-plugin-missing: a Ready GPU node without a device-plugin pod
  (healthGate.devicePluginSelector) while the fleet's other nodes run one (or
  healthGate.devicePluginRequired): nothing new can be given its GPUs;
- driver-skew / cuda-skew / vbios-skew: a version other than the pool's
  (configured, else the one most of the pool's nodes run); the VBIOS as the
  agent reports it (GCM checks it within a node; a pool of one model should
  run one VBIOS too);
- missing-label / missing-taint: a GPU node without the labels or taints the
  config expects (pools.expectedLabels / expectedTaints, fleet-wide and per pool);
- unmanaged: a node with GPUs that the controller's nodeSelector does not match
  (and not opted out with gpuheal.io/managed=false): its faults are not acted on.

Pure: the time is passed in.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuheal.clock import duration, parse_time
from gpuheal.config import Config
from gpuheal.model import (
    ALLOCATABLE_DROP,
    DEVICE_PLUGIN_MISSING,
    GPU_PROCESSES,
    MANAGED_LABEL,
    ZERO_ALLOCATABLE,
    FaultRecord,
    NodeView,
    PodView,
    Taint,
)
from gpuheal.policy.nodes import gpu_node, gpus, in_maintenance, opted_out, usable_gpus
from gpuheal.policy.operator import driver_upgrade
from gpuheal.policy.pools import (
    NO_POOL,
    cuda_version,
    driver_version,
    expected_cuda,
    expected_driver,
    expected_gpus,
    expected_vbios,
    pool_config,
    pool_of,
    vbios_version,
)
from gpuheal.sources import hygiene
from gpuheal.sources.base import source_name

LEAK = "leak"
ZOMBIE_PROCESS = "zombie-process"
HOST_PROCESS = "host-process"
DRIVER_SKEW = "driver-skew"
CUDA_SKEW = "cuda-skew"
VBIOS_SKEW = "vbios-skew"
MISSING_LABEL = "missing-label"
MISSING_TAINT = "missing-taint"
UNMANAGED = "unmanaged"
KINDS = (
    UNMANAGED,
    LEAK,
    ZOMBIE_PROCESS,
    HOST_PROCESS,
    ZERO_ALLOCATABLE,
    ALLOCATABLE_DROP,
    DEVICE_PLUGIN_MISSING,
    DRIVER_SKEW,
    CUDA_SKEW,
    VBIOS_SKEW,
    MISSING_LABEL,
    MISSING_TAINT,
)
ERROR = "error"
WARNING = "warning"  # worth a look, may be intended (a host process such as dcgmi diag)

ANY_VALUE = "*"  # an expected label whose value does not matter
_LISTED = 5  # pods or processes named in one sentence


@dataclass(frozen=True)
class Finding:
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
class Examination:
    findings: tuple[Finding, ...]
    nodes: int  # GPU nodes examined
    pools: tuple[str, ...] = ()  # the pools of those nodes (the metric's zeros)
    warnings: tuple[str, ...] = ()  # unreadable agent reports

    def counts(self) -> dict[str, int]:
        counts = Counter(f.kind for f in self.findings)
        return {kind: counts[kind] for kind in KINDS if counts[kind]}


@dataclass(frozen=True)
class Examined:
    """One run of the controller's hygiene loop, as its metrics read it."""

    examination: Examination
    at: float  # Unix time
    duration_s: float


# -- which nodes ---------------------------------------------------------------


def gpu_labelled(node: NodeView, config: Config) -> bool:
    """A GPU node by the controller's selector, by its GPU capacity, or by GPU
    feature discovery's labels (a node whose device plugin never came up has no
    capacity, and still is a GPU node)."""
    capacity = gpus(node, config)
    if gpu_node(node.labels, capacity, config) or capacity > 0:
        return True  # GPUs whatever the labels say: a node the selector may be missing
    if node.labels.get("nvidia.com/gpu.present") == "true":
        return True
    count = node.labels.get(config.pools.expected_gpus_label, "")
    return count.isdigit() and int(count) > 0


def _listed(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_LISTED])
    return f"{shown} and {len(items) - _LISTED} more" if len(items) > _LISTED else shown


def _live(pod: PodView) -> bool:
    return not pod.terminal


# -- outside the controller's reach ----------------------------------------------


def _unmanaged(node: NodeView, pool: str, config: Config) -> list[Finding]:
    """A GPU node the controller's nodeSelector does not match: nothing it reports is
    acted on. Opting out (gpuheal.io/managed=false) says that is meant."""
    labels = node.labels
    capacity = gpus(node, config)
    if gpu_node(labels, capacity, config) or opted_out(labels):
        return []
    name = node.name
    missing = sorted((k, v) for k, v in config.node_selector.items() if labels.get(k) != v)
    wanted = " ".join(f"{k}={v}" for k, v in missing)
    offers = f"has {capacity} GPU(s)" if capacity else "is labelled as a GPU node"
    return [
        Finding(
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


def _stuck_terminating(pod: PodView, now: dt.datetime, stuck_after_s: float) -> float | None:
    """Seconds the pod has been Terminating past its grace period, or None while
    it is within the grace period (+ `stuck_after_s` for a slow kubelet)."""
    deleted = parse_time(pod.deletion_time)
    if deleted is None:
        return None
    # The API server sets deletionTimestamp to the end of the grace period.
    overdue = (now - deleted).total_seconds()
    return overdue if overdue > stuck_after_s else None


def _leaks(
    node: NodeView,
    pods: Sequence[PodView],
    pool: str,
    config: Config,
    *,
    now: dt.datetime,
    stuck_after_s: float,
) -> list[Finding]:
    name = node.name
    found: list[Finding] = []
    holding = [p for p in pods if _live(p) and p.gpu_count > 0]
    for pod in holding:
        overdue = _stuck_terminating(pod, now, stuck_after_s)
        if overdue is None:
            continue
        why = (
            f"finalizer {', '.join(pod.finalizers)} keeps it: fix or remove the finalizer"
            if pod.finalizers
            else "the kubelet has not confirmed its end: check the node, then force-delete it"
        )
        found.append(
            Finding(
                LEAK,
                name,
                pool,
                f"pod {pod.key} holds {pod.gpu_count} GPU(s) and is stuck Terminating "
                f"{duration(overdue)} past its grace period; {why}.",
            )
        )
    ready = node.ready
    allocated = sum(p.gpu_count for p in holding)
    if ready is not True and holding:
        pods_named = [f"{p.key} ({p.gpu_count})" for p in holding]
        condition = "NotReady" if ready is False else "Unknown"
        found.append(
            Finding(
                LEAK,
                name,
                pool,
                f"node is {condition} and still counts {allocated} GPU(s) for "
                f"{_listed(pods_named)}; bring the node back or delete those pods so "
                "their controllers place them elsewhere.",
            )
        )
    allocatable = usable_gpus(node, config)
    if allocated > allocatable:
        found.append(
            Finding(
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
    node: NodeView, pods: Sequence[PodView], pool: str, warnings: list[str]
) -> list[Finding]:
    name = node.name
    value = node.annotations.get(GPU_PROCESSES, "")
    entries, bad = _parse_processes(value)
    if bad:
        warnings.append(
            f"node {name}: {bad} malformed entr{'y' if bad == 1 else 'ies'} in {GPU_PROCESSES} "
            f"(want pid@podUID,...): {value[:120]!r}"
        )
    if not entries:
        return []
    live = {p.uid for p in pods if _live(p) and p.uid}
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
                Finding(
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
                Finding(
                    HOST_PROCESS,
                    name,
                    pool,
                    f"{what} {run} outside any pod, unseen by the scheduler's GPU accounting; "
                    f"stop {them} unless meant to be there (diagnostics, a monitoring agent).",
                    WARNING,
                )
            )
    return found


# -- what the node offers ----------------------------------------------------------------


def _withdrawn(node: NodeView, count: int) -> str:
    """Who keeps `count` GPUs from new pods: DRA devices' taints, or the device plugin."""
    tainted = sorted({k for d in node.devices for k in d.fencing})
    if tainted:
        return f"taints ({', '.join(tainted)}) keep new claims off {count}"
    return f"the device plugin withdrew {count} it found unhealthy"


def _offered(node: NodeView, pool: str, config: Config) -> list[Finding]:
    """Zero allocatable, or fewer GPUs allocatable than present, or fewer present than
    the pool expects. Nodes in maintenance are left out: their GPUs are down on purpose."""
    if in_maintenance(node.labels):
        return []
    name = node.name
    capacity = gpus(node, config)
    allocatable = usable_gpus(node, config)
    if allocatable == 0:
        return [
            Finding(
                ZERO_ALLOCATABLE,
                name,
                pool,
                f"labelled as a GPU node but offers 0 allocatable GPUs (capacity {capacity}); "
                f"check its device-plugin pod and driver: gpuheal doctor {name}.",
            )
        ]
    if allocatable < capacity:
        return [
            Finding(
                ALLOCATABLE_DROP,
                name,
                pool,
                f"offers {allocatable} of its {capacity} GPU(s): "
                f"{_withdrawn(node, capacity - allocatable)}; see which and why: "
                f"gpuheal doctor {name}.",
            )
        ]
    expected = expected_gpus(node.labels, config)
    if expected is not None and capacity < expected:
        return [
            Finding(
                ALLOCATABLE_DROP,
                name,
                pool,
                f"has {capacity} GPU(s), its pool expects {expected}: a GPU is lost to the "
                f"driver (fallen off the bus, or not bound); gpuheal doctor {name}.",
            )
        ]
    return []


def _device_plugin(
    node: NodeView,
    pods: Sequence[PodView],
    pool: str,
    config: Config,
    *,
    covered: int,
    now: dt.datetime,
) -> list[Finding]:
    """A Ready GPU node that runs no device-plugin pod while `covered` other GPU nodes
    do (or the config requires one): the selector finds the plugin in this fleet, so
    its absence here is no naming difference."""
    gate = config.health_gate
    if not gate.device_plugin_selector or in_maintenance(node.labels):
        return []
    if not gate.device_plugin_required and covered == 0:
        return []
    if any(p.device_plugin and _live(p) and not p.deleting for p in pods):
        return []
    ready = node.condition("Ready")
    since = parse_time(ready.last_transition_time) if ready is not None else None
    if node.ready is not True or since is None:
        return []  # a node that is not Ready is its own finding (leak) or nobody's yet
    if (now - since).total_seconds() < config.hygiene.device_plugin_grace_seconds:
        return []  # starting: the DaemonSet's pod is on its way
    selector = ",".join(f"{k}={v}" for k, v in sorted(gate.device_plugin_selector.items()))
    others = f"though {covered} other GPU node(s) run one" if covered else "which is required"
    return [
        Finding(
            DEVICE_PLUGIN_MISSING,
            node.name,
            pool,
            f"runs no device-plugin pod ({selector}), {others}: no new pod can be given its "
            "GPUs; check the DaemonSet's nodeSelector and tolerations against the node "
            f"(kubectl get pods -A -o wide -l {selector}).",
        )
    ]


# -- labels, taints, versions ---------------------------------------------------------


def _expected_labels(pool: str, config: Config) -> dict[str, str]:
    pools = config.pools
    wanted = {**pools.expected_labels, **pool_config(pool, config).expected_labels}
    if pools.by_name:  # pools are configured: every GPU node must say which it is in
        wanted.setdefault(pools.label, ANY_VALUE)
    return wanted


def _missing_labels(node: NodeView, pool: str, config: Config) -> list[Finding]:
    labels, name = node.labels, node.name
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
        found.append(Finding(MISSING_LABEL, name, pool, detail))
    return found


def _taint_text(taint: Taint) -> str:
    return f"{taint.key}{'=' + taint.value if taint.value else ''}:{taint.effect}"


def _missing_taints(node: NodeView, pool: str, config: Config) -> list[Finding]:
    wanted = (*config.pools.expected_taints, *pool_config(pool, config).expected_taints)
    found = []
    for taint in wanted:
        if any(
            t.key == taint.key
            and t.effect == taint.effect
            and (not taint.value or t.value == taint.value)
            for t in node.taints
        ):
            continue
        text = _taint_text(taint)
        found.append(
            Finding(
                MISSING_TAINT,
                node.name,
                pool,
                f"taint {text} is missing; add it: kubectl taint node {node.name} {text}.",
            )
        )
    return found


_VERSIONS: tuple[tuple[str, str, Callable[..., str], Callable[..., str], str], ...] = (
    (DRIVER_SKEW, "driver", driver_version, expected_driver, "driver_version"),
    (CUDA_SKEW, "CUDA", cuda_version, expected_cuda, "cuda_version"),
    (VBIOS_SKEW, "VBIOS", vbios_version, expected_vbios, "vbios_version"),
)


def _skew(pool: str, nodes: Sequence[NodeView], config: Config) -> list[Finding]:
    """Nodes of one pool whose driver or CUDA version is not the pool's."""
    found = []
    for kind, what, version_of, expected, setting in _VERSIONS:
        versions = {n.name: version_of(n.labels, n.annotations) for n in nodes}
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
            Finding(
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


# -- what a finding is not a fault for ---------------------------------------------------


def explained(node: NodeView, records: Iterable[FaultRecord]) -> str | None:
    """Why GPUs unusable on this node now are no fault of their own (None: nothing
    explains it): gpuheal's own work on it (an open fault of another source: its
    drain, repair or gate take the GPUs away), or gpu-operator's driver upgrade
    under way (the device plugin restarts with the driver). A signal made of it
    would be a second fault for one cause."""
    state = driver_upgrade(node.labels)
    if state is not None:
        return f"gpu-operator's driver upgrade ({state})"
    own = next(
        (
            r
            for r in records
            if r.node == node.name and r.open and source_name(r.source) != hygiene.SOURCE
        ),
        None,
    )
    return f"fault {own.fault_id} ({own.phase})" if own is not None else None


# -- the examination -------------------------------------------------------------------


def examine(
    nodes: Iterable[NodeView],
    pods_by_node: Mapping[str, Sequence[PodView]],
    config: Config,
    now: dt.datetime,
    *,
    stuck_after_s: float | None = None,
) -> Examination:
    """Every hygiene finding on the GPU nodes among `nodes`, given their live pods
    (a pod Terminating `stuck_after_s` past its grace is a leak: the config's by default)."""
    stuck = config.hygiene.stuck_after_seconds if stuck_after_s is None else stuck_after_s
    gpu_nodes = sorted((n for n in nodes if gpu_labelled(n, config)), key=lambda n: n.name)
    covered = sum(
        1 for n in gpu_nodes if any(p.device_plugin for p in pods_by_node.get(n.name, ()))
    )
    findings: list[Finding] = []
    warnings: list[str] = []
    by_pool: dict[str, list[NodeView]] = defaultdict(list)
    for node in gpu_nodes:
        pool = pool_of(node.labels, config)
        by_pool[pool].append(node)
        pods = pods_by_node.get(node.name, ())
        findings += _unmanaged(node, pool, config)
        findings += _leaks(node, pods, pool, config, now=now, stuck_after_s=stuck)
        findings += _processes(node, pods, pool, warnings)
        findings += _offered(node, pool, config)
        findings += _device_plugin(node, pods, pool, config, covered=covered, now=now)
        findings += _missing_labels(node, pool, config)
        findings += _missing_taints(node, pool, config)
    for pool, members in sorted(by_pool.items()):
        findings += _skew(pool, members, config)
    order = {kind: i for i, kind in enumerate(KINDS)}
    findings.sort(key=lambda f: (order[f.kind], f.pool == NO_POOL, f.pool, f.node))
    return Examination(tuple(findings), len(gpu_nodes), tuple(sorted(by_pool)), tuple(warnings))
