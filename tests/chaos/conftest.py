"""The chaos suite's own control plane: these tests restart the API server and
kill controllers mid-storm, so they do not share the session's control plane.

The apiserver writes an audit log of every request the controller's user makes;
"exactly once" is checked against that server-side record, which no SIGKILL of
the controller can lose or invent.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client

from gpuheal.sim import ControlPlane, ControlPlaneConfig, audit
from gpuheal.sim.controller import install_crds
from gpuheal.sim.controlplane import KWOK
from gpuheal.sim.workloads import create_namespace

CONTROLLER_USER = "gpuheal-controller"


@pytest.fixture(scope="package")
def chaos_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    config = ControlPlaneConfig(
        scheduler=False,
        controller_manager=False,
        audit_users=[CONTROLLER_USER],
        # The device fence (DeviceTaintRules) for the storm of bad DRA cards.
        device_taint_rules=True,
        # kwok works a pod only while it holds its node's Lease, and it reads "held"
        # from its lease informer's cache. After the agent test's 60 s API outage
        # that informer can still be in its reconnect backoff when the next test
        # makes new nodes and pods: the pods are skipped as "read only" and never
        # looked at again (CI saw 0/200 Running after 120 s). This plane has no
        # kube-controller-manager to miss node heartbeats, so it runs without
        # node Leases and kwok works every pod on its nodes.
        extra_args={KWOK: ["--node-lease-duration-seconds=0"]},
        workdir=tmp_path_factory.mktemp("chaos-cp"),
        keep_workdir=os.environ.get("GPUHEAL_SIM_KEEP") == "1",
    )
    with ControlPlane(config) as cp:
        client = cp.client()
        install_crds(client)
        create_namespace(client, "gpuheal-system")
        audit.grant_cluster_admin(client, CONTROLLER_USER)
        yield cp


@pytest.fixture
def chaos_kube(chaos_plane: ControlPlane) -> Client:
    return chaos_plane.client()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
