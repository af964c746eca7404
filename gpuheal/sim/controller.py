"""Run `gpuheal controller` as a real child process against the local control
plane: for tests (crash, failover), benchmarks and the demo."""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from lightkube import ApiError, Client, codecs
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

from gpuheal.model import GPUFAULT_API_VERSION, GPUFAULT_KIND
from gpuheal.sim.crashing import CRASH_ENV
from gpuheal.sim.process import Component, free_port, http_ok, stop_all
from gpuheal.sim.resources import GPUFault

CRD_DIR = Path(__file__).resolve().parents[2] / "deploy" / "crds"
CRD_FILE = CRD_DIR / "gpufaults.gpuheal.io.yaml"


def install_crds(client: Client, timeout_s: float = 30) -> None:
    """Create (or keep) every CRD of deploy/crds (GPUFault, GPURollout) and wait
    until each is served."""
    for path in sorted(CRD_DIR.glob("*.yaml")):
        _install_crd(client, yaml.safe_load(path.read_text()), timeout_s)
    _warm_up(client)


def _install_crd(client: Client, manifest: dict[str, Any], timeout_s: float) -> None:
    try:
        client.create(codecs.from_dict(manifest))
    except ApiError as err:
        if err.status.code != 409:
            raise
    name = manifest["metadata"]["name"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        crd = client.get(CustomResourceDefinition, name)
        conditions = (crd.status.conditions if crd.status else None) or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
        time.sleep(0.1)
    raise TimeoutError(f"CRD {name} not Established in time")


def _warm_up(client: Client) -> None:
    """The API server answers the first write of a new custom resource ~2 s late
    (measured); a dry-run create pays that once here, not in the first remediation."""
    probe = {
        "apiVersion": GPUFAULT_API_VERSION,
        "kind": GPUFAULT_KIND,
        "metadata": {"name": "warm-up"},
        "spec": {
            "node": "warm-up",
            "faultID": "warm-up",
            "scope": "node",
            "source": "gpuheal-sim",
            "reason": "WarmUp",
            "severity": "P2",
        },
    }
    client.create(GPUFault.from_dict(probe), dry_run=True)


class ControllerProcess:
    """One controller replica. `start()` returns once /readyz answers 200."""

    def __init__(
        self,
        workdir: Path,
        kubeconfig: Path,
        config: Mapping[str, Any],
        *,
        identity: str = "controller-0",
        env: Mapping[str, str] | None = None,
        code: Path | None = None,
    ) -> None:
        """`code`: run the controller from that checkout instead of this one (a
        benchmark's A/B of two versions on one fleet)."""
        self.workdir = workdir
        self.identity = identity
        self.port = free_port()
        self.config_path = workdir / f"config-{identity}.yaml"
        self.config_path.write_text(yaml.safe_dump(dict(config)))
        # A pod's IP, as the chart's downward API gives it: the leader's address on the
        # Lease, where a standby forwards what only the leader does.
        self.env = {"POD_IP": "127.0.0.1", **(env or {})}
        if code is not None:
            self.env["PYTHONPATH"] = str(code)
        argv = [
            sys.executable,
            # -P: `-m` must not put the working directory (this checkout) first.
            *(["-P"] if code is not None else []),
            "-m",
            # A crash test's controller: the harness's entry with its crashpoint.
            "gpuheal.sim.crashing" if CRASH_ENV in self.env else "gpuheal.cli",
            "--log-level",
            "INFO",
            "controller",
            "--kubeconfig",
            str(kubeconfig),
            "--config",
            str(self.config_path),
            "--identity",
            identity,
            "--listen",
            f"127.0.0.1:{self.port}",
        ]
        self.component = Component(f"controller-{identity}", argv, workdir / f"{identity}.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60, *, ready: bool = True) -> ControllerProcess:
        """Start and wait until ready (`ready`), or only until it answers /readyz at all."""
        self.component.start(env=self.env)
        self.component.wait_ready(
            self._ready if ready else self._serving, time.monotonic() + timeout_s
        )
        return self

    def _ready(self) -> bool:
        return http_ok(f"{self.url}/readyz")

    def _serving(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=2):  # noqa: S310
                return True
        except urllib.error.HTTPError:
            return True  # 503: serving, not ready
        except OSError:
            return False

    def leading(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as response:  # noqa: S310
                return bool(json.load(response).get("leader"))
        except (OSError, ValueError):
            return False

    def wait_leading(self, timeout_s: float = 30) -> ControllerProcess:
        deadline = time.monotonic() + timeout_s
        while not self.leading():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.identity} did not become leader in {timeout_s}s")
            time.sleep(0.05)
        return self

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:  # noqa: S310
            return str(response.read().decode())

    def stop(self, grace_s: float = 15) -> None:
        stop_all([self.component], grace_s)

    def hangup(self) -> None:
        """SIGHUP: reload the config file."""
        self.component.signal(signal.SIGHUP)

    def kill(self) -> None:
        self.component.signal(signal.SIGKILL)
        self.component.wait_stopped(10)

    def wait_exit(self, timeout_s: float) -> int | None:
        self.component.wait_stopped(timeout_s)
        return self.component.exit_code()

    def log(self) -> str:
        return self.component.log_path.read_text(errors="replace")
