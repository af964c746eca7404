"""`gpuheal audit`: what is wrong across the GPU fleet, found in one snapshot.

The checks are fleet hygiene's (gpuheal/policy/hygiene.py, which lists each kind):
the controller runs the same ones from its caches and exports them as
gpuheal_hygiene_findings, so the command and the metric agree. Here the command
reads the cluster (kube/snapshot.py: every node and the live bound pods) and
turns the snapshot into the views the controller holds.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rich.text import Text

from gpuheal.config import Config
from gpuheal.kube.projections import device_plugin_matcher, node_view, pod_view_factory
from gpuheal.kube.snapshot import Snapshot, read_snapshot
from gpuheal.model import DeviceKey, DraDevice, PodView
from gpuheal.ops import exitcodes
from gpuheal.ops.output import Notes, Table, render
from gpuheal.ops.selector import Requirement, SelectorError, parse_selector, selected
from gpuheal.policy.dra import by_key, claim_gpus, holding
from gpuheal.policy.hygiene import ERROR, KINDS, Finding, examine

if TYPE_CHECKING:
    from gpuheal.ops.context import Context


@dataclass(frozen=True)
class AuditReport:
    findings: tuple[Finding, ...]
    nodes: int  # GPU nodes audited
    warnings: tuple[str, ...] = ()  # unreadable agent reports: printed on stderr

    def counts(self) -> dict[str, int]:
        return {k: n for k in KINDS if (n := sum(1 for f in self.findings if f.kind == k))}

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


def audit(
    snap: Snapshot,
    config: Config,
    now: dt.datetime,
    *,
    selector: tuple[Requirement, ...] = (),
    stuck_after_s: float | None = None,
) -> AuditReport:
    """Every finding of `gpuheal audit`, from a snapshot (pure): its nodes and pods as
    the controller's caches hold them (the same projections), then hygiene's checks."""
    gate = config.health_gate
    pod_view = pod_view_factory(
        config.is_gpu_resource,
        device_plugin_matcher(gate.device_plugin_selector, gate.device_plugin_namespaces),
    )
    nodes = [
        replace(node_view(n), devices=snap.devices.get(n.metadata.name, ()))
        for n in snap.nodes
        if selected(n.metadata.labels, selector)
    ]
    devices = by_key(snap.devices)
    pods = {
        node: [_holding(pod_view(p), snap, devices) for p in listed]
        for node, listed in snap.pods_by_node.items()
    }
    seen = examine(nodes, pods, config, now, stuck_after_s=stuck_after_s)
    return AuditReport(seen.findings, seen.nodes, seen.warnings)


def _holding(view: PodView, snap: Snapshot, devices: Mapping[DeviceKey, DraDevice]) -> PodView:
    """The pod with the GPU devices its claims were allocated (a snapshot with DRA)."""
    if not view.claims:
        return view
    return holding(view, claim_gpus(view.namespace, view.claims, snap.allocated, devices))


async def run_audit(ctx: Context, *, selector: str = "", stuck_after_s: float | None = None) -> int:
    """Print the audit; 3 (FINDINGS) when there is anything to fix, else 0."""
    try:
        wanted = parse_selector(selector)
        if stuck_after_s is not None and stuck_after_s < 0:
            raise SelectorError(f"--stuck-after must be >= 0, got {stuck_after_s:g}")
    except SelectorError as err:
        ctx.err.print(Text(f"gpuheal audit: {err}", style="red"))
        return exitcodes.USAGE
    # Every node: a GPU node the controller's nodeSelector misses is a finding.
    snap = await read_snapshot(ctx.api, faults=False, drivers=frozenset(ctx.config.gpu_drivers))
    report = audit(snap, ctx.config, ctx.now(), selector=wanted, stuck_after_s=stuck_after_s)
    for warning in report.warnings:
        ctx.err.print(Text(f"warning: {warning}", style="yellow"))
    render(report, ctx.output, ctx.out)
    return exitcodes.FINDINGS if report.findings else exitcodes.OK
