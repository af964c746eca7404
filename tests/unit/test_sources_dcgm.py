"""DCGM query results -> findings, signals and fault ids (pure), on the series
dcgm-exporter really publishes."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

import aiohttp
import pytest

from gpuheal.config import parse_config
from gpuheal.controller.dcgm_source import DcgmSource
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.model import Severity
from gpuheal.sim.process import free_port
from gpuheal.sources.dcgm import (
    BLANK,
    NON_FINITE,
    NOT_AN_XID,
    Query,
    episode,
    host_matchers,
    interpret,
    is_node_fault,
    old_episode,
    queries,
    run_starts,
    signal_for,
)
from gpuheal.values import FIELD_MAX, LABEL_VALUE_MAX, is_label_value
from tests.corpus import EKS_NODES, FQDN_253, GPU_UUIDS, MIG_UUIDS, NODE_NAMES, dcgm_labels
from tests.port import Port

XID, DBE, TEMPCRIT = (q for q in queries(85, 95) if q.name in ("xid", "dbe", "tempcrit"))
WEEK_MS = 7 * 86400 * 1000


def sample(labels: dict[str, str], value: str, name: str = "DCGM_FI_DEV_XID_ERRORS") -> object:
    return {"metric": {"__name__": name, **labels}, "value": [1796092786.0, value]}


def test_findings_name_node_and_device_with_either_hostname_spelling() -> None:
    node, other = EKS_NODES[:2]
    lower = {k if k != "Hostname" else "hostname": v for k, v in dcgm_labels(other, 5).items()}
    del lower["UUID"]
    result = [
        sample(dcgm_labels(node, 3), "3", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
        sample(lower, "1", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
        {"metric": {"gpu": "1"}, "value": [1.0, "1"]},  # no host: not ours to place
        {"garbage": True},
        "not a series",
    ]
    reading = interpret(DBE, result)
    assert [(f.node, f.gpu, f.value, f.host_label) for f in reading.findings] == [
        (node, GPU_UUIDS[3], 3.0, "Hostname"),
        (other, "5", 1.0, "hostname"),
    ]
    assert signal_for(reading.findings[0], "f").devices == (GPU_UUIDS[3],)
    assert signal_for(reading.findings[1], "f").devices == ()
    assert interpret(DBE, {"not": "a list"}).findings == []


def test_a_dcgm_xid_is_classified_by_the_xid_catalogue_overrides_first() -> None:
    app, hw = interpret(
        XID,
        [sample(dcgm_labels(EKS_NODES[0], 0), "13"), sample(dcgm_labels(EKS_NODES[0], 1), "79")],
    ).findings
    assert not is_node_fault(app.value) and is_node_fault(hw.value)
    assert (signal_for(hw, "b").reason, signal_for(hw, "b").severity) == (
        "XidCritical79",
        Severity.P0,
    )
    # The pod the exporter names on the series is the finding's.
    assert (app.namespace, app.pod) == ("ml-training", "llama-70b-pretrain-worker-3")
    overrides = parse_config({"xid": {13: {"reason": "Xid13Here", "severity": "P1"}}}).xid_overrides
    assert is_node_fault(app.value, overrides)
    assert signal_for(app, "a", overrides=overrides).reason == "Xid13Here"


@pytest.mark.parametrize(
    ("query", "value", "why"),
    [
        (XID, "+Inf", NON_FINITE),
        (XID, "-Inf", NON_FINITE),
        (XID, "NaN", NON_FINITE),
        (XID, "1e400", NON_FINITE),  # what an exporter's overflowing float reads as
        (XID, "NaNx", NON_FINITE),
        (XID, "-5", NOT_AN_XID),
        (XID, "79.5", NOT_AN_XID),
        (XID, "2147483632", NOT_AN_XID),  # DCGM's INT32 blank
        (XID, "9223372036854775794", BLANK),  # DCGM's INT64 "not supported"
        (DBE, "+Inf", NON_FINITE),
        (DBE, "9223372036854775794", BLANK),
        (TEMPCRIT, "1e400", NON_FINITE),
        (TEMPCRIT, "140737488355328", BLANK),  # DCGM's FP64 blank
    ],
)
def test_a_sample_no_fault_can_be_made_of_is_dropped_alone(
    query: Query, value: str, why: str
) -> None:
    bad, good = dcgm_labels(EKS_NODES[0], 2), dcgm_labels(EKS_NODES[1], 0)
    reading = interpret(query, [sample(bad, value), sample(good, "79")])
    assert [f.node for f in reading.findings] == [EKS_NODES[1]]
    (dropped,) = reading.dropped
    assert dropped.why == why and dropped.value == value
    assert f'Hostname="{EKS_NODES[0]}"' in dropped.series and GPU_UUIDS[2] in dropped.series


def test_every_finding_makes_a_signal() -> None:
    """Before: signal_for raised OverflowError on +Inf (which killed the poller)
    and ValueError on NaN (which aborted every poll)."""
    values = ["+Inf", "NaN", "1e400", "-1", "0.5", "79", "1e18", "65535", "65536"]
    for query in queries(85, 95):
        result = [sample(dcgm_labels(EKS_NODES[0], i), v) for i, v in enumerate(values)]
        for finding in interpret(query, result).findings:
            assert signal_for(finding, "f").reason


@pytest.mark.parametrize("gpu", [*GPU_UUIDS, *MIG_UUIDS, "7", "", "a" * 300])
@pytest.mark.parametrize("query", [q.name for q in queries(85, 95)])
def test_episode_fault_ids_are_short_valid_label_values(query: str, gpu: str) -> None:
    start_ms = 1796092786000
    found = episode(query, gpu, start_ms)
    assert is_label_value(found.fault_id) and len(found.fault_id) <= min(LABEL_VALUE_MAX, 40)
    assert len(found.fault_id) <= FIELD_MAX
    assert found == episode(query, gpu, start_ms)  # a function of the episode alone
    assert found.fault_id != episode(query, gpu, start_ms + 1000).fault_id
    assert found.detected_at == "2026-12-01T02:39:46.000Z"
    old = old_episode(query, gpu, start_ms, WEEK_MS)
    assert is_label_value(old.fault_id) and len(old.fault_id) <= LABEL_VALUE_MAX


def test_distinct_gpus_and_queries_get_distinct_ids() -> None:
    ids = {episode(q.name, g, 0).fault_id for q in queries(85, 95) for g in GPU_UUIDS}
    assert len(ids) == len(queries(85, 95)) * len(GPU_UUIDS)


def test_an_episode_older_than_the_lookback_keeps_one_id_for_its_period() -> None:
    period = 2900 * WEEK_MS  # a period start: multiples of the lookback since the epoch
    first = old_episode("xid", GPU_UUIDS[0], period + 1000, WEEK_MS)
    assert first == old_episode("xid", GPU_UUIDS[0], period + WEEK_MS - 1, WEEK_MS)
    assert first != old_episode("xid", GPU_UUIDS[0], period + WEEK_MS, WEEK_MS)
    assert first.detected_at == "" and "before" in first.fault_id
    # Never the id of an episode with a known start.
    assert first.fault_id != episode("xid", GPU_UUIDS[0], period - WEEK_MS).fault_id


@pytest.mark.parametrize("node", NODE_NAMES)
def test_the_episode_lookup_selects_exactly_its_nodes(node: str) -> None:
    matchers = host_matchers("Hostname", [node, "ip-10-0-0-1.ec2.internal"])
    assert matchers.startswith('Hostname=~"') and matchers.endswith('"')
    query = XID.restricted(matchers, offset_ms=30000)
    assert (
        query.startswith("DCGM_FI_DEV_XID_ERRORS{Hostname=~") and '"} offset 30000ms != 0' in query
    )


def test_run_starts_are_read_per_finding_key_latest_first() -> None:
    node = FQDN_253
    old, new = dcgm_labels(node, 1), {**dcgm_labels(node, 1), "pod": "llama-70b-pretrain-worker-4"}
    result = [
        {"metric": old, "value": [1796092800.0, "1796092000"]},
        {"metric": new, "value": [1796092800.0, "1796092786"]},
        {"metric": dcgm_labels(node, 2), "value": [1796092800.0, "NaN"]},
    ]
    assert run_starts(XID, result) == {f"{node}/xid/{GPU_UUIDS[1]}": 1796092786000}


def test_detected_at_is_the_episode_start() -> None:
    found = episode("xid", GPU_UUIDS[0], 1796092786000)
    parsed = dt.datetime.fromisoformat(found.detected_at.replace("Z", "+00:00"))
    assert parsed.timestamp() == 1796092786


def test_a_device_id_that_is_no_uuid_names_no_device() -> None:
    labels = {**dcgm_labels(EKS_NODES[0], 0), "UUID": "GPU-" + "a" * 300}
    (finding,) = interpret(DBE, [sample(labels, "2")]).findings
    assert signal_for(finding, "f").devices == ()
    assert is_label_value(episode("dbe", finding.gpu, 0).fault_id)


def test_an_unreachable_prometheus_is_backed_off_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing listens on the port: each poll is one refused connection, and
    the waits between polls double up to the cap, however long it lasts."""
    metrics = ControllerMetrics()
    dcgm = DcgmSource(
        f"http://127.0.0.1:{free_port()}",
        1.0,
        queries(85, 95),
        port=Port(),
        metrics=metrics,
    )

    async def polls(count: int) -> list[float]:
        async with aiohttp.ClientSession() as session:
            return [await dcgm.poll_safely(session) for _ in range(count)]

    caplog.set_level(logging.DEBUG, logger="gpuheal.controller.dcgm_source")
    assert asyncio.run(polls(10)) == [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    refused = {"reason": "connection"}
    assert metrics.registry.get_sample_value("gpuheal_dcgm_poll_errors_total", refused) == 10
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and getattr(warned[0], "reason", "") == "connection"
    dcgm.failures = 5000  # months of it: 2.0**5000 would raise OverflowError
    assert asyncio.run(polls(1)) == [300]


def test_a_reload_that_drops_a_query_withdraws_its_findings() -> None:
    resolved: list[tuple[str, str]] = []

    def resolve(node: str, fault_id: str) -> int:
        resolved.append((node, fault_id))
        return 1

    dcgm = DcgmSource(
        "http://127.0.0.1:9",
        1.0,
        queries(85, 95),
        port=Port(resolve=resolve),
        metrics=ControllerMetrics(),
    )
    held = episode("appxids", GPU_UUIDS[0], 1796092786000)
    dcgm.episodes["appxids"] = {f"{EKS_NODES[0]}/appxids/{GPU_UUIDS[0]}": held}
    dcgm.configure(queries(85, 95, application_xids_per_gpu=0), None)
    assert resolved == [(EKS_NODES[0], held.fault_id)] and "appxids" not in dcgm.episodes
    assert "appxids" not in {q.name for q in dcgm.queries}


def test_no_look_before_the_node_cache_has_synced() -> None:
    """Before: the source polled while the controller's node cache was empty, its
    findings' nodes unknown and dropped, and that empty look settled it: a
    restarted controller released the quarantine of an Xid still present."""
    looks: list[str] = []
    dcgm = DcgmSource(
        f"http://127.0.0.1:{free_port()}",
        0.01,
        queries(85, 95),
        port=Port(managed=lambda _: False, settled=lambda: looks.append("looked")),
        metrics=ControllerMetrics(),
    )

    async def run() -> tuple[int, int]:
        synced = asyncio.Event()
        task = asyncio.create_task(dcgm.run(synced))
        await asyncio.sleep(0.3)
        before = dcgm.failures + len(looks)
        synced.set()
        for _ in range(100):
            await asyncio.sleep(0.05)
            if dcgm.failures:
                break
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return before, dcgm.failures

    before, after = asyncio.run(run())
    assert before == 0  # not one request while the cache had not synced
    assert after >= 1  # then the first poll (refused: nothing listens)
