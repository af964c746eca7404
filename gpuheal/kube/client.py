"""Kubernetes API clients built from a kubeconfig file."""

from __future__ import annotations

import os
from pathlib import Path

import httpx2
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import SingleConfig
from lightkube.core.exceptions import ConfigError

from gpuheal.kube.api import KubeApi

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


def operator_config(kubeconfig: Path | None, context: str | None) -> SingleConfig:
    """kubectl's order, for an operator's shell: --kubeconfig, then the first file of
    $KUBECONFIG, then ~/.kube/config, then the in-cluster service account; then
    --context, else the file's current context. lightkube's ConfigError on failure."""
    path = kubeconfig
    if path is None and os.environ.get("KUBECONFIG"):
        path = Path(os.environ["KUBECONFIG"].split(os.pathsep)[0])
    if path is None and (home := Path("~/.kube/config").expanduser()).exists():
        path = home
    loaded = KubeConfig.from_file(path) if path else KubeConfig.from_service_account()
    config = loaded.get(context_name=context)
    if config is None:
        raise ConfigError(f"no context in {path or 'the service account'}; pass --context")
    return config


def operator_client(kubeconfig: Path | None, context: str | None) -> Client:
    """A blocking client for the operator CLI (see operator_config)."""
    return Client(
        config=operator_config(kubeconfig, context),
        field_manager=FIELD_MANAGER,
        trust_env=True,  # operators' shells may need their proxy
        timeout=httpx2.Timeout(30.0),
    )


def operator_api(kubeconfig: Path | None, context: str | None) -> KubeApi:
    """The raw JSON client for the operator CLI's read commands (see operator_config).

    Provisional: lightkube loads the kubeconfig and builds the HTTP client, as
    KubeApi.from_kubeconfig does, until kube/ has a client of its own."""
    params = client_adapter.ConnectionParams(
        timeout=httpx2.Timeout(30.0),
        trust_env=True,  # operators' shells may need their proxy
    )
    return KubeApi(client_adapter.AsyncClient(operator_config(kubeconfig, context), params))


def async_client(kubeconfig: Path | None, *, trust_env: bool = False) -> AsyncClient:
    """An asyncio client."""
    return AsyncClient(config=_config(kubeconfig), field_manager=FIELD_MANAGER, trust_env=trust_env)
