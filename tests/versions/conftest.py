"""The multi-version tier: the core of the integration tier on each Kubernetes minor
testenv builds besides the default (testenv/versions/: the oldest supported and the
newest stable), one control plane per version for the whole tier.

`control_plane`, `kube` and `crds` are the session's, per version: every test here
runs once for each minor (`[1.32]`, `[1.37]`), and pytest runs all of one minor's
tests before it starts the next one's control plane. A minor whose binaries are not
built fails its tests saying which files are missing and what builds them: none skips.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from lightkube import Client

from gpuheal.sim import ControlPlane, ControlPlaneConfig
from gpuheal.sim.binaries import other_versions, require_control_plane, version_binaries
from gpuheal.sim.controller import install_crds
from gpuheal.sim.workloads import create_namespace
from tests.conftest import AUDITED_CONTROLLER

# The fixtures the imported tests use beside these: function-scoped, so each resolves
# `kube` and `control_plane` to this tier's.
from tests.integration.conftest import (  # noqa: F401
    agents,
    pool,
    sink,
    start_agent,
    start_controller,
)

VERSIONS = other_versions()


@pytest.fixture(scope="session", params=VERSIONS)
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """Kubernetes `request.param`'s control plane, set up as the session's default one."""
    minor = str(request.param)
    config = ControlPlaneConfig(
        keep_workdir=os.environ.get("GPUHEAL_SIM_KEEP") == "1",
        audit_users=[AUDITED_CONTROLLER],
        binaries=require_control_plane(version_binaries(minor), minor),
    )
    with ControlPlane(config) as cp:
        yield cp


# Not the session's `kube` and `crds` (tests/conftest.py, tests/integration/conftest.py):
# pytest would hand those out from their cache, bound to the default control plane.
@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Client:
    return control_plane.client()


@pytest.fixture(scope="session")
def crds(kube: Client) -> None:
    install_crds(kube)
    create_namespace(kube, "gpuheal-system")


def minor_of(control_plane: ControlPlane) -> int:
    """36 for "v1.36.3"."""
    return int(control_plane.version.split(".")[1])
