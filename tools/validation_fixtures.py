"""Write tests/unit/data/validation/: what `dcgmi diag -j` and `all_reduce_perf` print.

    .venv/bin/python tools/validation_fixtures.py            # writes the files and README.md
    .venv/bin/python tools/validation_fixtures.py --check    # exit 1 when a committed file differs

The validation Job's script (gpuheal/policy/validation.py) reads these two tools'
output; its tests run it over these files with fake `dcgmi`/`all_reduce_perf`
executables that print them and exit with the real tools' exit codes. No output of
a real run on GPUs is published in the tools' repositories (their tests check
fields, not whole documents), so each file is built field by field from the code
that writes it, at the commits named in README.md:

- `dcgmi diag -j`: dcgmi/Diag.cpp of NVIDIA/DCGM builds a Json::Value (3.x:
  HelperJsonBuildOutput over dcgmDiagResponse_v10, root "DCGM GPU Diagnostic"; 4.x:
  over dcgmDiagResponse_v12, root "DCGM Diagnostic", with entity_groups, metadata and
  test_summary) and prints it with jsoncpp's Value::toStyledString(): jsoncpp 1.9.5
  (DCGM 3.3.9) / 1.9.6 (4.x) StreamWriterBuilder defaults, i.e. tab indentation,
  `"key" : value`, an object or array value on the line after its key, every array
  one element a line (CommentStyle::All), keys in byte order (std::map), non-ASCII
  as \\uXXXX. `jsoncpp_styled` below writes that format (facts taken from jsoncpp's
  json_writer.cpp, not its code). The key names are nvvs/include/NvvsJsonStrings.h's;
  test names, categories, messages and error codes are DCGM's own strings
  (dcgmlib/dcgm_errors.h, dcgmlib/src/dcgm_errors.c, dcgmi/Diag.cpp,
  nvvs/include/PluginStrings.h). GPU serials, the driver version and the numbers in
  `info` are made up.
- `all_reduce_perf`: NVIDIA/nccl-tests' printf formats (src/util.cu and src/common.cu
  at 2.19.6; src/common.cu at 2.13.6), with the defaults the Job's command line
  leaves (`-b 1G -e 1G -g <gpus>`: float, sum, 20 iterations, data check on). Times,
  the host name and the PCI addresses are made up; the bandwidths follow from them
  as the tests compute them (algbw = bytes / time, busbw = algbw * 2(n-1)/n).

Nothing here is the tools' code: only what they write.
"""

# ruff: noqa: UP031 -- C printf formats, kept as nccl-tests writes them
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "tests/unit/data/validation"

DCGM = "NVIDIA/DCGM"
NCCL_TESTS = "NVIDIA/nccl-tests"
JSONCPP = "open-source-parsers/jsoncpp"
COMMITS = {
    (DCGM, "3.3.9"): "b0ec3c624ea21e688b0d93cf9b214ae0eeb6fe52",
    (DCGM, "4.0.0"): "d2a3091b77aa5cf65492061951c9a626585d6cc3",
    (DCGM, "4.6.0"): "51b65ccebf9d61e6593713a7d6b68e594d9d7975",
    (NCCL_TESTS, "2.13.6"): "0b4c4cb99fb1381edec1f78c37230688ea1ceb26",
    (NCCL_TESTS, "2.19.6"): "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432",
    (JSONCPP, "1.9.5"): "5defb4ed1a4293b8e2bf641e16b156fb9de498cc",
    (JSONCPP, "1.9.6"): "89e2973c754a9c02a49974d839779b151e95afd6",
}


# -- jsoncpp's styled format ------------------------------------------------------------


def _quoted(text: str) -> str:
    """valueToQuotedStringN with emitUTF8 false: \\" \\\\ \\b \\f \\n \\r \\t, other controls
    and every non-ASCII code point as \\uXXXX (lower-case hex; UTF-16 surrogate pairs
    above U+FFFF); '/' as is."""
    named = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r"}
    named["\t"] = "\\t"
    out = ['"']
    for char in text:
        code = ord(char)
        if char in named:
            out.append(named[char])
        elif code < 0x20 or 0x80 <= code < 0x10000:
            out.append(f"\\u{code:04x}")
        elif code >= 0x10000:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def jsoncpp_styled(value: Any) -> str:
    """What Json::Value::toStyledString() returns in jsoncpp 1.9.5 and 1.9.6 for `value`
    (dicts, lists, str, int, bool, None): BuiltStyledStreamWriter with indentation "\\t",
    colon " : ", CommentStyle::All, then one '\\n'."""
    out: list[str] = []
    state = {"indent": "", "indented": True}

    def write_indent() -> None:
        out.append("\n" + str(state["indent"]))

    def with_indent(text: str) -> None:
        if not state["indented"]:
            write_indent()
        out.append(text)
        state["indented"] = False

    def write(node: Any) -> None:  # noqa: PLR0912 -- one branch per JSON type
        if isinstance(node, dict):
            if not node:
                out.append("{}")
                return
            with_indent("{")
            state["indent"] = str(state["indent"]) + "\t"
            keys = sorted(node, key=lambda k: k.encode())
            for n, key in enumerate(keys):
                with_indent(_quoted(key))
                out.append(" : ")
                write(node[key])
                if n + 1 < len(keys):
                    out.append(",")
            state["indent"] = str(state["indent"])[:-1]
            with_indent("}")
        elif isinstance(node, list):
            if not node:
                out.append("[]")
                return
            with_indent("[")
            state["indent"] = str(state["indent"]) + "\t"
            for n, child in enumerate(node):
                if not state["indented"]:
                    write_indent()
                state["indented"] = True
                write(child)
                state["indented"] = False
                if n + 1 < len(node):
                    out.append(",")
            state["indent"] = str(state["indent"])[:-1]
            with_indent("]")
        elif node is None:
            out.append("null")
        elif isinstance(node, bool):
            out.append("true" if node else "false")
        elif isinstance(node, int):
            out.append(str(node))
        elif isinstance(node, str):
            out.append(_quoted(node))
        else:
            raise TypeError(f"no jsoncpp value for {node!r}")

    write(value)
    return "".join(out) + "\n"


# -- DCGM's strings ---------------------------------------------------------------------

# dcgmlib/dcgm_errors.h: (code, category, severity) from dcgmErrorMeta (dcgm_errors.c).
FR_PERSISTENCE_MODE = (29, 8, 5)  # DCGM_FR_EC_SOFTWARE_OTHER, DCGM_ERROR_CONFIG
FR_FAULTY_MEMORY = (52, 10, 2)  # DCGM_FR_EC_HARDWARE_MEMORY, DCGM_ERROR_ISOLATE
FR_MEMORY_ALLOC = (56, 8, 4)  # DCGM_FR_EC_SOFTWARE_OTHER, DCGM_ERROR_TRIAGE
FR_MEMORY_MISMATCH = (58, 10, 2)  # DCGM_FR_EC_HARDWARE_MEMORY, DCGM_ERROR_ISOLATE
FR_PENDING_ROW_REMAP = (85, 10, 6)  # DCGM_FR_EC_HARDWARE_MEMORY, DCGM_ERROR_RESET
FR_EUD_TEST_FAILED = (95, 7, 2)  # DCGM_FR_EC_SOFTWARE_EUD, DCGM_ERROR_ISOLATE
FR_TEST_SKIPPED = (117, 3, 5)  # DCGM_FR_EC_SOFTWARE_CONFIG, DCGM_ERROR_CONFIG
# The *_NEXT texts DcgmError appends after a space (common/DcgmError.h SetFullError).
TRIAGE_RUN_FIELD_DIAG = "Run a field diagnostic on the GPU."
SYSTEM_TRIAGE = "Check DCGM and system logs for errors. Reset GPU. Restart DCGM. Rerun diagnostics."
PERSISTENCE_NEXT = 'Enable persistence mode by running "nvidia-smi -i <gpuId> -pm 1 " as root.'

DRIVER = "550.127.05"
DEVICE_ID = "2330"  # H100 SXM5's PCI device id, as DCGM lists it
GPU_NAME = "NVIDIA H100 80GB HBM3"


def serial(gpu: int) -> str:
    return f"165222301{gpu:04d}"


def warning3(message: str, meta: tuple[int, int, int], *, key: str = "warning") -> dict[str, Any]:
    """A 3.x warnings[] entry; Diag.cpp's level-one tests name the message "warnings"."""
    code, category, severity = meta
    return {key: message, "error_id": code, "error_category": category, "error_severity": severity}


# 3.3.9 Diag.cpp levelOneTests, less "CUDA Toolkit Library" (never run: left out of the JSON).
DEPLOYMENT3 = (
    "Denylist",
    "NVML Library",
    "CUDA Main Library",
    "Permissions and OS Blocks",
    "Persistence Mode",
    "Environment Variables",
    "Page Retirement/Row Remap",
    "Graphics Processes",
    "Inforom",
)


def dcgm3(
    level: int,
    gpus: Sequence[int],
    *,
    deployment: Mapping[str, dict[str, Any]] | None = None,
    per_gpu: Mapping[tuple[str, int], dict[str, Any]] | None = None,
    skipped: Sequence[str] = (),
) -> dict[str, Any]:
    """`dcgmi diag -r <level> -j` of DCGM 3.3.9 (HelperJsonBuildOutput): the level-one
    (Deployment) tests' one result each, then Integration, Hardware and Stress with one
    result per GPU (gpu_id a string). `deployment` and `per_gpu` replace a result;
    `skipped` tests are "Skip" on every GPU."""
    deployment = deployment or {}
    per_gpu = per_gpu or {}
    categories: list[dict[str, Any]] = [
        {
            "category": "Deployment",
            "tests": [
                {"name": name, "results": [deployment.get(name, {"status": "Pass"})]}
                for name in DEPLOYMENT3
            ],
        }
    ]
    # NvidiaValidationSuite.cpp's suites: medium (2) adds PCIe and memory; long (3) the
    # diagnostic, EUD (as root), memory bandwidth, targeted stress and power; xlong (4)
    # memtest and the pulse test. Within a category, in the order of DCGM's test index
    # (dcgm_structs.h DCGM_*_INDEX), as HelperJsonBuildOutput walks them.
    hardware = [("GPU Memory", 2), ("Diagnostic", 3), ("Pulse Test", 4), ("EUD Test", 3)]
    stress = [
        ("Targeted Stress", 3),
        ("Targeted Power", 3),
        ("Memory Bandwidth", 3),
        ("Memtest", 4),
    ]
    plan = {
        "Integration": ["PCIe"] if level >= 2 else [],
        "Hardware": [name for name, least in hardware if level >= least],
        "Stress": [name for name, least in stress if level >= least],
    }
    for category, names in plan.items():
        tests = []
        for name in names:
            results = []
            for gpu in gpus:
                result: dict[str, Any] = {"gpu_id": str(gpu), "status": "Pass"}
                if name == "GPU Memory":
                    result["info"] = "Allocated 83623464960 bytes (97.8%)"
                if name in skipped:
                    result = {"gpu_id": str(gpu), "status": "Skip"}
                results.append(per_gpu.get((name, gpu), result))
            tests.append({"name": name, "results": results})
        if tests:
            categories.append({"category": category, "tests": tests})
    return {
        "DCGM GPU Diagnostic": {"test_categories": categories},
        "Driver Version Detected": DRIVER,
        "GPU Device IDs": [DEVICE_ID for _ in gpus],
        "GPU Device Serials": {str(gpu): serial(gpu) for gpu in gpus},
        "version": "3.3.9",
    }


def warning4(message: str, meta: tuple[int, int, int]) -> dict[str, Any]:
    code, category, severity = meta
    return {
        "warning": message,
        "error_id": code,
        "error_category": category,
        "error_severity": severity,
    }


def entity(group: str, entity_id: int) -> dict[str, Any]:
    """HelperJsonAddResult's entity keys (dcgm_field_entity_group_t: GPU 1, CPU 7)."""
    return {
        "entity_group": group,
        "entity_group_id": {"GPU": 1, "CPU": 7}[group],
        "entity_id": entity_id,
    }


def dcgm4(
    level: int,
    gpus: Sequence[int],
    *,
    version: str = "4.6.0",
    override: Mapping[tuple[str, str, int], dict[str, Any]] | None = None,
    summaries: Mapping[str, dict[str, Any]] | None = None,
    extra: Mapping[str, Sequence[dict[str, Any]]] | None = None,
    cpus: Sequence[int] = (),
) -> dict[str, Any]:
    """`dcgmi diag -r <level> -j` of DCGM 4.x (HelperJsonBuildOutput over
    dcgmDiagResponse_v12): entity_groups, metadata, and per category the tests with one
    result per entity and a test_summary. `override[(test, group, id)]` replaces a
    result; `summaries[test]` a test_summary; `extra[test]` adds results (CPU entities)."""
    override = override or {}
    summaries = summaries or {}
    extra = extra or {}
    # NvidiaValidationSuite.cpp (4.6.0) FillTestVectors by level; eud and cpu_eud run as
    # root (the Job's container is root), nvbandwidth and nccl_tests left out (they need
    # their binaries in the image).
    plan = {
        "Deployment": ["software"],
        "Integration": ["pcie"] if level >= 2 else [],
        "Hardware": (["memory"] if level >= 2 else [])
        + (["diagnostic", "eud"] if level >= 3 else [])
        + (["cpu_eud"] if level >= 3 and cpus else []),
        "Stress": ["memory_bandwidth", "targeted_stress", "targeted_power"] if level >= 3 else [],
    }
    categories = []
    for category, names in plan.items():
        tests = []
        for name in names:
            results: list[dict[str, Any]] = []
            entities = (
                [("CPU", c) for c in cpus] if name == "cpu_eud" else [("GPU", g) for g in gpus]
            )
            for group, number in entities:
                result = {**entity(group, number), "status": "Pass"}
                if name == "memory":
                    result["info"] = ["Allocated 83623464960 bytes (97.8%)"]
                results.append(override.get((name, group, number), result))
            results += extra.get(name, ())
            summary = summaries.get(name, {"status": "Pass"})
            tests.append({"name": name, "results": results, "test_summary": summary})
        if tests:
            categories.append({"category": category, "tests": tests})
    groups: list[dict[str, Any]] = [
        {
            "entities": [
                {"device_id": DEVICE_ID, "entity_id": gpu, "serial_num": serial(gpu)}
                for gpu in gpus
            ],
            "entity_group": "GPU",
            "entity_group_id": 1,
        }
    ]
    if cpus:
        groups.append(
            {
                "entities": [{"device_id": "", "entity_id": cpu} for cpu in cpus],
                "entity_group": "CPU",
                "entity_group_id": 7,
            }
        )
    return {
        "DCGM Diagnostic": {"test_categories": categories},
        "entity_groups": groups,
        "metadata": {"Driver Version Detected": DRIVER, "version": version},
    }


def runtime_error(name: str, version: str, message: str) -> dict[str, Any]:
    """Diag::HelperDisplayFailureMessage in JSON mode (printed with std::endl after it)."""
    return {name: {"runtime_error": message, "version": version}}


# -- nccl-tests' all_reduce_perf ----------------------------------------------------------

HOST = "gpuheal-validate-3f9c2a81d4-1-x7k2q"
GiB = 1 << 30


def _float_str(value: float, width: int) -> str:
    """util.cu getFloatStr (2.19): the widest of %.2f, %.1f, %.0f that fits, else %e."""
    for spec in (f"%{width}.2f", f"%{width}.1f", f"%{width}.0f"):
        text = spec % value
        if len(text) <= width:
            return text
    return (f"%{width}.1e" if width >= 7 else f"%{width}.0e") % value


def _time_213(usec: float) -> str:
    """2.13.6 common.cu: %7.0f from 10 ms, %7.1f from 100 us, else %7.2f."""
    return ("%7.0f" if usec >= 10000 else "%7.1f" if usec >= 100 else "%7.2f") % usec


@dataclass(frozen=True)
class Bench:
    """One size's out-of-place and in-place times (us) and wrong elements."""

    usec: tuple[float, float]
    wrong: tuple[int, int] = (0, 0)


def _bw(nbytes: int, usec: float, ranks: int) -> tuple[float, float]:
    algbw = nbytes / (usec * 1e-6) / 1e9
    return algbw, algbw * 2 * (ranks - 1) / ranks  # all_reduce.cu AllReduceGetBw


def nccl_219(
    gpus: int,
    bench: Bench | None,
    *,
    min_bw_env: float | None = None,
    failure: Sequence[str] = (),
) -> str:
    """all_reduce_perf -b 1G -e 1G -g <gpus> of nccl-tests 2.19.6 (NCCL 2.28.3): the
    device report (util.cu writeDeviceReport), the result table (writeResultHeader,
    writeBenchmarkLine*), the footer (writeResultFooter, finalizeFooter, writeErrors).
    With `failure`, those lines end the run where the table would start."""
    lines = [
        "# nccl-tests version 2.19.6 nccl-headers=22803 nccl-library=22803",
        "# Collective test starting: all_reduce_perf",
        f"# nThread 1 nGpus {gpus} minBytes {GiB} maxBytes {GiB} step: 1048576(bytes) "
        "warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0",
        "#",
        "# Using devices",
    ]
    for rank in range(gpus):
        bus = 0x18 + 0x11 * rank
        lines.append(
            "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s"
            % (rank, 0, 1, HOST, rank, 0, bus, 0, GPU_NAME)
        )
    if failure or bench is None:
        return "\n".join([*lines, *failure]) + "\n"
    lines.append("#")
    lines.append(
        "# %10s  %12s  %8s  %6s  %6s           out-of-place "
        "                      in-place          " % ("", "", "", "", "")
    )
    columns = ("time", "algbw", "busbw", "#wrong")
    lines.append(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s"
        % ("size", "count", "type", "redop", "root", *columns, *columns, "")
    )
    lines.append(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s"
        % (
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "",
        )
    )
    row = "%12li  %12li  %8s  %6s  %6s" % (GiB, GiB // 4, "float", "sum", "%6i" % -1)
    busbws = []
    for usec, wrong in zip(bench.usec, bench.wrong, strict=True):
        algbw, busbw = _bw(GiB, usec, gpus)
        busbws.append(busbw)
        row += "  %7s  %6s  %6s  %6g" % (
            _float_str(usec, 7),
            _float_str(algbw, 6),
            _float_str(busbw, 6),
            float(wrong),
        )
    lines.append(row)
    errors = sum(1 for w in bench.wrong if w)
    avg = sum(busbws) / len(busbws)
    check = "" if min_bw_env is None else ("FAILED" if avg < min_bw_env * 0.9 else "OK")
    lines.append("# %-20s : %d %s" % ("Out of bounds values", errors, "FAILED" if errors else "OK"))
    lines.append("# %-20s : %g %s" % ("Avg bus bandwidth", avg, check))
    lines += ["#", "# Collective test concluded: all_reduce_perf", "#", ""]
    if errors or (min_bw_env is not None and avg < min_bw_env * 0.9):
        # run() returns testNumResults; main's TESTCHECK(result) (common.cu:1454) says so.
        lines.append(f" .. {HOST} pid 1: Test failure common.cu:1454")
    return "\n".join(lines) + "\n"


def nccl_213(gpus: int, bench: Bench) -> str:
    """all_reduce_perf -b 1G -e 1G -g <gpus> of nccl-tests 2.13.6 (common.cu's PRINTs)."""
    lines = [
        f"# nThread 1 nGpus {gpus} minBytes {GiB} maxBytes {GiB} step: 1048576(bytes) "
        "warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    for rank in range(gpus):
        lines.append(
            "#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s"
            % (rank, 0, 1, HOST, rank, 0x18 + 0x11 * rank, GPU_NAME)
        )
    lines.append("#")
    lines.append(
        "# %10s  %12s  %8s  %6s  %6s           out-of-place "
        "                      in-place          " % ("", "", "", "", "")
    )
    columns = ("time", "algbw", "busbw", "#wrong")
    lines.append(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s"
        % ("size", "count", "type", "redop", "root", *columns, *columns)
    )
    lines.append(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s"
        % (
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
        )
    )
    row = "%12li  %12li  %8s  %6s  %6s" % (GiB, GiB // 4, "float", "sum", "%6i" % -1)
    busbws = []
    for usec, wrong in zip(bench.usec, bench.wrong, strict=True):
        algbw, busbw = _bw(GiB, usec, gpus)
        busbws.append(busbw)
        row += "  %7s  %6.2f  %6.2f  %5g" % (_time_213(usec), algbw, busbw, float(wrong))
    lines.append(row)
    errors = sum(1 for w in bench.wrong if w)
    avg = sum(busbws) / len(busbws)
    lines.append("# Out of bounds values : %d %s" % (errors, "FAILED" if errors else "OK"))
    lines.append("# Avg bus bandwidth    : %g %s" % (avg, ""))
    lines += ["#", ""]  # then ncclGetLastError(NULL) and "\n": empty
    return "\n".join(lines) + "\n"


# -- the fixtures -------------------------------------------------------------------------

DIAG3 = (
    "dcgmi/Diag.cpp (HelperJsonBuildOutput, HelperJsonAddBasicTests, HelperJsonAddResult, "
    "HelperDisplayDiagResult, GetFailureResult)"
)
DIAG4 = (
    "dcgmi/Diag.cpp (HelperJsonBuildOutput, HelperJsonAddResult, HelperJsonAddTestSummary, "
    "HelperJsonAddEntities, HelperJsonAddMetadata, GetFailureResult)"
)
FAILURE_MESSAGE = "dcgmi/Diag.cpp (RunDiagOnce, HelperDisplayFailureMessage)"
UTIL_219 = (
    "src/util.cu (writeDeviceReport, writeResultHeader, writeBenchmarkLine*, "
    "writeResultFooter, writeErrors), src/common.cu (run, main)"
)
COMMON_213 = "src/common.cu (PRINTs of the device report, the table and the footer)"


@dataclass(frozen=True)
class Fixture:
    name: str
    tool: str  # "dcgmi" or "all_reduce_perf"
    stdout: str
    exit_code: int
    source: tuple[str, str, str]  # repository, version, paths
    why: str  # what the run is, and why it exits so
    stderr: str = ""
    constructed: bool = False  # not a shape the tool writes: says so in README.md


def _json(doc: dict[str, Any], *, endl: bool = False) -> str:
    return jsoncpp_styled(doc) + ("\n" if endl else "")


def fixtures() -> list[Fixture]:
    eight = range(8)
    dcgm339 = (DCGM, "3.3.9", DIAG3)
    dcgm460 = (DCGM, "4.6.0", DIAG4)
    found: list[Fixture] = []

    def add(*args: Any, **kw: Any) -> None:
        found.append(Fixture(*args, **kw))

    add(
        "dcgm3-r2-pass.json",
        "dcgmi",
        _json(dcgm3(2, eight)),
        0,
        dcgm339,
        "DCGM 3.3.9, -r 2 on 8 H100s: Deployment, PCIe and GPU Memory pass on every GPU.",
    )
    add(
        "dcgm3-r3-gpu3-memory-fail.json",
        "dcgmi",
        _json(
            dcgm3(
                3,
                eight,
                per_gpu={
                    ("GPU Memory", 3): {
                        "gpu_id": "3",
                        "status": "Fail",
                        "warnings": [
                            warning3(
                                f"Found 4 faulty memory elements on GPU 3 {TRIAGE_RUN_FIELD_DIAG}",
                                FR_FAULTY_MEMORY,
                            )
                        ],
                    }
                },
            )
        ),
        205,
        dcgm339,
        "DCGM 3.3.9, -r 3: GPU Memory fails on GPU 3 (DCGM_FR_FAULTY_MEMORY, an ISOLATE "
        "error): exit 205, DCGM_ST_NVVS_ISOLATE_ERROR (-51) as an unsigned byte.",
    )
    add(
        "dcgm3-r1-deployment-fail.json",
        "dcgmi",
        _json(
            dcgm3(
                1,
                eight,
                deployment={
                    "Page Retirement/Row Remap": {
                        "gpu_id": 5,
                        "status": "Fail",
                        "warnings": [
                            warning3(
                                "GPU 5 had memory errors and row remappings are pending "
                                + SYSTEM_TRIAGE,
                                FR_PENDING_ROW_REMAP,
                                key="warnings",
                            )
                        ],
                    }
                },
            )
        ),
        226,
        dcgm339,
        "DCGM 3.3.9, -r 1: the Deployment test Page Retirement/Row Remap fails for GPU 5 "
        "(DCGM_FR_PENDING_ROW_REMAP); a level-one result names its GPU with an integer gpu_id "
        'and its message "warnings" (HelperJsonAddBasicTests): exit 226, DCGM_ST_NVVS_ERROR (-30).',
    )
    add(
        "dcgm3-r2-warn-exit0.json",
        "dcgmi",
        _json(
            dcgm3(
                2,
                eight,
                deployment={
                    "Persistence Mode": {
                        "gpu_id": 0,
                        "status": "Fail",
                        "warnings": [
                            warning3(
                                f"Persistence mode for GPU 0 is disabled. {PERSISTENCE_NEXT}",
                                FR_PERSISTENCE_MODE,
                                key="warnings",
                            )
                        ],
                    }
                },
            )
        ),
        0,
        dcgm339,
        "DCGM 3.3.9, -r 2 with persistence mode off: the software plugin sets a WARN result "
        '(nvvs/plugin_src/software/Software.cpp), which HelperDisplayDiagResult writes "Fail", '
        "and GetFailureResult counts only DCGM_DIAG_RESULT_FAIL: a Fail in the JSON, exit 0.",
    )
    add(
        "dcgm3-r4-skipped.json",
        "dcgmi",
        _json(dcgm3(4, eight, skipped=("Pulse Test",))),
        0,
        dcgm339,
        "DCGM 3.3.9, -r 4: Pulse Test skipped on every GPU, everything else passes: exit 0.",
    )
    add(
        "dcgm3-r2-7-of-8-gpus.json",
        "dcgmi",
        _json(dcgm3(2, range(7))),
        0,
        dcgm339,
        "DCGM 3.3.9, -r 2 that ran on 7 GPUs (GPU Device IDs and Serials list 7): every "
        "result passes, exit 0; the Job asked for 8.",
    )
    add(
        "dcgm3-runtime-error.json",
        "dcgmi",
        _json(
            runtime_error(
                "DCGM GPU Diagnostic",
                "3.3.9",
                "Error: Unable to complete diagnostic for group 2147483647. Return: (-39) A "
                "diag instance is already running, cannot run a new diag until the current "
                "one finishes.",
            ),
            endl=True,
        ),
        217,
        (DCGM, "3.3.9", FAILURE_MESSAGE),
        "DCGM 3.3.9 while another diagnostic runs: runtime_error only (group 2147483647 is "
        "DCGM_GROUP_ALL_GPUS, dcgmi's default), exit 217, DCGM_ST_DIAG_ALREADY_RUNNING (-39).",
    )
    add(
        "dcgmi-no-host-engine.txt",
        "dcgmi",
        "Error: Unable to start an embedded host engine. DCGM initialization error.\n",
        249,
        (DCGM, "3.3.9", "dcgmi/Diag.cpp (StartDiag::DoExecuteConnectionFailure)"),
        "No host engine to reach and none can be started in the container: dcgmi prints a "
        "sentence, not JSON, even with -j; exit 249, DCGM_ST_INIT_ERROR (-7).",
    )
    add(
        "dcgm4-r2-pass.json",
        "dcgmi",
        _json(dcgm4(2, eight)),
        0,
        dcgm460,
        "DCGM 4.6.0, -r 2 on 8 H100s: software, pcie and memory pass on every GPU.",
    )
    add(
        "dcgm4.0-r1-pass.json",
        "dcgmi",
        _json(dcgm4(1, range(4), version="4.0.0")),
        0,
        (DCGM, "4.0.0", DIAG4),
        "DCGM 4.0.0, -r 1 on 4 GPUs: the software test only.",
    )
    mismatch = warning4(
        f"A memory mismatch was detected on GPU 6, but no error was reported by CUDA or NVML. "
        f"{TRIAGE_RUN_FIELD_DIAG}",
        FR_MEMORY_MISMATCH,
    )
    add(
        "dcgm4-r3-gpu6-memory-fail.json",
        "dcgmi",
        _json(
            dcgm4(
                3,
                eight,
                override={
                    ("memory", "GPU", 6): {
                        **entity("GPU", 6),
                        "status": "Fail",
                        "warnings": [mismatch],
                    }
                },
                summaries={"memory": {"status": "Fail", "warnings": [mismatch]}},
            )
        ),
        205,
        dcgm460,
        "DCGM 4.6.0, -r 3: memory fails on GPU 6 (DCGM_FR_MEMORY_MISMATCH, ISOLATE); its "
        "test_summary carries every error of the test: exit 205.",
    )
    add(
        "dcgm4-r3-skipped.json",
        "dcgmi",
        _json(
            dcgm4(
                3,
                eight,
                override={("eud", "GPU", g): {**entity("GPU", g), "status": "Skip"} for g in eight},
                summaries={"eud": {"status": "Skip"}},
            )
        ),
        0,
        dcgm460,
        "DCGM 4.6.0, -r 3: eud skipped on every GPU, everything else passes: exit 0.",
    )
    cpu_failed = warning4("The CPU EUD test failed on CPU 0.", FR_EUD_TEST_FAILED)
    add(
        "dcgm4-r3-cpu-fail-exit0.json",
        "dcgmi",
        _json(
            dcgm4(
                3,
                eight,
                cpus=(0,),
                override={
                    ("cpu_eud", "CPU", 0): {
                        **entity("CPU", 0),
                        "status": "Fail",
                        "warnings": [cpu_failed],
                    }
                },
                summaries={"cpu_eud": {"status": "Fail", "warnings": [cpu_failed]}},
            )
        ),
        0,
        dcgm460,
        "DCGM 4.6.0, -r 3 on a Grace system: cpu_eud fails on CPU 0. GetFailureResult counts "
        "only errors of the software test, of a GPU, or of no entity with a code: an error of "
        "a CPU leaves the exit 0 with a Fail in the JSON. (The message is made up: "
        "DCGM_FR_EUD_TEST_FAILED's text is written in place by the EUD.)",
    )
    alloc = warning4(
        f"Couldn't allocate at least 90.0% of GPU memory on GPU 2 {SYSTEM_TRIAGE}", FR_MEMORY_ALLOC
    )
    add(
        "dcgm4-r2-pass-with-error-exit226.json",
        "dcgmi",
        _json(
            dcgm4(
                2,
                eight,
                override={
                    ("memory", "GPU", 2): {
                        **entity("GPU", 2),
                        "info": ["Allocated 72367714304 bytes (84.6%)"],
                        "status": "Pass",
                        "warnings": [alloc],
                    }
                },
                summaries={"memory": {"status": "Pass", "warnings": [alloc]}},
            )
        ),
        226,
        dcgm460,
        "DCGM 4.6.0, -r 2: memory reports DCGM_FR_MEMORY_ALLOC on GPU 2 yet passes (DCGM "
        "issue 284); GetFailureResult sees an error of a GPU: every status Pass, exit 226.",
    )
    add(
        "dcgm4-runtime-error.json",
        "dcgmi",
        _json(
            runtime_error(
                "DCGM Diagnostic",
                "4.6.0",
                "Error: Unable to complete diagnostic. Return: (-39) : A diag instance is already "
                "running, cannot run a new diag until the current one finishes\n",
            ),
            endl=True,
        ),
        217,
        (DCGM, "4.6.0", FAILURE_MESSAGE),
        "DCGM 4.6.0 while another diagnostic runs: runtime_error (with the newline 4.x ends "
        "it with), exit 217.",
    )
    add(
        "dcgm4-status-warn.json",
        "dcgmi",
        _json(
            dcgm4(
                2,
                eight,
                override={
                    ("pcie", "GPU", 1): {
                        **entity("GPU", 1),
                        "status": "Warn",
                        "warnings": [
                            warning4(
                                "GPU 1 is running at PCI link width 8X, which is below the minimum "
                                "allowed link generation of 16 (parameter 'min_pci_width')",
                                (12, 13, 4),
                            )
                        ],
                    }
                },
                summaries={"pcie": {"status": "Warn"}},
            )
        ),
        0,
        dcgm460,
        'Constructed: dcgmi -j writes a WARN result "Fail" (HelperDisplayDiagResult without '
        'DDR_DISPLAY_WARN; dcgmi/tests/DiagTests.cpp checks it); "Warn" is what it writes in '
        "its table. This file is 4.6.0's shape with that word, for the script's warn rule.",
        constructed=True,
    )
    nccl219 = (NCCL_TESTS, "2.19.6", UTIL_219)
    add(
        "nccl-2.19-pass.txt",
        "all_reduce_perf",
        nccl_219(8, Bench((4123.6, 4119.2))),
        0,
        nccl219,
        "nccl-tests 2.19.6, 8 GPUs, 1 GiB all-reduce at about 456 GB/s bus bandwidth.",
    )
    add(
        "nccl-2.19-slow.txt",
        "all_reduce_perf",
        nccl_219(8, Bench((15650.0, 15702.3))),
        0,
        nccl219,
        "nccl-tests 2.19.6, 8 GPUs at about 120 GB/s (an NVLink down: PCIe speeds); it checks "
        "no threshold of its own (NCCL_TESTS_MIN_BW unset): exit 0.",
    )
    add(
        "nccl-2.19-min-bw-env.txt",
        "all_reduce_perf",
        nccl_219(8, Bench((4123.6, 4119.2)), min_bw_env=350.0),
        0,
        nccl219,
        "nccl-tests 2.19.6 with NCCL_TESTS_MIN_BW=350 set: the average line ends in OK.",
    )
    add(
        "nccl-2.19-wrong-results.txt",
        "all_reduce_perf",
        nccl_219(8, Bench((4123.6, 4119.2), wrong=(3, 0))),
        7,
        nccl219,
        "nccl-tests 2.19.6: 3 wrong elements out of place, so 1 out-of-bounds value FAILED; "
        "run() returns testNumResults, main's TESTCHECK prints its line: exit 7.",
    )
    add(
        "nccl-2.19-nccl-error.txt",
        "all_reduce_perf",
        nccl_219(
            8,
            None,
            failure=(
                f"{HOST}: Test NCCL failure common.cu:222 'unhandled cuda error (run with "
                "NCCL_DEBUG=INFO for details) / Cuda failure 2 'out of memory''",
                f" .. {HOST} pid 1: Test failure common.cu:1620",
                f" .. {HOST} pid 1: Test failure common.cu:1454",
            ),
        ),
        3,
        nccl219,
        "nccl-tests 2.19.6 whose communicators fail to start (NCCLCHECK in initComms, then "
        "TESTCHECK in run and main): no table, no footer, exit 3 (testNcclError). The text "
        "after ' / ' (ncclGetLastError) is made up.",
    )
    add(
        "nccl-2.19-invalid-gpus.txt",
        "all_reduce_perf",
        nccl_219(8, None, failure=(f" .. {HOST} pid 1: Test failure common.cu:1454",)),
        5,
        nccl219,
        "nccl-tests 2.19.6 asked for 8 GPUs where CUDA finds 7 (writeDeviceReport, on "
        "stderr): exit 5 (testNotImplemented).",
        stderr="Invalid number of GPUs: 8 requested but only 7 were found.\n"
        "Please check the number of processes and GPUs per process.\n",
    )
    add(
        "nccl-2.13-pass.txt",
        "all_reduce_perf",
        nccl_213(8, Bench((4131.1, 4127.9))),
        0,
        (NCCL_TESTS, "2.13.6", COMMON_213),
        "nccl-tests 2.13.6 (older table widths, no version line), 8 GPUs at about 455 GB/s.",
    )
    return found


def index(found: Sequence[Fixture]) -> str:
    """index.json: how each file's run exits, for the tests' fake tools."""
    entries = {
        f.name: {
            "tool": f.tool,
            "exit_code": f.exit_code,
            **({"stderr": f.name + ".stderr"} if f.stderr else {}),
        }
        for f in found
    }
    return json.dumps(entries, indent=2, sort_keys=True) + "\n"


def readme(found: Sequence[Fixture]) -> str:
    lines = [
        "# What the validation Job's tools print",
        "",
        "Written by `tools/validation_fixtures.py` (do not edit by hand; `--check` compares).",
        "Each file is what one run of `dcgmi diag -r <level> -j` or `all_reduce_perf -b 1G -e 1G",
        "-g <gpus>` writes on its standard output (`<name>.stderr`: on its standard error),",
        "built field by field from the code that writes it, at these commits:",
        "",
    ]
    lines += [f"- {repo} {version}: `{commit}`" for (repo, version), commit in COMMITS.items()]
    lines += [
        "",
        "`dcgmi diag -j` is printed with jsoncpp's `Value::toStyledString()` (jsoncpp 1.9.5 in",
        "DCGM 3.3.9, 1.9.6 in 4.x: `src/lib_json/json_writer.cpp`, StreamWriterBuilder defaults).",
        "`tools/validation_fixtures.py`'s writer of that format was checked byte for byte",
        "against jsoncpp 1.9.5 built from its source: parsing each `.json` here and printing it",
        "with `toStyledString()` gives the file back (the two runtime-error files end in one",
        "more newline, dcgmi's `std::endl`).",
        "",
        "`index.json` gives each run's exit code. Made up, as no run is published: GPU serials,",
        "the driver version, times, host names, PCI addresses and the numbers in `info`.",
        "",
        "| file | repository | version | from | exit | the run |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for f in found:
        repo, version, paths = f.source
        lines.append(f"| `{f.name}` | {repo} | {version} | {paths} | {f.exit_code} | {f.why} |")
    return "\n".join(lines) + "\n"


def files() -> dict[str, str]:
    found = fixtures()
    out = {f.name: f.stdout for f in found}
    out.update({f.name + ".stderr": f.stderr for f in found if f.stderr})
    out["index.json"] = index(found)
    out["README.md"] = readme(found)
    return out


def main(argv: list[str] | None = None, write: Callable[[Path, str], None] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    made = files()
    if args.check:
        stale = [
            name
            for name, text in made.items()
            if not (args.output / name).is_file()
            or (args.output / name).read_text(encoding="utf-8") != text
        ]
        for name in stale:
            print(
                f"{args.output / name}: differs from what {Path(__file__).name} makes",
                file=sys.stderr,
            )
        return 1 if stale else 0
    args.output.mkdir(parents=True, exist_ok=True)
    for name, text in made.items():
        (args.output / name).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
