"""`gpuheal gate NODE`: gather a node's health-gate facts from the cluster, judge them
with gpuheal.policy.gate (the controller's recovery uses the same checks), print them.

The node, its pool's nodes and its pods are read as slim projections
(kube/projections.py); `maintenance finish` runs the same checks.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import msgspec
from rich.text import Text

from gpuheal.clock import iso, parse_time
from gpuheal.config import Config
from gpuheal.kube.api import ApiError, KubeApi, node_path
from gpuheal.kube.projections import NodeJson, PodJson, device_plugin_matcher
from gpuheal.kube.rollouts import pool_rollout
from gpuheal.kube.snapshot import ALL_PODS, list_all, read_node_dra
from gpuheal.model import MAINTENANCE_SINCE
from gpuheal.ops import exitcodes
from gpuheal.ops.fleet import (
    gpu_node,
    node_ready,
    node_selector_query,
    pod_live,
    pod_name,
    quantity,
)
from gpuheal.ops.output import Notes, Table, render
from gpuheal.policy.gate import (
    Check,
    CheckResult,
    DevicePluginPod,
    GateFacts,
    GateResult,
    evaluate,
)
from gpuheal.policy.pools import NO_POOL, driver_version, pool_of

if TYPE_CHECKING:
    from gpuheal.ops.context import Context

_NODE = msgspec.json.Decoder(NodeJson)


async def get_node(api: KubeApi, name: str) -> NodeJson | None:
    try:
        return _NODE.decode(await api.get(node_path(name)))
    except ApiError as err:
        if err.code == 404:
            return None
        raise


async def node_named(ctx: Context, prog: str, name: str) -> NodeJson | int:
    """The node a command was given, or NOT_FOUND after `prog` said it is not there."""
    node = await get_node(ctx.api, name)
    if node is None:
        ctx.err.print(Text(f"{prog}: node {name} not found", style="bold red"))
        return exitcodes.NOT_FOUND
    return node


async def pods_on(api: KubeApi, node: str) -> list[PodJson]:
    return await list_all(api, ALL_PODS, PodJson, "Pod", field_selector=f"spec.nodeName={node}")


def pod_ready(pod: PodJson) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ())


async def gather(api: KubeApi, config: Config, node: NodeJson) -> GateFacts:
    """The node's facts: itself, its device-plugin pods, its pool's other nodes' drivers
    and its pool's roll-out, if any (all read at once)."""
    name = node.metadata.name
    labels = node.metadata.labels
    pool = pool_of(labels, config)
    nodes, pods, rollout, dra = await asyncio.gather(
        list_all(api, node_path(), NodeJson, "Node", label_selector=node_selector_query(config)),
        pods_on(api, name),
        pool_rollout(api, pool) if pool != NO_POOL else asyncio.sleep(0, None),
        read_node_dra(api, name, frozenset(config.gpu_drivers)),
    )
    peers: Counter[str] = Counter()
    for other in nodes:
        if other.metadata.name == name or not gpu_node(other, config):
            continue
        other_labels = other.metadata.labels
        if pool_of(other_labels, config) == pool:
            version = driver_version(other_labels, other.metadata.annotations)
            if version:
                peers[version] += 1
    gate = config.health_gate
    is_plugin = device_plugin_matcher(gate.device_plugin_selector, gate.device_plugin_namespaces)
    plugins = tuple(
        DevicePluginPod(pod_name(p), pod_ready(p))
        for p in pods
        if pod_live(p) and is_plugin(p.metadata.namespace, p.metadata.labels)
    )
    return GateFacts(
        node=name,
        ready=node_ready(node),
        labels=dict(labels),
        annotations=dict(node.metadata.annotations),
        allocatable={k: quantity(v) for k, v in node.status.allocatable.items() if "/" in k},
        pool_drivers=dict(peers),
        device_plugin_pods=plugins,
        rollout=rollout.driver_view(name) if rollout is not None else None,
        devices=dra.devices,
    )


def maintenance_since(annotations: Mapping[str, str], ctx: Context) -> dt.datetime | None:
    """When the node's maintenance began (the gate's `since`, from the node's
    annotations); warns if unreadable."""
    raw = annotations.get(MAINTENANCE_SINCE, "")
    since = parse_time(raw)
    if raw and since is None:
        ctx.err.print(
            Text(
                f"warning: {MAINTENANCE_SINCE} is not an RFC 3339 time ({raw[:64]!r}); "
                "the gate judges error counters without a start time",
                style="yellow",
            )
        )
    return since


def gate_exit_code(result: GateResult) -> int:
    return exitcodes.OK if result.passed else exitcodes.GATE_FAILED | result.bits


_STYLE = {CheckResult.PASS: "ok", CheckResult.FAIL: "bad", CheckResult.SKIPPED: ""}


@dataclass(frozen=True)
class GateReport:
    result: GateResult
    since: dt.datetime | None = None
    # What `maintenance finish` did after the gate ("" for the read-only `gate`).
    outcome: str = ""
    finished: bool | None = None

    def data(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node": self.result.node,
            "passed": self.result.passed,
            "exitCode": gate_exit_code(self.result),
            "since": iso(self.since, "seconds") if self.since else None,
            "checks": [
                {"name": c.name, "result": c.result.value, "reason": c.reason, "bit": c.bit}
                for c in self.result.checks
            ],
        }
        if self.finished is not None:
            out["finished"] = self.finished
            out["outcome"] = self.outcome
        return out

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> GateReport:
        """The report again, from its data() (the controller's record of a finish)."""
        checks = tuple(
            Check(c["name"], CheckResult(c["result"]), c.get("reason", ""))
            for c in data.get("checks", [])
        )
        finished = data.get("finished")
        return cls(
            GateResult(data.get("node", ""), checks),
            parse_time(data.get("since") or ""),
            data.get("outcome", ""),
            finished if isinstance(finished, bool) else None,
        )

    def views(self) -> Sequence[Table | Notes]:
        table = Table(
            title=f"Health gate: {self.result.node}",
            columns=("CHECK", "RESULT", "WHY"),
            rows=[(c.name, c.result.value, c.reason) for c in self.result.checks],
        )
        if self.result.passed:
            verdict = ("ok", "passed")
        else:
            names = ", ".join(c.name for c in self.result.failing)
            verdict = ("bad", f"failed: {names} (exit {gate_exit_code(self.result)})")
        lines = [verdict]
        if self.outcome:
            lines.append(("ok" if self.finished else "warn", self.outcome))
        return (table, Notes("", lines))


async def judge_node(
    ctx: Context, node: NodeJson, since: dt.datetime | None, *, validate: bool = False
) -> GateResult:
    """The gate's checks; with `validate`, once the others pass, the validation Job's too
    (ops/validation.py: it runs on the node and is waited for)."""
    facts = await gather(ctx.api, ctx.config, node)
    result = evaluate(facts, ctx.config, ctx.now(), since)
    if not (validate and result.passed):
        return result
    from gpuheal.ops.validation import validate_node  # noqa: PLC0415 -- only with --validate

    verdict = await validate_node(ctx.api, ctx.config, node, since, now=ctx.now, say=ctx.err.print)
    return evaluate(replace(facts, validation=verdict), ctx.config, ctx.now(), since)


async def run_gate(ctx: Context, name: str, *, validate: bool = False) -> int:
    """Print the checks, exit 0 or 64 | the failing checks' bits. Read-only, but for
    `validate`'s Job (deleted once read)."""
    node = await node_named(ctx, "gpuheal gate", name)
    if isinstance(node, int):
        return node
    since = maintenance_since(node.metadata.annotations, ctx)
    result = await judge_node(ctx, node, since, validate=validate)
    render(GateReport(result, since), ctx.output, ctx.out)
    return gate_exit_code(result)
