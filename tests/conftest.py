"""Shared fixtures: one real control plane per test session, a namespace and a
set of fake GPU nodes per test. Tier markers come from the test's folder."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Namespace
from playwright.sync_api import Browser, sync_playwright

from gpuheal.sim import ControlPlane, ControlPlaneConfig
from gpuheal.sim.nodes import create_gpu_nodes, delete_nodes, wait_nodes_ready
from gpuheal.sim.workloads import create_namespace
from tests.corpus import eks_node_names
from tests.helpers import FakeNodes, unique

_TIERS = ("unit", "integration", "e2e", "chaos", "versions", "node")
AUDITED_CONTROLLER = "gpuheal-controller"  # one of gpuheal.sim's static identities
# Debian's chromium, installed by `make browser`; never a downloaded one.
CHROMIUM = "/usr/bin/chromium"
_TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(_TESTS).parts
        for tier in _TIERS:
            if parts and parts[0] == tier:
                item.add_marker(tier)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """The session's control plane: every component, started once.

    GPUHEAL_SIM_KEEP=1 keeps its workdir (logs, kubeconfigs) after the run. The
    API server audits the requests of the gpuheal-controller identity: a test that
    runs a controller as that user counts, on the server's side, what its retries cost.
    It serves DeviceTaintRules (Kubernetes 1.36's beta API, off by default), as a
    cluster that fences single GPUs must.
    """
    config = ControlPlaneConfig(
        keep_workdir=os.environ.get("GPUHEAL_SIM_KEEP") == "1",
        audit_users=[AUDITED_CONTROLLER],
        device_taint_rules=True,
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
    GPU nodes with unique names and deletes them after the test. The names are
    EKS's (ip-10-a-b-c.us-west-2.compute.internal), as real fleets have them."""
    created: list[str] = []

    def make(count: int, **options: object) -> list[str]:
        names = eks_node_names(count)
        created.extend(create_gpu_nodes(kube, names, **options))  # type: ignore[arg-type]
        wait_nodes_ready(kube, names)
        return names

    yield make
    delete_nodes(kube, created)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Chromium under playwright, one per test module (the console's browser tests)."""
    assert shutil.which("chromium"), "chromium missing: run `make browser`"
    with sync_playwright() as playwright:
        # As root (CI, containers) chromium runs only without its sandbox.
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()
