"""Real Prometheus and Alertmanager (Debian's packages) on loopback, plus a fake
dcgm-exporter endpoint: the monitoring stack many GPU clusters already run,
for tests and benchmarks of the alert path."""

from __future__ import annotations

import http.server
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Counter:
    """One line of a dcgm-exporter counters file: field, Prometheus type, help."""

    name: str
    kind: str
    help: str


XID_GAUGE = Counter("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.")
GPU_TEMP = Counter("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).")
UNCORRECTABLE_REMAPPED = Counter(
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "counter",
    "Number of remapped rows for uncorrectable errors",
)
CORRECTABLE_REMAPPED = Counter(
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "counter",
    "Number of remapped rows for correctable errors",
)
REMAP_FAILURE = Counter(
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"
)
GPU_UTIL = Counter("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).")
FB_FREE = Counter("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).")
FB_USED = Counter("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).")
# Commented out or absent in dcgm-exporter's default list: exported only from a
# counters file that lists them (the chart's dcgmCounters, docs/deploy.md).
XID_WINDOW = Counter(
    "DCGM_EXP_XID_ERRORS_COUNT",
    "gauge",
    "Count of XID Errors within user-specified time window (see xid-count-window-size param).",
)
ECC_DBE = Counter(
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."
)
REMAP_PENDING = Counter(
    "DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending"
)
NVLINK_REPLAY = Counter(
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries."
)
NVLINK_RECOVERY = Counter(
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "counter",
    "Total number of NVLink recovery errors.",
)
CLOCK_EVENTS = Counter("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons.")
# The counters of etc/default-counters.csv (3.x and 4.x alike) that gpuheal relates to.
DEFAULT_COUNTERS = (
    XID_GAUGE,
    GPU_TEMP,
    UNCORRECTABLE_REMAPPED,
    CORRECTABLE_REMAPPED,
    REMAP_FAILURE,
    GPU_UTIL,
    FB_FREE,
    FB_USED,
)
# With a counters file that enables every field gpuheal can read.
OPTIONAL_COUNTERS = (
    *DEFAULT_COUNTERS, XID_WINDOW, ECC_DBE, REMAP_PENDING, NVLINK_REPLAY, NVLINK_RECOVERY,
    CLOCK_EVENTS,
)  # fmt: skip
COUNTERS = {c.name: c for c in OPTIONAL_COUNTERS}
# dcgm-exporter's --xid-count-window-size default: 5 minutes.
XID_WINDOW_MS = 300_000


def exporter_labels(
    node: str,
    gpu: int,
    uuid: str,
    *,
    pci_bus_id: str = "",
    pod: tuple[str, str] | None = None,
    host_label: str = "Hostname",
    driver: str = "550.54.15",
    model: str = "NVIDIA H100 80GB HBM3",
) -> dict[str, str]:
    """A per-GPU series' labels in the order dcgm-exporter writes them (3.x, 4.x in
    Kubernetes mode): gpu, UUID, pci_bus_id, device, modelName, Hostname (`hostname`
    on its main branch since May 2026), its label counters, then the pod using the
    GPU (container, namespace, pod) when one does."""
    labels = {
        "gpu": str(gpu),
        "UUID": uuid,
        "pci_bus_id": pci_bus_id or f"00000000:{0x18 + gpu:02X}:00.0",
        "device": f"nvidia{gpu}",
        "modelName": model,
        host_label: node,
        "DCGM_FI_DRIVER_VERSION": driver,
    }
    if pod is not None:
        labels |= {"container": "main", "namespace": pod[0], "pod": pod[1]}
    return labels


@dataclass
class Gpu:
    """One GPU as a fake exporter publishes it."""

    labels: dict[str, str]
    fields: dict[str, float] = field(default_factory=dict)
    window: dict[int, int] = field(default_factory=dict)  # xid -> count within the window


class FakeDcgmExporter:
    """Serves /metrics as dcgm-exporter writes it: `# HELP` and `# TYPE` per counter,
    each GPU's labels in the exporter's order. `counters` is the exporter's counters
    file (DEFAULT_COUNTERS, or OPTIONAL_COUNTERS with the fields gpuheal can read
    enabled); each GPU added (`add_gpu`) publishes every one of them, as the exporter
    does. Series may also be set one by one (`set`). A value is a number, or the
    sample's text as an exporter could write it (`+Inf`, `NaN`, `1e400`)."""

    def __init__(
        self, counters: tuple[Counter, ...] = DEFAULT_COUNTERS, window_ms: int = XID_WINDOW_MS
    ) -> None:
        self.counters = counters
        self.window_ms = window_ms
        self.series: dict[str, dict[str, float | str]] = {}  # metric -> labels text -> value
        self.gpus: dict[tuple[str, str], Gpu] = {}  # (node, UUID) -> GPU
        self._lock = threading.Lock()
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exporter.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # -- series one by one ----------------------------------------------------

    def set(self, name: str, labels: Mapping[str, str], value: float | str) -> None:
        with self._lock:
            self.series.setdefault(name, {})[self._labels(labels)] = value

    def remove(self, name: str, labels: Mapping[str, str]) -> None:
        """The exporter stops publishing a series (as dcgm-exporter does for a pod gone)."""
        with self._lock:
            self.series.get(name, {}).pop(self._labels(labels), None)

    @staticmethod
    def _labels(labels: Mapping[str, str]) -> str:
        return ",".join(f'{k}="{v}"' for k, v in labels.items())

    # -- GPUs -----------------------------------------------------------------

    def add_gpu(self, labels: Mapping[str, str], **fields: float) -> Gpu:
        """A GPU the exporter publishes every counter of: 0 unless `fields` says
        (by counter name), 40 °C, and at work (37 %, 1 GiB of its 80 GiB in use)."""
        working = {GPU_TEMP.name: 40.0, GPU_UTIL.name: 37.0, FB_USED.name: 1024.0}
        gpu = Gpu(dict(labels), {c.name: 0.0 for c in self.counters} | working)
        gpu.fields[FB_FREE.name] = 80 * 1024.0 - 1024.0
        gpu.fields |= fields
        with self._lock:
            self.gpus[(labels.get("Hostname") or labels.get("hostname", ""), labels["UUID"])] = gpu
        return gpu

    def xid(self, gpu: Gpu, code: int) -> None:
        """An Xid on the GPU: the gauge shows it (until the exporter restarts) and the
        window, where exported, counts it."""
        with self._lock:
            gpu.fields[XID_GAUGE.name] = float(code)
            gpu.window[code] = gpu.window.get(code, 0) + 1

    def set_field(self, gpu: Gpu, counter: Counter, value: float) -> None:
        with self._lock:
            gpu.fields[counter.name] = value

    def window_passed(self, gpu: Gpu) -> None:
        """The window no longer holds the GPU's Xids."""
        with self._lock:
            gpu.window.clear()

    def restart(self) -> None:
        """The exporter restarts (after a GPU reset or a reboot): its DCGM starts
        again, so the Xid gauge reads 0 and the window is empty."""
        with self._lock:
            for gpu in self.gpus.values():
                gpu.fields[XID_GAUGE.name] = 0.0
                gpu.window.clear()

    # -- the page ----------------------------------------------------------------

    def render(self) -> str:
        with self._lock:
            by_metric = {name: dict(series) for name, series in self.series.items()}
            for gpu in self.gpus.values():
                for counter in self.counters:
                    page = by_metric.setdefault(counter.name, {})
                    if counter is XID_WINDOW:
                        page.update(self._window(gpu))
                    else:
                        page[self._labels(gpu.labels)] = gpu.fields[counter.name]
        lines = []
        for name, series in by_metric.items():
            if not series:
                continue
            known = COUNTERS.get(name)
            if known is not None:
                lines += [f"# HELP {name} {known.help}", f"# TYPE {name} {known.kind}"]
            lines += [f"{name}{{{labels}}} {_sample(value)}" for labels, value in series.items()]
        return "\n".join(lines) + "\n"

    def _window(self, gpu: Gpu) -> dict[str, float | str]:
        """DCGM_EXP_XID_ERRORS_COUNT as the exporter's XID collector writes it: per Xid
        within the window a series with its `xid` label and count; none, and a 0
        without an `xid` label (the window's size in `window_size_in_ms` either way,
        among the label counters, sorted, before the pod's labels)."""
        pod_keys = ("container", "namespace", "pod")
        base = {k: v for k, v in gpu.labels.items() if k not in pod_keys}
        pod = {k: gpu.labels[k] for k in pod_keys if k in gpu.labels}
        window = {"window_size_in_ms": str(self.window_ms)}
        if not gpu.window:
            return {self._labels(base | window | pod): 0.0}
        return {
            self._labels(base | window | {"xid": str(code)} | pod): float(count)
            for code, count in sorted(gpu.window.items())
        }

    def start(self) -> FakeDcgmExporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()


def _sample(value: float | str) -> str:
    if isinstance(value, str):
        return value
    # dcgm-exporter prints its integer fields as integers, its floats as %f.
    return str(int(value)) if float(value).is_integer() else f"{value:f}"


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
        job: str = "dcgm",
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
            # The job's name: the chart's monitors set gpuheal-agent and gpuheal-controller.
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}],
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
