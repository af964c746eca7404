"""Kubeconfig files for the local control plane: one per identity, token auth."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml


def write_kubeconfig(path: Path, *, server: str, ca_cert: Path, user: str, token: str) -> Path:
    """Write a kubeconfig that talks to `server` as `user` with a bearer token.

    The file holds a secret, so it is written 0600.
    """
    ca_data = base64.b64encode(ca_cert.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpuheal-sim",
                "cluster": {"server": server, "certificate-authority-data": ca_data},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "gpuheal-sim", "user": user}}],
        "current-context": user,
    }
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def write_cert_kubeconfig(
    path: Path, *, server: str, ca_cert: Path, user: str, cert: Path, key: Path
) -> Path:
    """Write a kubeconfig that talks to `server` with a client certificate (as a
    kubelet does: system:node:<name> in system:nodes). Written 0600."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpuheal-sim",
                "cluster": {"server": server, "certificate-authority": str(ca_cert)},
            }
        ],
        "users": [
            {"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}
        ],
        "contexts": [{"name": user, "context": {"cluster": "gpuheal-sim", "user": user}}],
        "current-context": user,
    }
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
