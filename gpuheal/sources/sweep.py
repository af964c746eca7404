"""A failed check of the idle-node sweep as a fault signal: the pushed source `sweep`.

The sweep (policy/sweep.py, run by controller/sweep.py) runs the validation Job
on idle GPU nodes. A check that fails is a fault of the node like any other:
P0, quarantined at once (the node holds no GPU pods, so there is nothing to
drain), held while the evidence stands: until the node boots again (a repair,
a part swapped) or a person removes the node's gpuheal.io/sweep annotation.
Then its recovery goes through the health gate (with healthGate.validation, the
same Job again) like every other fault's.

The fault is named by the moment the check ended, carried in the node's
annotation, so a restarted controller holds the same fault, not a new one.

Pure: no I/O, no clock reads.
"""

from __future__ import annotations

import datetime as dt

from gpuheal.clock import iso
from gpuheal.model import FaultSignal, Severity
from gpuheal.sources.base import Seen, claimed
from gpuheal.values import label_value

SOURCE = "sweep"
OWN = False

REASON = "SweepFailed"


def signals(seen: Seen) -> tuple[FaultSignal, ...]:
    return claimed(SOURCE, seen)


def fault_id(ended: dt.datetime) -> str:
    """`sweep-<UTC end>`: a valid label value, unique per node and check."""
    return label_value(f"{SOURCE}-{ended.astimezone(dt.UTC).strftime('%Y%m%d%H%M%S')}")


def signal_for(node: str, fault: str, since: dt.datetime) -> FaultSignal:
    return FaultSignal(
        node=node,
        fault_id=fault,
        reason=REASON,
        source=SOURCE,
        severity=Severity.P0,
        detected_at=iso(since, "seconds"),
    )
