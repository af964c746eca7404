"""Run the real node-problem-detector (built by testenv/npd/build.sh) for one fake GPU
node, with a system log monitor config over a kernel log file that tests write to.

What it is given of the machine: nothing but that file. The monitor config's
`"plugin": "kmsg"` (NPD's own /dev/kmsg watcher) becomes the filelog watcher over the
file, each line `<RFC 3339 time> <node> kernel: <message>` as syslog writes kern.log;
the binary has no journald, custom plugin or system stats monitor compiled in; its
HTTP server and Prometheus endpoint are off. It reports to the control plane as the
`node-problem-detector` identity, through the Kubernetes exporter only.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

from gpuheal import values
from gpuheal.sim.binaries import Binaries, default_binaries
from gpuheal.sim.process import Component, stop_all

USER = "node-problem-detector"  # gpuheal.sim's static identity for it
# The filelog watcher's reading of a line: time, then the kernel's message.
FILELOG = {
    "timestamp": "^(\\S+)",
    "message": "kernel: (.*)$",
    "timestampFormat": "2006-01-02T15:04:05.999999999Z07:00",
}


def over_file(monitor: dict[str, Any], log: Path) -> dict[str, Any]:
    """The monitor config with its log path pointed at a file (NPD's filelog watcher)
    instead of /dev/kmsg: its conditions and rules as they are."""
    return {**monitor, "plugin": "filelog", "pluginConfig": FILELOG, "logPath": str(log)}


class NodeProblemDetector:
    def __init__(
        self,
        workdir: Path,
        kubeconfig: Path,
        node: str,
        monitor: dict[str, Any],
        *,
        heartbeat_s: float = 2.0,
        binaries: Binaries | None = None,
    ) -> None:
        binary = (binaries or default_binaries()).node_problem_detector
        self.node = node
        self.dir = workdir / f"npd-{values.label_value(node)}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "kern.log"
        self.log_path.touch()
        self.config_path = self.dir / "nvidia-monitor.json"
        self.config_path.write_text(json.dumps(over_file(monitor, self.log_path), indent=2))
        # useServiceAccount=false: never a token of this machine's own.
        override = (
            f"https://127.0.0.1?inClusterConfig=false&useServiceAccount=false&auth={kubeconfig}"
        )
        self.component = Component(
            f"node-problem-detector[{node}]",
            [
                str(binary),
                f"--config.system-log-monitor={self.config_path}",
                f"--hostname-override={node}",
                f"--apiserver-override={override}",
                "--apiserver-wait-interval=1s",
                "--apiserver-wait-timeout=60s",
                # It re-sends its conditions this often (lastHeartbeatTime): each is a
                # Node update the controller sees.
                f"--k8s-exporter-heartbeat-period={heartbeat_s}s",
                "--port=0",
                "--prometheus-port=0",
                "--logtostderr",
                "--v=2",
            ],
            self.dir / "npd.log",
        )

    def start(self) -> NodeProblemDetector:
        self.component.start()
        return self

    def kernel(self, message: str, at: dt.datetime | None = None) -> None:
        """One kernel log line, as syslog writes it to kern.log (whole, at once)."""
        when = (at or dt.datetime.now(dt.UTC)).isoformat(timespec="microseconds")
        when = when.replace("+00:00", "Z")
        with self.log_path.open("a") as log:
            log.write(f"{when} {self.node} kernel: {message}\n")

    def running(self) -> bool:
        return self.component.exit_code() is None

    def log(self) -> str:
        try:
            return self.component.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, grace: float = 5.0) -> None:
        stop_all([self.component], grace)

    def wait_exited(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.component.exit_code()
