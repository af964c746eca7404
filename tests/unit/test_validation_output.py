"""The validation Job's reading of its tools: the Python reader (policy/validation_output.py)
and the Job's own sh + awk script (policy/validation_script.py), each over every fixture in
tests/unit/data/validation/ (what `dcgmi diag -j` and `all_reduce_perf` really print, built
from their code: README.md there). The script runs under /bin/sh with fake `dcgmi` and
`all_reduce_perf` on PATH that print a fixture and exit as the real tool did, and a fake
/dev; the two readers must reach the same verdict in the same words."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuheal.policy.validation import DEFAULT_SCRIPT, parse_result
from gpuheal.policy.validation_output import (
    DETAIL_MAX,
    ToolVerdict,
    clip,
    judge_all_reduce_perf,
    judge_dcgmi_diag,
    parse_all_reduce_perf,
    parse_dcgmi_diag,
)
from gpuheal.policy.validation_script import DCGMI_AWK, ESCAPE_AWK, NCCL_AWK

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests/unit/data/validation"
INDEX: dict[str, dict[str, Any]] = json.loads((DATA / "index.json").read_text(encoding="utf-8"))
sys.path.insert(0, str(ROOT / "tools"))
import validation_fixtures  # noqa: E402

DCGMI = sorted(n for n, e in INDEX.items() if e["tool"] == "dcgmi")
NCCL = sorted(n for n, e in INDEX.items() if e["tool"] == "all_reduce_perf")
PASS3 = "dcgm3-r2-pass.json"
PASS4 = "dcgm4-r2-pass.json"
# Every awk the script may meet: Ubuntu's DCGM image has mawk, UBI's gawk, small images
# busybox. `make awks` (a step of `make test`) installs them; a missing one fails below.
AWKS = ["mawk", "gawk", "original-awk", "busybox"]
SHELLS = ["/bin/sh", "dash", "bash"]


@pytest.mark.parametrize("program", AWKS + SHELLS)
def test_every_awk_and_shell_the_script_meets_is_here(program: str) -> None:
    assert shutil.which(program), f"{program} is missing: run `make awks` (Debian's package)"


# What each fixture must come to (the Job asks for 8 GPUs, 4 for the 4.0 one), and words
# its detail must hold. Every "fail" here matters as much as a "pass".
EXPECTED: dict[str, tuple[bool, tuple[str, ...]]] = {
    "dcgm3-r2-pass.json": (True, ("dcgmi diag -r 2 passed on 8 GPUs: 11 tests",)),
    "dcgm3-r4-skipped.json": (True, ("passed on 8 GPUs", "skipped: Pulse Test")),
    "dcgm3-r3-gpu3-memory-fail.json": (
        False,
        ("exited 205 (DCGM_ST_NVVS_ISOLATE_ERROR)", "GPU Memory failed on GPU 3: Found 4 faulty"),
    ),
    "dcgm3-r1-deployment-fail.json": (
        False,
        ("exited 226 (DCGM_ST_NVVS_ERROR)", "Page Retirement/Row Remap failed on GPU 5: GPU 5 had"),
    ),
    "dcgm3-r2-warn-exit0.json": (
        False,
        ("exited 0:", "Persistence Mode failed on GPU 0: Persistence mode for GPU 0 is disabled"),
    ),
    "dcgm3-r2-7-of-8-gpus.json": (False, ("exited 0: it ran on 7 of 8 GPUs",)),
    "dcgm3-runtime-error.json": (
        False,
        ("exited 217 (DCGM_ST_DIAG_ALREADY_RUNNING): Error: Unable to complete diagnostic",),
    ),
    "dcgmi-no-host-engine.txt": (
        False,
        ("exited 249 (DCGM_ST_INIT_ERROR) without JSON: Error: Unable to start an embedded",),
    ),
    "dcgm4-r2-pass.json": (True, ("dcgmi diag -r 2 passed on 8 GPUs: 3 tests",)),
    "dcgm4.0-r1-pass.json": (True, ("dcgmi diag -r 1 passed on 4 GPUs: 1 test",)),
    "dcgm4-r3-skipped.json": (True, ("skipped: eud",)),
    "dcgm4-r3-gpu6-memory-fail.json": (
        False,
        ("exited 205", "memory failed on GPU 6: A memory mismatch was detected on GPU 6"),
    ),
    "dcgm4-r3-cpu-fail-exit0.json": (False, ("exited 0: cpu_eud failed on CPU 0",)),
    "dcgm4-r2-pass-with-error-exit226.json": (
        False,
        ("exited 226", "no result in its JSON failed", "Couldn't allocate at least 90.0%"),
    ),
    "dcgm4-runtime-error.json": (False, ("exited 217", "Return: (-39) : A diag instance")),
    "dcgm4-status-warn.json": (True, ("passed on 8 GPUs", "pcie warned on GPU 1: GPU 1 is")),
    "nccl-2.19-pass.txt": (True, ("bus bandwidth 455.925 GB/s (at least 350)",)),
    "nccl-2.13-pass.txt": (True, ("bus bandwidth 455.031 GB/s",)),
    "nccl-2.19-min-bw-env.txt": (True, ("bus bandwidth 455.925 GB/s",)),
    "nccl-2.19-slow.txt": (False, ("exited 0: bus bandwidth 119.867 GB/s, below 350 GB/s",)),
    "nccl-2.19-wrong-results.txt": (
        False,
        ("exited 7 (testNumResults)", "1 out-of-bounds values", "3 wrong elements at 1073741824 B"),
    ),
    "nccl-2.19-nccl-error.txt": (
        False,
        ("exited 3 (testNcclError)", 'no "# Avg bus bandwidth" line', "Test NCCL failure"),
    ),
    "nccl-2.19-invalid-gpus.txt": (
        False,
        ("exited 5", "it said: Invalid number of GPUs: 8 requested but only 7 were found"),
    ),
}


def text(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def stderr_of(name: str) -> str:
    extra = INDEX[name].get("stderr")
    return text(extra) if extra else ""


def level_of(name: str) -> str:
    found = re.search(r"-r(\d)", name)
    return found.group(1) if found else "2"


def gpus_of(name: str) -> int:
    return 4 if name.startswith("dcgm4.0") else 8


def python_dcgmi(
    name: str, exit_code: int | None = None, *, fail_on_warn: bool = False
) -> ToolVerdict:
    return judge_dcgmi_diag(
        text(name),
        INDEX[name]["exit_code"] if exit_code is None else exit_code,
        level=level_of(name),
        gpus=gpus_of(name),
        stderr=stderr_of(name),
        fail_on_warn=fail_on_warn,
    )


def python_nccl(name: str, min_gbps: str = "350") -> ToolVerdict:
    return judge_all_reduce_perf(
        text(name), INDEX[name]["exit_code"], gpus=8, min_gbps=min_gbps, stderr=stderr_of(name)
    )


# -- the script, run ---------------------------------------------------------------------


@dataclass
class Tool:
    stdout: str
    exit_code: int = 0
    stderr: str = ""


@dataclass
class Job:
    """One run of the built-in script as the Job runs it, with fake tools and /dev."""

    dcgmi: Tool | None
    nccl: Tool | None = None
    gpus: int = 8
    devices: int | None = None  # /dev/nvidia<N> nodes; None: as many as gpus
    level: str = "2"
    min_gbps: str = "0"
    env: dict[str, str] = field(default_factory=dict)
    awk: str | None = None  # an awk to put first on PATH as `awk`
    shell: str = "/bin/sh"


@dataclass(frozen=True)
class Ran:
    exit_code: int
    result: str
    tool: str
    detail: str
    message: str
    log: str


def fake(path: Path, tool: Tool) -> None:
    (path.parent / f"{path.name}.out").write_text(tool.stdout, encoding="utf-8")
    (path.parent / f"{path.name}.err").write_text(tool.stderr, encoding="utf-8")
    path.write_text(
        f"#!/bin/sh\ncat '{path}.out'\ncat '{path}.err' >&2\nexit {tool.exit_code}\n",
        encoding="utf-8",
    )
    path.chmod(0o755)


def run(job: Job, tmp: Path) -> Ran:
    bin_dir, dev = tmp / "bin", tmp / "dev"
    bin_dir.mkdir(exist_ok=True)
    dev.mkdir(exist_ok=True)
    for n in range(job.gpus if job.devices is None else job.devices):
        (dev / f"nvidia{n}").touch()
    for other in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
        (dev / other).touch()  # the driver's other nodes: no GPU each
    (dev / "nvidia-caps").mkdir(exist_ok=True)
    if job.dcgmi is not None:
        fake(bin_dir / "dcgmi", job.dcgmi)
    if job.nccl is not None:
        fake(bin_dir / "all_reduce_perf", job.nccl)
    if job.awk is not None:
        real = shutil.which(job.awk)
        assert real
        applet = " awk" if job.awk == "busybox" else ""
        (bin_dir / "awk").write_text(f'#!/bin/sh\nexec {real}{applet} "$@"\n', encoding="utf-8")
        (bin_dir / "awk").chmod(0o755)
    result = tmp / "termination-log"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "GPUHEAL_RESULT_FILE": str(result),
        "GPUHEAL_DEVICE_DIR": str(dev),
        "GPUHEAL_GPUS": str(job.gpus),
        "GPUHEAL_DCGM_LEVEL": job.level,
        "GPUHEAL_NCCL_MIN_BUSBW_GBPS": job.min_gbps,
        **job.env,
    }
    done = subprocess.run(
        [job.shell, "-c", DEFAULT_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    message = result.read_text(encoding="utf-8")
    said = json.loads(message)
    assert set(said) == {"result", "tool", "detail"}, message
    assert done.stderr == "", done.stderr
    return Ran(done.returncode, said["result"], said["tool"], said["detail"], message, done.stdout)


def dcgmi_job(name: str, **kw: Any) -> Job:
    tool = Tool(text(name), INDEX[name]["exit_code"], stderr_of(name))
    return Job(tool, gpus=gpus_of(name), level=level_of(name), **kw)


def nccl_job(name: str, **kw: Any) -> Job:
    tool = Tool(text(name), INDEX[name]["exit_code"], stderr_of(name))
    return Job(Tool(text(PASS3)), nccl=tool, min_gbps="350", **kw)


def same(ran: Ran, verdict: ToolVerdict) -> None:
    """The script said what the Python reader says, and the gate reads it so."""
    assert (ran.result, ran.detail) == ("pass" if verdict.passed else "fail", verdict.detail)
    assert (ran.exit_code == 0) == verdict.passed
    gate = parse_result(ran.exit_code, ran.message)
    assert gate.passed == verdict.passed, gate
    assert len(ran.message.encode()) < 4096  # the kubelet keeps 4096 bytes of the message
    assert f"validation {ran.result}: {ran.tool}: " in ran.log  # and it says so in its log


# -- the fixtures ------------------------------------------------------------------------


def test_the_fixtures_are_what_the_generator_makes_of_the_tools_code() -> None:
    made = validation_fixtures.files()
    on_disk = {p.name for p in DATA.iterdir()}
    assert on_disk == set(made)
    for name, body in made.items():
        assert text(name) == body, f"{name}: run tools/validation_fixtures.py"
    assert set(EXPECTED) == set(INDEX), "every fixture has its expected verdict here"


def test_the_jsoncpp_format_is_jsoncpps() -> None:
    """jsoncpp 1.9.x toStyledString: tab indentation, ' : ', a container on the line after
    its key, each array element on its own line, keys in byte order, \\u escapes."""
    doc = {"b": [1, "x"], "B": {}, "a": {"k": None}, "é": 'q"\n'}
    assert validation_fixtures.jsoncpp_styled(doc) == (
        '{\n\t"B" : {},\n\t"a" : \n\t{\n\t\t"k" : null\n\t},\n\t"b" : \n\t[\n\t\t1,\n'
        '\t\t"x"\n\t],\n\t"\\u00e9" : "q\\"\\n"\n}\n'
    )
    assert text(PASS3).startswith('{\n\t"DCGM GPU Diagnostic" : \n\t{\n\t\t"test_categories" : ')


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_python_reader_judges_each_fixture(name: str) -> None:
    passed, words = EXPECTED[name]
    verdict = python_dcgmi(name) if name in DCGMI else python_nccl(name)
    assert verdict.passed is passed, verdict
    for word in words:
        assert word in verdict.detail, (word, verdict.detail)


@pytest.mark.parametrize("name", DCGMI)
def test_the_script_judges_each_dcgmi_fixture_as_the_python_reader(
    name: str, tmp_path: Path
) -> None:
    ran = run(dcgmi_job(name), tmp_path)
    same(ran, python_dcgmi(name))
    assert ran.tool == "dcgmi-diag"


@pytest.mark.parametrize("name", NCCL)
def test_the_script_judges_each_all_reduce_fixture_as_the_python_reader(
    name: str, tmp_path: Path
) -> None:
    ran = run(nccl_job(name), tmp_path)
    verdict = python_nccl(name)
    if verdict.passed:  # the pass says both tools' details
        dcgm = judge_dcgmi_diag(text(PASS3), 0, level="2", gpus=8)
        verdict = ToolVerdict(True, clip(f"{dcgm.detail}; {verdict.detail}", DETAIL_MAX))
        assert ran.tool == "dcgmi-diag+nccl-all-reduce"
    else:
        assert ran.tool == "nccl-all-reduce"
    same(ran, verdict)


@pytest.mark.parametrize("awk", AWKS)
@pytest.mark.parametrize("shell", SHELLS)
def test_every_awk_and_shell_here_reads_alike(awk: str, shell: str, tmp_path: Path) -> None:
    for n, name in enumerate(("dcgm3-r3-gpu3-memory-fail.json", PASS4, "dcgm3-r2-warn-exit0.json")):
        (tmp_path / str(n)).mkdir()
        same(run(dcgmi_job(name, awk=awk, shell=shell), tmp_path / str(n)), python_dcgmi(name))
    (tmp_path / "nccl").mkdir()
    ran = run(nccl_job("nccl-2.19-wrong-results.txt", awk=awk, shell=shell), tmp_path / "nccl")
    same(ran, python_nccl("nccl-2.19-wrong-results.txt"))


# -- dcgmi: the rules ----------------------------------------------------------------------


def test_the_status_key_is_lower_case_as_dcgm_writes_it() -> None:
    """Issue 25 item 6: the old script looked for "Status": "Fail". NVVS_STATUS is "status"
    (nvvs/include/NvvsJsonStrings.h), and dcgmi can exit 0 with a failed test inside."""
    raw = text("dcgm3-r2-warn-exit0.json")
    assert '"status" : "Fail"' in raw and '"Status"' not in raw
    assert re.search(r'"Status" *: *"Fail"', raw) is None  # what the old script grepped
    assert INDEX["dcgm3-r2-warn-exit0.json"]["exit_code"] == 0
    assert not python_dcgmi("dcgm3-r2-warn-exit0.json").passed


def test_both_json_shapes_are_read_result_by_result() -> None:
    three = parse_dcgmi_diag(text("dcgm3-r3-gpu3-memory-fail.json"))
    assert three.root == "dcgm gpu diagnostic" and three.gpus == 8 and three.runtime_error is None
    (failed,) = [r for r in three.results if r.outcome == "fail"]
    assert (failed.category, failed.test, failed.entity, failed.status) == (
        "Hardware",
        "GPU Memory",
        "GPU 3",
        "Fail",
    )
    assert failed.messages[0].startswith("Found 4 faulty memory elements on GPU 3")
    four = parse_dcgmi_diag(text("dcgm4-r3-gpu6-memory-fail.json"))
    assert four.root == "dcgm diagnostic" and four.gpus == 8
    fails = [r for r in four.results if r.outcome == "fail"]
    assert [(r.test, r.entity, r.summary) for r in fails] == [
        ("memory", "GPU 6", False),
        ("memory", "", True),  # the test_summary
    ]
    level_one = parse_dcgmi_diag(text("dcgm3-r1-deployment-fail.json"))
    (row_remap,) = [r for r in level_one.results if r.outcome == "fail"]
    # A level-one result: an integer gpu_id, its message under "warnings".
    assert row_remap.entity == "GPU 5" and row_remap.messages[0].startswith("GPU 5 had memory")


def test_a_warn_is_said_and_fails_only_when_asked(tmp_path: Path) -> None:
    name = "dcgm4-status-warn.json"
    assert python_dcgmi(name).passed
    strict = python_dcgmi(name, fail_on_warn=True)
    assert not strict.passed and "pcie warned on GPU 1" in strict.detail
    ran = run(dcgmi_job(name, env={"GPUHEAL_FAIL_ON_WARN": "1"}), tmp_path)
    same(ran, strict)


def test_a_non_zero_exit_with_a_passing_json_fails(tmp_path: Path) -> None:
    """dcgmi's exit says what its JSON may not (4.x: an error recorded by a passing test;
    a killed or timed-out run): a non-zero exit fails whatever the JSON says."""
    for code in (226, 1):
        verdict = python_dcgmi(PASS3, exit_code=code)
        assert not verdict.passed
        assert verdict.detail.startswith(f"dcgmi diag -r 2 exited {code}")
        assert "no result in its JSON failed" in verdict.detail
        (tmp_path / str(code)).mkdir()
        same(run(Job(Tool(text(PASS3), code)), tmp_path / str(code)), verdict)


def test_no_json_empty_output_or_a_cut_json_fails_saying_so(tmp_path: Path) -> None:
    cut = text(PASS4)[: len(text(PASS4)) // 2]
    cases = {
        "killed": (Tool("", 137), "dcgmi diag -r 2 exited 137 without output"),
        "stderr only": (
            Tool("", 1, "dcgmi: error while loading shared libraries: libdcgm.so.4\n"),
            "exited 1 without JSON: dcgmi: error while loading shared libraries",
        ),
        "cut": (Tool(cut, 0), "dcgmi diag -r 2 exited 0; its JSON is cut short or malformed"),
        "other json": (
            Tool('{"result": "pass"}', 0),
            'its JSON has no "DCGM Diagnostic" object',
        ),
        "nothing run": (
            Tool('{"DCGM Diagnostic": {"test_categories": []}}', 0),
            "it ran on 0 of 8 GPUs; its JSON has no test results",
        ),
    }
    for n, (case, (tool, says)) in enumerate(cases.items()):
        verdict = judge_dcgmi_diag(
            tool.stdout, tool.exit_code, level="2", gpus=8, stderr=tool.stderr
        )
        assert not verdict.passed and says in verdict.detail, (case, verdict)
        (tmp_path / str(n)).mkdir()
        same(run(Job(tool), tmp_path / str(n)), verdict)


def test_a_run_whose_every_test_skipped_fails(tmp_path: Path) -> None:
    skipped = text(PASS4).replace('"status" : "Pass"', '"status" : "Skip"')
    verdict = judge_dcgmi_diag(skipped, 0, level="2", gpus=8)
    assert not verdict.passed and verdict.detail.endswith("no test passed")
    same(run(Job(Tool(skipped)), tmp_path), verdict)


def test_an_unknown_status_fails_and_is_named(tmp_path: Path) -> None:
    doc = json.loads(text(PASS3))
    (integration,) = [
        c for c in doc["DCGM GPU Diagnostic"]["test_categories"] if c["category"] == "Integration"
    ]
    integration["tests"][0]["results"][4]["status"] = "Aborted"
    odd = validation_fixtures.jsoncpp_styled(doc)
    assert odd != text(PASS3)
    verdict = judge_dcgmi_diag(odd, 0, level="2", gpus=8)
    assert not verdict.passed and 'PCIe failed on GPU 4: status "Aborted"' in verdict.detail
    same(run(Job(Tool(odd)), tmp_path), verdict)


def test_the_container_must_see_every_gpu_it_asked_for(tmp_path: Path) -> None:
    ran = run(dcgmi_job(PASS3, devices=7), tmp_path)
    assert ran.exit_code == 1 and ran.result == "fail" and ran.tool == "gpu-count"
    assert ran.detail == "saw 7 of 8 GPUs (/dev/nvidia[0-9]* in the container)"
    # nvidiactl, nvidia-uvm and nvidia-caps are the driver's, not GPUs: a node with no
    # GPU device fails even though they are there.
    (tmp_path / "none").mkdir()
    assert run(dcgmi_job(PASS3, devices=0), tmp_path / "none").detail.startswith("saw 0 of 8")
    (tmp_path / "more").mkdir()  # a privileged container sees all the node's: enough
    assert run(dcgmi_job(PASS3, devices=9), tmp_path / "more").result == "pass"


def test_a_missing_tool_fails_naming_it(tmp_path: Path) -> None:
    assert run(Job(None), tmp_path).detail == "dcgmi is not in the image"
    (tmp_path / "nccl").mkdir()
    ran = run(Job(Tool(text(PASS3)), min_gbps="350"), tmp_path / "nccl")
    assert (ran.result, ran.tool, ran.detail) == (
        "fail",
        "nccl-all-reduce",
        "all_reduce_perf is not in the image",
    )


def test_the_reading_ignores_layout_and_key_case(tmp_path: Path) -> None:
    """What matters is the structure: compact JSON, other indentation, "Status"/"STATUS",
    a status in capitals (nvvs's own "PASS") read the same."""
    raw = text("dcgm3-r3-gpu3-memory-fail.json")
    doc = json.loads(raw)
    want = python_dcgmi("dcgm3-r3-gpu3-memory-fail.json")

    def capital(found: re.Match[str]) -> str:
        return f'"{found[1].upper()}"'

    layouts = {
        "compact": json.dumps(doc, separators=(",", ":")),
        "indented": json.dumps(doc, indent=1),
        "keys in capitals": re.sub(r'"(status|warnings|gpu_id|tests)"', capital, raw),
        "statuses in capitals": raw.replace('"Pass"', '"PASS"').replace('"Fail"', '"FAIL"'),
    }
    for n, (layout, body) in enumerate(layouts.items()):
        verdict = judge_dcgmi_diag(body, 205, level="3", gpus=8)
        assert verdict == want, layout
        (tmp_path / str(n)).mkdir()
        same(run(Job(Tool(body, 205), level="3"), tmp_path / str(n)), verdict)


def test_many_failures_still_make_one_readable_message(tmp_path: Path) -> None:
    doc = json.loads(text(PASS4))
    for category in doc["DCGM Diagnostic"]["test_categories"]:
        for test in category["tests"]:
            for result in test["results"]:
                result["status"] = "Fail"
                result["warnings"] = [{"warning": 'quote " backslash \\ ' + "x" * 400}]
    body = validation_fixtures.jsoncpp_styled(doc)
    verdict = judge_dcgmi_diag(body, 226, level="2", gpus=8)
    assert not verdict.passed and len(verdict.detail) <= DETAIL_MAX
    # Each test named once with its GPUs, each message cut at MESSAGE_SHOWN.
    assert verdict.detail.count(" failed on GPU 0, GPU 1, GPU 2") == 3
    assert verdict.detail.count("xxx...") == 3
    ran = run(Job(Tool(body, 226)), tmp_path)
    same(ran, verdict)
    assert 'quote " backslash \\' in json.loads(ran.message)["detail"]


# -- all_reduce_perf: the rules -------------------------------------------------------------


def test_the_bandwidth_line_is_read_as_printed() -> None:
    run_ = parse_all_reduce_perf(text("nccl-2.19-pass.txt"))
    assert (run_.bus_bandwidth, run_.bandwidth_check) == ("455.925", "")
    assert (run_.out_of_bounds, run_.out_of_bounds_check, run_.wrong) == ("0", "OK", ())
    checked = parse_all_reduce_perf(text("nccl-2.19-min-bw-env.txt"))
    assert (checked.bus_bandwidth, checked.bandwidth_check) == ("455.925", "OK")
    wrong = parse_all_reduce_perf(text("nccl-2.19-wrong-results.txt"))
    assert wrong.out_of_bounds == "1" and wrong.out_of_bounds_check == "FAILED"
    assert wrong.wrong == (("1073741824", "3"),)
    old = parse_all_reduce_perf(text("nccl-2.13-pass.txt"))
    assert old.bus_bandwidth == "455.031" and old.wrong == ()


def test_bad_bandwidth_lines_fail(tmp_path: Path) -> None:
    good = text("nccl-2.19-pass.txt")
    cases = {
        "nan": (
            good.replace(": 455.925 ", ": -nan "),
            'its average bus bandwidth is "-nan", not a number',
        ),
        "no line": (
            "\n".join(line for line in good.split("\n") if "Avg bus bandwidth" not in line),
            'no "# Avg bus bandwidth" line in its output',
        ),
        "empty": (
            good.replace(": 455.925 ", ": "),
            'its average bus bandwidth is "", not a number',
        ),
        "wrong without exit": (
            good.replace("  455.68       0", "  455.68       2"),
            "exited 0: 2 wrong elements at 1073741824 B",
        ),
    }
    for n, (case, (body, says)) in enumerate(cases.items()):
        verdict = judge_all_reduce_perf(body, 0, gpus=8, min_gbps="350")
        assert not verdict.passed and says in verdict.detail, (case, verdict)
        (tmp_path / str(n)).mkdir()
        same(
            run(Job(Tool(text(PASS3)), nccl=Tool(body), min_gbps="350"), tmp_path / str(n)), verdict
        )


def test_the_threshold_is_inclusive_and_nccl_runs_only_when_asked(tmp_path: Path) -> None:
    at = judge_all_reduce_perf(text("nccl-2.19-pass.txt"), 0, gpus=8, min_gbps="455.925")
    above = judge_all_reduce_perf(text("nccl-2.19-pass.txt"), 0, gpus=8, min_gbps="455.926")
    assert at.passed and not above.passed
    slow = Tool(text("nccl-2.19-slow.txt"))
    # One GPU, or no threshold: no all-reduce, so the slow run is never looked at.
    for n, (gpus, min_gbps) in enumerate(((1, "350"), (8, "0"))):
        (tmp_path / str(n)).mkdir()
        job = Job(Tool(text(PASS3)), nccl=slow, min_gbps=min_gbps, gpus=gpus, devices=8)
        ran = run(job, tmp_path / str(n))
        assert (ran.result, ran.tool) == ("pass", "dcgmi-diag"), ran


# -- the two readers agree -------------------------------------------------------------------

STATUSES = ["Pass", "Fail", "Skip", "Warn", "PASS", "fail ", "Not Run", "Aborted", ""]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    statuses=st.lists(st.sampled_from(STATUSES), min_size=3, max_size=3),
    exit_code=st.sampled_from([0, 226, 205]),
    gpus=st.integers(1, 9),
    warn=st.booleans(),
)
def test_the_script_and_the_python_reader_agree_on_any_results(
    statuses: list[str],
    exit_code: int,
    gpus: int,
    warn: bool,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    doc = json.loads(text(PASS4))
    tests = [t for c in doc["DCGM Diagnostic"]["test_categories"] for t in c["tests"]]
    for test, status in zip(tests, statuses, strict=True):
        test["results"][gpus % 8]["status"] = status
        test["test_summary"]["status"] = status
    body = validation_fixtures.jsoncpp_styled(doc)
    verdict = judge_dcgmi_diag(body, exit_code, level="2", gpus=gpus, fail_on_warn=warn)
    failing = {"Fail", "fail ", "Aborted", ""} | ({"Warn"} if warn else set())
    if verdict.passed:  # the rules, said once more
        assert exit_code == 0 and gpus <= 8 and not failing & set(statuses)
    env = {"GPUHEAL_FAIL_ON_WARN": "1" if warn else "0"}
    tmp = tmp_path_factory.mktemp("agree")
    ran = run(Job(Tool(body, exit_code), gpus=gpus, devices=max(gpus, 8), env=env), tmp)
    same(ran, verdict)


def test_the_awk_programs_fit_in_single_quotes() -> None:
    for program in (DCGMI_AWK, NCCL_AWK, ESCAPE_AWK):
        assert "'" not in program
