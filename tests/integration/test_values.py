"""Property: whatever a fault source reports, every object gpuheal would write for
it is accepted by the real API server (server-side dry runs, nothing stored).

Hypothesis makes node names (any DNS-1123 subdomain up to 253 characters), fault
ids, reasons, times and device lists as the node annotations carry them, and
alert labels as Alertmanager sends them; the bodies come from the same builders
the controller sends (gpuheal.kube.writes, gpuheal.kube.events).
"""

from __future__ import annotations

import datetime as dt
import string
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lightkube import ApiError, Client, codecs
from lightkube.resources.core_v1 import Namespace
from lightkube.types import PatchType

from gpuheal import values
from gpuheal.config import Config
from gpuheal.kube.events import event_body, fault_ref, node_ref
from gpuheal.kube.writes import (
    canary_pod,
    device_marks,
    fault_record,
    news_patch,
    taint_patch,
)
from gpuheal.model import (
    FAULT_DEVICES,
    FAULT_ID,
    FAULT_REASON,
    FAULT_TIME,
    NODE_LABEL,
    STATUS,
    ActionEntry,
    FaultSignal,
    Mode,
    NodeView,
    Phase,
    fault_record_name,
)
from gpuheal.policy.devices import canary_name
from gpuheal.policy.plan import current_signal
from gpuheal.sim.nodes import gpu_node
from gpuheal.sim.resources import GPUFault
from gpuheal.sim.workloads import create_namespace
from gpuheal.sources import Seen
from gpuheal.sources.alertmanager import Webhook, interpret
from tests.corpus import NODE_NAMES, alert, webhook
from tests.helpers import unique

pytestmark = pytest.mark.timeout(300)

_LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)
NODE_NAMES_ANY = st.one_of(
    st.sampled_from(NODE_NAMES),
    st.lists(_LABEL, min_size=1, max_size=8)
    .map(".".join)
    .filter(lambda n: len(n) <= values.NAME_MAX),
)
# Anything `kubectl annotate` can carry: any text, long, with controls and non-ASCII.
ANY_TEXT = st.text(max_size=400)
TIMES = st.one_of(
    st.just(""),
    ANY_TEXT,
    st.datetimes(timezones=st.just(dt.UTC)).map(lambda t: t.isoformat().replace("+00:00", "Z")),
)
DEVICES = st.lists(st.text(alphabet=string.printable, max_size=300), max_size=100)


# Where the canary pods' dry runs go (the device-health canary namespace's stand-in).
CANARIES = unique("canaries")


@pytest.fixture(scope="module")
def parked_record(kube: Client, crds: None) -> Iterator[str]:
    """A real GPUFault: status writes are validated by dry-run patches of it."""
    name = unique("values-probe")
    signal = FaultSignal(
        node="ip-10-0-12-34.us-west-2.compute.internal",
        fault_id="probe",
        reason="Probe",
        source="test",
    )
    kube.create(codecs.from_dict(fault_record(name, signal, Mode.OBSERVE)))
    create_namespace(kube, CANARIES)  # with its default ServiceAccount, as pods need
    yield name
    kube.delete(GPUFault, name)
    kube.delete(Namespace, CANARIES)


def dry_run_create(kube: Client, body: dict[str, Any]) -> None:
    try:
        kube.create(codecs.from_dict(body), dry_run=True)
    except ApiError as err:
        pytest.fail(f"the API server refused {body['kind']}: {err.status.message}\n{body}")


def dry_run_all(kube: Client, parked: str, signal: FaultSignal) -> None:
    """Every write of one fault's remediation, as the controller would send it."""
    node, name = signal.node, fault_record_name(signal.node, signal.fault_id)
    assert values.is_subdomain(name)
    dry_run_create(kube, fault_record(name, signal, Mode.FULL))
    view = NodeView(name=node, resource_version="")
    manifest = gpu_node(node)
    manifest["metadata"]["labels"] |= {NODE_LABEL: values.node_label(node)}
    patch = taint_patch(
        view,
        signal.fault_id,
        "NoSchedule",
        state="quarantined",
        handled_at="2026-12-01T02:30:12.345Z",
    )
    manifest["metadata"]["labels"] |= patch["metadata"]["labels"]
    manifest["spec"] = patch["spec"]
    manifest["metadata"]["annotations"] |= patch["metadata"]["annotations"]
    marks = device_marks(signal.devices, signal.devices, ())["metadata"]["annotations"]
    manifest["metadata"]["annotations"] |= {k: v for k, v in marks.items() if v is not None}
    dry_run_create(kube, manifest)
    cfg = Config().device_health
    canary = canary_pod(
        canary_name(name, 1),
        CANARIES,
        node,
        name,
        "nvidia.com/gpu",
        image=cfg.canary_image,
        command=list(cfg.canary_command),
        timeout_seconds=cfg.canary_timeout_seconds,
    )
    dry_run_create(kube, canary)
    entries = [
        ActionEntry("2026-12-01T02:30:12.345Z", "detect", "ok", signal.source),
        ActionEntry("2026-12-01T02:30:13.001Z", "superseded", "ok", f"by {signal.fault_id}"),
        ActionEntry("2026-12-01T02:30:14.002Z", "evict", "blocked", signal.reason * 10),
    ]
    meta = kube.get(GPUFault, parked).metadata
    assert meta is not None and meta.resourceVersion
    status = news_patch(
        meta.resourceVersion,
        Phase.DRAINING,
        entries,
        evicted=["ml-training/llama-70b-0"],
        recovering_since="",
        expiry="2026-12-01T03:30:12.345Z",
        plan=None,
        contact_support=True,
        repair_approval=None,
    )
    try:
        kube.patch(GPUFault.Status, parked, status, patch_type=PatchType.MERGE, dry_run=True)
    except ApiError as err:
        pytest.fail(f"the API server refused the record status: {err.status.message}\n{status}")
    note = f"{signal.reason} ({signal.source}, {signal.severity}), fault {signal.fault_id}"
    for regarding, related in (
        (node_ref(node), fault_ref(name)),
        (fault_ref(name), node_ref(node)),
    ):
        body = event_body(
            regarding,
            reason="GPUFaultDetected",
            note=note,
            action="Detected",
            warning=False,
            related=related,
            instance=f"gpuheal-{node}",
            now=dt.datetime.now(dt.UTC),
        )
        dry_run_create(kube, body)
    # The label selector the CLI and the tests list a node's records with is legal.
    list(kube.list(GPUFault, labels={NODE_LABEL: values.node_label(node)}))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(node=NODE_NAMES_ANY, fault_id=ANY_TEXT, reason=ANY_TEXT, time=TIMES, devices=DEVICES)
def test_whatever_an_annotation_says_every_write_is_accepted(
    kube: Client,
    parked_record: str,
    node: str,
    fault_id: str,
    reason: str,
    time: str,
    devices: list[str],
) -> None:
    annotations = {
        STATUS: "faulty",
        FAULT_ID: fault_id or "x",
        FAULT_REASON: reason,
        FAULT_TIME: time,
        FAULT_DEVICES: ",".join(devices),
    }
    signal = current_signal(
        Seen(NodeView(name=node, resource_version="", annotations=annotations), Config())
    )
    if signal is None:  # a blank fault id is no fault: the agent contract
        assert not (fault_id or "x").strip()
        return
    dry_run_all(kube, parked_record, signal)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    node=NODE_NAMES_ANY,
    labels=st.dictionaries(
        st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,40}", fullmatch=True), ANY_TEXT, max_size=8
    ),
    starts_at=TIMES,
    fingerprint=st.text(alphabet="0123456789abcdef", max_size=40),
)
def test_whatever_an_alert_says_every_write_is_accepted(
    kube: Client,
    parked_record: str,
    node: str,
    labels: dict[str, str],
    starts_at: str,
    fingerprint: str,
) -> None:
    body = alert({**labels, "node": node}, starts_at=starts_at, fingerprint=fingerprint)
    hook = msgspec.convert(webhook([body]), Webhook)
    for outcome in interpret(hook, node_labels=("node",), find_node=lambda _label, value: value):
        if outcome.signal is not None:
            dry_run_all(kube, parked_record, outcome.signal)


def test_every_corpus_node_name_is_a_node_the_api_server_takes(kube: Client) -> None:
    """The corpus itself: each real-shaped name is a node the API server takes."""
    for name in NODE_NAMES:
        dry_run_create(kube, gpu_node(name))
