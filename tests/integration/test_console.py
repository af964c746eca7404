"""The web console in a real headless browser (Debian's chromium, driven by
Playwright), against the real control plane and controller (docs/console.md):
faults appear live, the timeline is the record's, an approval from the page
remediates once and says who, a held fault released from the page is remediated
once past the breaker, strings from the cluster are text, and a request
without a session, without the CSRF token or from a view-only session is refused.
The run writes the screenshots docs/console.md shows."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node
from playwright.sync_api import Browser, BrowserContext, Dialog, Page, expect

from gpuheal.api.console.routes import CSP
from gpuheal.sim.controller import ControllerProcess
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import apply, gpu_deployment, gpu_pod, wait_pods_running
from tests.corpus import alert, webhook
from tests.helpers import FakeNodes, wait_for
from tests.integration.conftest import (
    StartController,
    controller_config,
    entries_of,
    events_for,
    faults_of,
    our_taint,
    pods_on,
    pods_told_evicted,
    report_fault,
)
from tests.integration.test_controller_resilience import one_leader

pytestmark = pytest.mark.timeout(240)

TOKEN = "console-act-token-7d2e91c4b5a0"
VIEW_TOKEN = "console-view-token-3a8f0e6d1c27"
XSS = "<img src=x onerror=alert(1)>"
DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    made = browser.new_context(viewport={"width": 1280, "height": 900})
    yield made
    made.close()


def console_config(pool: dict[str, str], tmp_path: Path, *, approval: bool) -> dict[str, Any]:
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "view-token").write_text(VIEW_TOKEN + "\n")
    extra: dict[str, Any] = {
        "apiTokenFile": str(tmp_path / "token"),
        "consoleViewTokenFile": str(tmp_path / "view-token"),
    }
    if approval:
        extra["approval"] = {"byReason": {"XidCritical79": True}, "expirySeconds": 600}
    return controller_config(pool, **extra)


def sign_in(page: Page, controller: ControllerProcess, token: str, user: str) -> None:
    page.goto(f"{controller.url}/console/login")
    page.fill("input[name=user]", user)
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url("**/console/fleet")
    live(page)


def live(page: Page) -> None:
    """Wait until the page's event stream is open."""
    page.wait_for_selector("body[data-live=on]", timeout=15_000)


def record_of(kube: Client, node: str, phase: str) -> dict[str, Any]:
    def reached() -> dict[str, Any]:
        records = faults_of(kube, node)
        if len(records) == 1 and (records[0].status or {}).get("phase") == phase:
            return dict(kube.get(GPUFault, records[0].metadata.name))
        return {}

    return wait_for(f"the record {phase}", reached, timeout_s=30)


def name_of(record: dict[str, Any]) -> str:
    return str(record["metadata"]["name"])


def post(
    controller: ControllerProcess,
    path: str,
    form: dict[str, str],
    *,
    cookie: str = "",
    origin: str = "",
) -> int:
    """A POST as a forger would send it: the status answered."""
    request = urllib.request.Request(  # noqa: S310
        controller.url + path, data=urllib.parse.urlencode(form).encode(), method="POST"
    )
    if cookie:
        request.add_header("Cookie", f"gpuheal_session={cookie}")
    if origin:
        request.add_header("Origin", origin)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def session_cookie(context: BrowserContext) -> dict[str, Any]:
    (cookie,) = [c for c in context.cookies() if c["name"] == "gpuheal_session"]
    return dict(cookie)


def test_a_fault_appears_live_and_an_approval_from_the_page_remediates_once(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    tmp_path: Path,
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    context: BrowserContext,
) -> None:
    node, _spare = fake_gpu_nodes(2, labels=pool)
    apply(kube, gpu_pod("trainer-0", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=1)
    controller = start_controller(console_config(pool, tmp_path, approval=True)).wait_leading()

    fleet = context.new_page()
    sign_in(fleet, controller, TOKEN, "night-oncall")
    faults = context.new_page()
    faults.goto(f"{controller.url}/console/faults")
    live(faults)
    for page in (fleet, faults):
        page.evaluate("window.notReloaded = true")
    assert fleet.locator("#awaiting").count() == 0

    report_fault(kube, node, "xid-79-gpu-fell-off-the-bus")
    fleet.wait_for_selector("#awaiting tr[data-fault]", timeout=30_000)
    faults.wait_for_selector("#faults tr[data-fault]", timeout=30_000)
    for page in (fleet, faults):
        assert page.evaluate("window.notReloaded") is True  # swapped in, not reloaded
    name = name_of(record_of(kube, node, "AwaitingApproval"))
    assert fleet.get_attribute("#awaiting tr[data-fault]", "data-fault") == name
    assert node in fleet.inner_text("#attention")

    page = context.new_page()
    page.goto(f"{controller.url}/console/faults/{name}")
    live(page)

    def timeline_is_the_records() -> bool:
        shown = [
            [cell.inner_text() for cell in row.locator("td").all()]
            for row in page.locator("#timeline tr:has(td)").all()
        ]
        status = kube.get(GPUFault, name).get("status") or {}
        recorded = [
            [a["time"], a["action"], a["result"], a.get("detail", "")] for a in status["actions"]
        ]
        return bool(recorded) and shown == recorded

    wait_for("the timeline as recorded", timeline_is_the_records, timeout_s=15)
    assert page.inner_text("#phase") == "AwaitingApproval"
    assert page.inner_text("#pods") == f"{namespace}/trainer-0"  # what the plan would move
    fleet.reload()
    fleet.screenshot(path=str(DOCS / "console-fleet.png"), full_page=True)
    page.screenshot(path=str(DOCS / "console-fault.png"), full_page=True)

    # Someone is on it: said in the record and an Event, nothing else moves.
    page.click("button.acknowledge")
    page.wait_for_url(f"**/console/faults/{name}")
    (acknowledged,) = entries_of(kube, "acknowledged", name=name)
    assert acknowledged["detail"] == "by console:night-oncall"
    (told,) = events_for(kube, node, "GPUFaultAcknowledged", at_least=1)
    assert told.message == "fault xid-79-gpu-fell-off-the-bus acknowledged by console:night-oncall"
    assert record_of(kube, node, "AwaitingApproval") and our_taint(kube, node) is None
    live(page)

    page.click("button.approve")
    page.wait_for_url(f"**/console/faults/{name}")
    live(page)
    # The page follows the remediation as the record moves on.
    expect(page.locator("#phase")).to_have_text("Drained", timeout=30_000)
    assert page.evaluate("window.notReloaded") is None  # a new page after the POST
    assert page.inner_text("#decision").startswith("approved by console:night-oncall at ")
    assert our_taint(kube, node) is not None
    assert not pods_on(kube, namespace, node)
    status = kube.get(GPUFault, name).get("status") or {}
    assert status["approval"]["by"] == "console:night-oncall"
    (approved,) = entries_of(kube, "approved", name=name)
    assert "by console:night-oncall" in approved["detail"]
    assert len(entries_of(kube, "taint", name=name)) == 1
    assert len(events_for(kube, node, "GPUFaultApproved", at_least=1)) == 1
    assert pods_told_evicted(kube, node, at_least=1) == [f"{namespace}/trainer-0"]
    wait_for("the timeline as recorded", timeline_is_the_records, timeout_s=15)

    node_page = context.new_page()
    node_page.goto(f"{controller.url}/console/nodes/{node}")
    assert node_page.inner_text("#state") == "quarantined"
    assert name in node_page.inner_html("#history")
    node_page.screenshot(path=str(DOCS / "console-node.png"), full_page=True)


def test_the_fault_page_shows_where_a_deployments_evicted_pod_went_and_its_events(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    tmp_path: Path,
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    context: BrowserContext,
) -> None:
    nodes = fake_gpu_nodes(2, labels=pool)
    apply(kube, gpu_deployment("llm-finetune", namespace, replicas=1, node_selector=pool))
    (running,) = wait_pods_running(kube, namespace, count=1, labels={"app": "llm-finetune"})
    assert running.metadata and running.spec and running.metadata.ownerReferences
    evicted = f"{namespace}/{running.metadata.name}"
    node = str(running.spec.nodeName)
    (spare,) = set(nodes) - {node}
    controller = start_controller(console_config(pool, tmp_path, approval=False)).wait_leading()

    report_fault(kube, node, "xid-79-moved-pods")
    name = name_of(record_of(kube, node, "Drained"))
    page = context.new_page()
    sign_in(page, controller, TOKEN, "night-oncall")
    page.goto(f"{controller.url}/console/faults/{name}")
    live(page)
    row = page.locator(f'#moves tr[data-pod="{evicted}"]')
    expect(row.locator("td.where")).to_have_text(spare, timeout=30_000)
    owner = running.metadata.ownerReferences[0]
    expect(row.locator("td.owner")).to_have_text(f"ReplicaSet/{owner.name}")
    assert pods_on(kube, namespace, spare)  # its replacement, where the page says
    # gpuheal's Events about it, from the controller's Event cache.
    (quarantined,) = wait_for(
        "the Event sent", lambda: events_for(kube, node, "GPUFaultQuarantined"), timeout_s=15
    )
    expect(page.locator("#events td.reason", has_text="GPUFaultQuarantined")).to_have_count(
        1, timeout=30_000
    )
    expect(page.locator("#events")).to_contain_text(str(quarantined.message))


def test_strings_from_the_cluster_render_as_text_and_run_nothing(
    kube: Client,
    pool: dict[str, str],
    tmp_path: Path,
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    context: BrowserContext,
) -> None:
    annotated, alerted = fake_gpu_nodes(2, labels=pool)
    controller = start_controller(console_config(pool, tmp_path, approval=False)).wait_leading()
    dialogs: list[str] = []
    page = context.new_page()

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    sign_in(page, controller, TOKEN, "night-oncall")

    kube.patch(Node, annotated, {"metadata": {"annotations": {"gpuheal.io/notes": XSS}}})
    report_fault(kube, annotated, "xid-79-xss", reason=XSS)
    labels = {"alertname": "GPUXidError", "Hostname": alerted, "severity": "critical"}
    body = webhook([alert({**labels, "gpuheal_reason": XSS})])
    request = urllib.request.Request(  # noqa: S310
        f"{controller.url}/api/v1/alerts", data=json.dumps(body).encode(), method="POST"
    )
    request.add_header("Authorization", f"Bearer {TOKEN}")
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        assert json.loads(response.read())["accepted"]
    records = [
        name_of(record_of(kube, annotated, "Drained")),
        name_of(record_of(kube, alerted, "Drained")),
    ]

    # (No wait_for_function: the CSP forbids the eval it runs in the page.)
    expect(page.locator("#attention tr[data-node]")).to_have_count(2, timeout=30_000)
    visited = [
        "/console/fleet",
        "/console/faults",
        *(f"/console/faults/{r}" for r in records),
        f"/console/nodes/{annotated}",
        f"/console/nodes/{alerted}",
    ]
    for path in visited:
        page.goto(controller.url + path)
        text = page.inner_text("#live")
        assert XSS in text, path  # shown, as text
        assert page.locator("#live img").count() == 0, path
    page.goto(f"{controller.url}/console/nodes/{annotated}")
    assert XSS in page.inner_text("#facts")  # the annotation itself
    assert dialogs == []


def test_no_session_no_csrf_token_or_a_view_session_cannot_act(
    kube: Client,
    pool: dict[str, str],
    tmp_path: Path,
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    browser: Browser,
    context: BrowserContext,
) -> None:
    (node,) = fake_gpu_nodes(1, labels=pool)
    controller = start_controller(console_config(pool, tmp_path, approval=True)).wait_leading()
    report_fault(kube, node, "xid-79-awaiting")
    name = name_of(record_of(kube, node, "AwaitingApproval"))
    approve = f"/console/faults/{name}/approve"

    # Not signed in: pages send to the sign-in, the stream and actions refuse.
    page = context.new_page()
    response = page.goto(f"{controller.url}/console/fleet")
    assert response is not None and page.url.endswith("/console/login")
    assert response.headers["content-security-policy"] == CSP
    assert page.request.get(f"{controller.url}/console/events").status == 401
    assert post(controller, approve, {"_csrf": "x"}) == 401
    page.fill("input[name=user]", "night-oncall")
    page.fill("input[name=token]", "not-the-token")
    page.click("button[type=submit]")
    assert page.inner_text("#error") == "unknown token"

    # Signed in to act: the cookie is out of scripts' and other sites' reach, and
    # a POST without the page's CSRF token, or from another site, is refused.
    sign_in(page, controller, TOKEN, "night-oncall")
    cookie = session_cookie(context)
    assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")
    assert page.evaluate("document.cookie") == ""
    csrf = page.get_attribute("form[action='/console/logout'] input[name=_csrf]", "value")
    assert csrf
    assert post(controller, approve, {}, cookie=cookie["value"]) == 403
    assert post(controller, approve, {"_csrf": "0" * 64}, cookie=cookie["value"]) == 403
    assert (
        post(
            controller, approve, {"_csrf": csrf}, cookie=cookie["value"], origin="https://evil.test"
        )
        == 403
    )
    assert page.locator("#awaiting button.approve").count() == 1
    acknowledge = f"/console/faults/{name}/acknowledge"
    assert post(controller, acknowledge, {}, cookie=cookie["value"]) == 403

    # A view session sees the fault and no button; its forged POST, with its own
    # valid CSRF token, is refused too.
    viewer = browser.new_context()
    try:
        view_page = viewer.new_page()
        sign_in(view_page, controller, VIEW_TOKEN, "shadow-oncall")
        assert view_page.locator("#awaiting tr[data-fault]").count() == 1
        assert view_page.locator("button.act").count() == 0
        view_page.goto(f"{controller.url}/console/faults/{name}")
        assert view_page.locator("button.act").count() == 0
        view_csrf = view_page.get_attribute(
            "form[action='/console/logout'] input[name=_csrf]", "value"
        )
        assert view_csrf
        for path in (approve, acknowledge):
            forged = post(
                controller, path, {"_csrf": view_csrf}, cookie=session_cookie(viewer)["value"]
            )
            assert forged == 403, path
    finally:
        viewer.close()
    status = kube.get(GPUFault, name).get("status") or {}
    assert status["phase"] == "AwaitingApproval" and "approval" not in status
    assert not entries_of(kube, "acknowledged", name=name)
    assert our_taint(kube, node) is None


def test_a_held_fault_released_from_the_page_is_remediated_once_and_a_viewer_cannot(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    tmp_path: Path,
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    browser: Browser,
    context: BrowserContext,
) -> None:
    first, second, third = fake_gpu_nodes(3, labels=pool)
    for i, node in enumerate((second, third)):
        apply(kube, gpu_pod(f"trainer-{i}", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=2)
    # A breaker of one node: with the first quarantined, the others are held.
    config = console_config(pool, tmp_path, approval=False) | {"breakerMaxNodes": 1}
    controller = start_controller(config).wait_leading()
    report_fault(kube, first, "xid-79-first")
    wait_for("the first taint", lambda: our_taint(kube, first) is not None, timeout_s=30)
    report_fault(kube, second, "xid-79-second")
    report_fault(kube, third, "xid-79-third")
    held = {node: name_of(record_of(kube, node, "Held")) for node in (second, third)}
    release = f"/console/faults/{held[second]}/release"

    # A view session sees the held faults and no Release button; its forged POST,
    # with its own valid CSRF token, is refused.
    viewer = browser.new_context()
    try:
        view_page = viewer.new_page()
        sign_in(view_page, controller, VIEW_TOKEN, "shadow-oncall")
        expect(view_page.locator("#held tr[data-fault]")).to_have_count(2)
        assert view_page.locator("button.release").count() == 0
        view_page.goto(f"{controller.url}/console/faults/{held[second]}")
        assert view_page.locator("button.act").count() == 0
        view_csrf = view_page.get_attribute(
            "form[action='/console/logout'] input[name=_csrf]", "value"
        )
        assert view_csrf
        forged = post(
            controller, release, {"_csrf": view_csrf}, cookie=session_cookie(viewer)["value"]
        )
        assert forged == 403
    finally:
        viewer.close()
    assert "release" not in (kube.get(GPUFault, held[second]).get("status") or {})

    page = context.new_page()
    sign_in(page, controller, TOKEN, "night-oncall")
    expect(page.locator("#held button.release")).to_have_count(2)
    assert post(controller, release, {}, cookie=session_cookie(context)["value"]) == 403
    page.locator(f"#held tr[data-fault='{held[second]}'] button.release").click()
    page.wait_for_url(f"**/console/faults/{held[second]}")
    live(page)
    # The page follows the remediation as the record moves on.
    expect(page.locator("#phase")).to_have_text("Drained", timeout=30_000)
    expect(page.locator("#released")).to_contain_text("by console:night-oncall at ")
    assert page.locator("button.release").count() == 0
    status = kube.get(GPUFault, held[second]).get("status") or {}
    assert status["release"]["by"] == "console:night-oncall"
    (released,) = entries_of(kube, "released", name=held[second])
    assert released["detail"].startswith("by console:night-oncall at ")
    assert len(entries_of(kube, "taint", name=held[second])) == 1
    assert len(events_for(kube, second, "GPUFaultReleased", at_least=1)) == 1
    assert pods_told_evicted(kube, second, at_least=1) == [f"{namespace}/trainer-0"]
    assert our_taint(kube, second) is not None and not pods_on(kube, namespace, second)

    # The other held fault stays held, its button still there.
    page.goto(f"{controller.url}/console/fleet")
    expect(page.locator("#held tr[data-fault]")).to_have_count(1)
    assert page.get_attribute("#held tr[data-fault]", "data-fault") == held[third]
    assert (kube.get(GPUFault, held[third]).get("status") or {})["phase"] == "Held"
    assert our_taint(kube, third) is None and pods_on(kube, namespace, third) == {"trainer-1"}


def test_on_the_standby_a_person_signs_in_and_approves_and_the_leader_acts_once(
    kube: Client,
    namespace: str,
    pool: dict[str, str],
    tmp_path: Path,
    fake_gpu_nodes: FakeNodes,
    start_controller: StartController,
    context: BrowserContext,
) -> None:
    """Two replicas: the Service (or `kubectl port-forward svc/...`) lands on either.
    The standby passes the approval on to the leader named on the Lease."""
    (node,) = fake_gpu_nodes(1, labels=pool)
    apply(kube, gpu_pod("trainer-0", namespace, node_name=node))
    wait_pods_running(kube, namespace, count=1)
    config = console_config(pool, tmp_path, approval=True)
    group = [start_controller(config, identity=f"replica-{i}") for i in range(2)]
    (leader,) = wait_for("one leader", lambda: one_leader(group))
    (standby,) = [r for r in group if r is not leader]

    report_fault(kube, node, "xid-79-gpu-fell-off-the-bus")
    name = name_of(record_of(kube, node, "AwaitingApproval"))
    page = context.new_page()
    sign_in(page, standby, TOKEN, "night-oncall")
    page.goto(f"{standby.url}/console/faults/{name}")
    live(page)
    page.click("button.approve")
    page.wait_for_url(f"{standby.url}/console/faults/{name}")
    expect(page.locator("#phase")).to_have_text("Drained", timeout=30_000)
    status = kube.get(GPUFault, name).get("status") or {}
    assert status["approval"]["by"] == "console:night-oncall"
    assert len(entries_of(kube, "approved", name=name)) == 1
    assert len(entries_of(kube, "taint", name=name)) == 1
    assert pods_told_evicted(kube, node, at_least=1) == [f"{namespace}/trainer-0"]
    assert '"forwarded to the leader"' in standby.log()
    assert '"console action"' in leader.log() and '"console action"' not in standby.log()
