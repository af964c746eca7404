"""The nvidia-smi probe: `nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader`
where the agent cannot load NVML (or beside it). Each finding names its GPU by index,
UUID and bus id where nvidia-smi prints them, and by the UUID it printed in an earlier
round where it no longer does: the UUID is what a reset (`nvidia-smi -r -i <uuid>`)
and the fault's devices need.

What nvidia-smi prints, as public reports quote it (testenv/nvml/smi.c prints the same
shapes over the fake node's spec), and what each is:

- a row per GPU, `3, GPU-0a1b…, 00000000:1B:00.0`: nothing wrong.
- a field NVML could not read is NVML's error in brackets in its place:
  `3, [GPU is lost], [GPU is lost]` (NVIDIA k8s-test-infra's nvidia-smi checks),
  `[Unknown Error]`, `[N/A]` (utkuozdemir/nvidia_gpu_exporter #68, #115; `N/A` bare
  in older tables): a GPU whose UUID or bus id cannot be read is `GpuLost` (P0).
- `Unable to determine the device handle for GPU0000:CB:00.0: Unknown Error`
  (leptonai/gpud's test; `GPU 0000:0B:00.0` with a space in older drivers,
  NVIDIA/open-gpu-kernel-modules #387; `…: GPU is lost. Reboot the system to recover
  this GPU`, JosephKJ/OWOD #81; `GPU1: 0000:34:00.0: Unknown Error` with the index in
  newer ones): nvidia-smi cannot open the GPU at all: `GpuLost` (P0).
- fewer GPUs (rows and such lines) than the node should have: `GpuMissing` (P0),
  naming the GPUs listed in earlier rounds that are gone.
- no GPU at all (`No devices were found`, exit 6), the driver or library missing
  (exits 9, 12), the tool missing or not done within `smiTimeoutSeconds`: the probe
  did not run. Like NVML seeing no GPU, that vouches for nothing (Unknown when no
  other level probe ran) and is not a fault: it is what a container that was not
  handed the GPUs sees.
- no GPU line but an exit code nvidia-smi(1)'s RETURN VALUE gives to a GPU's fault
  (8 power cables, 10 interrupt, 14 infoROM, 15 fallen off the bus): `SmiFailed` (P0).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpuheal.agent.findings import ProbeFinding, ProbeResult
from gpuheal.agent.kmsg import normalize_pci
from gpuheal.model import Severity

PROBE = "smi"
FIELDS = ("index", "uuid", "pci.bus_id")
LOST = "GpuLost"
MISSING = "GpuMissing"
FAILED = "SmiFailed"
# nvidia-smi(1), RETURN VALUE: the codes that say a GPU is at fault (NVML's texts for
# the same nvmlReturn_t values).
GPU_FAULT_EXITS = {
    8: "a device's external power cables are not properly attached",
    10: "NVIDIA Kernel detected an interrupt issue with a GPU",
    14: "infoROM is corrupted",
    15: "the GPU has fallen off the bus or has otherwise become inaccessible",
}
NONE_FOUND = "No devices were found"
# After a kill, how long to wait for the child: a call hung in the driver (state D)
# dies only when the call returns, and the round must not wait for that.
REAP_S = 0.5

_PCI = r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]"
_PCI_FIELD = re.compile(_PCI, re.IGNORECASE)
_UUID_FIELD = re.compile(r"GPU-[0-9a-f-]+", re.IGNORECASE)
_HANDLE = re.compile(r"Unable to determine the device handle for GPU\s*(?P<rest>.*)", re.I)
_AT_PCI = re.compile(rf"(?P<pci>{_PCI})\s*:\s*(?P<error>.*)", re.IGNORECASE)
_AT_INDEX = re.compile(rf"(?P<index>\d+)\s*:\s*(?:(?P<pci>{_PCI})\s*:\s*)?(?P<error>.*)", re.I)


@dataclass(frozen=True)
class Listed:
    """One GPU in nvidia-smi's output: its row, or the line saying it cannot be reached."""

    index: int | None
    uuid: str  # "" where nvidia-smi printed none
    pci: str  # as printed; "" where it printed none
    problem: str = ""  # "" for a row it could read whole

    def name(self, uuid: str) -> str:
        """`GPU 3 (GPU-0a1b…, 00000000:1B:00.0)`, with what is known of it."""
        known = ", ".join(part for part in (uuid, self.pci) if part)
        head = "GPU" if self.index is None else f"GPU {self.index}"
        return f"{head} ({known})" if known else head


@dataclass(frozen=True)
class Output:
    gpus: tuple[Listed, ...]
    none_found: bool = False
    other: tuple[str, ...] = ()  # lines that say neither


def _unreadable(value: str) -> bool:
    return value.upper() == "N/A" or (value.startswith("[") and value.endswith("]"))


def _row(line: str) -> Listed | None:
    """A `--query-gpu` row of FIELDS, its unreadable fields said; None: not a row."""
    values = [v.strip() for v in line.split(",")]
    if len(values) != len(FIELDS):
        return None
    index, uuid, pci = values
    readable = (index.isdigit(), bool(_UUID_FIELD.fullmatch(uuid)), bool(_PCI_FIELD.fullmatch(pci)))
    bad = [(name, v) for name, v, ok in zip(FIELDS, values, readable, strict=True) if not ok]
    if not all(_unreadable(v) for _, v in bad):
        return None
    return Listed(
        int(index) if readable[0] else None,
        uuid if readable[1] else "",
        pci if readable[2] else "",
        ", ".join(f"{name} {v}" for name, v in bad),
    )


def _handle_line(line: str) -> Listed | None:
    found = _HANDLE.search(line)
    if found is None:
        return None
    rest = found["rest"]
    at = _AT_PCI.fullmatch(rest) or _AT_INDEX.fullmatch(rest)
    if at is None:
        return Listed(None, "", "", line.strip())
    index = at.groupdict().get("index")
    said = f"Unable to determine the device handle: {at['error']}"
    return Listed(int(index) if index else None, "", at["pci"] or "", said)


def parse_output(text: str) -> Output:
    """nvidia-smi's stdout and stderr for the query, line by line."""
    gpus: list[Listed] = []
    other: list[str] = []
    none_found = False
    for line in (raw.strip() for raw in text.splitlines()):
        if not line:
            continue
        gpu = _handle_line(line) or _row(line)
        if gpu is not None:
            gpus.append(gpu)
        elif line == NONE_FOUND:
            none_found = True
        else:
            other.append(line)
    return Output(tuple(gpus), none_found, tuple(other))


@dataclass(frozen=True)
class Place:
    index: int | None
    pci: str  # normalised (kmsg.normalize_pci)


@dataclass
class Names:
    """Each GPU nvidia-smi printed a whole row for, by UUID: where it was last seen."""

    seen: dict[str, Place] = field(default_factory=dict)

    def learn(self, gpus: Sequence[Listed]) -> None:
        for gpu in gpus:
            if gpu.problem or not gpu.uuid:
                continue
            if gpu.index is not None:  # GPUs renumber when one goes: one owner per index
                for uuid, place in self.seen.items():
                    if place.index == gpu.index and uuid != gpu.uuid:
                        self.seen[uuid] = Place(None, place.pci)
            self.seen[gpu.uuid] = Place(gpu.index, normalize_pci(gpu.pci))

    def uuid_of(self, gpu: Listed, by_pci: Callable[[str], str | None]) -> str:
        """The GPU's UUID: printed, else remembered by bus id (or `by_pci`'s, the kernel
        log's `NVRM: GPU at PCI:…` lines), else by index; "" when unknown."""
        if gpu.uuid:
            return gpu.uuid
        pci = normalize_pci(gpu.pci) if gpu.pci else ""
        for uuid, place in self.seen.items():
            if pci and place.pci == pci:
                return uuid
        from_log = by_pci(pci) if pci else None
        if from_log:
            return from_log
        for uuid, place in self.seen.items():
            if gpu.index is not None and place.index == gpu.index:
                return uuid
        return ""


def judge(
    output: Output,
    returncode: int,
    expected: int | None,
    names: Names,
    by_pci: Callable[[str], str | None] = lambda _: None,
) -> ProbeResult:
    """The probe's result for one run of nvidia-smi (`names` from the earlier rounds
    and this one's whole rows)."""
    if not output.gpus:
        return _nothing_listed(output, returncode)
    findings: list[ProbeFinding] = []
    listed: set[str] = set()
    for gpu in output.gpus:
        uuid = names.uuid_of(gpu, by_pci)
        listed.add(uuid)
        if gpu.problem:
            message = f"nvidia-smi: {gpu.name(uuid)}: {gpu.problem}"
            findings.append(ProbeFinding(LOST, Severity.P0, message[:512], (uuid,) if uuid else ()))
    findings += _missing(len(output.gpus), expected, names, listed)
    if not findings and returncode in GPU_FAULT_EXITS:
        findings.append(_failed(returncode, output.other))
    warnings = tuple(f"nvidia-smi said: {line[:200]}" for line in output.other[:3])
    return ProbeResult(PROBE, ran=True, level=True, findings=tuple(findings), warnings=warnings)


def _nothing_listed(output: Output, returncode: int) -> ProbeResult:
    if returncode in GPU_FAULT_EXITS:
        finding = _failed(returncode, output.other)
        return ProbeResult(PROBE, ran=True, level=True, findings=(finding,))
    said = NONE_FOUND if output.none_found else "; ".join(output.other)[:200] or "nothing"
    return ProbeResult(
        PROBE, ran=False, level=True, error=f"nvidia-smi listed no GPU (exit {returncode}): {said}"
    )


def _failed(returncode: int, said: Sequence[str]) -> ProbeFinding:
    text = "; ".join(said)[:200]
    message = f"nvidia-smi failed ({returncode}: {GPU_FAULT_EXITS[returncode]})"
    return ProbeFinding(FAILED, Severity.P0, f"{message}: {text}" if text else message)


def _missing(
    count: int, expected: int | None, names: Names, listed: set[str]
) -> list[ProbeFinding]:
    if expected is None or count >= expected:
        return []
    gone = sorted(uuid for uuid in names.seen if uuid not in listed)
    message = f"{expected} GPUs expected, {count} visible to nvidia-smi"
    if gone:
        message += f"; gone: {', '.join(gone)}"
    return [ProbeFinding(MISSING, Severity.P0, message[:512], tuple(gone))]


@dataclass(frozen=True)
class Ran:
    returncode: int
    output: str  # stdout, then stderr


def execute(argv: Sequence[str], timeout_s: float) -> Ran | str:
    """Run nvidia-smi for at most `timeout_s` (then kill it); a string says why there
    is no answer."""
    try:
        child = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace"
        )
    except OSError as err:
        return f"{argv[0]}: {err.strerror or err}"
    try:
        stdout, stderr = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        try:
            child.communicate(timeout=REAP_S)
        except subprocess.TimeoutExpired:
            return f"{argv[0]} did not answer within {timeout_s:g}s; killed, still in a call"
        return f"{argv[0]} did not answer within {timeout_s:g}s; killed"
    return Ran(child.returncode, stdout + stderr)


class SmiProbe:
    """nvidia-smi's view of the GPUs, once per round, remembering their names."""

    def __init__(
        self,
        command: Sequence[str],
        timeout_s: float,
        *,
        expected_gpus: Callable[[], int | None],
        by_pci: Callable[[str], str | None] = lambda _: None,
    ) -> None:
        self.argv = [*command, f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader"]
        self.timeout_s = timeout_s
        self.expected_gpus = expected_gpus
        self.by_pci = by_pci
        self.names = Names()

    def run(self) -> ProbeResult:
        ran = execute(self.argv, self.timeout_s)
        if isinstance(ran, str):
            # Killed for not answering: it hung in a driver call (agent/timeouts.py).
            hung = "did not answer" in ran
            return ProbeResult(PROBE, ran=False, level=True, error=ran, hung=hung)
        output = parse_output(ran.output)
        self.names.learn(output.gpus)
        return judge(output, ran.returncode, self.expected_gpus(), self.names, self.by_pci)
