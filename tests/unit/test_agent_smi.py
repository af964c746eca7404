"""The nvidia-smi probe (gpuheal/agent/smi.py) over nvidia-smi's real output shapes,
each quoted from a public report (the module's docstring names them): the parser,
the naming of each GPU across rounds, the round's verdict, and a hang bounded by the
timeout. tests/integration/test_agent_smi.py runs the same over the stand-in binary."""

from __future__ import annotations

import sys
import time

import pytest

from gpuheal.agent.findings import Health, ProbeResult, verdict
from gpuheal.agent.smi import (
    FAILED,
    LOST,
    MISSING,
    Listed,
    Names,
    Output,
    Ran,
    SmiProbe,
    execute,
    judge,
    parse_output,
)
from gpuheal.model import Severity

UUIDS = [f"GPU-5c1f8a22-0000-4000-8000-{i:012d}" for i in range(4)]
PCIS = [f"00000000:{0x18 + i:02X}:00.0" for i in range(4)]
HEALTHY = "".join(f"{i}, {UUIDS[i]}, {PCIS[i]}\n" for i in range(4))


def rows(*skip: int, extra: str = "") -> str:
    """The healthy node's output without the rows of `skip`, `extra` first."""
    lines = [f"{i}, {UUIDS[i]}, {PCIS[i]}\n" for i in range(4) if i not in skip]
    return extra + "".join(lines)


def named(output: str, returncode: int = 0, expected: int | None = 4) -> ProbeResult:
    """One round after a healthy one: the probe has seen every GPU's row before."""
    names = Names()
    names.learn(parse_output(HEALTHY).gpus)
    now = parse_output(output)
    names.learn(now.gpus)
    return judge(now, returncode, expected, names)


# -- the parser ---------------------------------------------------------------


def test_healthy_rows_are_gpus_with_index_uuid_and_bus_id() -> None:
    assert parse_output(HEALTHY) == Output(tuple(Listed(i, UUIDS[i], PCIS[i]) for i in range(4)))


@pytest.mark.parametrize(
    ("line", "gpu"),
    [
        # NVIDIA k8s-test-infra: a lost GPU's fields read "[GPU is lost]"
        ("2, [GPU is lost], [GPU is lost]",
         Listed(2, "", "", "uuid [GPU is lost], pci.bus_id [GPU is lost]")),
        # nvidia_gpu_exporter #115 (driver 535): a field NVML cannot read, "[N/A]"
        (f"2, [N/A], {PCIS[2]}", Listed(2, "", PCIS[2], "uuid [N/A]")),
        ("2, N/A, N/A", Listed(2, "", "", "uuid N/A, pci.bus_id N/A")),
        (f"2, {UUIDS[2]}, [Unknown Error]", Listed(2, UUIDS[2], "", "pci.bus_id [Unknown Error]")),
        # leptonai/gpud's test: the driver 5xx form, no space before the bus id
        ("Unable to determine the device handle for GPU0000:CB:00.0: Unknown Error",
         Listed(None, "", "0000:CB:00.0", "Unable to determine the device handle: Unknown Error")),
        # JosephKJ/OWOD #81 (with a space; a lost GPU's advice)
        ("Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. "
         "Reboot the system to recover this GPU",
         Listed(None, "", "0000:02:00.0",
                "Unable to determine the device handle: GPU is lost. "
                "Reboot the system to recover this GPU")),
        # a 610 driver: the index, then the bus id
        ("Unable to determine the device handle for GPU1: 0000:34:00.0: Unknown Error",
         Listed(1, "", "0000:34:00.0", "Unable to determine the device handle: Unknown Error")),
        ("Unable to determine the device handle for GPU1: Unknown Error",
         Listed(1, "", "", "Unable to determine the device handle: Unknown Error")),
    ],
)  # fmt: skip
def test_each_real_shape_of_a_gpu_nvidia_smi_cannot_read(line: str, gpu: Listed) -> None:
    assert parse_output(rows(2, extra=line + "\n")).gpus[0] == gpu


def test_other_lines_are_neither_gpus_nor_dropped() -> None:
    output = parse_output(
        "WARNING: infoROM is corrupted at gpu 0000:18:00.0\n" + HEALTHY + "0, GPU-x\n"
    )
    assert len(output.gpus) == 4
    assert output.other == ("WARNING: infoROM is corrupted at gpu 0000:18:00.0", "0, GPU-x")
    assert parse_output("No devices were found\n") == Output((), none_found=True)


# -- each finding names its GPU -------------------------------------------------


def test_a_lost_row_is_named_by_the_uuid_its_index_had() -> None:
    result = named(rows(2, extra="2, [GPU is lost], [GPU is lost]\n"))
    (finding,) = result.findings
    assert (finding.reason, finding.severity, finding.devices) == (LOST, Severity.P0, (UUIDS[2],))
    assert finding.message == (
        f"nvidia-smi: GPU 2 ({UUIDS[2]}): uuid [GPU is lost], pci.bus_id [GPU is lost]"
    )


@pytest.mark.parametrize(
    "line",
    [
        "Unable to determine the device handle for GPU0000:1A:00.0: Unknown Error",
        "Unable to determine the device handle for GPU 0000:1a:00.0: GPU is lost. "
        "Reboot the system to recover this GPU",
        "Unable to determine the device handle for GPU2: 0000:1A:00.0: Unknown Error",
    ],
)
def test_a_gpu_without_a_handle_is_named_by_the_uuid_its_bus_id_had(line: str) -> None:
    (finding,) = named(rows(2, extra=line + "\n"), returncode=15).findings
    assert (finding.reason, finding.devices) == (LOST, (UUIDS[2],))
    assert UUIDS[2] in finding.message and "0000:1" in finding.message


def test_by_index_where_nvidia_smi_prints_no_bus_id() -> None:
    line = "Unable to determine the device handle for GPU2: Unknown Error\n"
    (finding,) = named(rows(2, extra=line)).findings
    assert finding.devices == (UUIDS[2],)
    assert finding.message.startswith(f"nvidia-smi: GPU 2 ({UUIDS[2]}): Unable to determine")


def test_a_gpu_lost_before_the_first_round_is_named_by_the_kernel_log() -> None:
    line = "Unable to determine the device handle for GPU0000:1A:00.0: Unknown Error\n"
    output = parse_output(rows(2, extra=line))
    names = Names()
    names.learn(output.gpus)
    kernel_log = {"0000:1a:00": "GPU-from-the-kernel-log"}
    (finding,) = judge(output, 255, 4, names, kernel_log.get).findings
    assert finding.devices == ("GPU-from-the-kernel-log",)
    # Nobody knows it: the finding still says which, by what nvidia-smi printed.
    (unknown,) = judge(output, 255, 4, names).findings
    assert unknown.devices == ()
    assert unknown.message.startswith("nvidia-smi: GPU (0000:1A:00.0): Unable to determine")


def test_gpus_renumbered_after_one_went_keep_their_own_names() -> None:
    names = Names()
    names.learn(parse_output(HEALTHY).gpus)
    # GPU 1 went; nvidia-smi numbers the rest 0..2 (the index is its enumeration).
    names.learn(parse_output(f"0, {UUIDS[0]}, {PCIS[0]}\n1, {UUIDS[2]}, {PCIS[2]}\n").gpus)
    lost = Listed(1, "", "", "uuid [GPU is lost]")
    assert names.uuid_of(lost, lambda _: None) == UUIDS[2]


def test_fewer_gpus_than_expected_names_the_ones_gone() -> None:
    result = named(rows(3))
    (finding,) = result.findings
    assert (finding.reason, finding.severity, finding.devices) == (
        MISSING,
        Severity.P0,
        (UUIDS[3],),
    )
    assert finding.message == f"4 GPUs expected, 3 visible to nvidia-smi; gone: {UUIDS[3]}"
    # A GPU nvidia-smi cannot reach is there, not missing: one finding, not two.
    line = "Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error\n"
    assert [f.reason for f in named(rows(3, extra=line)).findings] == [LOST]
    assert named(rows(3), expected=None).findings == ()
    assert named(rows(3), expected=3).findings == ()


# -- the round's verdict ----------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "returncode", "health", "reason", "devices"),
    [
        (HEALTHY, 0, Health.HEALTHY, "GPUsHealthy", ()),
        (rows(1, extra="1, [GPU is lost], [GPU is lost]\n"), 0, Health.FAULTY, LOST, (UUIDS[1],)),
        (rows(1, extra="Unable to determine the device handle for GPU0000:19:00.0: GPU is lost. "
                       "Reboot the system to recover this GPU\n"),
         15, Health.FAULTY, LOST, (UUIDS[1],)),
        (rows(1), 0, Health.FAULTY, MISSING, (UUIDS[1],)),
        # nvidia-smi(1): 14, infoROM is corrupted; gpu-operator's troubleshooting shows it
        # with every row printed
        ("WARNING: infoROM is corrupted at gpu 0000:18:00.0\n", 14, Health.FAULTY, FAILED, ()),
        # no GPU, no driver, no library: the probe vouches for nothing
        ("No devices were found\n", 6, Health.UNKNOWN, "ProbesFailed", ()),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
         "Make sure that the latest NVIDIA driver is installed and running.\n",
         9, Health.UNKNOWN, "ProbesFailed", ()),
        ("", 0, Health.UNKNOWN, "ProbesFailed", ()),
    ],
)  # fmt: skip
def test_each_shape_is_the_documented_verdict(
    output: str, returncode: int, health: Health, reason: str, devices: tuple[str, ...]
) -> None:
    seen = verdict([named(output, returncode)])
    assert (seen.health, seen.reason, seen.devices) == (health, reason, devices)


def test_a_gpu_fault_exit_without_a_gpu_line_says_what_the_manual_says() -> None:
    (finding,) = named("", returncode=15).findings
    assert (finding.reason, finding.severity) == (FAILED, Severity.P0)
    assert "15: the GPU has fallen off the bus" in finding.message
    assert named("garbage\n", returncode=2).error == "nvidia-smi listed no GPU (exit 2): garbage"


# -- running it -------------------------------------------------------------------


def test_a_hung_nvidia_smi_is_killed_at_the_timeout_and_the_round_is_unknown() -> None:
    # A stand-in that never answers: `python -c <sleep> --query-gpu=... --format=...`.
    hang = [sys.executable, "-c", "import time; time.sleep(60)"]
    probe = SmiProbe(hang, 0.3, expected_gpus=lambda: 4)
    started = time.monotonic()
    result = probe.run()
    assert time.monotonic() - started < 3
    assert (result.ran, result.error) == (
        False,
        f"{sys.executable} did not answer within 0.3s; killed",
    )
    seen = verdict([result])
    assert (seen.health, seen.reason) == (Health.UNKNOWN, "DriverUnresponsive")
    assert "smi: " in seen.message and "did not answer" in seen.message


def test_a_missing_nvidia_smi_did_not_run() -> None:
    result = SmiProbe(["/nonexistent/nvidia-smi"], 5, expected_gpus=lambda: None).run()
    assert (result.ran, result.error) == (
        False,
        "/nonexistent/nvidia-smi: No such file or directory",
    )


def test_stdout_and_stderr_are_read_whatever_the_exit_code() -> None:
    script = "import sys; print('0, x'); print('said', file=sys.stderr); sys.exit(3)"
    assert execute([sys.executable, "-c", script], 5) == Ran(3, "0, x\nsaid\n")


def test_the_probe_asks_for_index_uuid_and_bus_id_and_remembers_them() -> None:
    probe = SmiProbe(["nvidia-smi"], 5, expected_gpus=lambda: 4)
    assert probe.argv == [
        "nvidia-smi",
        "--query-gpu=index,uuid,pci.bus_id",
        "--format=csv,noheader",
    ]
    lost = rows(0, extra="0, [GPU is lost], [GPU is lost]\n")
    for text, devices in [(HEALTHY, ()), (lost, (UUIDS[0],))]:
        probe.argv = [sys.executable, "-c", f"print({text!r}, end='')"]
        result = probe.run()
        assert tuple(d for f in result.findings for d in f.devices) == devices
