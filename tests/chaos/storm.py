"""A fault storm on a pool of fake GPU nodes, the controllers that remediate it,
and the exactly-once checks, for the chaos tests."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from gpuheal.kube.leader import log as leader_log
from gpuheal.model import (
    FAULT_ID,
    FAULT_REASON,
    FAULT_TIME,
    HANDLED_FAULT_ID,
    STATUS,
    TAINT_KEY,
    Phase,
)
from gpuheal.sim import ControlPlane, audit
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.controlplane import KWOK
from gpuheal.sim.nodes import create_gpu_nodes, wait_nodes_ready
from gpuheal.sim.process import log_tail
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import apply, create_namespace, gpu_pod, wait_pods_running
from tests.chaos.conftest import CONTROLLER_USER
from tests.corpus import eks_node_names
from tests.helpers import unique, wait_for


class Replicas:
    """Controller replicas managing one pool, as the controller's own user."""

    def __init__(self, cp: ControlPlane, workdir: Path, pool: dict[str, str]) -> None:
        self.cp = cp
        self.workdir = workdir
        self.pool = pool
        self.started: list[ControllerProcess] = []
        # Fast test settings, every throttle lifted; one lease for all replicas.
        self.config: dict[str, Any] = {
            "nodeSelector": self.pool,
            "recoveryWindowSeconds": 1,
            "cooldownSeconds": 0,
            "rateLimitPerSecond": 10_000,
            "rateLimitBurst": 10_000,
            "breakerMaxNodes": 10_000,
            "breakerMaxPercent": 100,
            # Every round faults the same nodes seconds apart: by the third, each would
            # be a repeat offender held for a person (tests/unit/test_policy_offenders.py).
            "repeatOffenders": {"faults": 1000},
            "evictionRetryBaseSeconds": 0.2,
            "evictionRetryMaxSeconds": 1,
            "leaderElection": {
                "name": f"gpuheal-{unique('lease')}",
                "leaseSeconds": 2,
                "renewDeadlineSeconds": 1.5,
                "retryPeriodSeconds": 0.25,
            },
        }

    def start(self) -> ControllerProcess:
        """A new replica (a new identity, as a restarted pod would have)."""
        replica = ControllerProcess(
            self.workdir, self.cp.kubeconfig_for(CONTROLLER_USER), self.config,
            identity=unique("ctl"),
        )  # fmt: skip
        self.started.append(replica)
        return replica.start(timeout_s=60)

    def live(self) -> list[ControllerProcess]:
        return [r for r in self.started if r.component.exit_code() is None]

    def leader(self) -> ControllerProcess | None:
        return next((r for r in self.live() if r.leading()), None)

    def stop(self) -> None:
        for replica in self.live():
            replica.stop()
        for replica in self.started:
            print(f"--- {replica.identity} log (tail) ---\n{replica.log()[-1000:]}")


class Storm:
    def __init__(
        self, cp: ControlPlane, kube: Client, workdir: Path, *, nodes: int, pods_per_node: int
    ) -> None:
        self.cp = cp
        self.kube = kube
        self.pool = {"gpuheal.chaos/pool": unique("pool")}
        self.namespace = unique("chaos")
        self.pods_per_node = pods_per_node
        # A node group's names, as EKS gives them (ip-10-a-b-c.us-west-2.compute.internal).
        self.nodes = create_gpu_nodes(kube, eks_node_names(nodes), labels=self.pool)
        wait_nodes_ready(kube, self.nodes)
        create_namespace(kube, self.namespace)
        self.controllers = Replicas(cp, workdir, self.pool)

    # -- a round ---------------------------------------------------------------

    def add_pods(self, tag: str) -> set[tuple[str, str]]:
        """GPU pods for this round, bound to every node; returns (namespace, name)s."""
        made = set()
        for node in self.nodes:
            for j in range(self.pods_per_node):
                name = f"{tag}-{node}-{j}"
                apply(
                    self.kube, gpu_pod(name, self.namespace, node_name=node, labels={"round": tag})
                )
                made.add((self.namespace, name))
        # Faults strike running workloads; and a round must not start while the
        # simulated kubelet (kwok) is still finding its feet, e.g. after the agent
        # test's API outage, or a stuck round would be blamed on the controller.
        wait_pods_running(
            self.kube, self.namespace, count=len(made), labels={"round": tag}, timeout_s=120
        )
        return made

    def fault_id(self, tag: str, node: str) -> str:
        return f"{tag}-{node}"

    def report(self, tag: str) -> None:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        for node in self.nodes:
            annotations = {
                STATUS: "faulty",
                FAULT_ID: self.fault_id(tag, node),
                FAULT_TIME: now,
                FAULT_REASON: "XidCritical79",
            }
            self.kube.patch(Node, node, {"metadata": {"annotations": annotations}})

    def clear(self) -> None:
        gone = {STATUS: None, FAULT_ID: None, FAULT_TIME: None, FAULT_REASON: None}
        for node in self.nodes:
            self.kube.patch(Node, node, {"metadata": {"annotations": gone}})

    def _nodes(self) -> list[Any]:
        return list(self.kube.list(Node, labels=dict(self.pool)))

    def unhandled(self, tag: str) -> list[str]:
        return [
            n.metadata.name
            for n in self._nodes()
            if (n.metadata.annotations or {}).get(HANDLED_FAULT_ID)
            != self.fault_id(tag, n.metadata.name)
        ]

    def pods_left(self, tag: str) -> int:
        return len(list(self.kube.list(Pod, namespace=self.namespace, labels={"round": tag})))

    def tainted(self) -> list[str]:
        return [
            n.metadata.name
            for n in self._nodes()
            if any(t.key == TAINT_KEY for t in (n.spec.taints or []))
        ]

    def wait_remediated(self, tag: str, timeout_s: float = 240) -> None:
        try:
            wait_for(
                f"every fault of {tag} handled",
                lambda: not self.unhandled(tag),
                timeout_s=timeout_s,
            )
            wait_for(f"the pods of {tag} gone", lambda: self.pods_left(tag) == 0, timeout_s=60)
        except AssertionError as err:
            # A timeout alone says nothing of why; the state of what is stuck does.
            # No traceback: CI shows the end of the output, and this is what matters.
            pytest.fail(f"{err}\n{self.explain(tag)}", pytrace=False)

    def explain(self, tag: str, shown: int = 8) -> str:
        """Where the round is stuck: the unhandled nodes with their taint, records and
        pods left, and what each live replica says of itself."""
        stuck = self.unhandled(tag)
        lines = [f"{len(stuck)} of {len(self.nodes)} nodes unhandled: {stuck[:shown]}"]
        pods: list[Any] = list(self.kube.list(Pod, namespace=self.namespace, labels={"round": tag}))
        records = self._records()
        for name in stuck[:shown]:
            node: Any = self.kube.get(Node, name)
            annotations = node.metadata.annotations or {}
            taints = [f"{t.key}={t.value}:{t.effect}" for t in (node.spec.taints or [])]
            lines.append(
                f"- {name}: fault {annotations.get(FAULT_ID)} handled "
                f"{annotations.get(HANDLED_FAULT_ID)} taints {taints} "
                f"unschedulable {node.spec.unschedulable}"
            )
            for record in records:
                spec, status = record.spec or {}, record.status or {}
                if spec.get("node") == name:
                    steps = [
                        f"{a.get('action')}:{a.get('result')}" for a in status.get("actions", [])
                    ]
                    lines.append(
                        f"  record {record.metadata.name} {status.get('phase')} {steps[-6:]}"
                    )
            for pod in pods:
                if pod.spec.nodeName == name:
                    lines.append(
                        f"  pod {pod.metadata.name} phase {pod.status.phase} "
                        f"deleting since {pod.metadata.deletionTimestamp} "
                        f"finalizers {pod.metadata.finalizers}"
                    )
        lines.append(f"{len(pods)} pods of {tag} left in all")
        for replica in self.controllers.live():
            try:
                metrics = [
                    line
                    for line in replica.metrics().splitlines()
                    if line.startswith(("gpuheal_leader", "gpuheal_queue_depth"))
                ]
            except OSError as err:
                metrics = [f"metrics unreadable: {err}"]
            lines.append(f"replica {replica.identity}: {metrics}")
        for replica in self.controllers.started:
            # Leadership changes and everything not routine, in order, from every replica.
            notable = [line for line in replica.log().splitlines() if _notable(line)]
            lines.append(f"replica {replica.identity} notable log lines:")
            lines += [f"  {line[:300]}" for line in notable[-12:]]
        kwok = self.cp.components.get(KWOK)
        if kwok is not None:  # kwok finishes the evicted pods' deletion
            lines.append(f"kwok exit code {kwok.exit_code()}; log tail:")
            lines += [f"  {_brief(line)}" for line in log_tail(kwok.log_path, 15).splitlines()]
        return "\n".join(lines)

    def wait_recovered(self, timeout_s: float = 120) -> None:
        wait_for("no taint left", lambda: not self.tainted(), timeout_s=timeout_s)

    # -- the checks --------------------------------------------------------------

    def assert_exactly_once(self, tag: str, pods: set[tuple[str, str]], since: int) -> None:
        """Every pod of the round evicted exactly once (server side), every fault one
        record; what is printed on failure names the culprits."""
        codes = audit.evictions(
            audit.requests(self.cp.audit_log, user=CONTROLLER_USER, since=since)
        )
        twice = {pod: c for pod, c in codes.items() if c.count(201) > 1}
        assert not twice, f"evicted more than once (response codes): {twice}"
        # A request cut off by a SIGKILL is logged with the code the server gave up
        # with (504: the client's context was cancelled) or none (0), yet may have
        # evicted the pod: the next replica then sees it terminating and leaves it.
        evicted = {pod for pod, c in codes.items() if any(x in {0, 201, 504} for x in c)}
        missed = pods - evicted
        shown = {pod: codes.get(pod, []) for pod in sorted(missed)[:5]}
        assert not missed, f"{len(missed)} pods never evicted (response codes): {shown}"
        stray = set(codes) - pods
        assert not stray, f"evicted pods outside the round: {sorted(stray)[:5]}"
        records: dict[str, list[str]] = {}
        for record in self._records():
            spec = record.spec or {}
            if spec.get("node") in self.nodes and str(spec.get("faultID", "")).startswith(tag):
                records.setdefault(spec["node"], []).append(spec["faultID"])
        doubled = {n: ids for n, ids in records.items() if len(ids) != 1}
        assert not doubled, f"nodes without exactly one record: {doubled}"
        assert set(records) == set(self.nodes), "faults without a record"

    def _records(self) -> list[Any]:
        return list(self.kube.list(GPUFault))

    def open_records(self, tag: str) -> list[str]:
        return [
            r.metadata.name
            for r in self._records()
            if str((r.spec or {}).get("faultID", "")).startswith(tag)
            and (r.status or {}).get("phase") != Phase.RESOLVED.value
        ]

    def wait_records_resolved(self, tag: str, timeout_s: float = 30) -> None:
        """The record is resolved right after the untaint (its own write, a few ms
        later), so this waits rather than asserting at the moment the taint is gone."""
        wait_for(f"every record of {tag} Resolved", lambda: not self.open_records(tag), timeout_s)


def _brief(line: str) -> str:
    """One kwok log line, short: time, level, message, object, error."""
    try:
        entry = json.loads(line)
    except ValueError:
        return line[:300]
    fields = [entry.get(k) for k in ("time", "level", "msg", "pod", "node", "err")]
    return " ".join(str(f)[:160] for f in fields if f)


def _notable(line: str) -> bool:
    """A controller log line worth showing: anything but routine info, and leadership."""
    try:
        entry: dict[str, Any] = json.loads(line)
    except ValueError:
        return True  # not ours: a traceback or a crash message
    return bool(entry.get("level") != "info" or entry.get("logger") == leader_log.name)
