"""One classification of Xids for every controller source: an alert's `xid` label,
the DCGM gauge and windowed count, a manual request's `xid` all go through NVIDIA's
catalogue with the config's `xid` rows first; an Xid that is no node fault is an
`Observed`, never a signal; the queries read dcgm-exporter as it really exports."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from gpuheal.api.server import decode_webhook
from gpuheal.config import parse_config
from gpuheal.controller.observed_xids import ObservedXids
from gpuheal.kube.events import ObjectRef
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.model import PodView, Severity
from gpuheal.sim.monitoring import (
    DEFAULT_COUNTERS,
    OPTIONAL_COUNTERS,
    XID_WINDOW,
    FakeDcgmExporter,
)
from gpuheal.sources import alertmanager, dcgm, manual
from gpuheal.sources.dcgm import (
    XID,
    Episode,
    XidGauge,
    application_xids,
    episode,
    node_xid_query,
    not_node_faults,
    queries,
    series_counts,
    window_xids,
)
from gpuheal.sources.xids import Observed, workload, xid_of
from gpuheal.vocabulary import Reason
from gpuheal.xid import CATALOGUE, Kind, classify
from tests.corpus import EKS_NODES, GPU_UUIDS, alert, dcgm_labels, webhook

NODE = EKS_NODES[0]
OVERRIDES = parse_config(
    {
        "xid": {
            13: {"reason": "Xid13OnOurFleet", "severity": "P1"},
            79: {"reason": "Xid79Tolerated", "severity": "P2"},
            150: {"reason": "OurAppXid150", "severity": "P2", "application": True},
        }
    }
).xid_overrides


# -- the Xid label, the pod --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "xid"),
    [("79", 79), (" 13 ", 13), ("0", None), ("65536", None), ("79.0", None), ("-5", None),
     ("1e2", None), ("x", None), ("", None), ("٧٩", None)],
)  # fmt: skip
def test_an_xid_label_is_an_integer_from_1_to_65535_in_ascii_digits(
    text: str, xid: int | None
) -> None:
    assert xid_of(text) == xid


def test_the_pod_is_the_workloads_whichever_way_prometheus_kept_its_labels() -> None:
    labels = dcgm_labels(NODE, 3)
    assert workload(labels) == ("ml-training", "llama-70b-pretrain-worker-3")
    # Scraped without honorLabels: the plain labels name the exporter's own pod.
    scraped = labels | {"exported_namespace": "ml", "exported_pod": "trainer-0",
                        "namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x2k"}  # fmt: skip
    assert workload(scraped) == ("ml", "trainer-0")
    old = {"pod_namespace": "ml", "pod_name": "trainer-1"}  # --use-old-namespace
    assert workload(old) == ("ml", "trainer-1")
    assert workload({"namespace": "ml"}) == ("", "")
    assert workload({"namespace": "ml", "pod": "Not_A_Pod"}) == ("", "")


# -- the catalogue's sets, the overrides --------------------------------------------


def test_the_node_fault_filter_leaves_out_exactly_the_xids_that_are_no_node_fault() -> None:
    others = not_node_faults()
    assert {13, 31, 43, 45, 63, 94} <= set(others)
    assert not {79, 48, 95, 64, 119, 74} & set(others)
    assert others == sorted(c for c, row in CATALOGUE.items() if not row.node_fault)
    assert set(application_xids()) == {c for c in others if CATALOGUE[c].application}
    # An unknown Xid is a node fault: never in the list of the others.
    assert 999 not in others and classify(999).node_fault
    # The config's rows first, both ways.
    overridden = not_node_faults(OVERRIDES)
    assert 13 not in overridden and 79 in overridden and 150 in overridden
    assert 150 in application_xids(OVERRIDES) and 79 not in application_xids(OVERRIDES)


def test_the_gauge_query_for_node_faults_chains_the_others_out() -> None:
    gauge = next(q for q in queries(85, 95) if q.name == XID)
    node = node_xid_query(gauge)
    assert node.name == XID and node.expr.startswith("DCGM_FI_DEV_XID_ERRORS{} != 0 != 8 != 11")
    assert " != 13 " in node.expr and " != 79 " not in node.expr
    assert " != 79 " in node_xid_query(gauge, OVERRIDES).expr + " "


def test_the_queries_read_dcgm_exporters_counters_and_say_which_are_optional() -> None:
    found = {q.name: q for q in queries(85, 95)}
    assert list(found) == [
        "xid", "dbe", "remapfail", "remappend", "tempcrit", "tempwarn", "nvreplay", "nvrecover",
        "hwslow", "hwthermal", "hwbrake", "appxids",
    ]  # fmt: skip
    exported = {c.name for c in OPTIONAL_COUNTERS}
    default = {c.name for c in DEFAULT_COUNTERS}
    for query in found.values():
        assert query.needs and set(query.needs) <= exported, query.name
        assert query.optional == (not set(query.needs) <= default), query.name
        # The lifetime counts of remapped rows are the GPU repairing itself: read by none.
        assert "REMAPPED_ROWS" not in query.template
    assert [q for q in found.values() if not q.optional] == [
        found["xid"], found["remapfail"], found["tempcrit"], found["tempwarn"]
    ]  # fmt: skip
    assert (found["remapfail"].severity, found["remappend"].severity) == (Severity.P0, Severity.P1)
    assert found["remappend"].reason == "RowRemapPending"
    rate = found["appxids"]
    assert (rate.reason, rate.severity) == ("RepeatedApplicationXids", Severity.P1)
    assert rate.expr.endswith(">= 10") and 'xid=~"8|11|13|' in rate.expr and "|79|" not in rate.expr
    assert "appxids" not in {q.name for q in queries(85, 95, application_xids_per_gpu=0)}
    assert (
        "|150" in next(q for q in queries(85, 95, overrides=OVERRIDES) if q.name == "appxids").expr
    )


# -- the Xid gauge: sticky, a run ----------------------------------------------------


def test_a_node_fault_value_holds_for_the_gauges_run_whatever_follows() -> None:
    at, step = 1796092800000, 30000
    gpu = GPU_UUIDS[0]
    gauge = XidGauge(13)  # an application's Xid: no fault

    def now(i: int, value: int) -> tuple[Episode | None, Episode | None, int]:
        """The gauge at instant i: (the fault it replaces, its fault, the fault's value)."""
        replaced = gauge.step(value, classify(value).node_fault, at + i * step, gpu)
        return replaced, gauge.fault, gauge.fault_value

    assert now(0, 13) == (None, None, 0)
    first = episode(XID, gpu, at + step)
    assert now(1, 48) == (None, first, 48)  # a DBE: the fault, named by now
    # The application fails too: its Xid replaces the 48 in the gauge, not the fault.
    assert now(2, 43) == (None, first, 48)
    # Staying at one value: one episode.
    assert all(now(i, 43) == (None, first, 48) for i in range(3, 10))
    # A node-fault value again, after another: a new Xid, a new fault (the first ends).
    again = episode(XID, gpu, at + 10 * step)
    assert now(10, 79) == (first, again, 79)
    # From one node-fault value to another: the same fault, the latest value.
    assert now(11, 95) == (None, again, 95)


# -- the windowed count, the presence ----------------------------------------------


def _series(text: str) -> list[dict[str, Any]]:
    """An exposition page as Prometheus answers an instant query of it."""
    found = []
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        head, value = line.rsplit(" ", 1)
        name, _, rest = head.partition("{")
        labels = dict(pair.split("=", 1) for pair in rest.rstrip("}").split(",") if pair)
        metric = {"__name__": name} | {k: v.strip('"') for k, v in labels.items()}
        found.append({"metric": metric, "value": [1796092800.0, value]})
    return found


def test_the_windowed_count_is_read_as_dcgm_exporters_xid_collector_writes_it() -> None:
    exporter = FakeDcgmExporter(OPTIONAL_COUNTERS)
    quiet = exporter.add_gpu(dcgm_labels(NODE, 0))
    busy = exporter.add_gpu(dcgm_labels(NODE, 1))
    for code in (13, 13, 31, 79):
        exporter.xid(busy, code)
    page = exporter.render()
    assert "# TYPE DCGM_EXP_XID_ERRORS_COUNT gauge" in page
    window = [s for s in _series(page) if s["metric"]["__name__"] == XID_WINDOW.name]
    # A GPU without an Xid in the window: one 0 without an `xid` label.
    (zero,) = [s for s in window if s["metric"]["UUID"] == quiet.labels["UUID"]]
    assert "xid" not in zero["metric"] and zero["value"][1] == "0"
    assert zero["metric"]["window_size_in_ms"] == "300000"
    read = window_xids([s for s in window if float(s["value"][1]) > 0])
    assert [(w.gpu, w.xid, w.count) for w in read] == [
        (GPU_UUIDS[1], 13, 2), (GPU_UUIDS[1], 31, 1), (GPU_UUIDS[1], 79, 1)
    ]  # fmt: skip
    assert {(w.namespace, w.pod) for w in read} == {("ml-training", "llama-70b-pretrain-worker-3")}
    assert window_xids([{"metric": {"Hostname": NODE, "xid": "x"}, "value": [0, "3"]}]) == []


def test_the_presence_of_each_counter_is_counted_by_name() -> None:
    result = [
        {"metric": {"__name__": "DCGM_FI_DEV_XID_ERRORS"}, "value": [0, "16"]},
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP"}, "value": [0, "NaN"]},
        {"metric": {}, "value": [0, "1"]},
    ]
    assert series_counts(result) == {"DCGM_FI_DEV_XID_ERRORS": 16}
    assert dcgm.presence_query(["B", "A", "A"]) == 'count by (__name__) ({__name__=~"A|B"})'


# -- Alertmanager ----------------------------------------------------------------


def _alerts(*labels: dict[str, str]) -> list[alertmanager.Outcome]:
    hook = decode_webhook(
        json.dumps(
            webhook([alert(x, fingerprint=f"{i:016x}") for i, x in enumerate(labels)])
        ).encode()
    )
    return alertmanager.interpret(
        hook, node_labels=("Hostname",), find_node=lambda _l, v: v, overrides=OVERRIDES
    )


def test_an_alert_naming_an_xid_is_classified_by_the_catalogue_not_its_severity() -> None:
    rule = dcgm_labels(NODE, 3) | {"alertname": "GPUXidError", "severity": "critical"}
    app, hw, ignored, unknown, plain, broken = _alerts(
        rule | {"xid": "31"},
        rule | {"xid": "48", "severity": "warning", "gpuheal_reason": "Whatever"},
        rule | {"xid": "43"},
        rule | {"xid": "999"},
        rule,  # no Xid named: its severity label stands
        rule | {"xid": "13.5"},
    )
    assert app.signal is None and app.observed is not None
    seen = app.observed
    assert (seen.source, seen.node, seen.xid, seen.row.kind) == (
        "alertmanager", NODE, 31, Kind.APPLICATION
    )  # fmt: skip
    assert (seen.device, seen.namespace, seen.pod) == (
        GPU_UUIDS[3], "ml-training", "llama-70b-pretrain-worker-3"
    )  # fmt: skip
    assert hw.signal is not None and hw.observed is None
    assert (hw.signal.reason, hw.signal.severity) == ("EccDoubleBit48", Severity.P0)
    assert ignored.observed is not None and ignored.observed.row.kind is Kind.INFORMATIONAL
    assert unknown.signal is not None and unknown.signal.severity is Severity.P1
    assert plain.signal is not None and plain.signal.severity is Severity.P0
    assert plain.signal.reason == "GPUXidError"
    assert broken.invalid and broken.skipped.startswith("$.alerts[5].labels.xid: want an Xid")


def test_the_configs_xid_rows_win_for_alerts() -> None:
    rule = dcgm_labels(NODE, 0) | {"alertname": "GPUXidError", "severity": "critical"}
    thirteen, seventy_nine = _alerts(rule | {"xid": "13"}, rule | {"xid": "79"})
    assert thirteen.signal is not None
    assert (thirteen.signal.reason, thirteen.signal.severity) == ("Xid13OnOurFleet", Severity.P1)
    assert seventy_nine.signal is None and seventy_nine.observed is not None


# -- the manual API ----------------------------------------------------------------


def _manual(xid: int, **given: Any) -> Any:
    return manual.checked_xid(
        node=NODE,
        action=given.pop("action", manual.QUARANTINE),
        fault_id="",
        xid=xid,
        detail=given.pop("detail", None),
        given=frozenset(given),
        overrides=OVERRIDES,
    )


def test_a_manual_request_naming_an_xid_is_classified_and_refused_when_it_says_more() -> None:
    assert _manual(95).reason == "EccUncontained95" and _manual(95).node_fault
    assert not _manual(31).node_fault
    assert _manual(13).severity is Severity.P1  # the config's row
    for wrong, message in [
        ({"severity": "P0"}, "$.severity: not with xid"),
        ({"reason": "R"}, "$.reason: not with xid"),
        ({"action": manual.CLEAR}, "$.xid: only with action quarantine"),
        ({"detail": " padded "}, "$.detail: want 1 to 256"),
    ]:
        with pytest.raises(ValueError, match=message.replace("$", r"\$")):
            _manual(79, **wrong)
    for bad in (0, 65536, -1):
        with pytest.raises(ValueError, match=r"\$\.xid: want an Xid"):
            _manual(bad)


# -- what the controller does with an Observed ---------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[ObjectRef, str, str, bool]] = []

    def emit(self, regarding: ObjectRef, *, reason: str, note: str, action: str,
             warning: bool = False, related: ObjectRef | None = None) -> None:  # fmt: skip
        self.sent.append((regarding, reason, note, warning))


def test_an_observed_xid_is_counted_once_and_told_only_to_a_gpu_pod_on_its_node() -> None:
    metrics, recorder = ControllerMetrics(), Recorder()
    pod = PodView("ml", "trainer-0", "uid-1", NODE, "Running", "7", gpu=True)
    pods = {pod.key: pod, "ml/cpu-only": replace(pod, name="cpu-only", gpu=False)}
    observed = ObservedXids(metrics, recorder, pods.get, ttl_s=3600)  # type: ignore[arg-type]
    seen = Observed("alertmanager", NODE, 13, classify(13), GPU_UUIDS[0], "ml", "trainer-0")
    assert observed.observe(seen, "am-1") and not observed.observe(seen, "am-1")  # a repeat
    assert observed.observe(replace(seen, source="dcgm", count=3))
    ignorable = replace(seen, xid=43, row=classify(43), source="manual", namespace="", pod="")
    assert observed.observe(ignorable)
    for elsewhere in (replace(seen, node=EKS_NODES[1]), replace(seen, pod="cpu-only"),
                      replace(seen, pod="gone")):  # fmt: skip
        assert observed.observe(elsewhere)

    def count(source: str, xid: str, kind: str) -> float:
        labels = {"source": source, "xid": xid, "kind": kind}
        return metrics.registry.get_sample_value("gpuheal_xids_observed_total", labels) or 0.0

    assert count("alertmanager", "13", "application") == 4  # the repeat not counted
    assert count("dcgm", "13", "application") == 3
    assert count("manual", "43", "informational") == 1
    told = [(ref.kind, ref.namespace, ref.name, ref.uid, reason, warning)
            for ref, reason, _, warning in recorder.sent]  # fmt: skip
    assert told == [
        ("Pod", "ml", "trainer-0", "uid-1", Reason.APPLICATION_XID, True),
        ("Pod", "ml", "trainer-0", "uid-1", Reason.APPLICATION_XID, True),
    ]
    assert "Xid 13 (XidApplication13) on GPU" in recorder.sent[0][2]
    assert "Not a node fault" in recorder.sent[0][2]
    assert Reason.INFORMATIONAL_XID.value == "GPUInformationalXid"
