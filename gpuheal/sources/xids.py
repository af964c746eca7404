"""Xids as the controller's pushed sources meet them: one number (an alert's `xid`
label, a DCGM sample, a manual request), classified by NVIDIA's catalogue
(`gpuheal.xid.classify`, the config's `xid` overrides first) like the agent's.

A node-fault Xid becomes a FaultSignal in its source's module. Any other (NVIDIA:
restart the application, or ignore) never quarantines a node from any source: it is
an `Observed`, which the controller counts (by source and xid) and, when the
series or alert names the pod that used the GPU, tells that pod in an Event.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuheal import values
from gpuheal.xid import XidRow

# Xids are small positive integers (NVIDIA's catalogue ends below 200); anything
# above is no Xid (DCGM's INT32 blank is 0x7ffffff0).
XID_MAX = 65535
XID_RULE = f"an Xid: an integer from 1 to {XID_MAX}"
_DIGITS = re.compile(r"[0-9]{1,5}", re.ASCII)

# Where dcgm-exporter (Kubernetes mode) names the pod using the GPU. Scraped with
# honorLabels off, Prometheus moves its labels to exported_*, and the plain ones
# name the exporter's own pod; --use-old-namespace writes pod_name/pod_namespace.
_WORKLOAD_LABELS = (
    ("exported_namespace", "exported_pod"),
    ("namespace", "pod"),
    ("pod_namespace", "pod_name"),
)


@dataclass(frozen=True)
class Observed:
    """An Xid that is no node fault by itself, seen by a controller source."""

    source: str  # the registered source: alertmanager, dcgm, manual
    node: str
    xid: int
    row: XidRow
    device: str = ""  # the GPU (a UUID), if the source names it
    namespace: str = ""  # the pod that used the GPU, if the source names it
    pod: str = ""
    count: int = 1  # occurrences this report stands for (a DCGM window's rise)


def xid_of(text: str) -> int | None:
    """The Xid a label value names ("79"; `{{ $value }}` of a rule writes it so), or None."""
    text = text.strip()
    if not _DIGITS.fullmatch(text):
        return None
    xid = int(text)
    return xid if 0 < xid <= XID_MAX else None


def workload(labels: Mapping[str, object]) -> tuple[str, str]:
    """(namespace, pod) of the pod using the GPU, as the series or alert names it;
    ("", "") when it names none or names one no pod can have."""
    for namespace_label, pod_label in _WORKLOAD_LABELS:
        namespace, pod = labels.get(namespace_label), labels.get(pod_label)
        if isinstance(namespace, str) and isinstance(pod, str) and namespace and pod:
            if values.is_label_value(namespace) and values.is_subdomain(pod):
                return namespace, pod
            return "", ""
    return "", ""
