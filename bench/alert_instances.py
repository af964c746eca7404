"""Measurement: one Alertmanager body of 12,000 alerts against 2,000 nodes,
matched by `instance` (a scrape target's host:port), as the controller's event
loop runs it: decode, then interpret with the controller's node lookup.

No control plane: the real Reconciler and ControllerIntake over an in-memory
node store fed through the informer's change handlers. Prints the seconds the
event loop would be blocked (JSON on stdout, a summary on stderr).

    PYTHONPATH=. .venv/bin/python bench/alert_instances.py --alerts 12000 --nodes 2000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from prometheus_client import CollectorRegistry

from gpuheal.api.server import decode_webhook
from gpuheal.config import parse_config
from gpuheal.controller.effects.context import WriteThrough
from gpuheal.controller.executor import Executor
from gpuheal.controller.fleet import Fleet
from gpuheal.controller.intake import ControllerIntake
from gpuheal.controller.reconciler import Reconciler
from gpuheal.controller.signals import ExternalSignals
from gpuheal.kube.api import KubeApi
from gpuheal.kube.events import EventRecorder
from gpuheal.kube.informer import Handler
from gpuheal.kube.kubeconfig import RestConfig
from gpuheal.kube.workqueue import WorkQueue
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.model import NodeView
from gpuheal.sources.alertmanager import interpret
from tests.corpus import alert, dcgm_labels, webhook


class MemoryStore:
    """The informer's Store side: a dict and its change handlers."""

    def __init__(self) -> None:
        self.items: dict[str, Any] = {}
        self._handlers: list[Handler] = []

    @property
    def handlers(self) -> list[Handler]:
        return self._handlers

    def get(self, key: str) -> Any:
        return self.items.get(key)

    def put(self, view: NodeView) -> None:
        old = self.items.get(view.name)
        self.items[view.name] = view
        for handler in self._handlers:
            handler(old, view)


def address(i: int) -> str:
    # Every 10th node is IPv6-only, as on dual-stack fleets that scrape over v6.
    return f"fd00::{i:x}" if i % 10 == 0 else f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"


def target(i: int) -> str:
    host = address(i)
    return f"[{host}]:9400" if ":" in host else f"{host}:9400"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, default=12_000)
    parser.add_argument("--nodes", type=int, default=2_000)
    parser.add_argument(
        "--miss",
        type=float,
        default=0.0,
        help="fraction of alerts whose instance is no node's (a pod IP: dcgm-exporter"
        " without hostNetwork), the lookup's worst case",
    )
    args = parser.parse_args()

    pool = {"gpuheal.test/pool": "bench"}
    config = parse_config({"nodeSelector": pool})
    nodes, records, pods = MemoryStore(), MemoryStore(), MemoryStore()
    metrics = ControllerMetrics(CollectorRegistry())
    api = KubeApi(RestConfig("https://127.0.0.1:1", "bench"))  # never called: nothing writes
    caches = WriteThrough(
        node=nodes.get, record=records.get, put_node=nodes.put,
        put_record=lambda _: None, put_pod=lambda _: None,
    )  # fmt: skip
    executor = Executor(
        api, caches=caches, recorder=EventRecorder(api, "bench"), metrics=metrics,
        config=lambda: config,
    )  # fmt: skip
    fleet = Fleet(lambda: config)
    fleet.watch(nodes, pods, records)
    reconciler = Reconciler(
        config=lambda: config, nodes=nodes, pods=pods, records=records, fleet=fleet,
        external=ExternalSignals(config.external_signal_ttl_seconds), executor=executor,
        metrics=metrics,
    )  # fmt: skip
    queue = WorkQueue()
    intake = ControllerIntake(
        reconciler, nodes, records, enqueue=queue.add, synced=lambda: True, leading=lambda: True
    )
    names = [
        f"ip-10-{i >> 8 & 255}-{i & 255}-{i % 7}.us-west-2.compute.internal"
        for i in range(args.nodes)
    ]
    for i, name in enumerate(names):
        nodes.put(
            NodeView(name=name, resource_version="1", labels=dict(pool), gpus=8,
                     addresses=(address(i), name))
        )  # fmt: skip

    misses = round(args.alerts * args.miss)
    alerts = []
    for n in range(args.alerts):
        i = n % args.nodes
        instance = f"100.64.{n >> 8 & 255}.{n & 255}:9400" if n < misses else target(i)
        labels = dcgm_labels(names[i], gpu=n % 8) | {"instance": instance}
        del labels["Hostname"]  # relabelled away: only the scrape target names the node
        alerts.append(alert(labels | {"alertname": "GPUXidError"}, fingerprint=f"{n:016x}"))
    body = json.dumps(webhook(alerts)).encode()

    started = time.perf_counter()
    hook = decode_webhook(body)
    outcomes = interpret(
        hook, node_labels=("node", "Hostname", "hostname", "instance"), find_node=intake.find_node
    )
    seconds = time.perf_counter() - started
    matched = sum(
        1
        for n, o in enumerate(outcomes)
        if o.node == (names[n % args.nodes] if n >= misses else "")
    )
    result = {
        "benchmark": "alert_instances",
        "alerts": args.alerts,
        "nodes": args.nodes,
        "body_bytes": len(body),
        "misses": misses,
        "seconds": round(seconds, 3),
        "matched": matched,
    }
    print(json.dumps(result))
    print(
        f"{args.alerts} alerts x {args.nodes} nodes by instance: {seconds:.3f}s on the loop,"
        f" {matched} right ({misses} expected to match no node)",
        file=sys.stderr,
    )
    return 0 if matched == args.alerts else 1


if __name__ == "__main__":
    sys.exit(main())
