"""A slice of the security matrix (tests/integration/test_security_matrix.py) on every
other Kubernetes minor testenv builds: the whole matrix of the chart's four identities,
and the real agent reporting with a token bound to its node (the node name such tokens
carry, which the agent's admission policy reads)."""

from __future__ import annotations

from tests.integration.test_security_matrix import (  # noqa: F401
    scene,
    test_every_identity_is_refused_every_dangerous_change_and_allowed_its_job,
    test_the_real_agent_reports_with_its_token_under_the_policy,
)
