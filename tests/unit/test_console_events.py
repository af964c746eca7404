"""The Events on a fault's page (views.fault_events): gpuheal's own, about the
record or about its node since the record was made, never another fault's."""

from __future__ import annotations

import dataclasses

from gpuheal.api.console import render
from gpuheal.api.console.auth import Role, issue
from gpuheal.api.console.views import fault_events
from gpuheal.model import EventView, Phase
from tests.console_fleet import DETECTED, cluster, record

XSS = "<img src=x onerror=alert(1)>"
INSTANCE = "gpuheal-controller-7d9f-x2k4q"
MADE = "2026-12-01T03:12:44Z"


def event(reason: str, time: str, regarding: tuple[str, str], **changes: object) -> EventView:
    made = EventView(
        key=f"default/{reason}.{time}",
        time=time,
        reason=reason,
        note=f"{reason} note",
        type="Normal",
        action=reason.removeprefix("GPUFault"),
        instance=INSTANCE,
        regarding=regarding,
    )
    return dataclasses.replace(made, **changes)  # type: ignore[arg-type]


def test_a_faults_events_are_its_own_and_its_nodes_since_it_was_made() -> None:
    c = cluster(10)
    node = next(iter(c.nodes))
    # Made in that second (creationTimestamp has whole seconds).
    mine = dataclasses.replace(record(node, "xid-79", Phase.DRAINED), created_at=MADE)
    other = record(node, "xid-48", Phase.RESOLVED)
    on_node = ("Node", node)
    events = [
        event(
            "GPUFaultQuarantined",
            "2026-12-01T03:12:45.500000Z",
            on_node,
            related=("GPUFault", mine.name),
        ),
        event("GPUFaultDetected", "2026-12-01T03:12:44.001000Z", ("GPUFault", mine.name)),
        event("GPUReconcileFailed", "2026-12-01T03:12:44.000001Z", on_node),
        event(
            "GPUFaultRecovered", "2026-12-01T03:12:46Z", on_node, related=("GPUFault", other.name)
        ),
        event("GPUNodeUnmanaged", "2026-12-01T03:12:43.999999Z", on_node),
    ]
    assert [e.reason for e in fault_events(mine, events)] == [
        "GPUFaultQuarantined",
        "GPUFaultDetected",
        "GPUReconcileFailed",
    ]


def test_the_fault_page_shows_its_events_as_text_or_says_they_are_not_loaded() -> None:
    c = cluster(10)
    node = next(iter(c.nodes))
    mine = record(node, "xid-79", Phase.DRAINED)
    shown = event("GPUFaultQuarantined", DETECTED, ("GPUFault", mine.name), note=XSS)
    c = dataclasses.replace(c, records={mine.name: mine}, events_of=lambda _objects: [shown])
    viewer = issue(Role.VIEW, "oncall", b"v" * 32, 0.0)[1]

    html = render.fault_page(c, mine.name, viewer)
    assert html is not None and 'id="events-unknown"' in html  # the cache has not listed yet

    html = render.fault_page(dataclasses.replace(c, events_synced=True), mine.name, viewer)
    assert html is not None
    assert '<td class="reason">GPUFaultQuarantined</td>' in html
    assert XSS not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert INSTANCE in html
