"""The lightkube client of the local control plane and the tests: their
fixtures and checks build objects as lightkube models. The product's programs
speak to the API server only through gpuheal/kube (KubeApi).
"""

from __future__ import annotations

from pathlib import Path

import httpx2
from lightkube import Client, KubeConfig

FIELD_MANAGER = "gpuheal"


def _config(kubeconfig: Path | None) -> KubeConfig:
    # None: in-cluster service account, then $KUBECONFIG, then ~/.kube/config.
    return KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()


def sync_client(
    kubeconfig: Path | None, *, trust_env: bool = False, timeout_s: float = 10.0
) -> Client:
    """A blocking client. `trust_env=False` ignores HTTP(S)_PROXY variables by default."""
    return Client(
        config=_config(kubeconfig),
        field_manager=FIELD_MANAGER,
        trust_env=trust_env,
        timeout=httpx2.Timeout(timeout_s),
    )
