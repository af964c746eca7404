"""Kubernetes API clients built from a kubeconfig file."""

from __future__ import annotations

from pathlib import Path

from lightkube import AsyncClient, Client, KubeConfig

FIELD_MANAGER = "gpuheal"


def sync_client(kubeconfig: Path, *, trust_env: bool = False) -> Client:
    """A blocking client. `trust_env=False` ignores HTTP(S)_PROXY variables by default."""
    return Client(
        config=KubeConfig.from_file(kubeconfig), field_manager=FIELD_MANAGER, trust_env=trust_env
    )


def async_client(kubeconfig: Path, *, trust_env: bool = False) -> AsyncClient:
    """An asyncio client for the controller's event loop."""
    return AsyncClient(
        config=KubeConfig.from_file(kubeconfig), field_manager=FIELD_MANAGER, trust_env=trust_env
    )
