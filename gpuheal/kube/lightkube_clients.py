"""lightkube clients, for what serves the local control plane (gpuheal/sim) and
the tests; the product's programs use kube/api.py's KubeApi (issue 17). They
load lightkube only when called.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightkube import AsyncClient, Client, KubeConfig

FIELD_MANAGER = "gpuheal"


def _config(kubeconfig: Path | None) -> KubeConfig:
    from lightkube import KubeConfig  # noqa: PLC0415

    # None: in-cluster service account, then $KUBECONFIG, then ~/.kube/config.
    return KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()


def sync_client(
    kubeconfig: Path | None, *, trust_env: bool = False, timeout_s: float = 10.0
) -> Client:
    """A blocking client. `trust_env=False` ignores HTTP(S)_PROXY variables by default."""
    import httpx2  # noqa: PLC0415
    from lightkube import Client  # noqa: PLC0415

    return Client(
        config=_config(kubeconfig),
        field_manager=FIELD_MANAGER,
        trust_env=trust_env,
        timeout=httpx2.Timeout(timeout_s),
    )


def async_client(kubeconfig: Path | None, *, trust_env: bool = False) -> AsyncClient:
    """An asyncio client."""
    from lightkube import AsyncClient  # noqa: PLC0415

    return AsyncClient(config=_config(kubeconfig), field_manager=FIELD_MANAGER, trust_env=trust_env)
