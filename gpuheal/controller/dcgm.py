"""DCGM metrics as a fault source: query Prometheus for dcgm-exporter's series
every interval and turn what is wrong into signals.

`interpret` is pure (query results -> findings); `DcgmSource` does the HTTP.
A finding is an *episode*: it gets a fault id when it first appears and keeps
it while it is present; when it is gone from the results its signal is
resolved, and a later reappearance is a new fault.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from gpuheal.model import FaultSignal, Severity
from gpuheal.xid import classify

log = logging.getLogger(__name__)

SOURCE = "dcgm"


@dataclass(frozen=True)
class Query:
    name: str  # short, used in fault ids
    expr: str
    reason: str
    severity: Severity


def queries(temp_warning_c: int, temp_critical_c: int) -> list[Query]:
    """The dcgm-exporter series that mean a GPU is in trouble."""
    return [
        Query("xid", "DCGM_FI_DEV_XID_ERRORS != 0", "DcgmXid", Severity.P0),
        Query("dbe", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0", "EccUncorrectable", Severity.P0),
        Query("remapfail", "DCGM_FI_DEV_ROW_REMAP_FAILURE > 0", "RowRemapFailure", Severity.P0),
        Query(
            "uncremap",
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS > 0",
            "RowRemapUncorrectable",
            Severity.P1,
        ),
        Query("tempcrit", f"DCGM_FI_DEV_GPU_TEMP >= {temp_critical_c}", "Thermal", Severity.P0),
        Query(
            "tempwarn",
            f"DCGM_FI_DEV_GPU_TEMP >= {temp_warning_c}"
            f" and DCGM_FI_DEV_GPU_TEMP < {temp_critical_c}",
            "ThermalWarning",
            Severity.P1,
        ),
        Query(
            "nvlink",
            "increase(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL[5m]) > 0"
            " or increase(DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL[5m]) > 100",
            "NvlinkErrors",
            Severity.P1,
        ),
    ]


@dataclass(frozen=True)
class Finding:
    node: str
    query: Query
    gpu: str  # UUID, else the gpu index
    value: float

    @property
    def key(self) -> str:
        return f"{self.node}/{self.query.name}/{self.gpu}"


def interpret(query: Query, result: list[dict[str, object]]) -> list[Finding]:
    """One Prometheus instant-vector result -> findings (series without a host are skipped)."""
    found = []
    for series in result:
        labels = series.get("metric")
        value = series.get("value")
        if not isinstance(labels, dict) or not isinstance(value, list) or len(value) != 2:
            continue
        # dcgm-exporter has spelled it both ways.
        node = labels.get("Hostname") or labels.get("hostname")
        if not node:
            continue
        try:
            number = float(value[1])
        except (TypeError, ValueError):
            continue
        gpu = str(labels.get("UUID") or labels.get("uuid") or labels.get("gpu") or "")
        found.append(Finding(str(node), query, gpu, number))
    return found


def signal_for(finding: Finding, fault_id: str) -> FaultSignal:
    reason, severity = finding.query.reason, finding.query.severity
    if finding.query.name == "xid":
        row = classify(int(finding.value))
        reason, severity = row.reason, row.severity
    return FaultSignal(
        node=finding.node,
        fault_id=fault_id,
        reason=reason,
        source=f"{SOURCE}/{finding.query.name}",
        severity=severity,
        devices=(finding.gpu,) if finding.gpu.startswith("GPU-") else (),
    )


class DcgmSource:
    def __init__(
        self,
        prometheus_url: str,
        interval_s: float,
        queries: list[Query],
        *,
        submit: Callable[[FaultSignal], bool],
        resolve: Callable[[str, str], int],
        managed: Callable[[str], bool],
    ) -> None:
        self.url = prometheus_url.rstrip("/") + "/api/v1/query"
        self.interval_s = interval_s
        self.queries = queries
        self.submit = submit
        self.resolve = resolve
        self.managed = managed
        self.episodes: dict[str, str] = {}  # finding key -> fault id
        self.failures = 0

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=max(5.0, self.interval_s))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                try:
                    await self.poll(session)
                except (aiohttp.ClientError, TimeoutError, ValueError) as err:
                    self.failures += 1
                    log.warning("prometheus query failed", extra={"error": str(err)})
                await asyncio.sleep(self.interval_s)

    async def poll(self, session: aiohttp.ClientSession) -> None:
        seen: dict[str, Finding] = {}
        for query in self.queries:
            async with session.get(self.url, params={"query": query.expr}) as response:
                body = await response.json()
            if body.get("status") != "success":
                raise ValueError(f"query {query.name}: {body.get('error', 'failed')}")
            for finding in interpret(query, body.get("data", {}).get("result", [])):
                if self.managed(finding.node):
                    seen[finding.key] = finding
        for key in [k for k in self.episodes if k not in seen]:
            node = key.split("/", 1)[0]
            self.resolve(node, self.episodes.pop(key))
        for key, finding in seen.items():
            if key not in self.episodes:
                self.episodes[key] = (
                    f"dcgm-{finding.query.name}-{finding.gpu or 'node'}-{int(time.time())}"
                )
            self.submit(signal_for(finding, self.episodes[key]))
