"""The device fence's DeviceTaintRule: one per device fault record, valid by
construction for any node, pool, device and fault id."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuheal import values
from gpuheal.model import TAINT_KEY, DeviceKey, fault_record_name
from gpuheal.policy.fence import (
    FAULT_ID_ANNOTATION,
    FENCE_LABEL,
    RECORD_LABEL,
    device_taint_rule,
    rule_name,
)
from tests.unit.test_policy_plan import NODE_NAMES

pytestmark = pytest.mark.unit

NODE = "ip-10-0-12-34.us-west-2.compute.internal"
GPU3 = DeviceKey("gpu.nvidia.com", NODE, "gpu-3")
AT = dt.datetime(2026, 12, 7, 3, 0, tzinfo=dt.UTC)


def test_the_rule_selects_exactly_the_device_and_carries_the_fault() -> None:
    record = fault_record_name(NODE, "xid-79-a1", "gpu.nvidia.com/gpu-3")
    rule = device_taint_rule(
        node=NODE,
        record=record,
        fault_id="xid-79-a1",
        reason="XidCritical79",
        device=GPU3,
        expires=AT,
    )
    assert rule["metadata"]["name"] == rule_name(record) == f"gpuheal-{record}"
    assert rule["spec"]["deviceSelector"] == {
        "driver": "gpu.nvidia.com",
        "pool": NODE,
        "device": "gpu-3",
    }
    assert rule["spec"]["taint"] == {"key": TAINT_KEY, "value": "xid-79-a1", "effect": "NoSchedule"}
    assert rule["metadata"]["labels"][FENCE_LABEL] == "device"
    assert rule["metadata"]["annotations"]["gpuheal.io/expires-at"] == "2026-12-07T03:00:00Z"


def test_one_record_one_rule_name_and_no_effect_but_the_two_fences() -> None:
    record = fault_record_name(NODE, "f", "d")
    assert rule_name(record) == rule_name(record) != rule_name(fault_record_name(NODE, "g", "d"))
    rule = device_taint_rule(
        node=NODE, record=record, fault_id="f", reason="r", device=GPU3, effect="NoExecute"
    )
    assert rule["spec"]["taint"]["effect"] == "NoExecute"
    with pytest.raises(ValueError, match="NoSchedule"):
        device_taint_rule(
            node=NODE, record=record, fault_id="f", reason="r", device=GPU3, effect="None"
        )


@given(node=NODE_NAMES, fault_id=st.text(min_size=1, max_size=600), reason=st.text(max_size=4000))
def test_any_node_and_fault_id_give_a_rule_the_api_server_takes(
    node: str, fault_id: str, reason: str
) -> None:
    record = fault_record_name(node, fault_id, f"gpu.nvidia.com/{node}/gpu-0")
    rule = device_taint_rule(
        node=node,
        record=record,
        fault_id=fault_id,
        reason=reason,
        device=DeviceKey("gpu.nvidia.com", node, "gpu-0"),
    )
    meta = rule["metadata"]
    assert values.is_subdomain(meta["name"])
    assert all(values.is_label_value(v) for v in meta["labels"].values())
    assert values.is_label_value(rule["spec"]["taint"]["value"])
    assert meta["labels"][RECORD_LABEL] == values.label_value(record)
    # The annotations: at most 256 KiB in all (each here far less), no control characters.
    assert sum(len(k) + len(v.encode()) for k, v in meta["annotations"].items()) < 8192
    assert meta["annotations"][FAULT_ID_ANNOTATION] == values.text(fault_id)
