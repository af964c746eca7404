"""DCGM metrics as a fault source: what dcgm-exporter's series in Prometheus
say is wrong, turned into signals. A pushed source: its poller,
`gpuheal.controller.dcgm_source`, asks Prometheus with this module's queries and
submits what they find; this module is pure.

A finding is an *episode*: the condition holding, without a break, on the
source's grid (instants that are multiples of the poll interval). Its fault id
is the grid instant the episode started, as Prometheus answers it, so every
controller process that asks about the same episode, whenever it asks, names it
the same way, and a condition that breaks and comes back is a new fault.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuheal.clock import iso
from gpuheal.model import FaultSignal, Severity
from gpuheal.sources.base import Seen, claimed
from gpuheal.values import FIELD_MAX, digest, label_value, text
from gpuheal.xid import classify

SOURCE = "dcgm"
OWN = False


def signals(seen: Seen) -> tuple[FaultSignal, ...]:
    return claimed(SOURCE, seen)


# dcgm-exporter has spelled the host both ways; the device is its UUID when
# there is one, else the index.
HOST_LABELS = ("Hostname", "hostname")
DEVICE_LABELS = ("UUID", "uuid", "gpu")
# What makes two series the same GPU across a change of their other labels
# (dcgm-exporter adds the pod using the GPU; a new pod is a new series).
IDENTITY_LABELS = HOST_LABELS + DEVICE_LABELS

# DCGM's "blank" sentinels (no data, not found, not supported, no permission):
# FP64 ones from 2**47 up, the INT64 ones near 2**63. dcgm-exporters before
# mid-2020 published them as values; a real count or temperature never gets there.
DCGM_BLANK_MIN = 2.0**47
# Xids are small positive integers (NVIDIA's catalogue ends below 200); DCGM's
# INT32 blank (0x7ffffff0) and anything else outside this is a broken series.
XID_MAX = 65535

# Why a sample is dropped (the `why` label of gpuheal_dcgm_samples_dropped_total).
NON_FINITE = "non-finite"
BLANK = "dcgm-blank"
NOT_AN_XID = "not-an-xid"


@dataclass(frozen=True)
class Query:
    """A condition on dcgm-exporter's series. `template` is PromQL with `{m}`
    after each metric name (where extra matchers go) and `{o}` after each
    selector (where an offset goes): the episode lookup needs both."""

    name: str  # short, used in fault ids
    template: str
    reason: str
    severity: Severity

    @property
    def expr(self) -> str:
        return self.restricted("")

    def restricted(self, matchers: str, offset_ms: int = 0) -> str:
        offset = f" offset {offset_ms}ms" if offset_ms else ""
        return self.template.format(m=matchers, o=offset)


def queries(temp_warning_c: int, temp_critical_c: int) -> list[Query]:
    """The dcgm-exporter series that mean a GPU is in trouble."""
    temp = "DCGM_FI_DEV_GPU_TEMP{m}{o}"
    return [
        Query("xid", "DCGM_FI_DEV_XID_ERRORS{m}{o} != 0", "DcgmXid", Severity.P0),
        Query("dbe", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{m}{o} > 0", "EccUncorrectable", Severity.P0),
        Query(
            "remapfail", "DCGM_FI_DEV_ROW_REMAP_FAILURE{m}{o} > 0", "RowRemapFailure", Severity.P0
        ),
        Query(
            "uncremap",
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{m}{o} > 0",
            "RowRemapUncorrectable",
            Severity.P1,
        ),
        Query("tempcrit", f"{temp} >= {temp_critical_c}", "Thermal", Severity.P0),
        Query(
            "tempwarn",
            f"{temp} >= {temp_warning_c} and {temp} < {temp_critical_c}",
            "ThermalWarning",
            Severity.P1,
        ),
        Query(
            "nvlink",
            "increase(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{m}[5m]{o}) > 0"
            " or increase(DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{m}[5m]{o}) > 100",
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
    host_label: str = "Hostname"  # the label that named the node

    @property
    def key(self) -> str:
        return finding_key(self.node, self.query.name, self.gpu)


def finding_key(node: str, query_name: str, gpu: str) -> str:
    return f"{node}/{query_name}/{gpu}"


@dataclass(frozen=True)
class Dropped:
    """A sample no fault can be made of: said once per series, counted always."""

    series: str  # the series as Prometheus names it, for people
    value: str
    why: str


@dataclass(frozen=True)
class Reading:
    findings: list[Finding] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)


def identity(labels: Mapping[str, object]) -> tuple[str, str, str] | None:
    """(node, the label that named it, device) of a series; None without a host."""
    for label in HOST_LABELS:
        node = labels.get(label)
        if isinstance(node, str) and node:
            device = next(
                (v for d in DEVICE_LABELS if isinstance(v := labels.get(d), str) and v), ""
            )
            return node, label, device
    return None


def xid_code(value: float) -> int | None:
    """The Xid a DCGM_FI_DEV_XID_ERRORS value carries, or None if it carries none."""
    if not math.isfinite(value) or not value.is_integer() or not 0 < value <= XID_MAX:
        return None
    return int(value)


def unusable(query: Query, value: float) -> str | None:
    """Why `value` is no sample of `query` to act on, or None."""
    if not math.isfinite(value):
        return NON_FINITE
    if value >= DCGM_BLANK_MIN:
        return BLANK
    if query.name == "xid" and xid_code(value) is None:
        return NOT_AN_XID
    return None


def series_text(labels: Mapping[str, object]) -> str:
    name = str(labels.get("__name__", ""))
    pairs = ",".join(
        f"{k}={json.dumps(str(v))}" for k, v in sorted(labels.items()) if k != "__name__"
    )
    return text(f"{name}{{{pairs}}}", 512)


def _series(result: object) -> Iterator[tuple[dict[str, Any], list[Any]]]:
    """The labels and [time, value] of each well-formed series of an instant vector;
    anything of another shape is skipped."""
    for series in result if isinstance(result, list) else []:
        if not isinstance(series, dict):
            continue
        labels, value = series.get("metric"), series.get("value")
        if isinstance(labels, dict) and isinstance(value, list) and len(value) == 2:
            yield labels, value


def interpret(query: Query, result: object) -> Reading:
    """One Prometheus instant-vector result -> findings. Series without a host or
    of another shape are skipped; samples no fault can be made of (NaN, ±Inf,
    DCGM's blank sentinels, an Xid that is no Xid) are dropped, each on its own:
    one bad series never costs the others."""
    reading = Reading()
    for labels, value in _series(result):
        named = identity(labels)
        if named is None:
            continue
        node, host_label, gpu = named
        try:
            number = float(value[1])
        except (TypeError, ValueError, OverflowError):
            number = math.nan  # not a number at all: dropped like NaN
        why = unusable(query, number)
        if why is not None:
            reading.dropped.append(Dropped(series_text(labels), text(str(value[1]), 64), why))
            continue
        reading.findings.append(Finding(node, query, gpu, number, host_label))
    return reading


def signal_for(finding: Finding, fault_id: str, detected_at: str = "") -> FaultSignal:
    reason, severity = finding.query.reason, finding.query.severity
    code = xid_code(finding.value) if finding.query.name == "xid" else None
    if code is not None:
        row = classify(code)
        reason, severity = row.reason, row.severity
    return FaultSignal(
        node=finding.node,
        fault_id=fault_id,
        reason=reason,
        source=f"{SOURCE}/{finding.query.name}",
        severity=severity,
        detected_at=detected_at,
        devices=(finding.gpu,) if _device_id(finding.gpu) else (),
    )


def _device_id(gpu: str) -> bool:
    """A UUID as NVML prints it, short enough for the record (else the fault
    stays a node fault rather than naming a device wrongly)."""
    return gpu.startswith(("GPU-", "MIG-")) and len(gpu) <= FIELD_MAX and gpu.isprintable()


# -- episodes -----------------------------------------------------------------


@dataclass(frozen=True)
class Episode:
    fault_id: str
    detected_at: str  # RFC 3339; "" when it started before the lookback


def device_part(gpu: str) -> str:
    """The device in a fault id: the index as `gpu3`, anything longer (a 40-character
    UUID) as a digest, so the id stays a short valid label value."""
    if not gpu:
        return "node"
    if gpu.isascii() and gpu.isdigit() and len(gpu) <= 4:
        return f"gpu{gpu}"
    return digest(gpu)


def _utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms // 1000, dt.UTC)


def episode(query_name: str, gpu: str, start_ms: int) -> Episode:
    """The fault of the episode that started at grid instant `start_ms`:
    `dcgm-<query>-<device>-<UTC start>`, 40 characters at most."""
    start = _utc(start_ms)
    fault_id = f"dcgm-{query_name}-{device_part(gpu)}-{start.strftime('%Y%m%d%H%M%S')}"
    return Episode(label_value(fault_id), iso(start))


def old_episode(query_name: str, gpu: str, at_ms: int, lookback_ms: int) -> Episode:
    """The fault of an episode that started before the lookback, so has no start to be
    named by. It is named by the lookback period (periods aligned to the epoch) in
    which it was seen: stable within a period, and no two episodes share a name,
    since an episode older than the lookback has been going on for the whole period."""
    period = at_ms - at_ms % lookback_ms
    before = _utc(period - lookback_ms).strftime("%Y%m%d%H%M%S")
    return Episode(label_value(f"dcgm-{query_name}-{device_part(gpu)}-before{before}"), "")


def promql_string(value: str) -> str:
    # PromQL strings take Go's escapes; JSON's ASCII-only form is a subset of them.
    return json.dumps(value, ensure_ascii=True)


def host_matchers(host_label: str, nodes: Iterable[str]) -> str:
    """Matchers selecting only these nodes' series (Prometheus anchors the regex)."""
    alternatives = "|".join(re.escape(n) for n in sorted(set(nodes)))
    return f"{{{host_label}=~{promql_string(alternatives)}}}"


def run_starts_query(query: Query, matchers: str, step_ms: int, window_ms: int) -> str:
    """Per series: the latest grid instant within `window_ms` at which the condition
    holds and did not hold one step before (a series absent counts as not holding).
    Evaluated at a grid instant where the condition holds, that is when its current
    run started, unless the run is older than the window."""
    now = query.restricted(matchers)
    before = query.restricted(matchers, offset_ms=step_ms)
    on = ", ".join(IDENTITY_LABELS)
    return (
        f"max_over_time(timestamp(({now}) unless on({on}) ({before}))[{window_ms}ms:{step_ms}ms])"
    )


def run_starts(query: Query, result: object) -> dict[str, int]:
    """A run_starts_query result -> finding key -> start (ms), the latest per key."""
    starts: dict[str, int] = {}
    for labels, value in _series(result):
        named = identity(labels)
        try:
            seconds = float(value[1])
        except (TypeError, ValueError, OverflowError):
            continue
        if named is None or not math.isfinite(seconds):
            continue
        node, _, gpu = named
        key = finding_key(node, query.name, gpu)
        starts[key] = max(starts.get(key, 0), round(seconds * 1000))
    return starts
