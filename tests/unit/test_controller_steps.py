"""A pass's actions in order, its evictions together (they are independent)."""

from __future__ import annotations

from gpuheal.controller.executor import _steps
from gpuheal.model import ActionEntry, Phase, PodView
from gpuheal.policy.actions import Action, AddTaint, Emit, Evict, MarkHandled, UpdateRecord
from gpuheal.policy.devices import DeviceAction
from tests.corpus import EKS_NODE


def evict(i: int) -> Evict:
    pod = PodView("ml", f"llama-70b-{i}", f"uid-{i}", EKS_NODE, "Running", gpu=True)
    return Evict(pod, "xid-79-a")


def test_consecutive_evictions_are_one_step_and_the_rest_keep_their_order() -> None:
    taint = AddTaint(EKS_NODE, "xid-79-a", "NoSchedule")
    told = Emit("GPUNodeQuarantined", "…", EKS_NODE, "r1")
    record = UpdateRecord(
        "r1", Phase.DRAINING, ActionEntry("2026-11-29T12:00:00.000Z", "evict", "evicted")
    )
    handled = MarkHandled(EKS_NODE, "xid-79-a")
    actions: tuple[Action | DeviceAction, ...] = (
        taint, told, evict(0), evict(1), evict(2), record, evict(3), handled,
    )  # fmt: skip
    assert _steps(actions) == [
        (taint,),
        (told,),
        (evict(0), evict(1), evict(2)),
        (record,),
        (evict(3),),
        (handled,),
    ]
    assert _steps(()) == []
