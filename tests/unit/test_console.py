"""The console without a server: what each page shows, that every string from the
cluster is text, that a view session gets no action, and the session and CSRF
primitives (docs/console.md)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import re
from pathlib import Path

import msgspec
import pytest

from gpuheal.api.console import render
from gpuheal.api.console.auth import SESSION_PURPOSE, SESSION_SECONDS, Role, Session, issue, verify
from gpuheal.api.console.feed import ChangeFeed
from gpuheal.api.console.views import fleet
from gpuheal.api.token import ApiTokens
from gpuheal.config import Config
from gpuheal.kube.projections import PodJson, pod_view_factory
from gpuheal.model import FAULT_REASON, ActionEntry, Phase
from gpuheal.vocabulary import Entry
from tests.console_fleet import DETECTED, POOLS, cluster, record

XSS = "<img src=x onerror=alert(1)>"
NOW = 1_800_000_000.0
ACT_KEY, VIEW_KEY = b"k" * 32, b"v" * 32
KEYS = {Role.ACT: (ACT_KEY,), Role.VIEW: (VIEW_KEY,)}


def session(role: Role = Role.ACT, user: str = "oncall@example.com") -> Session:
    return issue(role, user, ACT_KEY if role is Role.ACT else VIEW_KEY, NOW)[1]


def test_the_fleet_counts_nodes_by_pool_and_state_and_gpus() -> None:
    shown = fleet(cluster(600))
    assert [p.name for p in shown.pools] == sorted(POOLS)
    assert shown.totals.nodes == 600
    assert shown.totals.states["quarantined"] == 12  # one in 50
    assert shown.totals.capacity == 600 * 8
    assert shown.totals.allocated == 600 * 4
    # Tainted nodes take no pods: their GPUs are not free.
    tainted = 12 + 3  # quarantined and in maintenance (one in 250 from the 8th)
    assert shown.totals.free == (600 - tainted) * 4
    assert (shown.breaker_used, shown.breaker_capacity) == (12, 10)  # breakerMaxNodes: 10
    assert len(shown.awaiting) == 6 and all(
        r.phase is Phase.AWAITING_APPROVAL for r in shown.awaiting
    )
    assert len(shown.held) == 3 and len(shown.maintenance) == 3
    assert [n.state for n in shown.attention][:12] == ["quarantined"] * 12


def test_a_time_sliced_pool_counts_gpus_not_replicas() -> None:
    c = cluster(10)
    shared = {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    nodes = {
        name: dataclasses.replace(
            view,
            gpus=view.gpus * 4,
            capacity=tuple((k, n * 4) for k, n in view.capacity),  # replicas offered
            labels={**view.labels, **shared},
        )
        for name, view in c.nodes.items()
    }
    shown = fleet(dataclasses.replace(c, nodes=nodes))
    assert shown.totals.capacity == fleet(c).totals.capacity  # 8 GPUs each, as before
    # Each node's pods ask for 4 replicas: one GPU in use, seven free on each.
    assert shown.totals.allocated == 10 and shown.totals.free <= 7 * 10


def test_every_page_shows_strings_from_the_cluster_as_text() -> None:
    c = cluster(120)
    node = next(iter(c.nodes))
    view = c.nodes[node]
    nodes = dict(c.nodes)
    nodes[node] = dataclasses.replace(
        view, annotations={**view.annotations, FAULT_REASON: XSS, f"gpuheal.io/{XSS}": XSS}
    )
    bad = record(node, XSS, Phase.AWAITING_APPROVAL, reason=XSS)
    records = {**c.records, bad.name: bad}
    c = dataclasses.replace(
        c, nodes=nodes, records=records, records_by_node={**c.records_by_node, node: {bad.name}}
    )
    pages = [
        render.fleet_page(c, session()),
        render.faults_page(c, session()),
        render.fault_page(c, bad.name, session()),
        render.node_page(c, node, session()),
    ]
    for html in pages:
        assert html is not None
        assert XSS not in html
        assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_pages_carry_no_inline_script_or_style() -> None:
    """The CSP forbids them: one would not run, and its absence is what the CSP protects."""
    c = cluster(60)
    name = next(iter(c.records))
    for html in (
        render.fleet_page(c, session()),
        render.fault_page(c, name, session()) or "",
        render.page("login.html", csrf="x", error=""),
    ):
        assert re.findall(r"<script(?![^>]*\bsrc=)", html) == []
        assert not re.search(r"\s(on[a-z]+|style)=", html)
        assert f"/console/static/{render.ASSET_VERSION}/console.js" in html


def test_a_view_session_sees_no_action_and_an_act_session_gets_its_csrf_token() -> None:
    c = cluster(200)
    acting, viewing = session(Role.ACT), session(Role.VIEW)
    html = render.fleet_page(c, acting)
    assert html.count('class="act approve"') == 2 and acting.csrf() in html
    awaiting = next(r for r in c.records.values() if r.phase is Phase.AWAITING_APPROVAL)
    html = render.fault_page(c, awaiting.name, acting) or ""
    assert re.findall(r'class="act (\w+)"', html) == ["approve", "reject", "acknowledge"]
    for page in (render.fleet_page(c, viewing), render.fault_page(c, awaiting.name, viewing)):
        assert page is not None
        assert 'class="act ' not in page
        assert "/approve" not in page and "/acknowledge" not in page


def test_a_repeat_offender_held_for_a_person_is_listed_held_with_its_release() -> None:
    c = cluster(60)
    quarantined = next(r for r in c.records.values() if r.phase is Phase.DRAINED)
    waiting = dataclasses.replace(
        quarantined,
        phase=Phase.RECOVERING,
        actions=(
            *quarantined.actions,
            ActionEntry(DETECTED, Entry.REPEAT_OFFENDER, "contact-support", "3 faults"),
            ActionEntry(DETECTED, Entry.HELD_FOR_A_PERSON, "held", "cleared, held"),
        ),
    )
    held = dataclasses.replace(c, records={**c.records, waiting.name: waiting})
    assert waiting in fleet(held).held and quarantined not in fleet(c).held
    html = render.fault_page(held, waiting.name, session()) or ""
    assert re.findall(r'class="act (\w+)"', html) == ["release", "acknowledge"]
    released = dataclasses.replace(waiting, released_by="alice", released_at=DETECTED)
    after = dataclasses.replace(c, records={**c.records, waiting.name: released})
    assert released not in fleet(after).held
    html = render.fault_page(after, waiting.name, session()) or ""
    assert re.findall(r'class="act (\w+)"', html) == ["acknowledge"]


def test_the_fault_page_shows_the_records_timeline_in_order() -> None:
    c = cluster(60)
    r = next(iter(c.records.values()))
    html = render.fault_page(c, r.name, session()) or ""
    actions = re.findall(r'<td class="action">([^<]*)</td>', html)
    assert actions == [a.action for a in r.actions]
    assert render.fault_page(c, "no-such-record", session()) is None


def test_a_fragment_is_the_live_part_only() -> None:
    html = render.fleet_page(cluster(10, version="a1b2c3d4.42"), session(), fragment=True)
    assert html.startswith('<main id="live" data-version="a1b2c3d4.42">')
    assert "<head>" not in html


def test_a_session_verifies_with_its_roles_keys_only() -> None:
    cookie, made = issue(Role.VIEW, "night-oncall", VIEW_KEY, NOW)
    got = verify(cookie, KEYS, NOW + 1)
    assert got is not None and (got.role, got.user, got.may_act) == (
        Role.VIEW,
        "night-oncall",
        False,
    )
    assert got.csrf() == made.csrf()
    # The view token's key signed it: claiming the act role breaks the signature.
    payload, _, sig = cookie.partition(".")
    raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()
    forged = base64.urlsafe_b64encode(raw.replace("view|", "act|", 1).encode()).rstrip(b"=")
    assert verify(f"{forged.decode()}.{sig}", KEYS, NOW) is None
    # A token removed from its file takes its sessions with it.
    assert verify(cookie, {Role.ACT: (ACT_KEY,), Role.VIEW: ()}, NOW) is None
    assert verify(cookie, KEYS, NOW + SESSION_SECONDS) is None  # expired
    for junk in ("", ".", "x.y", "%%%.%%%", cookie + "x", cookie.replace(".", "")):
        assert verify(junk, KEYS, NOW) is None


def test_the_csrf_token_is_the_sessions_own() -> None:
    one, other = session(), session()
    assert one.csrf_ok(one.csrf())
    assert not one.csrf_ok(other.csrf())
    assert not one.csrf_ok("")


@pytest.mark.parametrize("user", ["", "a b", "<b>", "x" * 64, "-lead"])
def test_a_user_name_that_a_record_could_not_carry_as_is_is_refused(user: str) -> None:
    with pytest.raises(ValueError, match="user name"):
        issue(Role.ACT, user, ACT_KEY, NOW)


def test_the_change_feed_wakes_waiters_and_times_out() -> None:
    async def run() -> tuple[int, int, int]:
        feed = ChangeFeed()
        ahead = await feed.after(-1, 5)  # already past: at once
        waiter = asyncio.create_task(feed.after(0, 5))
        await asyncio.sleep(0)
        feed.on_change(None, None)
        woken = await asyncio.wait_for(waiter, 1)
        quiet = await feed.after(1, 0.01)
        return ahead, woken, quiet

    assert asyncio.run(run()) == (0, 1, 1)


def test_a_pods_gpus_are_what_its_containers_request() -> None:
    """Allocated GPUs per pool: the containers' GPU requests (or limits, which
    Kubernetes copies to requests for extended resources); an init container runs
    before them, on the same GPUs, so it adds none, but the scheduler reserves the
    larger of the containers' sum and the largest init container for the pod."""
    raw = {
        "metadata": {"name": "trainer-0", "namespace": "ml-train", "uid": "u"},
        "spec": {
            "nodeName": "ip-10-0-12-34.us-west-2.compute.internal",
            "containers": [
                {"resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "4"}}},
                {
                    "resources": {
                        "requests": {"nvidia.com/gpu": "4"},
                        "limits": {"nvidia.com/gpu": "4"},
                    }
                },
                {"resources": {"requests": {"memory": "1Gi"}}},
            ],
            "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        },
        "status": {"phase": "Running"},
    }
    pod = msgspec.json.decode(msgspec.json.encode(raw), type=PodJson)
    view = pod_view_factory(Config().is_gpu_resource)(pod)
    assert (view.gpu, view.gpu_count) == (True, 8)
    pod.spec.initContainers[0].resources.limits["nvidia.com/gpu"] = "1"
    small_init = pod
    assert pod_view_factory(Config().is_gpu_resource)(small_init).gpu_count == 6


def test_every_replica_derives_the_same_session_keys_and_a_removed_token_takes_its_own(
    tmp_path: Path,
) -> None:
    path = tmp_path / "token"
    path.write_text("token-old-91f2\ntoken-new-7c3a\n")
    one, other = ApiTokens(path), ApiTokens(path)
    one.refresh()
    other.refresh()
    keys = one.keys(SESSION_PURPOSE)
    assert keys == other.keys(SESSION_PURPOSE) and len(set(keys)) == 2
    assert one.keys(b"another purpose") != keys
    cookie, _ = issue(Role.ACT, "night-oncall", keys[0], NOW)
    assert verify(cookie, {Role.ACT: other.keys(SESSION_PURPOSE)}, NOW) is not None
    path.write_text("token-new-7c3a\n")
    other.refresh()
    assert other.keys(SESSION_PURPOSE) == keys[1:]
    assert verify(cookie, {Role.ACT: other.keys(SESSION_PURPOSE)}, NOW) is None
