from __future__ import annotations

import stat
from pathlib import Path

from lightkube import KubeConfig

from gpuheal.sim.kubeconfig import write_kubeconfig
from gpuheal.sim.pki import create_pki


def test_kubeconfig_is_private_and_lightkube_reads_it(tmp_path: Path) -> None:
    pki = create_pki(tmp_path)
    path = write_kubeconfig(
        tmp_path / "kc.yaml",
        server="https://127.0.0.1:6443",
        ca_cert=pki.ca.cert,
        user="gpuheal-agent",
        token="s3cr3t",
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config = KubeConfig.from_file(path).get()
    assert config is not None
    assert config.cluster.server == "https://127.0.0.1:6443"
    assert config.user is not None and config.user.token == "s3cr3t"
