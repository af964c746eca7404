from __future__ import annotations

from lightkube import codecs
from lightkube.resources.core_v1 import Node, Pod

from gpuheal.sim.gpustate import pod_gpus, render, summarize
from gpuheal.sim.nodes import gpu_node
from gpuheal.sim.workloads import gpu_pod


def _node(name: str, ready: bool = True) -> Node:
    manifest = gpu_node(name)
    manifest["status"]["conditions"] = [{"type": "Ready", "status": str(ready)}]
    node: Node = codecs.from_dict(manifest)  # type: ignore[assignment]
    return node


def _pod(name: str, node: str | None, gpus: int, phase: str = "Running") -> Pod:
    manifest = gpu_pod(name, "ns", gpus=gpus, node_name=node)
    manifest["status"] = {"phase": phase}
    pod: Pod = codecs.from_dict(manifest)  # type: ignore[assignment]
    return pod


def test_pod_gpus_takes_the_larger_of_containers_and_any_init_container() -> None:
    pod = _pod("p", "n", 2)
    assert pod_gpus(pod) == 2
    manifest = gpu_pod("p", "ns", gpus=1)
    manifest["spec"]["containers"].append(dict(manifest["spec"]["containers"][0], name="b"))
    manifest["spec"]["initContainers"] = [
        dict(
            manifest["spec"]["containers"][0],
            name="init",
            resources={"limits": {"nvidia.com/gpu": "3"}},
        )
    ]
    assert pod_gpus(codecs.from_dict(manifest)) == 3  # type: ignore[arg-type]


def test_pod_gpus_ignores_unparseable_quantities() -> None:
    manifest = gpu_pod("p", "ns")
    manifest["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "lots"}}
    assert pod_gpus(codecs.from_dict(manifest)) == 0  # type: ignore[arg-type]


def test_summarize_counts_only_live_gpu_pods_on_each_node() -> None:
    nodes = [_node("b"), _node("a", ready=False)]
    pods = [
        _pod("p1", "a", 2),
        _pod("p2", "a", 1, phase="Pending"),
        _pod("done", "a", 4, phase="Succeeded"),
        _pod("cpu-only", "a", 0),
        _pod("unscheduled", None, 8, phase="Pending"),
        _pod("p3", "b", 8),
    ]
    rows = summarize(nodes, pods)
    assert [
        (r.name, r.ready, r.gpus, r.allocated, r.gpu_pods, r.running_gpu_pods) for r in rows
    ] == [
        ("a", False, 8, 3, 2, 1),
        ("b", True, 8, 8, 1, 1),
    ]
    text = render(rows)
    assert text.splitlines()[-1] == (
        "1/2 nodes Ready, 16 GPUs, 11 allocated (69%), 2/3 GPU pods running"
    )
