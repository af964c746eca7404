"""Which roll-outs the leader drives (controller/rollouts.py: wants_driving) and
when the CLI's wait is over (ops/rollout.py: settled): a roll-out stopped by a
person still has its nodes in flight carried through, and the wait lasts until
they are; a held node waits for a person, not for the controller."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gpuheal.controller.rollouts import wants_driving
from gpuheal.kube.rollouts import RolloutJson, decode, state_of
from gpuheal.ops.rollout import settled
from tests.corpus import eks_node_names

NAMES = sorted(eks_node_names(3))


def rollout(phase: str, *steps: str) -> RolloutJson:
    status: dict[str, Any] = {
        "phase": phase,
        "nodes": [
            {"name": name, "batch": i, "step": step}
            for i, (name, step) in enumerate(zip(NAMES, steps, strict=False))
        ],
    }
    return msgspec.convert(
        {
            "metadata": {"name": "rollout-a.x"},
            "spec": {
                "pool": "a",
                "target": {"driverVersion": "560.35.03"},
                "canary": 1,
                "batchSize": 1,
                "maxUnavailable": 1,
            },
            "status": status,
        },
        RolloutJson,
    )


CASES = [
    # (phase, steps, the leader drives it, the CLI's wait is over)
    ("", (), True, False),  # just created: the order is the leader's to write
    ("Paused", (), True, False),  # paused before the order: written, nothing starts
    ("Running", ("done", "pending", "pending"), True, False),
    ("Running", ("done", "failed-held", "pending"), True, False),  # Failed is the next write
    ("Paused", ("done", "draining", "pending"), True, False),  # in flight: carried through
    ("Paused", ("done", "done", "pending"), False, True),
    ("Aborted", ("done", "gating", "pending"), True, False),
    ("Aborted", ("done", "failed-held", "pending"), False, True),  # held: a person's
    ("Failed", ("done", "failed-held", "waiting-for-change"), True, False),
    ("Failed", ("done", "failed-held", "pending"), False, True),
    ("Completed", ("done", "done", "done"), False, True),
    ("Aborted", (), False, True),
]


@pytest.mark.unit
@pytest.mark.parametrize(("phase", "steps", "driven", "over"), CASES)
def test_the_leader_drives_a_roll_out_while_it_has_work_and_the_wait_ends_with_it(
    phase: str, steps: tuple[str, ...], driven: bool, over: bool
) -> None:
    r = rollout(phase, *steps)
    assert wants_driving(state_of(r)) is driven
    assert settled(r) is over
    # Never both: a roll-out the leader still drives is not over for the CLI.
    assert not (driven and over)


@pytest.mark.unit
def test_a_roll_out_an_older_cli_drove_decodes_and_is_taken_up() -> None:
    """The status an older CLI wrote (its lease object in `driver`, leaseSeconds in the
    spec) still decodes: the leader takes the roll-out up and says no driver yet."""
    raw = (
        b'{"metadata":{"name":"rollout-a.x"},"spec":{"pool":"a","target":{"driverVersion":'
        b'"560.35.03"},"canary":1,"batchSize":1,"maxUnavailable":1,"leaseSeconds":30},'
        b'"status":{"phase":"Running","driver":{"holder":"laptop-4242","renewedAt":'
        b'"2026-12-01T10:00:00Z"},"nodes":[{"name":"a-0","batch":0,"step":"draining"}]}}'
    )
    r = decode(raw)
    assert r.status.driven_by == ""
    assert wants_driving(state_of(r)) and not settled(r)
