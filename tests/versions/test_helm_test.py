"""`helm test` on every other Kubernetes minor testenv builds: it passes on a working
install and names what is not (tests/integration/test_selftest.py)."""

from __future__ import annotations

from tests.integration.test_selftest import (  # noqa: F401
    release,
    test_helm_test_passes_on_a_working_install_and_names_what_is_not,
)
