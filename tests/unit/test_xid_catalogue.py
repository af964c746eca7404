"""The Xid catalogue: NVIDIA's data as NVIDIA publishes it, gpuheal's table over it,
and NVIDIA's conditional workflows. The kernel lines are from other projects'
public test data (NVSentinel's syslog-health-monitor tests), as the driver prints them."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pynvml
import pytest

from gpuheal.model import Severity
from gpuheal.xid import CATALOGUE, RECOVERY_ACTIONS, VERSION, Action, Kind, classify
from gpuheal.xid.decode import RECOVERY, matches
from gpuheal.xid.nvidia import NVIDIA
from gpuheal.xid.policy import ACTIONS, REASONS, UNLISTED, WORKFLOWS
from gpuheal.xid.sxid import TABLE as SXIDS
from gpuheal.xid.sxid import classify_sxid

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import xid_catalogue  # noqa: E402
import xid_table  # noqa: E402

# A reason is written into the GPUHealthy condition's reason: the API server's rule.
CONDITION_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
DATA_CENTRE = [x for x in NVIDIA.xids.values() if x.data_centre]


def test_the_committed_data_is_exactly_what_nvidias_files_make() -> None:
    made = xid_catalogue.render(xid_catalogue.catalogue())
    assert (ROOT / "gpuheal/xid/nvidia-catalogue.json").read_text(encoding="utf-8") == made


def test_the_catalogue_is_nvidias_whole_table() -> None:
    assert len(NVIDIA.xids) == 172 and len(DATA_CENTRE) == 109
    assert VERSION == "2025-09-30" and len(NVIDIA.sha256) == 64
    assert NVIDIA.xids[79].mnemonic == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert NVIDIA.xids[79].immediate == "RESTART_BM"
    assert NVIDIA.xids[13].applies_to == ("A100", "H100", "B100", "GB200")
    assert NVIDIA.xids[121].applies_to == ("GB200",)
    assert {r.xid for r in NVIDIA.nvlink5} == set(range(144, 151))


def test_every_nvidia_action_has_one_meaning_here() -> None:
    for xid in NVIDIA.xids.values():
        if xid.code in UNLISTED:
            # A newer workbook that gives one of these an action must be read again.
            assert xid.immediate == "", xid.code
        else:
            assert xid.immediate in ACTIONS or xid.immediate in WORKFLOWS, xid
    assert set(WORKFLOWS) <= set(NVIDIA.buckets)
    assert set(ACTIONS) - {"RESTART_BM"} <= set(NVIDIA.buckets)  # RESTART_BM: a row's own


def test_every_data_centre_xid_follows_nvidias_immediate_action() -> None:
    for xid in DATA_CENTRE:
        row = CATALOGUE[xid.code]
        assert row.nvidia.startswith(xid.immediate or "no action listed"), xid.code
        match xid.immediate:
            case "RESTART_APP":
                assert row.kind is Kind.APPLICATION and not row.node_fault, xid.code
            case "IGNORE":
                assert row.kind is Kind.INFORMATIONAL and not row.node_fault, xid.code
            case "RESET_GPU":
                assert (row.severity, row.action) == (Severity.P0, Action.RESET_GPU), xid.code
            case "RESTART_BM" | "RESTART_VM":
                assert (row.severity, row.action) == (Severity.P0, Action.REBOOT), xid.code
            case "CONTACT_SUPPORT":
                assert row.action is Action.CONTACT_SUPPORT, xid.code


@pytest.mark.parametrize("code", [13, 31, 43, 8, 38, 63, 92, 94, 121, 39, 68, 82, 105, 137])
def test_application_and_ignored_xids_are_never_node_faults(code: int) -> None:
    """The absences: a user program's Xid, a past row remap, a corrected C2C error."""
    assert not classify(code).node_fault
    assert not classify(code, detail="pid=4242, name=python3, Ch 00000008", recent=(13,)).node_fault


@pytest.mark.parametrize(
    ("code", "action"),
    [
        (79, Action.REBOOT),
        (48, Action.RESET_GPU),
        (95, Action.RESET_GPU),
        (109, Action.RESET_GPU),
        (119, Action.RESET_GPU),
        (64, Action.RESET_GPU),
    ],
)
def test_hardware_xids_are_p0_with_nvidias_action(code: int, action: Action) -> None:
    row = classify(code)
    assert (row.severity, row.action, row.kind) == (Severity.P0, action, Kind.NODE)


def test_reasons_are_one_per_code_and_valid_condition_reasons() -> None:
    reasons = {code: row.reason for code, row in CATALOGUE.items()}
    assert len(set(reasons.values())) == len(reasons)
    for reason in [*reasons.values(), *(r.reason for r in RECOVERY_ACTIONS.values())]:
        assert CONDITION_REASON.fullmatch(reason) and len(reason) <= 64, reason
    assert all(reasons[code] == name for code, name in REASONS.items())
    assert reasons[46] == "GpuTimeoutError46" and reasons[39] == "Ce0Error39"


def test_an_unknown_xid_is_a_p1_fault_naming_the_loaded_catalogue() -> None:
    row = classify(999)
    assert row.reason == "XidUnknown999" and row.severity is Severity.P1 and not row.catalogued
    assert VERSION in row.description


def test_config_overrides_win() -> None:
    mine = classify(13, {13: CATALOGUE[79]})
    assert mine is CATALOGUE[79]


# -- Xid 154: NVML's recovery-action enum -------------------------------------


def test_xid_154_reads_nvmls_enum_as_nvml_ships_it() -> None:
    shipped = {
        getattr(pynvml, n): n.removeprefix("NVML_GPU_RECOVERY_ACTION_")
        for n in dir(pynvml)
        if n.startswith("NVML_GPU_RECOVERY_ACTION_")
    }
    assert shipped == NVIDIA.recovery_actions
    assert set(shipped.values()) <= set(RECOVERY)  # every value NVML has, decided
    line = "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    assert classify(154, detail=line).action is Action.RESET_GPU
    reboot = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    assert classify(154, detail=reboot).reason == "NodeRebootRequired154"
    assert not classify(154, recovery_action=0).node_fault
    assert classify(154, recovery_action=4).action is Action.RESET_GPU  # drain and reset
    assert classify(154, recovery_action=3).severity is Severity.P1  # drain P2P: watched
    odd = classify(154, recovery_action=0x42)
    assert odd.reason == "RecoveryActionUnknown154" and "0x42" in odd.description
    assert classify(154).reason == "RecoveryActionUnknown154"  # no code at all


# -- Xids 144-150: NVIDIA's decode sheet ---------------------------------------

NETIR = (
    "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 "
    "(0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)
RLW_V1 = "RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000082 0x00000040 0x00000000 0x00000000 0x00000000 0x00000000)"
RLW_V2 = "RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000004 0x00000040 0x00000000 0x00000000 0x00000000 0x00000000)"


def test_the_masks_read_most_significant_bit_first() -> None:
    assert matches("-" * 31 + "1", 1) and not matches("-" * 31 + "1", 2)
    assert matches("1" + "-" * 31, 1 << 31)


def test_nvlink5_xids_follow_the_decode_sheet() -> None:
    netir = classify(149, detail=NETIR)  # a peer's link went down: NVIDIA resets the GPU
    assert netir.action is Action.RESET_GPU and "INVESTIGATE_PEER_DEVICE" in netir.nvidia
    # The same error status means another thing in each IntrInfo layout (R575).
    assert classify(145, detail=RLW_V1, driver="570.133.20").action is Action.RESET_GPU
    assert classify(145, detail=RLW_V2, driver="575.57.08").action is Action.RESET_GPU
    ignorable = RLW_V2.replace("0x00000040", "0x00000100")  # RLW_REMAP 0x100: IGNORE
    assert not classify(145, detail=ignorable, driver="580.65.06").node_fault
    evaluate = RLW_V2.replace("0x00000040", "0x00000001")  # XID_154_EVAL: the 154 decides
    assert classify(145, detail=evaluate, driver="580.65.06").kind is Kind.INFORMATIONAL
    both = RLW_V2.replace("0x00000040", "0x00000041")  # two errors: the stricter stands
    assert classify(145, detail=both, driver="580.65.06").action is Action.RESET_GPU
    # RLW_RXPIPE's promotable errors: IntrInfo bit 7 (V2) selects NVIDIA's action 2, a reset.
    rxpipe = "RLW_RXPIPE Nonfatal XC0 i0 Link 3 (0x{:08x} 0x00000001 0x0 0x0 0x0 0x0)"
    assert not classify(145, detail=rxpipe.format(0x06), driver="580.65.06").node_fault
    promoted = classify(145, detail=rxpipe.format(0x86), driver="580.65.06")
    assert promoted.action is Action.RESET_GPU and promoted.severity is Severity.P0


def test_an_nvlink5_xid_without_its_fields_is_watched_and_one_without_a_row_goes_by_its_word() -> (
    None
):
    assert classify(149).severity is Severity.P1
    unmatched = NETIR.replace("0x025525c6", "0x7fffffff")
    assert classify(149, detail=unmatched).severity is Severity.P0  # the line says Fatal
    assert not classify(149, detail=unmatched.replace("Fatal", "Nonfatal")).node_fault


# -- Xid 74: WORKFLOW_NVLINK_ERR -----------------------------------------------


def test_xid_74_by_its_registers() -> None:
    fatal = "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"
    assert (
        classify(74, detail=f"pid='<unknown>', name=<unknown>, {fatal}").action is Action.RESET_GPU
    )
    ignored = "NVLink: fatal error detected on link 2(0x800001, 0x0, 0x0, 0x0, 0x100000, 0x0, 0x0)"
    assert not classify(74, detail=ignored).node_fault  # bits 0, 23 and an ECC threshold only
    sympathetic = "NVLink: fatal error detected on link 2(0x2, 0x0, 0x0, 0x30000, 0x0, 0x0, 0x0)"
    assert not classify(74, detail=sympathetic).node_fault
    fabric = "NVLink: fatal error detected on link 2(0x0, 0x0, 0x0, 0x40000, 0x0, 0x0, 0x0)"
    assert classify(74, detail=fabric).node_fault  # fourth register bit 18: fabric reset
    assert classify(74).action is Action.RESET_GPU


# -- Xids 45, 48, 171/172 ------------------------------------------------------


def test_xid_45_alone_is_counted_and_after_another_xid_follows_it() -> None:
    alone, after = classify(45), classify(45, recent=(79,))
    assert alone.kind is Kind.APPLICATION and not alone.node_fault
    assert after.kind is Kind.INFORMATIONAL and "79" in after.nvidia


def test_xid_48_with_a_row_remap_is_the_drain_and_reset_branch() -> None:
    assert "solo" in classify(48).nvidia and classify(48).action is Action.RESET_GPU
    assert "DRAIN_AND_RESET" in classify(48, recent=(63,)).nvidia
    assert not classify(171, recent=(48,)).node_fault
    assert classify(172).action is Action.RESET_GPU


# -- SXids ---------------------------------------------------------------------


def test_sxids_follow_the_fabric_manager_guide_over_the_lines_word() -> None:
    assert len(SXIDS) == 93
    hang = classify_sxid(12028, fatal=False)  # "Non-fatal" on the line, GPU access hangs
    assert hang.severity is Severity.P0 and hang.reason == "NvswitchFatal12028"
    assert classify_sxid(20034, fatal=True).action is Action.REBOOT
    assert classify_sxid(23001, fatal=None).severity is Severity.P0  # always fatal, a Data line
    assert not classify_sxid(11012, fatal=False).node_fault  # single-bit ECC, corrected
    assert classify_sxid(31337, fatal=True).severity is Severity.P0  # unknown: the line's word
    assert not classify_sxid(31337, fatal=None).node_fault


def test_docs_hold_the_table_and_every_row_agrees_or_names_its_workflow() -> None:
    text = (ROOT / "docs/agent.md").read_text(encoding="utf-8")
    assert xid_table.rewrite(text) == text, "run tools/xid_table.py"
    rows = [line for line in xid_table.table().splitlines() if re.match(r"^\| \d+ \|", line)]
    assert len(rows) == len(DATA_CENTRE)
    for line in rows:
        last = line.rstrip(" |").rsplit(" | ", 1)[1]
        assert last.startswith(
            ("agrees", "follows WORKFLOW", "follows XID_154", "NVIDIA lists no")
        ), line


def test_the_old_table_disagreed_where_the_issue_says_and_this_one_does_not() -> None:
    now = xid_table.compare(xid_table._now)
    assert now["stricter"] == now["laxer"] == now["other action"] == 0
    assert now["agree"] == 87 and now["needs decoding"] == 22
