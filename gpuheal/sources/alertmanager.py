"""Alertmanager webhook payloads (version 4) -> fault signals. A pushed source:
its route, POST /api/v1/alerts (gpuheal.api.server), decodes the body into a
Webhook and hands it here. Pure functions.

A firing alert becomes a signal about one node; its fault id comes from the
alert's fingerprint and startsAt, so Alertmanager's repeats of one alert are
one fault, and the same alert firing again later is a new one. An alert that
names an Xid (an `xid` label: dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT carries
one, and the chart's GPUXidError rule writes the gauge's value into one) is
classified by NVIDIA's catalogue like every other source's Xid, whatever its
`severity` label says: an Xid that is no node fault is an `Observed`, never a
signal. An alert naming no Xid keeps its severity label.

A body that is not a webhook is refused whole (400): its sender is not
Alertmanager, or a broken one. One alert of the right shape whose values
cannot be carried is skipped with the field named, and the rest of its group
is taken: Alertmanager retries a refused body forever, so one odd alert must
not hold back the others.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuheal import values
from gpuheal.model import FaultSignal, Severity
from gpuheal.sources.base import Seen, claimed
from gpuheal.sources.fields import TIME_RULE, rfc3339, shown
from gpuheal.sources.xids import XID_RULE, Observed, workload, xid_of
from gpuheal.xid import XidRow, classify

SOURCE = "alertmanager"
OWN = False


def signals(seen: Seen) -> tuple[FaultSignal, ...]:
    return claimed(SOURCE, seen)


# An alert labelled `gpuheal_fault: "false"` is never a fault signal.
FAULT_LABEL = "gpuheal_fault"
_SEVERITIES = {
    "critical": Severity.P0,
    "page": Severity.P0,
    "p0": Severity.P0,
    "warning": Severity.P1,
    "p1": Severity.P1,
    "info": Severity.P2,
    "p2": Severity.P2,
    "none": Severity.P2,
}


# The webhook's shape, as its route decodes it (Alertmanager's field names).
@dataclass
class Alert:
    status: str
    labels: dict[str, str]
    startsAt: str  # noqa: N815
    annotations: dict[str, str] = field(default_factory=dict)
    endsAt: str = ""  # noqa: N815
    fingerprint: str = ""
    generatorURL: str = ""  # noqa: N815


@dataclass
class Webhook:
    version: str
    status: str
    alerts: list[Alert]
    receiver: str = ""
    groupKey: str = ""  # noqa: N815
    groupLabels: dict[str, str] = field(default_factory=dict)  # noqa: N815
    commonLabels: dict[str, str] = field(default_factory=dict)  # noqa: N815
    externalURL: str = ""  # noqa: N815


class PayloadError(ValueError):
    """The body is not an Alertmanager v4 webhook; the message says where."""


def checked(hook: Webhook) -> Webhook:
    """The webhook, if it is one gpuheal reads (version 4, each alert firing or
    resolved); else PayloadError."""
    if hook.version != "4":
        raise PayloadError(f'unsupported webhook version {hook.version!r} (want "4")')
    for i, alert in enumerate(hook.alerts):
        if alert.status not in ("firing", "resolved"):
            raise PayloadError(
                f"$.alerts[{i}].status: want firing or resolved, got {alert.status!r}"
            )
    return hook


@dataclass(frozen=True)
class Outcome:
    alert: str  # alertname/fingerprint, for the response
    node: str = ""
    fault_id: str = ""
    status: str = ""  # firing | resolved
    skipped: str = ""  # why nothing will be done, if so
    invalid: bool = False  # skipped for a value that cannot be carried
    signal: FaultSignal | None = None
    observed: Observed | None = None  # an Xid that is no node fault: counted, not acted on


_FINGERPRINT = re.compile(r"[0-9A-Za-z]+", re.ASCII)


def alert_fault_id(alert: Alert) -> str:
    """`am-<fingerprint>-<startsAt>`: at most 34 characters of `[0-9A-Za-z-]`,
    whatever the alert carries, so it is a valid taint value as is."""
    fingerprint = alert.fingerprint
    if not _FINGERPRINT.fullmatch(fingerprint):
        labels = "\x00".join(f"{k}={v}" for k, v in sorted(alert.labels.items()))
        fingerprint = hashlib.sha256(
            (fingerprint or labels).encode("utf-8", "surrogatepass")
        ).hexdigest()
    started = rfc3339(alert.startsAt)
    # UTC digits, so one instant written with two offsets is one fault.
    stamp = (
        started.replace(tzinfo=None).isoformat(timespec="seconds") if started else alert.startsAt
    )
    digits = "".join(ch for ch in stamp if "0" <= ch <= "9")[:14] or "0"
    return f"am-{fingerprint[:16]}-{digits}"


# The label naming an Xid: dcgm-exporter's on DCGM_EXP_XID_ERRORS_COUNT, and the
# chart's GPUXidError rule's (`xid: "{{ $value }}"`).
XID_LABEL = "xid"


def invalid(alert: Alert, index: int) -> str:
    """Why the alert's values cannot be carried ("" when they can)."""
    if rfc3339(alert.startsAt) is None:
        return f"$.alerts[{index}].startsAt: want {TIME_RULE}, got {shown(alert.startsAt)}"
    named = alert.labels.get(XID_LABEL)
    if named is not None and xid_of(named) is None:
        return f"$.alerts[{index}].labels.{XID_LABEL}: want {XID_RULE}, got {shown(named)}"
    return ""


def interpret(
    hook: Webhook,
    *,
    node_labels: Sequence[str],
    find_node: Callable[[str, str], str | None],
    overrides: Mapping[int, XidRow] | None = None,
) -> list[Outcome]:
    """One outcome per alert. `find_node(label, value)` resolves a label value to a
    managed node's name, or None (unknown, or outside the node selector);
    `overrides`: the config's `xid` rows, over NVIDIA's catalogue."""
    outcomes = []
    for index, alert in enumerate(hook.alerts):
        name = values.text(alert.labels.get("alertname", "") or alert.fingerprint) or "alert"
        fault_id = alert_fault_id(alert)
        problem = invalid(alert, index)
        if problem:
            outcomes.append(
                Outcome(name, fault_id=fault_id, status=alert.status, skipped=problem, invalid=True)
            )
            continue
        node = next(
            (
                n
                for label in node_labels
                if (v := alert.labels.get(label)) and (n := find_node(label, v))
            ),
            None,
        )
        if node is None:
            wanted = ", ".join(
                f"{label}={values.text(alert.labels[label], values.NAME_MAX)}"
                for label in node_labels
                if label in alert.labels
            )
            why = f"no managed node matches {wanted}" if wanted else "no node label on the alert"
            outcomes.append(Outcome(name, fault_id=fault_id, status=alert.status, skipped=why))
            continue
        if alert.labels.get(FAULT_LABEL, "").lower() == "false":
            # A rule that says it is no fault (the chart's usage alerts): told, not acted on.
            why = f"{FAULT_LABEL}: false (the rule says it is no fault)"
            outcomes.append(Outcome(name, node, fault_id, alert.status, skipped=why))
            continue
        # dcgm-exporter's GPU UUID; any other value is kept under a bounded identity.
        device = (alert.labels.get("UUID") or alert.labels.get("uuid") or "").strip()
        named = alert.labels.get(XID_LABEL)
        xid = xid_of(named) if named is not None else None
        if xid is not None:
            row = classify(xid, overrides)
            if not row.node_fault:
                namespace, pod = workload(alert.labels)
                seen = Observed(SOURCE, node, xid, row, device, namespace, pod)
                outcomes.append(Outcome(name, node, fault_id, alert.status, observed=seen))
                continue
            # The catalogue's reason and severity: a rule's labels cannot make an Xid
            # more or less than NVIDIA says (the config's `xid` rows can).
            reason, severity = row.reason, row.severity
        else:
            severity = _SEVERITIES.get(alert.labels.get("severity", "").lower(), Severity.P1)
            # Label values have no length limit: the reason is cut to the record's.
            reason = (
                values.text(alert.labels.get("gpuheal_reason", ""))
                or values.text(alert.labels.get("alertname", ""))
                or "Alert"
            )
        signal = FaultSignal(
            node=node,
            fault_id=fault_id,
            reason=reason,
            source=SOURCE,
            severity=severity,
            detected_at=alert.startsAt,
            devices=(values.fault_id(device),) if device else (),
        )
        outcomes.append(Outcome(name, node, fault_id, alert.status, signal=signal))
    return outcomes
