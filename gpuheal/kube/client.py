"""Kubernetes API clients built from a kubeconfig.

`operator_api` is the CLI's: kubectl's search order and --context, and the
proxy variables of an operator's shell honoured.
"""

from __future__ import annotations

from pathlib import Path

from gpuheal.kube.api import KubeApi
from gpuheal.kube.kubeconfig import load_rest_config


def operator_api(kubeconfig: Path | None, context: str | None) -> KubeApi:
    """The operator CLI's client: --kubeconfig, then $KUBECONFIG, then ~/.kube/config,
    then the in-cluster service account; --context, else the current context.
    Raises kube.kubeconfig.KubeconfigError (NoKubeconfigError when there is none)."""
    return KubeApi(
        load_rest_config(kubeconfig, context),
        trust_env=True,  # operators' shells may need their proxy
    )
