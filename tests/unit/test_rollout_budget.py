"""The roll-out's budget as counted from the nodes read (controller/rollouts.py): every
node of the pool out for any reason, the fleet's faults and maintenance, and the
roll-out's own nodes in flight before their cordon lands."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import msgspec

from gpuheal.config import Config, PoolsConfig
from gpuheal.controller.rollouts import budget_of
from gpuheal.kube.projections import NodeJson
from gpuheal.kube.rollouts import RolloutJson
from gpuheal.model import MAINTENANCE_TAINT_KEY, STATE_LABEL, TAINT_KEY
from gpuheal.policy.rollout import RolloutStep, plan_order
from tests.corpus import eks_node_names

CONFIG = Config(pools=PoolsConfig(label="gpuheal.io/pool"), breaker_max_nodes=4)
NAMES = sorted(eks_node_names(8))


def node(name: str, pool: str = "a", **change: Any) -> NodeJson:
    raw: dict[str, Any] = {
        "metadata": {"name": name, "labels": {"gpuheal.io/pool": pool}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    for key, value in change.items():
        raw[key] = {**raw[key], **value}
    return msgspec.convert(raw, NodeJson)


ROLLOUT = msgspec.convert(
    {
        "metadata": {"name": "rollout-a.x"},
        "spec": {
            "pool": "a",
            "target": {"driverVersion": "560.35.03"},
            "canary": 1,
            "batchSize": 2,
            "maxUnavailable": 3,
        },
    },
    RolloutJson,
)


def test_every_node_of_the_pool_out_counts_and_the_fleets_faults_and_maintenance() -> None:
    fault = {"taints": [{"key": TAINT_KEY, "effect": "NoSchedule"}]}
    fleet = [
        node(NAMES[0], spec=fault),  # quarantined by a fault
        node(NAMES[1], spec={"unschedulable": True}),  # cordoned by someone
        node(NAMES[2], status={"conditions": [{"type": "Ready", "status": "False"}]}),
        node(NAMES[3]),
        node(NAMES[4]),
        node(NAMES[5], pool="b", spec=fault),  # another pool's fault: the breaker's only
        node(
            NAMES[6],
            pool="b",
            metadata={
                "name": NAMES[6],
                "labels": {"gpuheal.io/pool": "b", STATE_LABEL: "maintenance"},
            },
            spec={"taints": [{"key": MAINTENANCE_TAINT_KEY, "effect": "NoSchedule"}]},
        ),
        node(NAMES[7], pool="b"),
    ]
    progress = plan_order(NAMES[:5], 1, 2)
    progress[3] = replace(progress[3], step=RolloutStep.DRAINING)  # written, not cordoned yet
    budget = budget_of(ROLLOUT, fleet, progress, CONFIG)
    assert budget.pool_unavailable == frozenset(NAMES[:4])
    assert budget.pool_allowed == 3
    assert budget.room == 0
    # Fleet-wide: the two faults, the maintenance, the node in flight; of 8 GPU nodes
    # the breaker allows min(4, 10 % of 8 -> at least 1).
    assert budget.fleet_unavailable == 4
    assert budget.fleet_allowed == 1
