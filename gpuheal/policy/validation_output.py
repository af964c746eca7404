"""What the validation Job's tools print, read as they really write it.

`dcgmi diag -r <level> -j` prints jsoncpp's styled JSON (tab-indented,
`"key" : value`, an object or array on the line after its key), in two shapes:

- DCGM 3.x: {"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests":
  [{"name", "results": [{"gpu_id", "status", "warnings": [{"warning", "error_id",
  ...}], "info"}]}]}]}, "GPU Device IDs": [...], "GPU Device Serials": {index:
  serial}, "Driver Version Detected", "version"}. A Deployment (level-one) result
  names its GPU with an integer gpu_id and its message "warnings", not "warning".
- DCGM 4.x: {"DCGM Diagnostic": {"test_categories": [... "tests": [{"name",
  "results": [{"entity_group": "GPU", "entity_group_id", "entity_id", "status",
  "warnings", "info": [...]}], "test_summary": {"status", "warnings"}}]}]},
  "entity_groups": [{"entity_group": "GPU", "entities": [{"entity_id", ...}]}],
  "metadata": {"version", ...}}.

Either may instead be {<root>: {"runtime_error": "...", "version"}}, and with no
host engine dcgmi prints a sentence, not JSON, even with -j. The key is "status"
(NVVS_STATUS, lower case) and its values "Pass", "Fail", "Skip" (dcgmi writes a
WARN result as "Fail" in JSON; "Warn" only in its table). The exit code is
DCGM's negative dcgmReturn_t as a byte: 226 for a failed test (DCGM_ST_NVVS_ERROR),
205 for one that says isolate the GPU. It is no proof either way: DCGM 3.x exits 0
for a WARN it writes "Fail", 4.x exits 0 for a failure of a CPU, and 4.x exits 226
when a passing test recorded an error.

`all_reduce_perf` (nccl-tests) prints a table whose header names the `#wrong`
columns, then `# Out of bounds values : N OK|FAILED` and `# Avg bus bandwidth    :
<%g> [OK|FAILED]` (the word only with NCCL_TESTS_MIN_BW set); it exits non-zero
on wrong results.

The rules here are the validation Job's (gpuheal/policy/validation.py), whose
shell script applies them with POSIX awk (the Job's image may have no Python):
the two are tested against each other over tests/unit/data/validation/, and the
details they write are the same sentences. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# dcgmi's exit code: DCGM's dcgmReturn_t (dcgmlib/dcgm_structs.h), negative, as a byte.
DCGMI_EXITS: Mapping[int, str] = {
    226: "DCGM_ST_NVVS_ERROR",  # -30: a test failed
    205: "DCGM_ST_NVVS_ISOLATE_ERROR",  # -51: a test failed, isolate the GPU
    242: "DCGM_ST_NO_DATA",  # -14: no tests or no results in the response
    217: "DCGM_ST_DIAG_ALREADY_RUNNING",  # -39
    203: "DCGM_ST_NVVS_KILLED",  # -53
    204: "DCGM_ST_NVVS_BINARY_NOT_FOUND",  # -52
    245: "DCGM_ST_TIMEOUT",  # -11
    249: "DCGM_ST_INIT_ERROR",  # -7
    248: "DCGM_ST_NVML_ERROR",  # -8
    235: "DCGM_ST_CONNECTION_NOT_VALID",  # -21
}
# all_reduce_perf's exit code: nccl-tests' testResult_t (src/common.h); 7 is what
# run() returns for wrong results or a bandwidth below NCCL_TESTS_MIN_BW.
NCCL_EXITS: Mapping[int, str] = {
    1: "testInternalError",
    2: "testCudaError",
    3: "testNcclError",
    4: "testTimeout",
    5: "testNotImplemented",
    6: "testInvalidUsage",
    7: "testNumResults",
}
ROOTS = ("dcgm gpu diagnostic", "dcgm diagnostic")  # NVVS_NAME, 3.x and 4.x, lower case
MESSAGE_SHOWN = 200  # characters of one tool message in a detail
TESTS_SHOWN = 4  # failing (or warning) tests named in a detail
SKIPS_SHOWN = 6
# dcgmi's JSON nests 8 deep; the script's recursive reader stops at this depth.
DEPTH_MAX = 64
DETAIL_MAX = 900  # the termination message holds 4096 bytes, the gate keeps 512 characters

NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?")
DIGITS = re.compile(r"[0-9]+")
# Lines of all_reduce_perf that say what went wrong (src/common.h's CHECK macros, the
# device report, writeErrors, NCCL's own warnings); TESTCHECK's trace only if none.
NCCL_ERROR = re.compile(
    r"Test (NCCL|CUDA) failure|Test timeout|^# error: |Invalid number of GPUs| NCCL WARN "
)
NCCL_TRACE = re.compile(r"Test failure")


@dataclass(frozen=True)
class ToolVerdict:
    passed: bool
    detail: str


def said(text: str) -> str:
    """A tool's string as one line for a detail: tabs, newlines (and \\b \\f \\r) as
    spaces, runs of spaces as one; other control and non-ASCII characters as JSON's
    \\uXXXX, as jsoncpp wrote them (the script keeps them so: it does not decode)."""
    out = []
    for char in text:
        code = ord(char)
        if char in "\t\n\r\f\b":
            out.append(" ")
        elif code < 0x20 or 0x80 <= code < 0x10000:
            out.append(f"\\u{code:04x}")
        elif code >= 0x10000:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(char)
    return re.sub(" +", " ", "".join(out)).strip(" ")


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def line_said(line: str) -> str:
    """A line of a tool's text (not JSON) for a detail: control characters as spaces, runs
    of spaces as one."""
    return re.sub(" +", " ", "".join(" " if ord(c) < 0x20 else c for c in line)).strip(" ")


def first_line(text: str) -> str:
    """The first line with more than blanks, said; "" when there is none."""
    for line in text.split("\n"):
        if line.strip(" \t\r"):
            return clip(line_said(line), MESSAGE_SHOWN)
    return ""


# -- dcgmi diag -j ----------------------------------------------------------------------


class NoJsonError(ValueError):
    """The output has no JSON object at all."""


class BadJsonError(ValueError):
    """The output's JSON is cut short or malformed."""


def _reject(constant: str) -> Any:
    raise BadJsonError(constant)


def _scalar(value: Any) -> str | None:
    """A scalar as the script holds it: strings as written, numbers as their text
    (parsed as text), true/false/null as those words; None for an object or array."""
    if isinstance(value, str):
        return value
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    return None


def _lower_keys(value: Any, depth: int = 1) -> Any:
    """Keys compared case-insensitively: lower-cased, spaces at their ends dropped. Of
    two keys that become one, the later wins (as in the script, and as in json)."""
    if depth > DEPTH_MAX:
        raise BadJsonError(f"nested deeper than {DEPTH_MAX}")
    if isinstance(value, dict):
        return {k.strip(" ").lower(): _lower_keys(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_lower_keys(v, depth + 1) for v in value]
    return value


def load_json(text: str) -> Any:
    """The first JSON object in `text` (what precedes its '{' and follows it is ignored);
    numbers are kept as their text. NoJsonError, or BadJsonError."""
    start = text.find("{")
    if start < 0:
        raise NoJsonError(text)
    decoder = json.JSONDecoder(parse_int=str, parse_float=str, parse_constant=_reject)
    try:
        value, _ = decoder.raw_decode(text, start)
    except (ValueError, RecursionError) as e:
        raise BadJsonError(str(e)) from e
    return _lower_keys(value)


@dataclass(frozen=True)
class DiagResult:
    """One "status" of a test: an entity's result, or the 4.x test_summary (entity "")."""

    where: tuple[int, int]  # the test: its category's and its own place in their lists
    category: str
    test: str
    entity: str  # "GPU 3", "CPU 0"; "" when the result names none
    status: str
    outcome: str  # pass, fail, skip, warn, notrun; an unknown status is a fail
    messages: tuple[str, ...]
    summary: bool = False
    gpu: str | None = None  # the GPU's id (index) when the result is a GPU's


@dataclass(frozen=True)
class DcgmDiag:
    root: str  # "dcgm gpu diagnostic" (3.x) or "dcgm diagnostic" (4.x)
    runtime_error: str | None
    results: tuple[DiagResult, ...]
    gpus: int  # GPUs the JSON lists as run on


def outcome(status: str) -> str:
    word = status.strip(" ").lower()
    for known in ("pass", "fail", "skip", "warn"):
        if word.startswith(known):
            return known
    if word.startswith(("not run", "notrun", "not_run")):
        return "notrun"
    return "fail"


def _messages(result: Mapping[str, Any]) -> tuple[str, ...]:
    found = []
    warnings = result.get("warnings")
    for item in warnings if isinstance(warnings, list) else ():
        if isinstance(item, dict):
            # 3.x level-one tests write the message under "warnings" (Diag.cpp).
            for key in ("warning", "warnings"):
                text = _scalar(item.get(key, []))
                if text is not None:
                    found.append(said(text))
                    break
        elif (text := _scalar(item)) is not None:
            found.append(said(text))
    return tuple(m for m in found if m)


def _entity(result: Mapping[str, Any]) -> tuple[str, str | None]:
    """(label, GPU id or None) of a result."""
    group, number = _scalar(result.get("entity_group", [])), _scalar(result.get("entity_id", []))
    if group is not None:
        label = f"{said(group)} {said(number or '')}".strip(" ")
        return label, (number if group.strip(" ").lower() == "gpu" else None)
    gpu = _scalar(result.get("gpu_id", []))
    if gpu is not None:
        return f"GPU {said(gpu)}", gpu
    return "", None


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _test_results(
    where: tuple[int, int], category: str, test: Mapping[str, Any]
) -> list[DiagResult]:
    name = said(_scalar(test.get("name", [])) or "")
    entries = [(r, False) for r in _items(test.get("results")) if isinstance(r, dict)]
    summary = test.get("test_summary")
    if isinstance(summary, dict):
        entries.append((summary, True))
    found = []
    for entry, is_summary in entries:
        status = _scalar(entry.get("status", []))
        if status is None:
            continue
        label, gpu = _entity(entry)
        found.append(
            DiagResult(
                where,
                category,
                name,
                label,
                status,
                outcome(status),
                _messages(entry),
                is_summary,
                gpu,
            )
        )
    return found


def _gpus_listed(doc: Mapping[str, Any], results: Sequence[DiagResult]) -> int:
    """The GPUs the JSON says it ran on: 3.x's "GPU Device IDs" (one per GPU) and
    "GPU Device Serials" (by GPU index), 4.x's entity_groups' GPU entities, and the GPUs
    its results name; the most of those counts."""
    ids = dict.fromkeys(r.gpu for r in results if r.gpu is not None)
    serials = doc.get("gpu device serials")
    ids.update(dict.fromkeys(serials if isinstance(serials, dict) else ()))
    for group in _items(doc.get("entity_groups")):
        if not isinstance(group, dict):
            continue
        if (_scalar(group.get("entity_group", [])) or "").strip(" ").lower() != "gpu":
            continue
        for one in _items(group.get("entities")):
            number = _scalar(one.get("entity_id", [])) if isinstance(one, dict) else None
            if number is not None:
                ids[number] = None
    return max(len(_items(doc.get("gpu device ids"))), len(ids))


def parse_dcgmi_diag(text: str) -> DcgmDiag:
    """`dcgmi diag -j`'s output. NoJsonError, BadJsonError; a JSON with neither root (or
    a root that is no object) is a DcgmDiag with root "" and nothing else."""
    doc = load_json(text)
    root = next((k for k in doc if k in ROOTS), "")
    body = doc.get(root) if root else None
    if not isinstance(body, dict):
        return DcgmDiag("", None, (), 0)
    results: list[DiagResult] = []
    for c, category in enumerate(_items(body.get("test_categories"))):
        if not isinstance(category, dict):
            continue
        name = said(_scalar(category.get("category", [])) or "")
        for t, test in enumerate(_items(category.get("tests"))):
            if isinstance(test, dict):
                results += _test_results((c, t), name, test)
    error = _scalar(body.get("runtime_error", []))
    return DcgmDiag(root, error, tuple(results), _gpus_listed(doc, results))


def _tests(results: Sequence[DiagResult], kind: str, verb: str) -> list[str]:
    """Each test with a result of `kind`, in order: 'memory failed on GPU 6: <message>'.
    The message is the first of its results', then of its test_summary; a status that
    is no known word is said as such."""
    by_test: dict[tuple[int, int], list[DiagResult]] = {}
    for r in results:
        if r.outcome == kind:
            by_test.setdefault(r.where, []).append(r)
    said_of = []
    for hits in by_test.values():
        entities = list(dict.fromkeys(r.entity for r in hits if r.entity))
        ordered = [r for r in hits if not r.summary] + [r for r in hits if r.summary]
        messages = [m for r in ordered for m in r.messages]
        unknown = [r.status for r in ordered if not r.status.strip(" ").lower().startswith(kind)]
        if not messages and unknown:
            messages = [f'status "{said(unknown[0])}"']
        text = f"{hits[0].test or 'a test'} {verb}"
        if entities:
            text += " on " + ", ".join(entities)
        if messages:
            text += ": " + clip(messages[0], MESSAGE_SHOWN)
        said_of.append(text)
    if len(said_of) > TESTS_SHOWN:
        said_of = [*said_of[:TESTS_SHOWN], f"and {len(said_of) - TESTS_SHOWN} more {verb}"]
    return said_of


def exit_said(code: int, names: Mapping[int, str]) -> str:
    return f"exited {code}" + (f" ({names[code]})" if code in names else "")


def judge_dcgmi_diag(
    stdout: str,
    exit_code: int,
    *,
    level: str,
    gpus: int,
    stderr: str = "",
    fail_on_warn: bool = False,
) -> ToolVerdict:
    """The validation's reading of one `dcgmi diag -r <level> -j`: it passes only on a
    JSON whose every result passes or is skipped (a warn too, unless `fail_on_warn`),
    with at least one pass, listing at least `gpus` GPUs, from an exit 0."""
    head = f"dcgmi diag -r {level}"
    ran = f"{head} {exit_said(exit_code, DCGMI_EXITS)}"
    try:
        diag = parse_dcgmi_diag(stdout)
    except NoJsonError:
        line = first_line(stdout) or first_line(stderr)
        return _fail(f"{ran} without JSON: {line}" if line else f"{ran} without output")
    except BadJsonError:
        return _fail(f"{ran}; its JSON is cut short or malformed")
    if not diag.root:
        return _fail(f'{ran}; its JSON has no "DCGM Diagnostic" object')
    if diag.runtime_error is not None and said(diag.runtime_error):
        return _fail(f"{ran}: {clip(said(diag.runtime_error), MESSAGE_SHOWN * 2)}")
    results = diag.results
    problems = _tests(results, "fail", "failed")
    if fail_on_warn:
        problems += _tests(results, "warn", "warned")
    if diag.gpus < gpus:
        problems.append(f"it ran on {diag.gpus} of {gpus} GPUs")
    passed = list(dict.fromkeys(r.where for r in results if r.outcome == "pass"))
    if not results:
        problems.append("its JSON has no test results")
    elif not passed:
        problems.append("no test passed")
    if exit_code != 0 and not problems:
        problems.append("no result in its JSON failed")
        found = [m for r in results for m in r.messages]
        if found:
            problems.append("it reported: " + clip(found[0], MESSAGE_SHOWN))
    if problems:
        return _fail(f"{ran}: " + "; ".join(problems))
    return ToolVerdict(True, clip(_passed(head, diag, len(passed)), DETAIL_MAX))


def _passed(head: str, diag: DcgmDiag, tests: int) -> str:
    detail = f"{head} passed on {diag.gpus} GPUs: {tests} test" + ("" if tests == 1 else "s")
    skips = {r.where: r.test or "a test" for r in diag.results if r.outcome == "skip"}
    skipped = list(skips.values())
    if skipped:
        more = len(skipped) - SKIPS_SHOWN
        detail += "; skipped: " + ", ".join(
            skipped[:SKIPS_SHOWN] + ([f"{more} more"] if more > 0 else [])
        )
    warned = _tests(diag.results, "warn", "warned")
    if warned:
        detail += "; " + "; ".join(warned)
    return detail


def _fail(detail: str) -> ToolVerdict:
    return ToolVerdict(False, clip(detail, DETAIL_MAX))


# -- all_reduce_perf --------------------------------------------------------------------


@dataclass(frozen=True)
class AllReduce:
    bus_bandwidth: str | None  # the "# Avg bus bandwidth" value as printed; None: no line
    bandwidth_check: str  # the word after it: "", "OK" or "FAILED" (NCCL_TESTS_MIN_BW)
    out_of_bounds: str | None  # the "# Out of bounds values" count as printed
    out_of_bounds_check: str
    wrong: tuple[tuple[str, str], ...]  # (size, #wrong) of each non-zero #wrong cell
    error: str  # the first line that says what went wrong, or ""


def _after_colon(line: str) -> tuple[str, str]:
    fields = [f for part in line.split(":", 1)[1].split(" ") for f in part.split("\t") if f]
    return (fields[0] if fields else ""), (fields[1] if len(fields) > 1 else "")


def parse_all_reduce_perf(text: str) -> AllReduce:
    bandwidth: tuple[str, str] | None = None
    bounds: tuple[str, str] | None = None
    columns: list[int] = []
    wrong: list[tuple[str, str]] = []
    error = trace = ""
    for raw in text.split("\n"):
        line = raw.removesuffix("\r")
        fields = line.split(" ")
        fields = [f for part in fields for f in part.split("\t") if f]
        if re.match(r"#[ \t]*Avg bus bandwidth[ \t]*:", line):
            bandwidth = _after_colon(line)
        elif re.match(r"#[ \t]*Out of bounds values[ \t]*:", line):
            bounds = _after_colon(line)
        elif line.startswith("#") and "#wrong" in fields:
            # The header's fields begin with "#" itself (its format is "# %10s  ..."):
            # a data row's fields are the header's less that one.
            shift = 1 if fields[0] == "#" else 0
            columns = [j - shift for j, f in enumerate(fields) if f == "#wrong"]
        elif not line.startswith("#") and fields and DIGITS.fullmatch(fields[0]) and columns:
            for j in columns:
                cell = fields[j] if j < len(fields) else ""
                if NUMBER.fullmatch(cell) and float(cell) > 0:
                    wrong.append((fields[0], cell))
        if not error and NCCL_ERROR.search(line):
            error = clip(line_said(line), MESSAGE_SHOWN)
        elif not trace and NCCL_TRACE.search(line):
            trace = clip(line_said(line), MESSAGE_SHOWN)
    return AllReduce(
        bandwidth[0] if bandwidth else None,
        bandwidth[1] if bandwidth else "",
        bounds[0] if bounds else None,
        bounds[1] if bounds else "",
        tuple(wrong),
        error or trace,
    )


def judge_all_reduce_perf(
    stdout: str, exit_code: int, *, gpus: int, min_gbps: str, stderr: str = ""
) -> ToolVerdict:
    """The validation's reading of `all_reduce_perf -g <gpus>` (its stdout, then its
    stderr): it passes on an exit 0 with no out-of-bounds value, no wrong cell, and an
    average bus bandwidth that is a number of at least `min_gbps`."""
    head = f"all_reduce_perf -g {gpus}"
    text = stdout + ("\n" if stdout and not stdout.endswith("\n") else "") + stderr
    if not NUMBER.fullmatch(min_gbps):
        return _fail(f'{head}: its threshold "{line_said(min_gbps)}" is not a number')
    run = parse_all_reduce_perf(text)
    problems = []
    if run.out_of_bounds is not None and (
        run.out_of_bounds != "0" or run.out_of_bounds_check == "FAILED"
    ):
        problems.append(f"{run.out_of_bounds} out-of-bounds values (wrong results)")
    problems += [f"{count} wrong elements at {size} B" for size, count in run.wrong[:3]]
    bw = run.bus_bandwidth
    if bw is None:
        problems.append('no "# Avg bus bandwidth" line in its output')
    elif not NUMBER.fullmatch(bw):
        problems.append(f'its average bus bandwidth is "{line_said(bw)}", not a number')
    else:
        if float(bw) < float(min_gbps):
            problems.append(f"bus bandwidth {bw} GB/s, below {min_gbps} GB/s")
        if run.bandwidth_check == "FAILED":
            problems.append("below NCCL_TESTS_MIN_BW by its own check")
    if exit_code != 0 or problems:
        if not problems:
            problems.append("no failure in its output")
        if run.error:
            problems.append("it said: " + run.error)
        return _fail(f"{head} {exit_said(exit_code, NCCL_EXITS)}: " + "; ".join(problems))
    return ToolVerdict(
        True, f"{head}: bus bandwidth {bw} GB/s (at least {min_gbps}), no wrong results"
    )
