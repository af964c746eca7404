"""The console's Approve / Reject on a record whose repair awaits approval
(repair.approval): shown while asked and unanswered, gone once answered."""

from __future__ import annotations

import dataclasses
import re

from gpuheal.api.console import render
from gpuheal.api.console.auth import Role, issue
from gpuheal.api.console.views import Cluster, fleet
from gpuheal.model import APPROVED, FaultRecord, Phase, RepairApproval
from tests.console_fleet import cluster

NOW = 1_800_000_000.0
QUESTION = RepairApproval(1, "reset-gpu", "2026-12-01T09:30:00Z")


def with_record(c: Cluster, record: FaultRecord) -> Cluster:
    return dataclasses.replace(c, records={**c.records, record.name: record})


def test_a_repair_awaiting_approval_gets_the_buttons_until_answered() -> None:
    c = cluster(200)
    acting = issue(Role.ACT, "oncall@example.com", b"k" * 32, NOW)[1]
    drained = next(r for r in c.records.values() if r.phase is Phase.DRAINED)
    html = render.fault_page(c, drained.name, acting) or ""
    assert "approve" not in re.findall(r'class="act (\w+)"', html)

    c = with_record(c, dataclasses.replace(drained, repair_approval=QUESTION))
    html = render.fault_page(c, drained.name, acting) or ""
    assert re.findall(r'class="act (\w+)"', html)[:2] == ["approve", "reject"]
    assert drained.name in {r.name for r in fleet(c).awaiting}

    answered = dataclasses.replace(QUESTION, decision=APPROVED, by="console:oncall", at="x")
    c = with_record(c, dataclasses.replace(drained, repair_approval=answered))
    html = render.fault_page(c, drained.name, acting) or ""
    assert "approve" not in re.findall(r'class="act (\w+)"', html)
    assert drained.name not in {r.name for r in fleet(c).awaiting}
