"""Alertmanager webhook payloads (version 4) -> fault signals. Pure functions.

A firing alert becomes a signal about one node; its fault id comes from the
alert's fingerprint and startsAt, so Alertmanager's repeats of one alert are
one fault, and the same alert firing again later is a new one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from gpuheal.model import FaultSignal, Severity

SOURCE = "alertmanager"

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


class Alert(msgspec.Struct):
    status: str
    labels: dict[str, str]
    startsAt: str  # noqa: N815 -- Alertmanager's field names
    annotations: dict[str, str] = {}
    endsAt: str = ""  # noqa: N815
    fingerprint: str = ""
    generatorURL: str = ""  # noqa: N815


class Webhook(msgspec.Struct):
    version: str
    status: str
    alerts: list[Alert]
    receiver: str = ""
    groupKey: str = ""  # noqa: N815
    groupLabels: dict[str, str] = {}  # noqa: N815
    commonLabels: dict[str, str] = {}  # noqa: N815
    externalURL: str = ""  # noqa: N815


class PayloadError(ValueError):
    """The body is not an Alertmanager v4 webhook; the message says where."""


def decode_webhook(body: bytes) -> Webhook:
    try:
        hook = msgspec.json.decode(body, type=Webhook)
    except msgspec.ValidationError as err:
        raise PayloadError(f"not an Alertmanager webhook: {err}") from None
    except msgspec.DecodeError as err:
        raise PayloadError(f"malformed JSON: {err}") from None
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
    signal: FaultSignal | None = None


def alert_fault_id(alert: Alert) -> str:
    fingerprint = (
        alert.fingerprint
        or hashlib.sha256(
            "\x00".join(f"{k}={v}" for k, v in sorted(alert.labels.items())).encode()
        ).hexdigest()
    )
    started = "".join(ch for ch in alert.startsAt if ch.isdigit())[:14]
    return f"am-{fingerprint[:16]}-{started}"


def interpret(
    hook: Webhook,
    *,
    node_labels: Sequence[str],
    find_node: Callable[[str, str], str | None],
) -> list[Outcome]:
    """One outcome per alert. `find_node(label, value)` resolves a label value to a
    managed node's name, or None (unknown, or outside the node selector)."""
    outcomes = []
    for alert in hook.alerts:
        name = alert.labels.get("alertname", "") or alert.fingerprint or "alert"
        node = next(
            (
                n
                for label in node_labels
                if (v := alert.labels.get(label)) and (n := find_node(label, v))
            ),
            None,
        )
        fault_id = alert_fault_id(alert)
        if node is None:
            wanted = ", ".join(
                f"{label}={alert.labels[label]}" for label in node_labels if label in alert.labels
            )
            why = f"no managed node matches {wanted}" if wanted else "no node label on the alert"
            outcomes.append(Outcome(name, fault_id=fault_id, status=alert.status, skipped=why))
            continue
        severity = _SEVERITIES.get(alert.labels.get("severity", "").lower(), Severity.P1)
        reason = alert.labels.get("gpuheal_reason") or alert.labels.get("alertname") or "Alert"
        signal = FaultSignal(
            node=node,
            fault_id=fault_id,
            reason=reason,
            source=SOURCE,
            severity=severity,
            detected_at=alert.startsAt,
            devices=tuple(d for d in (alert.labels.get("UUID") or alert.labels.get("uuid"),) if d),
        )
        outcomes.append(Outcome(name, node, fault_id, alert.status, signal=signal))
    return outcomes
