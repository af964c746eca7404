"""Real Prometheus and Alertmanager (Debian's packages) on loopback, plus a fake
dcgm-exporter endpoint: the monitoring stack many GPU clusters already run,
for tests and benchmarks of the alert path."""

from __future__ import annotations

import http.server
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gpuheal.sim.process import Component, ControlPlaneError, free_port, http_ok, stop_all

PROMETHEUS = "prometheus"
ALERTMANAGER = "prometheus-alertmanager"


def require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise ControlPlaneError(
            f"{binary} is not installed; `make monitoring` installs Debian's prometheus "
            "and prometheus-alertmanager packages"
        )
    return path


class FakeDcgmExporter:
    """Serves /metrics in the exposition format, with series a test can change.
    A value is a number, or the sample's text as an exporter could write it
    (`+Inf`, `NaN`, `1e400`)."""

    def __init__(self) -> None:
        self.series: dict[str, float | str] = {}
        self._lock = threading.Lock()
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exporter.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def set(self, name: str, labels: Mapping[str, str], value: float | str) -> None:
        with self._lock:
            self.series[self._series(name, labels)] = value

    def remove(self, name: str, labels: Mapping[str, str]) -> None:
        """The exporter stops publishing a series (as dcgm-exporter does for a pod gone)."""
        with self._lock:
            self.series.pop(self._series(name, labels), None)

    @staticmethod
    def _series(name: str, labels: Mapping[str, str]) -> str:
        text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return f"{name}{{{text}}}"

    def render(self) -> str:
        with self._lock:
            lines = [
                f"{series} {value if isinstance(value, str) else format(value, 'g')}"
                for series, value in sorted(self.series.items())
            ]
        return "\n".join(lines) + "\n"

    def start(self) -> FakeDcgmExporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()


class Monitoring:
    """Prometheus scraping `targets`, evaluating `rules`, alerting through an
    Alertmanager whose only receiver is `webhook_url` (with a bearer token)."""

    def __init__(
        self,
        workdir: Path,
        *,
        targets: list[str],
        rules: list[dict[str, Any]],
        webhook_url: str,
        token_file: Path,
        repeat_interval: str = "3s",
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.am_port, self.prom_port = free_port(), free_port()
        am_config = {
            "route": {
                "receiver": "gpuheal",
                "group_by": ["Hostname"],
                "group_wait": "1s",
                "group_interval": "2s",
                "repeat_interval": repeat_interval,
            },
            "receivers": [
                {
                    "name": "gpuheal",
                    "webhook_configs": [
                        {
                            "url": webhook_url,
                            "send_resolved": True,
                            "http_config": {"authorization": {"credentials_file": str(token_file)}},
                        }
                    ],
                }
            ],
        }
        (workdir / "alertmanager.yml").write_text(yaml.safe_dump(am_config))
        (workdir / "rules.yml").write_text(
            yaml.safe_dump({"groups": [{"name": "gpu", "rules": rules}]})
        )
        prom_config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(workdir / "rules.yml")],
            "alerting": {
                "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{self.am_port}"]}]}]
            },
            "scrape_configs": [{"job_name": "dcgm", "static_configs": [{"targets": targets}]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
        self.alertmanager = Component(
            "alertmanager",
            [
                require(ALERTMANAGER),
                f"--config.file={workdir / 'alertmanager.yml'}",
                f"--storage.path={workdir / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{self.am_port}",
                "--cluster.listen-address=",  # one instance, no gossip port
                "--log.level=warn",
            ],
            workdir / "alertmanager.log",
        )
        self.prometheus = Component(
            "prometheus",
            [
                require(PROMETHEUS),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{self.prom_port}",
                "--log.level=warn",
            ],
            workdir / "prometheus.log",
        )

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prom_port}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://127.0.0.1:{self.am_port}"

    def start(self, timeout_s: float = 60) -> Monitoring:
        deadline = time.monotonic() + timeout_s
        try:
            self.alertmanager.start()
            self.alertmanager.wait_ready(
                lambda: http_ok(f"{self.alertmanager_url}/-/ready"), deadline
            )
            self.prometheus.start()
            self.prometheus.wait_ready(lambda: http_ok(f"{self.prometheus_url}/-/ready"), deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        stop_all([self.prometheus, self.alertmanager], 10)
