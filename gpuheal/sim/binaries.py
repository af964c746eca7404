"""Where the control-plane binaries built by testenv/build.sh (and node-problem-detector,
by testenv/npd/build.sh) live."""

from __future__ import annotations

import os
import re
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
    node_problem_detector = _Binary("node-problem-detector")  # testenv/npd/build.sh


def _built(env: str, cache: str) -> Path:
    """Where a testenv build script put its output: $`env`, else .cache/`cache` in the
    source tree (the scripts' default)."""
    base = os.environ.get(env)
    return Path(base) if base else _REPO_ROOT / ".cache" / cache


def default_binaries() -> Binaries:
    """$GPUHEAL_TESTENV_DIR/bin, else .cache/testenv/bin in the source tree."""
    return Binaries(_built(ENV_DIR, "testenv") / "bin")


# -- other Kubernetes versions (testenv/versions/build.sh) ---------------------

# The default version's Go module, and one per other minor: each go.mod pins its release.
DEFAULT_SOURCE = _REPO_ROOT / "testenv" / "k8s"
VERSIONS_SOURCE = _REPO_ROOT / "testenv" / "versions"
_PINNED = re.compile(r"^\s*k8s\.io/kubernetes (v\S+)", re.MULTILINE)


class ControlPlaneMissingError(RuntimeError):
    """A control plane's binaries are not built: its tests fail with what to build,
    never skip."""


def other_versions() -> list[str]:
    """The minors besides the default that testenv builds ("1.32", "1.37"), oldest
    first: one per module under testenv/versions/."""
    found = [d.name for d in VERSIONS_SOURCE.iterdir() if (d / "go.mod").is_file()]
    return sorted(found, key=lambda minor: tuple(int(p) for p in minor.split(".")))


def pinned_release(module: Path) -> str:
    """The Kubernetes release a testenv module's go.mod pins ("v1.32.13")."""
    found = _PINNED.search((module / "go.mod").read_text())
    if found is None:
        raise ValueError(f"{module}/go.mod pins no k8s.io/kubernetes")
    return found.group(1)


def version_binaries(minor: str) -> Binaries:
    """Kubernetes `minor`'s build: $GPUHEAL_TESTENV_DIR-<minor>/bin, else
    .cache/testenv-<minor>/bin (kwok and helm there are the default build's)."""
    base = _built(ENV_DIR, "testenv")
    return Binaries(base.with_name(f"{base.name}-{minor}") / "bin")


def require_control_plane(binaries: Binaries, minor: str = "") -> Binaries:
    """`binaries`, or a ControlPlaneMissingError naming each file that is not there
    and the command that builds it."""
    wanted = (binaries.etcd, binaries.kube_apiserver, binaries.kube_scheduler,
              binaries.kube_controller_manager, binaries.kubectl, binaries.kwok,
              binaries.kwok_stages, binaries.helm)  # fmt: skip
    missing = [str(path) for path in wanted if not path.is_file()]
    if missing:
        what = f"Kubernetes {minor}'s control plane" if minor else "the control plane"
        build = f"testenv/versions/build.sh {minor}" if minor else "testenv/build.sh"
        raise ControlPlaneMissingError(
            f"{what} is not built ({', '.join(missing)} missing): run `make testenv` "
            f"({build}; kwok and helm come from testenv/build.sh)"
        )
    return binaries


# -- the NVML stand-in (testenv/nvml/build.sh) ---------------------------------

NVML_ENV_DIR = "GPUHEAL_NVML_DIR"
# The variable the stand-in library and nvidia-smi read the fake GPU node's spec from.
NVML_SPEC_ENV = "GPUHEAL_FAKE_NVML_SPEC"


class NvmlStandInMissingError(RuntimeError):
    """The NVML stand-in is not built: every agent test needs it, none skips without it."""


@dataclass(frozen=True)
class NvmlStandIn:
    """libnvidia-ml.so.1 and nvidia-smi over a spec file, for machines without a GPU."""

    directory: Path

    @property
    def lib_dir(self) -> Path:
        return self.directory / "lib"

    @property
    def library(self) -> Path:
        return self.lib_dir / "libnvidia-ml.so.1"

    @property
    def smi(self) -> Path:
        return self.directory / "bin" / "nvidia-smi"

    def require(self) -> NvmlStandIn:
        """Self, or a NvmlStandInMissingError naming what is missing and how to build it."""
        missing = [str(p) for p in (self.library, self.smi) if not p.is_file()]
        if missing:
            raise NvmlStandInMissingError(
                f"the NVML stand-in is not built ({', '.join(missing)} missing): "
                "run `make nvml` (testenv/nvml/build.sh; needs gcc and libyaml-dev)"
            )
        return self

    def environment(self, spec: Path, lib_dir: Path | None = None) -> dict[str, str]:
        """What a process needs to load the stand-in by NVML's ordinary name
        (pynvml dlopens "libnvidia-ml.so.1") over `spec`; `lib_dir` replaces the
        library's directory (a test of a node without the library)."""
        search = [str(lib_dir if lib_dir is not None else self.lib_dir)]
        if os.environ.get("LD_LIBRARY_PATH"):
            search.append(os.environ["LD_LIBRARY_PATH"])
        return {"LD_LIBRARY_PATH": ":".join(search), NVML_SPEC_ENV: str(spec)}


def default_nvml() -> NvmlStandIn:
    """$GPUHEAL_NVML_DIR, else .cache/nvml in the source tree."""
    return NvmlStandIn(_built(NVML_ENV_DIR, "nvml"))


# -- kured, the real reboot daemon (testenv/kured/build.sh) ---------------------

KURED_ENV_DIR = "GPUHEAL_KURED_DIR"


class KuredMissingError(RuntimeError):
    """kured is not built: the test that runs it fails with what to build, never skips."""


@dataclass(frozen=True)
class KuredBuild:
    """kured's binary and its own manifests (RBAC, the DaemonSet its lock lives on)."""

    directory: Path

    @property
    def binary(self) -> Path:
        return self.directory / "bin" / "kured"

    @property
    def rbac(self) -> Path:
        return self.directory / "kured-rbac.yaml"

    @property
    def daemonset(self) -> Path:
        return self.directory / "kured-ds.yaml"

    def require(self) -> KuredBuild:
        """Self, or a KuredMissingError naming what is missing and how to build it."""
        missing = [str(p) for p in (self.binary, self.rbac, self.daemonset) if not p.is_file()]
        if missing:
            raise KuredMissingError(
                f"kured is not built ({', '.join(missing)} missing): "
                "run `make testenv` (testenv/kured/build.sh; needs Go and the module proxy)"
            )
        return self


def default_kured() -> KuredBuild:
    """$GPUHEAL_KURED_DIR, else .cache/kured in the source tree."""
    return KuredBuild(_built(KURED_ENV_DIR, "kured"))


# -- a real node: the kubelet and its images (testenv/node/build.sh) -----------

NODE_ENV_DIR = "GPUHEAL_NODE_DIR"


@dataclass(frozen=True)
class NodeBuild:
    """The kubelet of the default release and the images a real node imports: the pod
    sandbox (pause) and the test pods' workload image, as OCI archives."""

    directory: Path

    @property
    def kubelet(self) -> Path:
        return self.directory / "bin" / "kubelet"

    @property
    def images(self) -> list[Path]:
        return [self.directory / "images" / "pause.tar", self.directory / "images" / "workload.tar"]

    def image_names(self) -> dict[str, str]:
        """Each image's file stem and reference, from images.txt ("REF DIGEST SIZE bytes")."""
        lines = (self.directory / "images.txt").read_text().splitlines()
        names = [line.split()[0] for line in lines]
        return {name.rsplit("/", 1)[-1].split(":")[0]: name for name in names}

    @property
    def pause_image(self) -> str:
        return self.image_names()["pause"]

    @property
    def workload_image(self) -> str:
        return self.image_names()["workload"]

    def missing(self) -> list[str]:
        wanted = [self.kubelet, *self.images, self.directory / "images.txt"]
        return [f"{p} (testenv/node/build.sh; `make node`)" for p in wanted if not p.is_file()]


def default_node_build() -> NodeBuild:
    """$GPUHEAL_NODE_DIR, else .cache/node in the source tree."""
    return NodeBuild(_built(NODE_ENV_DIR, "node"))


# -- the chart's image, built without a registry (deploy/docker/build.sh) -------

IMAGE_ENV_DIR = "GPUHEAL_IMAGE_DIR"


@dataclass(frozen=True)
class ChartImage:
    """An image as an OCI archive, and its reference (image.txt: "REF DIGEST SIZE")."""

    directory: Path
    file: str = "gpuheal.tar"

    @property
    def archive(self) -> Path:
        return self.directory / self.file

    @property
    def reference(self) -> str:
        return (self.directory / "image.txt").read_text().split()[0]

    @property
    def digest(self) -> str:
        return (self.directory / "image.txt").read_text().split()[1]


def default_chart_image() -> ChartImage:
    """$GPUHEAL_IMAGE_DIR, else .cache/image in the source tree."""
    return ChartImage(_built(IMAGE_ENV_DIR, "image"))


def default_device_plugin_image() -> ChartImage:
    """NVIDIA's device plugin on the chart image's base (testenv/deviceplugin/image.sh):
    $GPUHEAL_DEVICEPLUGIN_DIR, else .cache/deviceplugin."""
    return ChartImage(_built("GPUHEAL_DEVICEPLUGIN_DIR", "deviceplugin"), "image.tar")
