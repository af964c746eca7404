"""Where a fault's moved pods went (gpuheal/api/console/moves.py): each evicted
pod's controller and the nodes its controller's pods created since the eviction
run on, from the pod cache alone."""

from __future__ import annotations

import dataclasses

import msgspec

from gpuheal.api.console import render
from gpuheal.api.console.auth import Role, issue
from gpuheal.api.console.moves import Move, moves
from gpuheal.config import Config
from gpuheal.kube.projections import PodJson, pod_view_factory
from gpuheal.model import ActionEntry, Phase, PodView
from tests.console_fleet import cluster, record
from tests.corpus import EKS_NODES

NS = "ml-training"
RS = "ReplicaSet/llm-finetune-6d5f8b7c9d"
EVICTED_AT = "2026-12-01T09:40:27.513Z"
BEFORE, SAME_SECOND, AFTER = "2026-12-01T08:00:00Z", "2026-12-01T09:40:27Z", "2026-12-01T09:40:31Z"
FAULTY, SPARE_A, SPARE_B = EKS_NODES[0], EKS_NODES[1], EKS_NODES[2]


def pod(name: str, node: str, owner: str, created: str, **changes: object) -> PodView:
    made = PodView(
        NS, name, f"uid-{name}", node, "Running", gpu=True, owner=owner, created_at=created
    )
    return dataclasses.replace(made, **changes)  # type: ignore[arg-type]


def cache(*pods: PodView) -> dict[str, PodView]:
    return {p.key: p for p in pods}


def test_a_deployments_evicted_pod_is_shown_on_the_nodes_of_its_replacements() -> None:
    pods = cache(
        pod("llm-finetune-6d5f8b7c9d-x7k2p", SPARE_B, RS, BEFORE),  # a sibling, never moved
        pod("llm-finetune-6d5f8b7c9d-b4zqw", SPARE_A, RS, SAME_SECOND),
        pod("llm-finetune-6d5f8b7c9d-m9c2v", "", RS, AFTER, phase="Pending"),
        pod("llm-finetune-6d5f8b7c9d-r5tnh", SPARE_B, RS, AFTER, deleting=True),
    )
    (moved,) = moves([f"{NS}/llm-finetune-6d5f8b7c9d-q8w2l"], EVICTED_AT, pods)
    assert moved == Move(f"{NS}/llm-finetune-6d5f8b7c9d-q8w2l", RS, (SPARE_A,), pending=1)
    assert moved.where == f"{SPARE_A}, 1 pending"


def test_a_statefulsets_pod_comes_back_under_its_own_name() -> None:
    sts = "StatefulSet/llama-70b-worker"
    pods = cache(pod("llama-70b-worker-3", SPARE_A, sts, AFTER))
    (moved,) = moves([f"{NS}/llama-70b-worker-3"], EVICTED_AT, pods)
    assert (moved.owner, moved.where) == (sts, SPARE_A)


def test_the_owner_is_found_by_name_when_the_evicted_pod_is_gone() -> None:
    """The longest controller name that names the pod wins; a StatefulSet's pods
    end in an ordinal, a ReplicaSet's and a Job's in the API server's 5 characters."""
    pods = cache(
        pod("web-7c4x9", SPARE_A, "ReplicaSet/web", BEFORE),
        pod("web-api-zz4x9", SPARE_B, "ReplicaSet/web-api", AFTER),
        pod("eval-0", SPARE_A, "StatefulSet/eval", BEFORE),
        pod("bench-3-k2v9x", SPARE_B, "Job/bench", AFTER),
    )
    found = moves(
        [f"{NS}/web-api-7c4x9", f"{NS}/eval-1", f"{NS}/eval-abcde", f"{NS}/bench-0-q8w2l"],
        EVICTED_AT,
        pods,
    )
    assert [(m.owner, m.where) for m in found] == [
        ("ReplicaSet/web-api", SPARE_B),
        ("StatefulSet/eval", "not replaced yet"),
        ("", "no controller (not recreated)"),
        ("Job/bench", SPARE_B),
    ]


def test_a_bare_pod_is_not_recreated_and_other_namespaces_do_not_count() -> None:
    elsewhere = dataclasses.replace(
        pod("trainer-0-k2v9x", SPARE_A, "ReplicaSet/trainer-0", AFTER), namespace="other"
    )
    (moved,) = moves([f"{NS}/trainer-0"], EVICTED_AT, cache(elsewhere))
    assert moved == Move(f"{NS}/trainer-0", "", (), 0)
    assert moved.where == "no controller (not recreated)"


def test_the_projection_keeps_the_pods_controller_and_creation_time() -> None:
    raw = {
        "metadata": {
            "name": "llm-finetune-6d5f8b7c9d-q8w2l",
            "namespace": NS,
            "uid": "u",
            "creationTimestamp": SAME_SECOND,
            "ownerReferences": [
                {"kind": "Foo", "name": "not-the-controller"},
                {"kind": "ReplicaSet", "name": "llm-finetune-6d5f8b7c9d", "controller": True},
            ],
        },
        "spec": {"nodeName": FAULTY, "containers": []},
        "status": {"phase": "Running"},
    }
    view = pod_view_factory(Config().is_gpu_resource)(
        msgspec.json.decode(msgspec.json.encode(raw), type=PodJson)
    )
    assert (view.owner, view.created_at) == (RS, SAME_SECOND)


def test_the_fault_page_shows_where_each_moved_pod_went() -> None:
    c = cluster(40)
    node = next(iter(c.nodes))
    moved = record(node, "xid-79", Phase.DRAINED)
    moved = dataclasses.replace(
        moved,
        evicted_pods=(f"{NS}/llm-finetune-6d5f8b7c9d-q8w2l", f"{NS}/trainer-0"),
        actions=(ActionEntry(EVICTED_AT, "evict", "ok", "2 to evict, 0 terminating"),),
    )
    replacement = pod("llm-finetune-6d5f8b7c9d-b4zqw", SPARE_A, RS, AFTER)
    c = dataclasses.replace(
        c, records={moved.name: moved}, pods={**c.pods, replacement.key: replacement}
    )
    html = render.fault_page(c, moved.name, issue(Role.VIEW, "oncall", b"v" * 32, 0.0)[1])
    assert html is not None
    assert f'<td class="owner">{RS}</td>' in html
    assert f'<a href="/console/nodes/{SPARE_A}">{SPARE_A}</a>' in html
    assert "no controller (not recreated)" in html
