"""The core of the integration tier, each test as tests/integration has it, run on
every other Kubernetes minor testenv builds (conftest.py): a fault quarantined and
drained end to end, and a device fault through Pod status."""

from __future__ import annotations

from tests.integration.test_controller import (  # noqa: F401
    test_fault_quarantines_node_and_evicts_only_its_gpu_pods,
)
from tests.integration.test_device_health import (  # noqa: F401
    test_one_unhealthy_device_evicts_only_the_pods_holding_it_and_keeps_the_node,
)
