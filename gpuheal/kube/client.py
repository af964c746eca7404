"""Kubernetes API clients built from a kubeconfig.

`operator_api` is the CLI's: kubectl's search order and --context, and the
proxy variables of an operator's shell honoured. The lightkube clients below
serve the code not yet moved to KubeApi (ops/, agent/, sim/); they load
lightkube only when called, so the controller's path never imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpuheal.kube.api import KubeApi
from gpuheal.kube.kubeconfig import load_rest_config

if TYPE_CHECKING:
    from lightkube import AsyncClient, Client, KubeConfig
    from lightkube.config.kubeconfig import SingleConfig

FIELD_MANAGER = "gpuheal"


def operator_api(kubeconfig: Path | None, context: str | None) -> KubeApi:
    """The operator CLI's client: --kubeconfig, then $KUBECONFIG, then ~/.kube/config,
    then the in-cluster service account; --context, else the current context.
    Raises kube.kubeconfig.KubeconfigError (NoKubeconfigError when there is none)."""
    return KubeApi(
        load_rest_config(kubeconfig, context),
        trust_env=True,  # operators' shells may need their proxy
    )


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


def operator_config(kubeconfig: Path | None, context: str | None) -> SingleConfig:
    """kubectl's order, for an operator's shell (see operator_api). Raises
    KubeconfigError (NoKubeconfigError: nothing found) with kubectl's plain message."""
    from lightkube import KubeConfig  # noqa: PLC0415
    from lightkube.core.exceptions import ConfigError  # noqa: PLC0415

    rest = load_rest_config(kubeconfig, context)  # finds it, or says plainly why not
    files = [Path(p) for p in rest.source.split(" + ")] if rest.context else []
    loaded = KubeConfig.from_file(files[0]) if files else KubeConfig.from_service_account()
    config = loaded.get(context_name=context)
    if config is None:
        raise ConfigError(f"no context in {rest.source}; pass --context")
    return config


def operator_client(kubeconfig: Path | None, context: str | None) -> Client:
    """A blocking client for the operator CLI (see operator_config)."""
    import httpx2  # noqa: PLC0415
    from lightkube import Client  # noqa: PLC0415

    return Client(
        config=operator_config(kubeconfig, context),
        field_manager=FIELD_MANAGER,
        trust_env=True,  # operators' shells may need their proxy
        timeout=httpx2.Timeout(30.0),
    )


def async_client(kubeconfig: Path | None, *, trust_env: bool = False) -> AsyncClient:
    """An asyncio client."""
    from lightkube import AsyncClient  # noqa: PLC0415

    return AsyncClient(config=_config(kubeconfig), field_manager=FIELD_MANAGER, trust_env=trust_env)
