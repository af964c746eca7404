"""The node tier: a real kubelet and container runtime (gpuheal/sim/realnode.py) joined
to the session's control plane beside the kwok nodes, for this folder's tests only.

A machine that cannot run one fails these tests with what is missing (`make node`
installs and builds it), never skips them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuheal.sim import ControlPlane
from gpuheal.sim.binaries import default_chart_image
from gpuheal.sim.realnode import RealNode, RealNodeConfig

# The integration tier's fixtures, for the controller tests on the real node.
from tests.integration.conftest import crds, pool, start_controller  # noqa: F401


@pytest.fixture(scope="package")
def real_node(control_plane: ControlPlane) -> Iterator[RealNode]:
    """One real node for the tier, Ready, with the chart's image imported (`make image`);
    stopped (and removed) after its last test."""
    config = RealNodeConfig(extra_images=(default_chart_image().archive,))
    with RealNode(control_plane, config) as node:
        yield node
