"""Shared fixtures: one real control plane per test session, a namespace and a
set of fake GPU nodes per test. Tier markers come from the test's folder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Namespace

from gpuheal.sim import ControlPlane, ControlPlaneConfig
from gpuheal.sim.nodes import create_gpu_nodes, delete_nodes, wait_nodes_ready
from gpuheal.sim.workloads import create_namespace
from tests.helpers import FakeNodes, unique

_TIERS = ("unit", "integration", "e2e", "chaos")
AUDITED_USER = "gpuheal-controller"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in _TIERS:
            if tier in parts:
                item.add_marker(tier)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """The session's control plane: every component, started once.

    GPUHEAL_SIM_KEEP=1 keeps its workdir (logs, kubeconfigs) after the run.
    The apiserver audits the requests of AUDITED_USER only: a test that must count
    what a controller costs runs it as that user (start_controller(user=...)).
    """
    config = ControlPlaneConfig(
        keep_workdir=os.environ.get("GPUHEAL_SIM_KEEP") == "1", audit_users=(AUDITED_USER,)
    )
    with ControlPlane(config) as cp:
        yield cp


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> Client:
    """An admin client of the session's control plane."""
    return control_plane.client()


@pytest.fixture
def namespace(kube: Client) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (without waiting)."""
    name = unique("t")
    create_namespace(kube, name)
    yield name
    kube.delete(Namespace, name)


@pytest.fixture
def fake_gpu_nodes(kube: Client) -> Iterator[FakeNodes]:
    """Factory: `fake_gpu_nodes(count, **labels_and_options)` creates Ready fake
    GPU nodes with unique names and deletes them after the test."""
    created: list[str] = []

    def make(count: int, **options: object) -> list[str]:
        prefix = unique("gpu")
        names = [f"{prefix}-{i}" for i in range(count)]
        created.extend(create_gpu_nodes(kube, names, **options))  # type: ignore[arg-type]
        wait_nodes_ready(kube, names)
        return names

    yield make
    delete_nodes(kube, created)
