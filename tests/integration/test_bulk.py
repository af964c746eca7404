"""The benchmarks' bulk writer (gpuheal/sim/bulk.py) on the real control plane:
each object is created once, a re-run over a half-populated cluster counts only
what is new, and a refusal other than AlreadyExists is not swallowed."""

from __future__ import annotations

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from gpuheal.kube.api import ApiError
from gpuheal.sim import ControlPlane
from gpuheal.sim.bulk import create_all
from gpuheal.sim.nodes import delete_nodes, gpu_node
from gpuheal.sim.workloads import gpu_pod
from tests.corpus import eks_node_names

pytestmark = pytest.mark.timeout(120)


def test_a_rerun_creates_only_what_is_missing(
    control_plane: ControlPlane, kube: Client, namespace: str
) -> None:
    names = eks_node_names(3)
    pods = [gpu_pod(f"train-{i}", namespace, node_name=names[0]) for i in range(2)]
    try:
        assert (
            create_all(control_plane.kubeconfig, [gpu_node(n) for n in names[:2]], concurrency=2)
            == 2
        )
        # The first two nodes exist already: only the third node and the pods are new.
        manifests = [*(gpu_node(n) for n in names), *pods]
        assert create_all(control_plane.kubeconfig, manifests, concurrency=2) == 3
        assert set(names) <= {str(n.metadata.name) for n in kube.list(Node) if n.metadata}
        assert len(list(kube.list(Pod, namespace=namespace))) == 2
    finally:
        delete_nodes(kube, names)


def test_a_refusal_other_than_already_exists_raises(
    control_plane: ControlPlane, kube: Client
) -> None:
    (name,) = eks_node_names(1)
    # A namespace that does not exist: the API server answers 404, not 409.
    pod = gpu_pod("train-0", "no-such-namespace", node_name=name)
    with pytest.raises(ApiError) as refused:
        create_all(control_plane.kubeconfig, [pod])
    assert refused.value.code == 404
