"""DCGM metrics as a fault source: what dcgm-exporter's series in Prometheus
say is wrong, turned into signals. A pushed source: its poller,
`gpuheal.controller.dcgm_source`, asks Prometheus with this module's queries and
submits what they find; this module is pure.

A finding is an *episode*: the condition holding, without a break, on the
source's grid (instants that are multiples of the poll interval). Its fault id
is the grid instant the episode started, as Prometheus answers it, so every
controller process that asks about the same episode, whenever it asks, names it
the same way, and a condition that breaks and comes back is a new fault.

The queries read dcgm-exporter's counters as it really exports them (3.x and
4.x): its default counters file has the sticky Xid gauge (the last Xid seen, kept
until the exporter restarts), the GPU temperature, the row-remap failure flag and
the lifetime remapped-row counts (no fault: rows remapped are the GPU repairing
itself); the windowed Xid count, the volatile double-bit ECC count, the pending
row remap and the NVLink error counts only where a counters file lists them.
Each query names the counters it reads (`Query.needs`), so the poller can say
which cannot see anything.

The Xid gauge is read by NVIDIA's catalogue (gpuheal.xid.classify): its value is
a node fault or not. Being sticky, one value staying is one episode, and its run
(the gauge nonzero without a break) ends only when the exporter restarts (after
a reset or a reboot) or the series goes: a node-fault value followed by an
application one stays the node fault (the application's Xid may be its
consequence), so the fault is "a node-fault value seen in the current run of the
gauge" (`XidGauge`), named by the latest start of a run of node-fault values.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuheal.clock import iso
from gpuheal.model import FaultSignal, Severity
from gpuheal.sources.base import Seen, claimed
from gpuheal.sources.xids import XID_MAX, Observed, workload, xid_of
from gpuheal.values import FIELD_MAX, digest, label_value, text
from gpuheal.xid import CATALOGUE, Kind, XidRow, classify
from gpuheal.xid.limits import (
    HARDWARE_SLOWDOWNS,
    NVLINK_ERRORS,
    NVLINK_RECOVERY_REASON,
    NVLINK_REPLAY_REASON,
    NVLINK_WINDOW_SECONDS,
    SLOWDOWN_SHARE,
    SLOWDOWN_WINDOW_SECONDS,
)

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

# dcgm-exporter's counters, as it exports them (the field names of its counters file).
XID_GAUGE = "DCGM_FI_DEV_XID_ERRORS"  # the last Xid seen: sticky until the exporter restarts
XID_WINDOW = (
    "DCGM_EXP_XID_ERRORS_COUNT"  # per Xid seen within the window (labels xid, window_size_in_ms)
)
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
ECC_DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"  # since the driver loaded
REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"  # DCGM field 396; in no dcgm-exporter list
NVLINK_RECOVERY = "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"
NVLINK_REPLAY = "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"
# NVML's clock event reasons, a bitmask (dcgm-exporter 3.3 and later; before, the same
# field was DCGM_FI_DEV_CLOCK_THROTTLE_REASONS): in no default counters file.
CLOCK_EVENTS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
# The queries of the hardware slowdowns, by bit: names of at most 9 characters.
SLOWDOWN_QUERIES = {0x8: "hwslow", 0x40: "hwthermal", 0x80: "hwbrake"}
SLOWDOWN_LOOKS = 20
# Exported by dcgm-exporter's default counters file (etc/default-counters.csv, the
# same in 3.x and 4.x) of what gpuheal reads; the rest only where a counters file
# lists them (docs/deploy.md). The remapped-row counts are lifetime counts of rows
# the GPU remapped: no fault, not read.
DEFAULT_COUNTERS = frozenset({XID_GAUGE, GPU_TEMP, REMAP_FAILURE})
# The label of DCGM_EXP_XID_ERRORS_COUNT naming the Xid, and its window (ms).
XID_LABEL = "xid"
WINDOW_LABEL = "window_size_in_ms"

# Why a sample is dropped (the `why` label of gpuheal_dcgm_samples_dropped_total).
NON_FINITE = "non-finite"
BLANK = "dcgm-blank"
NOT_AN_XID = "not-an-xid"


@dataclass(frozen=True)
class Query:
    """A condition on dcgm-exporter's series. `template` is PromQL with `{m}` inside
    each selector's braces, last (where extra matchers go: `X{{{m}}}`, or
    `X{{a="b",{m}}}`), and `{o}` after each selector (where an offset goes): the
    episode lookup needs both."""

    name: str  # short, used in fault ids
    template: str
    reason: str
    severity: Severity
    needs: tuple[str, ...] = ()  # the dcgm-exporter counters it reads

    @property
    def expr(self) -> str:
        return self.restricted("")

    def restricted(self, matchers: str, offset_ms: int = 0) -> str:
        offset = f" offset {offset_ms}ms" if offset_ms else ""
        return self.template.format(m=matchers, o=offset)

    @property
    def optional(self) -> bool:
        """Reads a counter dcgm-exporter exports only when a counters file lists it."""
        return not set(self.needs) <= DEFAULT_COUNTERS


def selector(metric: str, *fixed: str) -> str:
    """A metric's selector in a template: its fixed matchers, then `{m}`, then `{o}`.
    (`X{a="b",}`, the trailing comma when `{m}` is empty, is PromQL.)"""
    inner = "".join(f"{f}," for f in fixed)
    return f"{metric}{{{{{inner}{{m}}}}}}{{o}}"


# The labels that name one GPU across series: a `sum by` keeps them all (a label a
# series lacks is simply absent).
_BY_GPU = "Hostname, hostname, UUID, uuid, gpu"

XID = "xid"  # the Xid gauge's query: the poller reads it its own way (XidGauge)
APPLICATION_XIDS = "appxids"


def not_node_faults(overrides: Mapping[int, XidRow] | None = None) -> list[int]:
    """The Xids that are no node fault by themselves (application or ignorable), the
    config's rows first: every other value, an unknown one included, is one."""
    codes = set(CATALOGUE) | set(overrides or {})
    return sorted(c for c in codes if not classify(c, overrides).node_fault)


def application_xids(overrides: Mapping[int, XidRow] | None = None) -> list[int]:
    """The Xids NVIDIA says to restart the application for: the per-GPU rate counts them."""
    codes = set(CATALOGUE) | set(overrides or {})
    return sorted(c for c in codes if classify(c, overrides).kind is Kind.APPLICATION)


def queries(
    temp_warning_c: int,
    temp_critical_c: int,
    *,
    overrides: Mapping[int, XidRow] | None = None,
    application_xids_per_gpu: int = 10,
    slowdown_window_s: float = SLOWDOWN_WINDOW_SECONDS,
) -> list[Query]:
    """The dcgm-exporter series that mean a GPU is in trouble."""
    temp = selector(GPU_TEMP)
    held = int(NVLINK_WINDOW_SECONDS)
    found = [
        # The reason and severity are the catalogue's, per value (signal_for).
        Query(XID, f"{selector(XID_GAUGE)} != 0", "DcgmXid", Severity.P0, (XID_GAUGE,)),
        Query("dbe", f"{selector(ECC_DBE)} > 0", "EccUncorrectable", Severity.P0, (ECC_DBE,)),
        # NVIDIA's row-remapping guide: a failed remap is a GPU to replace; a pending
        # one takes effect at the next reset (reset it when idle). The lifetime counts
        # of remapped rows are the GPU repairing itself: no fault.
        Query(
            "remapfail",
            f"{selector(REMAP_FAILURE)} > 0",
            "RowRemapFailure",
            Severity.P0,
            (REMAP_FAILURE,),
        ),
        Query(
            "remappend",
            f"{selector(REMAP_PENDING)} > 0",
            "RowRemapPending",
            Severity.P1,
            (REMAP_PENDING,),
        ),
        Query("tempcrit", f"{temp} >= {temp_critical_c}", "Thermal", Severity.P0, (GPU_TEMP,)),
        Query(
            "tempwarn",
            f"{temp} >= {temp_warning_c} and {temp} < {temp_critical_c}",
            "ThermalWarning",
            Severity.P1,
            (GPU_TEMP,),
        ),
        # As the agent judges NVML's counters (gpuheal/xid/limits.py, DCGM's health
        # watch): a replay or a recovery within the window is a failure.
        *(
            Query(
                name,
                f"increase({selector(counter).replace('{o}', f'[{held}s]{{o}}')})"
                f" > {NVLINK_ERRORS - 1}",
                reason,
                Severity.P1,
                (counter,),
            )
            for name, counter, reason in (
                ("nvreplay", NVLINK_REPLAY, NVLINK_REPLAY_REASON),
                ("nvrecover", NVLINK_RECOVERY, NVLINK_RECOVERY_REASON),
            )
        ),
    ]
    found += slowdowns(slowdown_window_s)
    codes = "|".join(map(str, application_xids(overrides)))
    if application_xids_per_gpu > 0 and codes:
        # dcgm-exporter's window counts each Xid per GPU: the application ones summed.
        window = selector(XID_WINDOW, f'{XID_LABEL}=~"{codes}"')
        found.append(
            Query(
                APPLICATION_XIDS,
                f"sum by ({_BY_GPU}) ({window}) >= {application_xids_per_gpu}",
                "RepeatedApplicationXids",
                Severity.P1,
                (XID_WINDOW,),
            )
        )
    return found


def slowdowns(window_s: float) -> list[Query]:
    """As the agent judges NVML's clock event reasons (gpuheal/xid/limits.py): a
    hardware slowdown held SLOWDOWN_SHARE of the window is a P1. PromQL has no
    bitwise operators: bit b of the mask is floor(mask / b) % 2, looked at twenty
    times over the window (a subquery); the share is of those twenty looks, so a
    GPU seen for less than the window is not judged on what little was seen."""
    window, step = int(window_s), max(int(window_s / SLOWDOWN_LOOKS), 1)
    held = math.ceil(SLOWDOWN_SHARE * window / step)
    return [
        Query(
            SLOWDOWN_QUERIES[bit],
            f"sum_over_time((floor({selector(CLOCK_EVENTS)} / {bit}) % 2)[{window}s:{step}s])"
            f" >= {held}",
            reason,
            Severity.P1,
            (CLOCK_EVENTS,),
        )
        for bit, reason in HARDWARE_SLOWDOWNS.items()
    ]


def node_xid_query(gauge: Query, overrides: Mapping[int, XidRow] | None = None) -> Query:
    """The Xid gauge holding a node-fault value: nonzero and none of the others
    (comparisons with a scalar filter, and chain)."""
    others = "".join(f" != {code}" for code in not_node_faults(overrides))
    return replace(gauge, template=gauge.template + others)


def presence_query(metrics: Iterable[str]) -> str:
    """How many series each counter has in Prometheus (a counter with none is absent)."""
    names = "|".join(sorted(set(metrics)))
    return f'count by (__name__) ({{__name__=~"{names}"}})'


def series_counts(result: object) -> dict[str, int]:
    """A presence_query result -> counter -> its series."""
    counts: dict[str, int] = {}
    for labels, value in _series(result):
        name = labels.get("__name__")
        try:
            number = float(value[1])
        except (TypeError, ValueError, OverflowError):
            continue
        if isinstance(name, str) and math.isfinite(number):
            counts[name] = int(number)
    return counts


@dataclass(frozen=True)
class DcgmFinding:
    node: str
    query: Query
    gpu: str  # UUID, else the gpu index
    value: float
    host_label: str = "Hostname"  # the label that named the node
    namespace: str = ""  # the pod using the GPU, as dcgm-exporter labels the series
    pod: str = ""

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
    findings: list[DcgmFinding] = field(default_factory=list)
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


def is_node_fault(value: float, overrides: Mapping[int, XidRow] | None = None) -> bool:
    """Whether an Xid gauge's value is a node fault (the catalogue's word)."""
    code = xid_code(value)
    return code is not None and classify(code, overrides).node_fault


def unusable(query: Query, value: float) -> str | None:
    """Why `value` is no sample of `query` to act on, or None."""
    if not math.isfinite(value):
        return NON_FINITE
    if value >= DCGM_BLANK_MIN:
        return BLANK
    if query.name == XID and xid_code(value) is None:
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
        namespace, pod = workload(labels)
        reading.findings.append(DcgmFinding(node, query, gpu, number, host_label, namespace, pod))
    return reading


def signal_for(
    finding: DcgmFinding,
    fault_id: str,
    detected_at: str = "",
    overrides: Mapping[int, XidRow] | None = None,
) -> FaultSignal:
    reason, severity = finding.query.reason, finding.query.severity
    code = xid_code(finding.value) if finding.query.name == XID else None
    if code is not None:
        row = classify(code, overrides)
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
    """The matcher selecting only these nodes' series (Prometheus anchors the regex),
    for `{m}` inside a selector's braces."""
    alternatives = "|".join(re.escape(n) for n in sorted(set(nodes)))
    return f"{host_label}=~{promql_string(alternatives)}"


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


def last_value_query(query: Query, matchers: str, step_ms: int, window_ms: int) -> str:
    """Per GPU: the condition's latest value within `window_ms` on the grid (the GPU's
    series of other pod labels taken as one)."""
    now = query.restricted(matchers)
    return f"last_over_time((max by ({_BY_GPU}) ({now}))[{window_ms}ms:{step_ms}ms])"


def _gpu_numbers(result: object) -> Iterator[tuple[str, str, float]]:
    """(node, GPU, value) of each series of a helper query's result (run starts, last
    values) that has a host and a finite number; the others are skipped."""
    for labels, value in _series(result):
        named = identity(labels)
        try:
            number = float(value[1])
        except (TypeError, ValueError, OverflowError):
            continue
        if named is not None and math.isfinite(number):
            node, _, gpu = named
            yield node, gpu, number


def run_starts(query: Query, result: object) -> dict[str, int]:
    """A run_starts_query result -> finding key -> start (ms), the latest per key."""
    starts: dict[str, int] = {}
    for node, gpu, seconds in _gpu_numbers(result):
        key = finding_key(node, query.name, gpu)
        starts[key] = max(starts.get(key, 0), round(seconds * 1000))
    return starts


def last_values(query: Query, result: object) -> dict[str, float]:
    """A last_value_query result -> finding key -> its value."""
    return {
        finding_key(node, query.name, gpu): number for node, gpu, number in _gpu_numbers(result)
    }


# -- the Xid gauge ------------------------------------------------------------


@dataclass
class XidGauge:
    """What the poller holds of one GPU's Xid gauge while it is nonzero (a run)."""

    value: int  # the gauge at the last grid instant
    node_fault_now: bool = False  # that value is a node fault
    fault: Episode | None = None  # the node fault of this run, once a node-fault value was seen
    fault_value: int = 0  # the latest node-fault value of the run

    def step(self, value: int, node_fault: bool, at_ms: int, gpu: str) -> Episode | None:
        """The gauge at the next grid instant. A node-fault value that did not hold one
        instant before starts a run of them, which names the fault (as the lookup
        names it: the latest such start); the fault it replaces is returned."""
        replaced = None
        if node_fault:
            if not self.node_fault_now:
                replaced, self.fault = self.fault, episode(XID, gpu, at_ms)
            self.fault_value = value
        self.value, self.node_fault_now = value, node_fault
        return replaced


# -- the windowed Xid count -----------------------------------------------------


@dataclass(frozen=True)
class WindowXid:
    """One series of DCGM_EXP_XID_ERRORS_COUNT: an Xid seen on a GPU within the
    exporter's window, `count` times."""

    node: str
    gpu: str
    xid: int
    count: int
    namespace: str = ""
    pod: str = ""

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.node, self.gpu, self.xid)


def window_query() -> str:
    return f"{XID_WINDOW} > 0"


def window_xids(result: object) -> list[WindowXid]:
    """A window_query result -> the Xids it counts (series without an Xid, a host, or
    a count that is a count, skipped)."""
    found = []
    for labels, value in _series(result):
        named = identity(labels)
        xid = xid_of(str(labels.get(XID_LABEL, "")))
        try:
            number = float(value[1])
        except (TypeError, ValueError, OverflowError):
            continue
        if named is None or xid is None or not math.isfinite(number) or number < 1:
            continue
        node, _, gpu = named
        namespace, pod = workload(labels)
        found.append(WindowXid(node, gpu, xid, int(min(number, DCGM_BLANK_MIN)), namespace, pod))
    return found


def observed(
    node: str,
    gpu: str,
    xid: int,
    row: XidRow,
    *,
    labels: Mapping[str, object] | None = None,
    count: int = 1,
    namespace: str = "",
    pod: str = "",
) -> Observed:
    """An Xid that is no node fault, as the DCGM source saw it."""
    if labels is not None:
        namespace, pod = workload(labels)
    device = gpu if _device_id(gpu) else ""
    return Observed(SOURCE, node, xid, row, device, namespace, pod, count)
