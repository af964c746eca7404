"""Which closed GPUFault records retention deletes: by age and by a count per node,
never an open one, never the record of a fault its node still reports."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from gpuheal.clock import iso
from gpuheal.config import RetentionConfig
from gpuheal.model import OPEN_PHASES, ActionEntry, FaultRecord, Phase
from gpuheal.policy.retention import AGE, COUNT, collectable
from tests.corpus import EKS_NODES

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
DAY = 86400.0
CONFIG = RetentionConfig(resolved_max_age_seconds=30 * DAY, per_node_max=3)


def record(
    name: str, node: str, closed_days_ago: float, phase: Phase = Phase.RESOLVED
) -> FaultRecord:
    opened = NOW - dt.timedelta(days=closed_days_ago + 1)
    closed = NOW - dt.timedelta(days=closed_days_ago)
    entries = (ActionEntry(iso(opened), "detect", "ok"), ActionEntry(iso(closed), "untaint", "ok"))
    return FaultRecord(
        name, node, f"f-{name}", phase, resource_version="7",
        created_at=opened.strftime("%Y-%m-%dT%H:%M:%SZ"), actions=entries,
    )  # fmt: skip


def test_old_closed_records_go_by_age_and_the_rest_by_count_per_node() -> None:
    a, b = EKS_NODES[0], EKS_NODES[1]
    records = [
        record("a-old", a, 45),
        record("a-old-failed", a, 31, Phase.FAILED),
        *(record(f"a-{i}", a, i) for i in range(1, 6)),  # 5 recent: the 2 oldest go
        record("a-open", a, 90, Phase.QUARANTINED),  # open, however old
        record("b-1", b, 2),
    ]
    due = collectable(records, CONFIG, NOW)
    assert [(c.name, c.why) for c in due] == [
        ("a-old", AGE),
        ("a-old-failed", AGE),
        ("a-5", COUNT),
        ("a-4", COUNT),
    ]
    assert all(c.resource_version == "7" and c.node == a for c in due)


def test_the_record_of_a_fault_still_reported_is_kept() -> None:
    records = [record("a-old", EKS_NODES[0], 45)]
    assert collectable(records, CONFIG, NOW, keep={"a-old"}) == []


def test_a_record_without_any_time_is_kept() -> None:
    timeless = FaultRecord("x", EKS_NODES[0], "f", Phase.RESOLVED)
    assert collectable([timeless], CONFIG, NOW) == []


@given(
    st.lists(
        st.tuples(
            st.sampled_from(EKS_NODES[:3]),
            st.floats(min_value=0, max_value=400),
            st.sampled_from(list(Phase)),
        ),
        max_size=60,
    ),
    st.integers(min_value=1, max_value=10),
)
def test_never_an_open_record_and_at_most_per_node_max_closed_ones_stay(
    specs: list[tuple[str, float, Phase]], per_node_max: int
) -> None:
    config = RetentionConfig(resolved_max_age_seconds=30 * DAY, per_node_max=per_node_max)
    records = [record(f"r{i}", node, days, phase) for i, (node, days, phase) in enumerate(specs)]
    due = {c.name for c in collectable(records, config, NOW)}
    left = [r for r in records if r.name not in due]
    assert all(r.name not in due for r in records if r.phase in OPEN_PHASES)
    for node in EKS_NODES[:3]:
        closed = [r for r in left if r.node == node and r.phase not in OPEN_PHASES]
        assert len(closed) <= per_node_max
