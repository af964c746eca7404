"""The write boundary's functions: every output is valid, distinct inputs stay distinct.

The same properties against the real API server: tests/integration/test_values.py.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuheal import values
from tests.corpus import EKS_NODE, FQDN_253, GPU_UUIDS


def test_a_valid_value_is_kept_as_is() -> None:
    assert values.taint_value("xid79-1733022000") == "xid79-1733022000"
    assert values.node_label("ip-10-0-12-34.us-west-2.compute.internal") == (
        "ip-10-0-12-34.us-west-2.compute.internal"
    )


def test_a_fault_id_from_an_eks_node_becomes_a_63_byte_taint_value() -> None:
    fault_id = f"{EKS_NODE}-xid79-20261201T023012Z-4f1c"
    value = values.taint_value(fault_id)
    assert len(fault_id) > 63 and len(value) <= 63 and values.is_label_value(value)
    assert value.startswith("ip-192-168-12-34")


def test_object_names_keep_their_unique_suffix() -> None:
    name = values.object_name(FQDN_253, "17b9a3c0e4d2f1a8")
    assert len(name) <= 253 and values.is_subdomain(name) and name.endswith(".17b9a3c0e4d2f1a8")


def test_event_notes_are_cut_by_bytes_at_a_character_boundary() -> None:
    note = values.utf8_text("温度" * 1000, values.EVENT_NOTE_MAX_BYTES)
    assert len(note.encode()) <= values.EVENT_NOTE_MAX_BYTES and note.endswith(values.ELLIPSIS)


def test_odd_fault_ids_are_normalized_and_stay_distinct() -> None:
    a, b = "x" * 300 + "a", "x" * 300 + "b"
    assert values.fault_id(a) != values.fault_id(b)
    assert all(len(values.fault_id(v)) <= values.FIELD_MAX for v in (a, b))
    assert values.fault_id("line\nbreak") != "line\nbreak"
    assert values.fault_id(GPU_UUIDS[0]) == GPU_UUIDS[0]


@given(st.text(max_size=600))
def test_every_label_value_is_valid(raw: str) -> None:
    assert values.is_label_value(values.label_value(raw))


@given(st.text(min_size=1, max_size=600), st.text(min_size=1, max_size=600))
def test_distinct_inputs_give_distinct_label_values(a: str, b: str) -> None:
    if a != b:
        assert values.label_value(a) != values.label_value(b)


@given(st.text(max_size=600), st.from_regex(r"[0-9a-f]{16}", fullmatch=True))
def test_every_object_name_is_a_subdomain(prefix: str, suffix: str) -> None:
    assert values.is_subdomain(values.object_name(prefix, suffix))


@given(st.text(max_size=2000))
def test_texts_fit_their_limits(raw: str) -> None:
    assert len(values.text(raw)) <= values.FIELD_MAX
    assert len(values.utf8_text(raw, 1024).encode()) <= 1024
    assert 0 < len(values.fault_id(raw)) <= values.FIELD_MAX


def test_a_trailing_newline_is_not_part_of_a_valid_label_value_or_name() -> None:
    # Python's `$` also matches before a final "\n": the API server's check does not.
    assert not values.is_label_value("xid79\n") and not values.is_subdomain(f"{EKS_NODE}\n")
    assert values.is_label_value(values.taint_value("xid79\n"))
