"""The agent's memory of recent Xids: the context NVIDIA's workflows read, one
event from two sources, and the application-Xid rate that alone is a node fault."""

from __future__ import annotations

import pytest

from gpuheal.agent.xids import REPEATED_APPLICATION_XIDS, RateRule, XidHistory
from gpuheal.model import Severity
from gpuheal.xid import Kind, classify
from tests.corpus import GPU_UUIDS

pytestmark = pytest.mark.unit

A, B = GPU_UUIDS[0], GPU_UUIDS[1]
APP = Kind.APPLICATION


def test_recent_is_the_same_gpus_xids_within_the_context_window() -> None:
    history = XidHistory(context_s=30, rule=RateRule())
    history.add(A, 79, Kind.NODE, 100, "kmsg")
    history.add(B, 48, Kind.NODE, 100, "kmsg")
    assert history.recent(A, now=110) == (79,)
    assert history.recent(A, now=131) == ()  # out of the window
    # What the agent does with it: a 45 right after the 79 follows it, a 45 alone counts.
    assert classify(45, recent=history.recent(A, 110)).kind is Kind.INFORMATIONAL
    assert classify(45, recent=history.recent(A, 200)).kind is APP


def test_the_second_sources_copy_of_an_xid_is_the_same_event() -> None:
    history = XidHistory(context_s=30, rule=RateRule())
    assert history.add(A, 13, APP, 100, "kmsg")
    assert not history.add(A, 13, APP, 101, "nvml")  # NVML's copy of the kernel log's
    assert history.add(A, 13, APP, 101, "kmsg")  # the same source twice: two crashes
    assert history.add(A, 13, APP, 107, "nvml")  # a new one
    assert history.add(B, 13, APP, 107, "kmsg")  # another GPU
    assert history.application_counts(now=108) == {A: 3, B: 1}


def test_application_xids_on_one_gpu_only_as_a_rate_are_a_fault() -> None:
    history = XidHistory(context_s=30, rule=RateRule(per_gpu=3, window_s=600))
    for i in range(2):
        history.add(A, 13, APP, 100 + 10 * i, "kmsg")
    assert history.rate_findings(now=130) == ()  # 2 < 3
    history.add(A, 31, APP, 130, "kmsg")
    (finding,) = history.rate_findings(now=131)
    assert finding.reason == REPEATED_APPLICATION_XIDS and finding.severity is Severity.P1
    assert finding.devices == (A,) and "3 application Xids" in finding.message
    assert history.rate_findings(now=701) == ()  # the first left the window: it clears


def test_a_rate_on_several_gpus_at_once_is_the_applications() -> None:
    history = XidHistory(context_s=30, rule=RateRule(per_gpu=2, window_s=600))
    for gpu in (A, B):
        for i in range(2):
            history.add(gpu, 31, APP, 100 + 10 * i, "kmsg")
    assert history.rate_findings(now=130) == ()


def test_ignorable_and_node_xids_do_not_count_toward_the_rate_and_zero_is_off() -> None:
    history = XidHistory(context_s=30, rule=RateRule(per_gpu=1, window_s=600))
    history.add(A, 43, Kind.INFORMATIONAL, 100, "kmsg")
    history.add(A, 79, Kind.NODE, 110, "kmsg")
    assert history.rate_findings(now=120) == ()
    off = XidHistory(context_s=30, rule=RateRule(per_gpu=0, window_s=600))
    off.add(A, 13, APP, now=100, source="kmsg")
    assert off.rate_findings(now=101) == ()
