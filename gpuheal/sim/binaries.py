"""Where the control-plane binaries built by testenv/build.sh live."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_DIR = "GPUHEAL_TESTENV_DIR"
_REPO_ROOT = Path(__file__).resolve().parents[2]


class _Binary:
    """A file of the binaries' directory, read as an attribute (`binaries.etcd`)."""

    def __init__(self, file: str) -> None:
        self.file = file

    def __get__(self, binaries: Binaries, owner: type[Binaries]) -> Path:
        return binaries.directory / self.file


@dataclass(frozen=True)
class Binaries:
    directory: Path

    etcd = _Binary("etcd")
    kube_apiserver = _Binary("kube-apiserver")
    kube_scheduler = _Binary("kube-scheduler")
    kube_controller_manager = _Binary("kube-controller-manager")
    kwok = _Binary("kwok")
    kwok_stages = _Binary("kwok-stages.yaml")
    kubectl = _Binary("kubectl")
    helm = _Binary("helm")


def default_binaries() -> Binaries:
    """$GPUHEAL_TESTENV_DIR/bin, else .cache/testenv/bin in the source tree."""
    base = os.environ.get(ENV_DIR)
    root = Path(base) if base else _REPO_ROOT / ".cache" / "testenv"
    return Binaries(root / "bin")
