"""The chart installed on every other Kubernetes minor testenv builds: its RBAC runs a
whole fault cycle (tests/integration/test_helm_chart.py), and `helm test` passes on a
working install and names what is not (tests/integration/test_selftest.py)."""

from __future__ import annotations

from tests.integration.test_helm_chart import (  # noqa: F401
    release,
    test_the_chart_rbac_is_enough_for_a_whole_cycle_and_no_more,
)
