"""A person's release of a fault the breaker holds, or of a repeat offender's
(policy/offenders.py: its node stays out after the fault clears), through
`gpuheal release`, the API or the console: when it may be given, and what it
writes on the record.

The release is written to the record's status (status.release: who, when) under
the resourceVersion it was checked against, so of two releases given at once
only one lands. The plan then lets that one fault past the breaker, exactly
once: its record leaves Held when the node is tainted, and no later release is
taken. Every other held fault stays held.
"""

from __future__ import annotations

from typing import Any

from gpuheal import values
from gpuheal.model import FaultRecord, Phase
from gpuheal.policy.offenders import repeat_offender


def refusal(record: FaultRecord) -> str | None:
    """Why `record` takes no release now; None when it does."""
    if record.released_by:
        return (
            f"GPUFault {record.name} was already released by {record.released_by} "
            f"at {record.released_at}"
        )
    if record.phase is not Phase.HELD and not (record.open and repeat_offender(record)):
        return (
            f"GPUFault {record.name} is {record.phase.value}, not held by the breaker nor "
            "a repeat offender's: nothing to release"
        )
    return None


def release_patch(record: FaultRecord, by: str, at: str) -> dict[str, Any]:
    """The status patch of a release: only valid on the version that was checked."""
    return {
        "metadata": {"resourceVersion": record.resource_version},
        "status": {"release": {"by": values.text(by), "at": at}},
    }


def released(record: FaultRecord) -> bool:
    """A person released this held fault: the plan lets it past the breaker."""
    return record.phase is Phase.HELD and bool(record.released_by)
