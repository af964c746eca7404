"""Doctor's fourth question: what else is affected?

The node's neighbours by pool, driver version and rack, and what keeps each
from serving GPUs (NotReady, quarantined, zero allocatable). Several troubled
nodes in one group point at a shared cause — a driver rollout, a rack's switch
or power — rather than at this node. Also: a driver that drifted from its pool's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuheal.config import Config
from gpuheal.kube.details import Node
from gpuheal.model import TAINT_KEY
from gpuheal.ops.cluster import annotations_of, labels_of, name_of
from gpuheal.ops.findings import INFO, OK, WARN, Facts, Finding, listed, plural
from gpuheal.ops.fleet import gpu_node, node_ready
from gpuheal.ops.scheduling import node_allocatable, taints_of
from gpuheal.policy.nodes import in_maintenance
from gpuheal.policy.pools import NO_POOL, driver_version, expected_driver, pool_config, pool_of


def rack_of(labels: dict[str, str], config: Config) -> str:
    """The node's rack: the first rack label present; "" when none."""
    return next((labels[k] for k in config.pools.rack_labels if labels.get(k)), "")


def node_troubles(node: Node, config: Config) -> list[str]:
    """What keeps a node from serving GPUs, as short words ([] when it serves)."""
    troubles = []
    if node_ready(node) is not True:
        troubles.append("NotReady")
    if any(t.key == TAINT_KEY for t in taints_of(node)):
        troubles.append("quarantined")
    if gpu_node(node, config) and sum(node_allocatable(node, config).values()) == 0:
        troubles.append("zero allocatable")
    return troubles


_HINTS = {
    "pool": "a driver or image rollout, a firmware update, the pool's network",
    "driver": "the driver version itself",
    "rack": "the rack's switch or power",
}


def question_affected(node: Node, facts: Facts, config: Config) -> list[Finding]:
    labels, annotations = labels_of(node), annotations_of(node)
    pool = pool_of(labels, config)
    driver = driver_version(labels, annotations)
    rack = rack_of(labels, config)
    findings: list[Finding] = []
    groups: list[tuple[str, str, Callable[[Node], bool]]] = []
    if pool != NO_POOL:
        groups.append(("pool", f"pool {pool}", lambda n: pool_of(labels_of(n), config) == pool))
    if driver:
        groups.append(
            (
                "driver",
                f"driver {driver}",
                lambda n: driver_version(labels_of(n), annotations_of(n)) == driver,
            )
        )
    else:
        findings.append(
            Finding(
                INFO,
                "driver-unknown",
                "The node's driver version is unknown (no agent report, no GPU feature "
                "discovery label): nodes on the same driver cannot be found.",
            )
        )
    if rack:
        groups.append(("rack", f"rack {rack}", lambda n: rack_of(labels_of(n), config) == rack))
    else:
        findings.append(
            Finding(
                INFO,
                "rack-unknown",
                f"The node has no rack label ({', '.join(config.pools.rack_labels)}): its "
                "rack neighbours cannot be found.",
            )
        )
    mine = node_troubles(node, config)
    for group, title, member in groups:
        members = [n for n in facts.nodes if member(n) or name_of(n) == facts.name]
        findings += _group(
            group, title=title, members=members, name=facts.name, mine=mine, config=config
        )
    if pool != NO_POOL:
        findings += _driver_drift(node, pool, facts, config)
    return findings


def _group(
    group: str,
    *,
    title: str,
    members: Sequence[Node],
    name: str,
    mine: Sequence[str],
    config: Config,
) -> list[Finding]:
    others = [n for n in members if name_of(n) != name]
    if not others:
        return [Finding(INFO, f"{group}-alone", f"The node is the only one of {title}.")]
    troubled = {name_of(n): node_troubles(n, config) for n in members}
    troubled = {k: v for k, v in troubled.items() if v}
    findings = []
    other_troubled = [k for k in troubled if k != name]
    if other_troubled:
        by_trouble: dict[str, list[str]] = {}
        for node_name, troubles in sorted(troubled.items()):
            for trouble in troubles:
                by_trouble.setdefault(trouble, []).append(node_name)
        states = "; ".join(
            f"{len(names)} {trouble} ({listed(names)})" for trouble, names in by_trouble.items()
        )
        serve = "does not serve" if len(troubled) == 1 else "do not serve"
        advice = (
            f"Suspect a shared cause ({_HINTS[group]})."
            if len(troubled) > 1
            else f"Look at it on its own: `gpuheal doctor {other_troubled[0]}`."
        )
        findings.append(
            Finding(
                WARN,
                f"{group}-degraded",
                f"{len(troubled)} of the {plural(len(members), 'node')} of {title} {serve} "
                f"GPUs: {states}. {advice}",
            )
        )
    else:
        local = f": the problem is local to {name}" if mine else ""
        the_others = "The other node" if len(others) == 1 else f"The other {len(others)} nodes"
        findings.append(
            Finding(
                OK,
                f"{group}-healthy",
                f"{the_others} of {title} {'serves' if len(others) == 1 else 'serve'}{local}.",
            )
        )
    maintenance = [name_of(n) for n in others if in_maintenance(labels_of(n))]
    if maintenance:
        findings.append(
            Finding(
                INFO,
                f"{group}-maintenance",
                f"{plural(len(maintenance), 'other node')} of {title} "
                f"{'is' if len(maintenance) == 1 else 'are'} in maintenance "
                f"({listed(maintenance)}).",
            )
        )
    return findings


def _driver_drift(node: Node, pool: str, facts: Facts, config: Config) -> list[Finding]:
    driver = driver_version(labels_of(node), annotations_of(node))
    peers = [n for n in facts.nodes if pool_of(labels_of(n), config) == pool]
    versions = [driver_version(labels_of(n), annotations_of(n)) for n in peers]
    expected = expected_driver(pool, versions, config)
    if not driver or not expected or driver == expected:
        return []
    if pool_config(pool, config).driver_version:
        basis = "configured for the pool"
    else:
        basis = f"{versions.count(expected)} of its {len(peers)} nodes"
    return [
        Finding(
            WARN,
            "driver-drift",
            f"The node runs driver {driver} while pool {pool} runs {expected} ({basis}): "
            "align it before the node returns; the health gate refuses a drifted driver.",
        )
    ]
