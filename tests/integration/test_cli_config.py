"""The operator commands judge with the running controller's config: its ConfigMap
read from the real API server (ops/configsource.py), `--config` instead when given,
the built-in defaults when there is none, an error when its document is bad, and
stderr says which."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Namespace

from gpuheal.cli import main
from gpuheal.sim import ControlPlane
from tests.helpers import FakeNodes, unique

pytestmark = pytest.mark.timeout(120)

POOL = "example.com/gpu-pool"  # a pool label the built-in config does not know


@pytest.fixture
def system(kube: Client) -> Iterator[str]:
    """A namespace of its own, as the chart's release namespace."""
    name = unique("gpuheal-system")
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    kube.delete(Namespace, name)


def configmap(kube: Client, namespace: str, name: str, data: dict[str, str]) -> str:
    made = kube.create(ConfigMap(metadata=ObjectMeta(name=name), data=data), namespace=namespace)
    assert made.metadata is not None
    return str(made.metadata.resourceVersion)


def status(
    capsys: pytest.CaptureFixture[str], control_plane: ControlPlane, *options: str
) -> tuple[int, str, str]:
    """`gpuheal status -o json ...`: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(["status", "-o", "json", "--kubeconfig", str(control_plane.kubeconfig), *options])
    out, err = capsys.readouterr()
    return code, out, err


def pools_of(out: str, nodes: list[str]) -> set[str]:
    states = json.loads(out)["nodeStates"]
    return {s["pool"] for s in states if s["node"] in nodes}


def test_the_controllers_configmap_is_read_and_said(
    kube: Client,
    control_plane: ControlPlane,
    system: str,
    namespace: str,
    fake_gpu_nodes: FakeNodes,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    nodes = fake_gpu_nodes(2, labels={"gpuheal.test/pool": namespace, POOL: "h100-train"})
    document = {"nodeSelector": {"gpuheal.test/pool": namespace}, "pools": {"label": POOL}}
    version = configmap(kube, system, "gh-controller", {"config.yaml": yaml.safe_dump(document)})
    ref = f"{system}/gh-controller"

    code, out, err = status(capsys, control_plane, "--controller-config", ref)
    assert code == 0, err
    assert pools_of(out, nodes) == {"h100-train"}  # the controller's pool label, not the built-in
    assert f"config: ConfigMap {ref} (the controller's, resourceVersion {version})" in err

    # --config wins, and reads no ConfigMap: its pool label is the built-in one.
    given = tmp_path / "gpuheal.yaml"
    given.write_text(yaml.safe_dump({"nodeSelector": {"gpuheal.test/pool": namespace}}))
    code, out, err = status(
        capsys, control_plane, "--controller-config", ref, "--config", str(given)
    )
    assert code == 0, err
    assert pools_of(out, nodes) != {"h100-train"}
    assert "config:" not in err  # the person named it

    # No such ConfigMap: the defaults, said as such.
    code, out, err = status(capsys, control_plane, "--controller-config", f"{system}/none")
    assert code == 0, err
    assert f"config: built-in defaults (no ConfigMap {system}/none;" in err


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (
            {"config.yaml": "breakerMaxPercent: 250\n"},
            "breakerMaxPercent: must be between 0 and 100, got 250",
        ),
        ({"config.yaml": "pools: [\n"}, "key config.yaml is not valid YAML"),
        ({"other.yaml": "{}"}, "has no config.yaml key: not a gpuheal controller's config"),
    ],
    ids=["bad-key", "bad-yaml", "no-key"],
)
def test_a_bad_controller_config_is_an_error_not_a_fallback(
    kube: Client,
    control_plane: ControlPlane,
    system: str,
    capsys: pytest.CaptureFixture[str],
    data: dict[str, str],
    said: str,
) -> None:
    configmap(kube, system, "gh-controller", data)
    code, out, err = status(capsys, control_plane, "--controller-config", f"{system}/gh-controller")
    assert (code, out) == (2, "")
    assert err.startswith("gpuheal status: ") and said in err, err
    assert f"ConfigMap {system}/gh-controller" in err


def test_a_reference_that_is_not_namespace_slash_name_is_refused(
    control_plane: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    for ref in ("gpuheal-controller", "a/b/c", "/b", "a/"):
        code, out, err = status(capsys, control_plane, "--controller-config", ref)
        assert (code, out) == (2, ""), ref
        assert f"--controller-config {ref!r} is not NAMESPACE/NAME" in err
