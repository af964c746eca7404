"""The effects' registry and what they build: one handler per action type, bodies
from gpuheal/kube/writes.py, the choices in them the policy's."""

from __future__ import annotations

import typing

import pytest

from gpuheal.controller.effects import HANDLERS, handler_for
from gpuheal.kube.writes import news_patch, taint_patch
from gpuheal.model import HANDLED_FAULT_ID, STATE_LABEL, ActionEntry, NodeView, Phase
from gpuheal.policy.actions import STATE_QUARANTINED, Action, state_label_with_taint
from gpuheal.policy.devices import DeviceAction
from gpuheal.policy.history import with_evictions

pytestmark = pytest.mark.unit

EKS_NODE = "ip-10-0-12-34.us-west-2.compute.internal"


def _with_subclasses(kinds: set[type]) -> set[type]:
    seen = set(kinds)
    todo: list[type] = list(kinds)
    while todo:
        sub: type
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return seen


def test_every_action_a_plan_can_hold_has_a_handler() -> None:
    """Subclasses included (AwaitApproval, WouldQuarantine, ReplaceIntent of
    UpdateRecord): a missing one would be a TypeError mid-pass."""
    kinds = _with_subclasses(set(typing.get_args(Action)) | set(typing.get_args(DeviceAction)))
    assert {k.__name__: handler_for(k).__name__ for k in kinds} == {
        "AddTaint": "add_taint",
        "AwaitApproval": "update_record",
        "CallReplace": "call_replace",
        "CreateCanary": "create_canary",
        "CreateDeviceRecord": "create_device_record",
        "CreateRecord": "create_record",
        "CreateValidationJob": "create_validation_job",
        "DeleteCanary": "delete_canary",
        "DeletePod": "delete_pod",
        "DeleteValidationJob": "delete_validation_job",
        "DeviceReleased": "count_release",
        "Emit": "queue",
        "GuardDisruption": "guard_disruption",
        "Evict": "evict",
        "FenceDevice": "fence_device",
        "MarkDevices": "mark_devices",
        "MarkHandled": "mark_handled",
        "RemoveTaint": "remove_taint",
        "ReplaceIntent": "write_intent",
        "RequestCheckpoint": "request_checkpoint",
        "RequestRepair": "request_repair",
        "Unfence": "unfence",
        "UpdateRecord": "update_record",
        "WouldQuarantine": "update_record",
    }
    assert set(HANDLERS) <= kinds


def test_a_kind_no_effect_carries_out_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="no effect carries out int"):
        handler_for(int)


@pytest.mark.parametrize(
    ("adding", "label", "wanted"),
    [
        (True, None, STATE_QUARANTINED),
        (True, STATE_QUARANTINED, STATE_QUARANTINED),
        (True, "maintenance", None),  # a person's state is not ours to set
        (False, STATE_QUARANTINED, ""),
        (False, "maintenance", None),  # nor to remove
        (False, None, None),
    ],
)
def test_our_state_label_follows_our_taint_and_no_other_state(
    adding: bool, label: str | None, wanted: str | None
) -> None:
    assert state_label_with_taint(adding, label) == wanted


def test_the_handled_mark_rides_in_the_taint_write_only_when_asked() -> None:
    node = NodeView(name=EKS_NODE, resource_version="41")
    plain = taint_patch(node, "xid-79-1", "NoExecute", state=STATE_QUARANTINED)
    merged = taint_patch(
        node, "xid-79-1", "NoExecute", state=STATE_QUARANTINED, handled_at="2026-12-03T01:00:00Z"
    )
    assert "annotations" not in plain["metadata"]
    assert merged["metadata"]["annotations"][HANDLED_FAULT_ID] == "xid-79-1"
    assert merged["metadata"]["labels"] == {STATE_LABEL: STATE_QUARANTINED}
    assert merged["metadata"]["resourceVersion"] == "41"
    assert merged["spec"] == plain["spec"]


def test_a_pass_status_write_names_only_the_fields_it_set() -> None:
    entry = ActionEntry("2026-12-03T01:00:00.000Z", "evict", "ok", "round 1")
    bare = news_patch(
        "7",
        Phase.DRAINING,
        [entry],
        evicted=None,
        recovering_since=None,
        expiry=None,
        plan=None,
        contact_support=False,
        repair_approval=None,
    )
    assert bare == {
        "metadata": {"resourceVersion": "7"},
        "status": {
            "phase": "Draining",
            "actions": [
                {"time": entry.time, "action": "evict", "result": "ok", "detail": "round 1"}
            ],
        },
    }
    cleared = news_patch(
        "7",
        Phase.DRAINING,
        [],
        evicted=["ml/a"],
        recovering_since="",
        expiry=None,
        plan=None,
        contact_support=True,
        repair_approval=None,
    )["status"]
    assert cleared["recoveringSince"] is None  # "" removes it (merge patch null)
    assert cleared["evictedPods"] == ["ml/a"]
    assert cleared["contactSupport"] is True


def test_an_eviction_round_entry_says_what_came_of_it() -> None:
    entry = ActionEntry("2026-12-03T01:00:00.000Z", "evict", "ok", "fault xid-79-1")
    assert with_evictions(entry, [], {}) == entry
    told = with_evictions(
        entry, ["ml/a", "ml/b"], {"ml/d": "PodDisruptionBudget ml/db", "ml/c": "429"}
    )
    assert told.detail == (
        "fault xid-79-1; evicted 2; blocked: ml/c by 429, ml/d by PodDisruptionBudget ml/db"
    )
    assert told.result == "blocked"
