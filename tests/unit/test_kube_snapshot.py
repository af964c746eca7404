"""The CLI's snapshot: LIST pages decoded into slim projections, one object at a time."""

from __future__ import annotations

import json
import logging
from typing import Any

import msgspec
import pytest

from gpuheal.config import Config, parse_config
from gpuheal.kube.projections import FaultJson, NodeJson, PodJson
from gpuheal.kube.snapshot import PageDecoder, Snapshot
from gpuheal.ops.fleet import gpu_node, node_selector_query, pod_gpus
from tests.corpus import EKS_NODE


def page(items: list[dict[str, Any]] | None, next_page: str = "") -> bytes:
    meta = {"resourceVersion": "4711", **({"continue": next_page} if next_page else {})}
    return json.dumps({"kind": "List", "metadata": meta, "items": items}).encode()


def test_a_page_gives_its_objects_and_the_token_of_the_next() -> None:
    raw = page(
        [
            {"metadata": {"name": EKS_NODE, "labels": {"nvidia.com/gpu.present": "true"}}},
            {"metadata": {"name": "ip-10-0-1-7.us-west-2.compute.internal"}},
        ],
        next_page="eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NDcxMX0",
    )
    nodes, next_page = PageDecoder(NodeJson, "Node").decode(raw)
    assert [n.metadata.name for n in nodes] == [EKS_NODE, "ip-10-0-1-7.us-west-2.compute.internal"]
    assert next_page == "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NDcxMX0"
    assert PageDecoder(NodeJson, "Node").decode(page(None)) == ([], "")


def test_an_object_the_projection_cannot_take_is_skipped_with_a_warning_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = {"metadata": {"name": "ok"}, "spec": {"node": EKS_NODE, "faultID": "a"}}
    bad = {"metadata": {"name": "broken"}, "spec": {"node": EKS_NODE, "faultID": 7}}
    with caplog.at_level(logging.WARNING):
        faults, _ = PageDecoder(FaultJson, "GPUFault").decode(page([good, bad]))
    assert [f.metadata.name for f in faults] == ["ok"]
    assert "GPUFault broken skipped: it cannot be read" in caplog.text
    assert "$.spec.faultID" in caplog.text
    pods = [{"metadata": {"name": "p", "namespace": "ml", "labels": ["not", "a", "map"]}}]
    with caplog.at_level(logging.WARNING):
        assert PageDecoder(PodJson, "Pod").decode(page(pods)) == ([], "")
    assert "Pod ml/p skipped" in caplog.text


def test_a_page_that_is_no_list_is_a_decode_error() -> None:
    with pytest.raises(msgspec.DecodeError):
        PageDecoder(NodeJson, "Node").decode(b'{"items": 3}')
    with pytest.raises(msgspec.DecodeError):
        PageDecoder(NodeJson, "Node").decode(b"<html>")


def test_pods_are_grouped_by_their_node() -> None:
    pods = [
        msgspec.convert({"metadata": {"name": n}, "spec": {"nodeName": on}}, PodJson)
        for n, on in (("a", EKS_NODE), ("b", "other"), ("c", EKS_NODE))
    ]
    snap = Snapshot(nodes=[], pods=pods)
    assert {k: [p.metadata.name for p in v] for k, v in snap.pods_by_node.items()} == {
        EKS_NODE: ["a", "c"],
        "other": ["b"],
    }


def test_gpus_of_a_pod_count_as_the_scheduler_counts_them() -> None:
    def container(**resources: dict[str, str]) -> dict[str, Any]:
        return {"name": "c", "resources": resources}

    pod = msgspec.convert(
        {
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    container(limits={"nvidia.com/gpu": "2"}),  # a limit implies the request
                    container(requests={"nvidia.com/mig-1g.10gb": "1"}, limits={"cpu": "1"}),
                ],
                "initContainers": [container(limits={"nvidia.com/gpu": "4"})],
            },
        },
        PodJson,
    )
    config = parse_config({"gpuResources": ["nvidia.com/gpu", "nvidia.com/mig-*"]})
    assert pod_gpus(pod, config) == 4  # the init container's 4 > the containers' 2 + 1


@pytest.mark.parametrize(
    ("selector", "query"),
    [
        ({}, ""),  # GPU capacity decides: no label selector can say it
        ({"nvidia.com/gpu.present": "true"}, "nvidia.com/gpu.present=true"),
        ({"b": "2", "a": ""}, "a=,b=2"),
        ({"pool": "a b"}, ""),  # no label has this value: decided in-process
        ({"pool in (a)": "x"}, ""),
    ],
)
def test_the_node_selector_goes_to_the_api_server_only_when_it_says_exactly_the_same(
    selector: dict[str, str], query: str
) -> None:
    assert node_selector_query(parse_config({"nodeSelector": selector})) == query


def test_the_default_node_selector_picks_gpu_nodes() -> None:
    gpu = msgspec.convert(
        {"metadata": {"name": EKS_NODE, "labels": {"nvidia.com/gpu.present": "true"}}}, NodeJson
    )
    cpu = msgspec.convert({"metadata": {"name": "cpu"}}, NodeJson)
    assert (gpu_node(gpu, Config()), gpu_node(cpu, Config())) == (True, False)
