"""Property-based fuzzing of the controller API from its own OpenAPI document
(schemathesis): whatever is sent, no 5xx and no crash."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from lightkube import Client
from schemathesis.checks import not_a_server_error

from gpuheal.sim import ControlPlane
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.nodes import create_gpu_nodes, delete_nodes
from tests.corpus import unique_eks_node
from tests.helpers import unique
from tests.integration.conftest import controller_config

TOKEN = "fuzz-token"
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def fuzzed(
    control_plane: ControlPlane, kube: Client, crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerProcess]:
    workdir = tmp_path_factory.mktemp("fuzz")
    pool = {"gpuheal.test/pool": unique("fuzz")}
    nodes = create_gpu_nodes(kube, [unique_eks_node() for _ in range(2)], labels=pool)
    token = workdir / "token"
    token.write_text(TOKEN)
    config = controller_config(
        pool, apiTokenFile=str(token), apiClientRatePerSecond=10_000, apiClientBurst=10_000
    )
    controller = ControllerProcess(workdir, control_plane.kubeconfig, config, identity="fuzz")
    controller.start().wait_leading()
    yield controller
    controller.stop()
    delete_nodes(kube, nodes)
    if "Traceback" in controller.log():
        pytest.fail(f"the controller logged a traceback:\n{controller.log()[-3000:]}")


def test_no_request_makes_the_api_fail(fuzzed: ControllerProcess) -> None:
    # Driven through schemathesis' Python API: its pytest plugin does not load under pytest 9.
    schema = schemathesis.openapi.from_url(f"{fuzzed.url}/openapi.yaml")
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    labels = {operation.label for operation in operations}
    assert {"POST /api/v1/alerts", "POST /api/v1/process", "GET /api/v1/faults"} <= labels
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def call(case: Any) -> None:
            case.call_and_validate(
                base_url=fuzzed.url,
                headers={"Authorization": f"Bearer {TOKEN}"},
                checks=[not_a_server_error],
            )

        call()
