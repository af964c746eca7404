"""The real node's pure parts: what a machine lacks is named, the configurations as the
kubelet, containerd and CNI read them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuheal.sim.binaries import NodeBuild
from gpuheal.sim.realnode import (
    KERNEL_DEFAULTS,
    RealNodeConfig,
    containerd_config,
    kubelet_config,
    missing_requirements,
    registries_config,
)


def test_a_machine_without_the_build_is_told_what_to_run(tmp_path: Path) -> None:
    config = RealNodeConfig(build=NodeBuild(tmp_path), extra_images=(tmp_path / "gpuheal.tar",))
    missing = "; ".join(missing_requirements(config))
    assert f"{tmp_path}/bin/kubelet (testenv/node/build.sh; `make node`)" in missing
    assert f"{tmp_path}/images/pause.tar" in missing
    assert f"{tmp_path}/gpuheal.tar (`make image`" in missing


def test_the_kubelet_never_writes_the_machine_s_kernel_settings(tmp_path: Path) -> None:
    """protectKernelDefaults: the kubelet only reads them (the node shows it its own
    values); off, it would write kernel.panic and friends of the whole machine."""
    config = kubelet_config(tmp_path, RealNodeConfig(), "/x/gpuheal-node-1")
    assert config["protectKernelDefaults"] is True
    assert set(KERNEL_DEFAULTS) >= {"kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory"}
    assert (config["cgroupDriver"], config["failCgroupV1"]) == ("cgroupfs", False)


@pytest.mark.parametrize("key", ["sandbox_image", "restrict_oom_score_adj", "config_path"])
def test_containerd_is_told_its_sandbox_its_limits_and_its_registries(
    tmp_path: Path, key: str
) -> None:
    assert key in containerd_config(tmp_path, "gpuheal.dev/pause:v1.36.3")


def test_every_registry_is_a_closed_loopback_port() -> None:
    """A pod naming an image the node did not import fails its pull here, sending
    nothing off the machine."""
    assert registries_config().startswith('server = "http://127.0.0.1:9"')
