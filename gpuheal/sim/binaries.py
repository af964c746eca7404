"""Where the control-plane binaries built by testenv/build.sh live."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_DIR = "GPUHEAL_TESTENV_DIR"
_REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Binaries:
    directory: Path

    @property
    def etcd(self) -> Path:
        return self.directory / "etcd"

    @property
    def kube_apiserver(self) -> Path:
        return self.directory / "kube-apiserver"

    @property
    def kube_scheduler(self) -> Path:
        return self.directory / "kube-scheduler"

    @property
    def kube_controller_manager(self) -> Path:
        return self.directory / "kube-controller-manager"

    @property
    def kwok(self) -> Path:
        return self.directory / "kwok"

    @property
    def kwok_stages(self) -> Path:
        return self.directory / "kwok-stages.yaml"

    @property
    def kubectl(self) -> Path:
        return self.directory / "kubectl"

    @property
    def helm(self) -> Path:
        return self.directory / "helm"


def default_binaries() -> Binaries:
    """$GPUHEAL_TESTENV_DIR/bin, else .cache/testenv/bin in the source tree."""
    base = os.environ.get(ENV_DIR)
    root = Path(base) if base else _REPO_ROOT / ".cache" / "testenv"
    return Binaries(root / "bin")
