"""GPUFault records as a long-running fleet accumulates them: closed faults of
days and months ago, made in bulk for the retention tests and benchmark. The
bodies are the controller's own (gpuheal.kube.writes); the history's times are
set in the past, which is what retention reads."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuheal.clock import iso
from gpuheal.kube import writes
from gpuheal.kube.api import KubeApi, gpufault_path
from gpuheal.model import ActionEntry, FaultSignal, Mode, Phase, fault_record_name
from gpuheal.sim.bulk import create_new, write_each
from gpuheal.vocabulary import Entry


@dataclass(frozen=True)
class PastFault:
    node: str
    fault_id: str
    closed_at: dt.datetime  # when it was resolved (its last action entry)
    phase: Phase = Phase.RESOLVED  # an open phase makes an open record, as old as given
    reason: str = "XidCritical79"

    @property
    def name(self) -> str:
        return fault_record_name(self.node, self.fault_id)

    def bodies(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The GPUFault to create and its status patch."""
        signal = FaultSignal(self.node, self.fault_id, self.reason, "agent")
        opened = self.closed_at - dt.timedelta(hours=1)
        entries = [
            ActionEntry(iso(opened), Entry.DETECT, "ok", "agent"),
            ActionEntry(iso(opened + dt.timedelta(seconds=1)), Entry.TAINT, "ok"),
        ]
        if self.phase not in (Phase.QUARANTINED, Phase.DETECTED):
            entries.append(ActionEntry(iso(self.closed_at), Entry.UNTAINT, "ok"))
        return writes.fault_record(self.name, signal, Mode.FULL), writes.record_status(
            self.phase, entries
        )


async def _create(api: KubeApi, fault: PastFault) -> bool:
    body, status = fault.bodies()
    await create_new(api, gpufault_path(), body)
    await api.patch(gpufault_path(fault.name, status=True), status)
    return True


def create_past_faults(
    kubeconfig: Path, faults: Iterable[PastFault], *, concurrency: int = 32
) -> int:
    """Create every record with its past history, `concurrency` at a time."""
    return write_each(kubeconfig, faults, _create, concurrency=concurrency)
