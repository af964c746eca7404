"""The supported Kubernetes range is one fact, said in four places: Chart.yaml's
kubeVersion, docs/deploy.md, README's table of what the tests run on, and the
versions testenv builds (testenv/k8s, testenv/versions/<minor>). A version whose
binaries are not built fails its tests saying what to build."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuheal.sim.binaries import (
    DEFAULT_SOURCE,
    VERSIONS_SOURCE,
    Binaries,
    ControlPlaneMissingError,
    other_versions,
    pinned_release,
    require_control_plane,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_chart_docs_and_readme_say_the_range_testenv_builds() -> None:
    oldest, newest = other_versions()[0], other_versions()[-1]
    chart = yaml.safe_load((ROOT / "deploy/helm/gpuheal/Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={oldest}.0-0"
    deploy = (ROOT / "docs/deploy.md").read_text()
    assert f"**Supported: Kubernetes {oldest} to {newest}**" in deploy
    assert f'`kubeVersion: ">={oldest}.0-0"`' in deploy
    default = pinned_release(DEFAULT_SOURCE)
    assert int(default.split(".")[1]) < int(newest.split(".")[1])  # the newest is an extra one
    releases = [default] + [pinned_release(VERSIONS_SOURCE / minor) for minor in other_versions()]
    readme = (ROOT / "README.md").read_text()
    for release in releases:
        assert f"{release.removeprefix('v')}" in deploy, release
        assert f"| {release}" in readme, release


def test_a_version_not_built_fails_naming_what_is_missing_and_what_builds_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "kube-apiserver").write_text("")
    with pytest.raises(ControlPlaneMissingError) as raised:
        require_control_plane(Binaries(tmp_path), "1.32")
    said = str(raised.value)
    assert said.startswith("Kubernetes 1.32's control plane is not built (")
    assert f"{tmp_path}/etcd" in said and f"{tmp_path}/helm" in said
    assert f"{tmp_path}/kube-apiserver" not in said
    assert "run `make testenv` (testenv/versions/build.sh 1.32;" in said
    for name in ("etcd", "kube-scheduler", "kube-controller-manager", "kubectl", "kwok",
                 "kwok-stages.yaml", "helm"):  # fmt: skip
        (tmp_path / name).write_text("")
    assert require_control_plane(Binaries(tmp_path), "1.32") == Binaries(tmp_path)
