"""The health gate: each check's pass, fail and skip, exit-code bits, bad input."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuheal.config import Config, HealthGateConfig, PoolConfig, PoolsConfig
from gpuheal.model import (
    COUNTERS_SINCE,
    DIAGNOSTICS,
    DRIVER_UPGRADE_SKIP,
    DRIVER_UPGRADE_STATE,
    DRIVER_VERSION,
    ECC_ERRORS,
    LAST_GPU_ERROR,
    MAINTENANCE_BASELINE,
    XID_ERRORS,
    Condition,
    DeviceKey,
    DeviceTaint,
    DraDevice,
    NodeView,
    PodView,
)
from gpuheal.policy.gate import (
    CHECK_BITS,
    CheckResult,
    DevicePluginPod,
    GateFacts,
    GateResult,
    Validated,
    bits_of,
    checks_of,
    evaluate,
    facts_from_views,
)

NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)
SINCE = NOW - dt.timedelta(hours=1)
CONFIG = Config()
LABELS = {"nvidia.com/gpu.product": "H100", "nvidia.com/gpu.count": "8"}


def stamp(moment: dt.datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def facts(**changes: object) -> GateFacts:
    base = GateFacts(
        node="n1",
        ready=True,
        labels=dict(LABELS),
        annotations={},
        allocatable={"nvidia.com/gpu": 8},
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def check(result: GateResult, name: str) -> tuple[CheckResult, str]:
    found = next(c for c in result.checks if c.name == name)
    return found.result, found.reason


def run(f: GateFacts, config: Config = CONFIG, since: dt.datetime | None = SINCE) -> GateResult:
    return evaluate(f, config, NOW, since)


def test_a_plain_healthy_node_passes_with_what_cannot_be_checked_skipped() -> None:
    result = run(facts())
    assert result.passed and result.bits == 0
    states = {c.name: c.result for c in result.checks}
    assert states == {
        "ready": CheckResult.PASS,
        "gpu-count": CheckResult.PASS,
        "driver": CheckResult.SKIPPED,
        "driver-upgrade": CheckResult.SKIPPED,
        "gpu-errors": CheckResult.SKIPPED,
        "diagnostics": CheckResult.SKIPPED,
        "device-plugin": CheckResult.SKIPPED,
        "environment": CheckResult.SKIPPED,
        "validation": CheckResult.SKIPPED,
    }
    assert [c.name for c in result.checks] == list(CHECK_BITS)


@pytest.mark.parametrize(
    ("state", "bits", "said"),
    [
        ("upgrade-required", 4, "gpu-operator is upgrading the node's driver"),
        ("drain-required", 4, "nvidia.com/gpu-driver-upgrade-state=drain-required"),
        ("validation-required", 4, "it returns once upgrade-done"),
        ("upgrade-failed", 4, "driver upgrade of the node failed"),
        ("upgrade-done", 0, "done"),
    ],
)
def test_a_node_gpu_operator_is_upgrading_stays_until_its_label_says_done(
    state: str, bits: int, said: str
) -> None:
    """k8s-operator-libs' states (pkg/upgrade/consts.go): every one but upgrade-done
    is an upgrade not done (NVIDIA's isIncompleteDriverUpgradeState)."""
    result = run(facts(labels=LABELS | {DRIVER_UPGRADE_STATE: state}))
    assert result.bits == bits
    assert said in check(result, "driver-upgrade")[1]
    # A node opted out of gpu-operator's upgrades (.skip=true) is not waited for.
    skipped = facts(labels=LABELS | {DRIVER_UPGRADE_STATE: state, DRIVER_UPGRADE_SKIP: "true"})
    assert run(skipped).bits == 0


def test_not_ready_fails_bit_1() -> None:
    assert run(facts(ready=False)).bits == 1
    result = run(facts(ready=None))
    assert result.bits == 1 and "Unknown or missing" in check(result, "ready")[1]


def test_gpu_count_below_the_label_fails_bit_2() -> None:
    result = run(facts(allocatable={"nvidia.com/gpu": 7}))
    assert result.bits == 2
    assert check(result, "gpu-count") == (
        CheckResult.FAIL,
        "7 nvidia.com/gpu allocatable, expected 8",
    )


def test_gpu_count_from_pool_config_and_its_mig_resource() -> None:
    mig = "nvidia.com/mig-1g.10gb"
    config = Config(pools=PoolsConfig(by_name={"H100": PoolConfig(gpus_per_node=56, resource=mig)}))
    assert run(facts(allocatable={mig: 56, "nvidia.com/gpu": 0}), config).passed
    result = run(facts(allocatable={mig: 49}), config)
    assert result.bits == 2 and mig in check(result, "gpu-count")[1]


def test_a_dra_node_with_a_gpu_in_mig_mode_counts_physical_gpus() -> None:
    """GPU 0 carved into seven MIG devices, seven GPUs whole: eight GPUs, as
    gpusPerNode and GFD count them; a fenced MIG device makes its GPU unusable."""
    node = "ip-10-0-12-34.us-west-2.compute.internal"
    gpu = "GPU-5c1e0f27-8a3b-4d2e-9f61-0c7d2b4a{:04x}".format
    whole = [
        DraDevice(DeviceKey("gpu.nvidia.com", node, f"gpu-{i}"), node, gpu(i), "gpu")
        for i in range(1, 8)
    ]
    carved = [
        DraDevice(DeviceKey("gpu.nvidia.com", node, f"gpu-0-mig-1g10gb-19-{i}"), node,
                  f"MIG-3e0b9a41-5c2d-5f7a-8b16-2d9c4e1f{i:04x}", "mig", parent_uuid=gpu(0))
        for i in range(7)
    ]  # fmt: skip
    result = run(facts(allocatable={}, devices=(*carved, *whole)))
    assert check(result, "gpu-count") == (
        CheckResult.PASS,
        "8 DRA GPUs usable (1 in MIG mode), as expected",
    )
    fenced = replace(carved[2], taints=(DeviceTaint("gpuheal.io/gpu-fault", "f1"),))
    result = run(facts(allocatable={}, devices=(*carved[:2], fenced, *carved[3:], *whole)))
    assert check(result, "gpu-count") == (
        CheckResult.FAIL,
        "7 of 8 DRA GPUs usable (1 in MIG mode), expected 8; "
        "tainted: gpu-0-mig-1g10gb-19-2 (gpuheal.io/gpu-fault)",
    )


def test_gpu_count_without_an_expectation_is_skipped_saying_how_to_declare_one() -> None:
    result = run(facts(labels={}, allocatable={}))
    state, reason = check(result, "gpu-count")
    assert (
        state is CheckResult.SKIPPED
        and "gpusPerNode" in reason
        and "nvidia.com/gpu.count" in reason
    )


def test_driver_against_the_prevailing_version_of_the_pool() -> None:
    peers = {"550.54.15": 2}
    same = facts(annotations={DRIVER_VERSION: "550.54.15"}, pool_drivers=peers)
    assert check(run(same), "driver")[0] is CheckResult.PASS
    drifted = facts(annotations={DRIVER_VERSION: "535.161.08"}, pool_drivers=peers)
    result = run(drifted)
    assert result.bits == 4
    assert check(result, "driver")[1] == "driver 535.161.08, but pool H100 runs 550.54.15"


def test_driver_configured_for_the_pool_wins_over_the_peers() -> None:
    config = Config(pools=PoolsConfig(by_name={"H100": PoolConfig(driver_version="560.1")}))
    f = facts(annotations={DRIVER_VERSION: "550.54.15"}, pool_drivers={"550.54.15": 5})
    assert run(f, config).bits == 4


def test_driver_from_gpu_feature_discovery_labels() -> None:
    labels = {**LABELS, "nvidia.com/cuda.driver-version.full": "550.54.15"}
    assert run(facts(labels=labels, pool_drivers={"550.54.15": 1})).passed


def test_driver_unknown_on_the_node_fails_when_the_pool_knows_one() -> None:
    result = run(facts(pool_drivers={"550.54.15": 3}))
    assert result.bits == 4 and "reports no driver version" in check(result, "driver")[1]


def test_no_error_counters_is_skipped() -> None:
    state, reason = check(run(facts()), "gpu-errors")
    assert (
        state is CheckResult.SKIPPED
        and reason == "the agent reports no error counters on this node"
    )


def counters(xid: int, ecc: int, since: dt.datetime, **more: str) -> dict[str, str]:
    return {XID_ERRORS: str(xid), ECC_ERRORS: str(ecc), COUNTERS_SINCE: stamp(since), **more}


def baseline(xid: int, ecc: int, since: dt.datetime) -> str:
    return json.dumps({"xid": xid, "ecc": ecc, "since": stamp(since)})


def test_counters_above_the_maintenance_baseline_fail_bit_8() -> None:
    start = SINCE - dt.timedelta(days=1)
    same = counters(3, 1, start, **{MAINTENANCE_BASELINE: baseline(3, 1, start)})
    assert run(facts(annotations=same)).passed
    more = counters(4, 1, start, **{MAINTENANCE_BASELINE: baseline(3, 1, start)})
    result = run(facts(annotations=more))
    assert result.bits == 8 and "1 new Xid" in check(result, "gpu-errors")[1]


def test_counters_reset_after_since_any_count_fails() -> None:
    rebooted = SINCE + dt.timedelta(minutes=10)
    clean = counters(0, 0, rebooted, **{MAINTENANCE_BASELINE: baseline(9, 0, SINCE)})
    assert run(facts(annotations=clean)).passed
    dirty = counters(0, 1, rebooted, **{MAINTENANCE_BASELINE: baseline(9, 0, SINCE)})
    assert run(facts(annotations=dirty)).bits == 8


def test_last_error_after_since_fails_before_it_passes() -> None:
    old = counters(5, 0, SINCE - dt.timedelta(days=2))
    before = old | {LAST_GPU_ERROR: stamp(SINCE - dt.timedelta(minutes=1))}
    assert run(facts(annotations=before)).passed  # recovery: no baseline, the time decides
    after = old | {LAST_GPU_ERROR: stamp(SINCE + dt.timedelta(minutes=1))}
    result = run(facts(annotations=after))
    assert result.bits == 8 and "after" in check(result, "gpu-errors")[1]


def test_malformed_counters_fail_naming_the_annotation() -> None:
    for key, bad in (
        (XID_ERRORS, "lots"),
        (ECC_ERRORS, "-1"),
        (COUNTERS_SINCE, "yesterday"),
        (LAST_GPU_ERROR, "0001-01-01T00:00:00+05:00"),
        (MAINTENANCE_BASELINE, "{not json"),
    ):
        annotations = counters(0, 0, SINCE - dt.timedelta(days=1)) | {key: bad}
        result = run(facts(annotations=annotations))
        state, reason = check(result, "gpu-errors")
        assert state is CheckResult.FAIL and key in reason, (key, reason)


def diag(result: str, at: dt.datetime, **more: object) -> dict[str, str]:
    return {DIAGNOSTICS: json.dumps({"result": result, "time": stamp(at), "tool": "dcgmi"} | more)}


def test_diagnostics_fresh_and_passing_pass() -> None:
    state, reason = check(run(facts(annotations=diag("pass", NOW))), "diagnostics")
    assert state is CheckResult.PASS and "dcgmi pass" in reason


def test_diagnostics_failing_fail_bit_16() -> None:
    result = run(facts(annotations=diag("fail", NOW)))
    assert result.bits == 16 and "not passing" in check(result, "diagnostics")[1]


def test_stale_diagnostics_fail_only_when_required() -> None:
    required = Config(health_gate=HealthGateConfig(diagnostics_required=True))
    before = facts(annotations=diag("pass", SINCE - dt.timedelta(minutes=5)))
    assert check(run(before), "diagnostics")[0] is CheckResult.SKIPPED
    assert run(before, required).bits == 16
    too_old = facts(annotations=diag("pass", NOW - dt.timedelta(days=2)))
    assert run(too_old, required, since=None).bits == 16
    assert run(facts(), required).bits == 16  # absent


def test_malformed_diagnostics_fail_naming_the_annotation() -> None:
    for bad in ("{", "[]", json.dumps({"time": stamp(NOW)}), json.dumps({"result": "pass"})):
        state, reason = check(run(facts(annotations={DIAGNOSTICS: bad})), "diagnostics")
        assert state is CheckResult.FAIL and DIAGNOSTICS in reason


def test_device_plugin() -> None:
    ready = facts(device_plugin_pods=(DevicePluginPod("kube-system/dp-1", ready=True),))
    assert check(run(ready), "device-plugin")[0] is CheckResult.PASS
    starting = facts(device_plugin_pods=(DevicePluginPod("kube-system/dp-1", ready=False),))
    assert run(starting).bits == 32
    required = Config(health_gate=HealthGateConfig(device_plugin_required=True))
    assert run(facts(), required).bits == 32
    assert check(run(facts()), "device-plugin")[0] is CheckResult.SKIPPED


def test_every_failing_check_is_in_the_bits_and_the_summary() -> None:
    f = facts(ready=False, allocatable={}, annotations=diag("fail", NOW))
    result = run(f)
    # Bit 16 is diagnostics' and validation's: the code names both, one of which failed.
    assert checks_of(result.bits) == ("ready", "gpu-count", "diagnostics", "validation")
    assert result.bits == 1 | 2 | 16
    summary = result.summary()
    assert all(name in summary for name in ("ready", "gpu-count", "diagnostics"))


@given(st.sets(st.sampled_from(sorted(CHECK_BITS))))
def test_bits_and_failing_checks_round_trip(names: set[str]) -> None:
    bits = bits_of(names)
    named = set(checks_of(bits))
    assert named >= names and bits_of(named) == bits
    # Beyond the failing checks, only those sharing one's bit are named.
    shared = {n for n, bit in CHECK_BITS.items() if any(CHECK_BITS[m] == bit for m in names)}
    assert named - names <= shared
    assert 0 <= bits < 64  # 64 | bits stays a valid exit code (< 128)


_KEYS = (
    XID_ERRORS,
    ECC_ERRORS,
    COUNTERS_SINCE,
    LAST_GPU_ERROR,
    MAINTENANCE_BASELINE,
    DIAGNOSTICS,
    DRIVER_VERSION,
    "nvidia.com/gpu.count",
)


@given(
    st.dictionaries(st.sampled_from(_KEYS), st.text(max_size=40)),
    st.dictionaries(st.sampled_from(_KEYS), st.text(max_size=40)),
    st.none() | st.datetimes(timezones=st.just(dt.UTC)),
)
def test_never_crashes_on_arbitrary_annotations(
    annotations: dict[str, str], labels: dict[str, str], since: dt.datetime | None
) -> None:
    result = run(facts(annotations=annotations, labels=labels), since=since)
    assert len(result.checks) == len(CHECK_BITS)
    assert all(c.reason for c in result.checks)
    assert result.bits == bits_of(c.name for c in result.failing)


@given(
    st.one_of(
        st.text(max_size=60),
        st.builds(
            lambda r, t, tool: json.dumps({"result": r, "time": t, "tool": tool}),
            st.one_of(st.text(max_size=8), st.integers(), st.none()),
            st.one_of(st.text(max_size=30), st.integers(), st.none()),
            st.one_of(st.text(max_size=8), st.integers()),
        ),
        st.builds(
            lambda x, e, s: json.dumps({"xid": x, "ecc": e, "since": s}),
            st.one_of(st.integers(), st.text(max_size=4), st.booleans()),
            st.one_of(st.integers(), st.floats(allow_nan=False)),
            st.one_of(st.text(max_size=30), st.integers()),
        ),
    )
)
def test_never_crashes_on_arbitrary_json(value: str) -> None:
    start = SINCE - dt.timedelta(days=1)
    for key in (DIAGNOSTICS, MAINTENANCE_BASELINE):
        result = run(facts(annotations=counters(1, 0, start) | {key: value}))
        assert all(c.reason for c in result.checks)


def test_facts_from_the_controllers_views() -> None:
    node = NodeView(
        "n1",
        "1",
        labels=dict(LABELS),
        annotations={DRIVER_VERSION: "550"},
        conditions=(Condition("Ready", "True"),),
        allocatable=(("nvidia.com/gpu", 8),),
    )
    plugin = PodView("gpu-operator", "dp", "u1", "n1", "Running", ready=True, device_plugin=True)
    other = PodView("ml", "job", "u2", "n1", "Running", ready=True)
    f = facts_from_views(node, (plugin, other), {"550": 2})
    assert f.ready is True and f.allocatable == {"nvidia.com/gpu": 8}
    assert f.device_plugin_pods == (DevicePluginPod("gpu-operator/dp", ready=True),)
    assert run(f).passed


def test_validation_is_skipped_unless_run_and_fails_on_bit_16_with_its_reason() -> None:
    skipped = check(run(facts()), "validation")
    assert skipped == (
        CheckResult.SKIPPED,
        "no validation Job run (healthGate.validation.enabled is false; --validate runs one)",
    )
    failed = run(
        facts(validation=Validated(False, "dcgmi-diag: Memory test failed: fail (exited 1)"))
    )
    assert failed.bits == 16
    assert "validation: dcgmi-diag: Memory test failed" in failed.summary()
    passed = run(facts(validation=Validated(True, "dcgmi-diag: pass")))
    assert passed.passed and check(passed, "validation") == (CheckResult.PASS, "dcgmi-diag: pass")
