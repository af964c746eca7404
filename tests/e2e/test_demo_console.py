"""`gpuheal demo --keep` watched on its console, as a person would: a real
headless chromium (Debian's) signs in with the token the demo prints, and the
demo's scripted faults appear on the fleet and faults views as they happen,
swapped in by the page's event stream (no reload); the timeline of a fault on
its page is its GPUFault record's. Ctrl-C then stops everything."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
from lightkube import Client, KubeConfig
from playwright.sync_api import Browser, expect

from gpuheal.sim.resources import GPUFault
from tests.e2e.test_demo import _gpuheal, _gpuheal_processes
from tests.helpers import wait_for

pytestmark = pytest.mark.timeout(300)

CONSOLE_LINE = re.compile(
    r"The console: (\S+)/console/ \(sign in with any name and the token '([^']+)'\)"
)
# The demo's four scripted faults, as it announces them (each after the last quarantined).
FAULTS = (
    r"Xid 79 in the kernel log of (\S+):",
    r"uncorrectable ECC errors on GPU 5 of (\S+) ",
    r"P1 temperature warning on (\S+) ",
    r"alert storm: the same Alertmanager alert for (\S+), ",
)
STEP_S = 120  # a demo step (control plane, faults, recovery) on a loaded machine
# The demo's shutdown is bounded by its parts' grace periods, each SIGKILLed after it
# (sim/process.py::stop_all): the agents 10 s, the controller 15 s, the control plane's
# clients, API server and etcd 10 s each; 55 s and the kills' waits if every part
# took all of its grace. It takes about 2 s here; 60 s was once too few in CI.
DEMO_STOP_S = 90


@dataclass
class DemoOutput:
    """The demo's stdout, read by a thread as it is printed, so the test can wait
    for a line while it drives the browser."""

    lines: list[str] = field(default_factory=list)
    done: bool = False
    changed: threading.Condition = field(default_factory=threading.Condition)

    def follow(self, stream: IO[str]) -> None:
        for line in stream:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.done = True
            self.changed.notify_all()

    def wait(self, pattern: re.Pattern[str] | str, start: int = 0) -> tuple[int, re.Match[str]]:
        """The index and match of the first line from `start` matching `pattern`."""
        compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + STEP_S
        with self.changed:
            while True:
                for i in range(start, len(self.lines)):
                    if found := compiled.search(self.lines[i]):
                        return i, found
                left = deadline - time.monotonic()
                assert left > 0 and not self.done, (
                    f"the demo printed no line like {compiled.pattern!r}:\n"
                    + "\n".join(self.lines[-40:])
                )
                self.changed.wait(min(left, 1.0))

    def text(self) -> str:
        with self.changed:
            return "\n".join(self.lines)


def _as_in_the_background() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture
def demo() -> Iterator[tuple[subprocess.Popen[str], DemoOutput]]:
    process = subprocess.Popen(
        [_gpuheal(), "demo", "--keep", "--nodes", "8", "--replicas", "8", "--gpus-per-pod", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        # Started as from a script in the background, which ignores SIGINT: the demo
        # must stop on Ctrl-C all the same (two clean-clone runs started so saw it
        # never stop: Python makes no KeyboardInterrupt of an inherited SIG_IGN).
        preexec_fn=_as_in_the_background,  # noqa: PLW1509 -- only a signal disposition
    )
    assert process.stdout is not None
    output = DemoOutput()
    reader = threading.Thread(target=output.follow, args=(process.stdout,), daemon=True)
    reader.start()
    try:
        yield process, output
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        reader.join(10)


def test_the_demos_faults_appear_live_on_its_console_and_the_timeline_is_the_records(
    browser: Browser, demo: tuple[subprocess.Popen[str], DemoOutput]
) -> None:
    process, output = demo
    at, console = output.wait(CONSOLE_LINE)
    url, token = console.group(1), console.group(2)

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    fleet = context.new_page()
    fleet.goto(f"{url}/console/login")
    fleet.fill("input[name=user]", "demo-watcher")
    fleet.fill("input[name=token]", token)
    fleet.click("button[type=submit]")
    fleet.wait_for_url("**/console/fleet")
    faults = context.new_page()
    faults.goto(f"{url}/console/faults")
    for page in (fleet, faults):
        page.wait_for_selector("body[data-live=on]", timeout=15_000)  # its event stream is open
        page.evaluate("window.notReloaded = true")
    # Both pages were open before the first fault: what follows arrives live.
    assert fleet.locator("#attention tr[data-node]").count() == 0
    assert faults.locator("#faults tr[data-fault]").count() == 0
    assert "Xid 79 in the kernel log" not in output.text(), "the console opened too late"

    seen: list[str] = []
    start = at
    for fault in FAULTS:
        at, injected = output.wait(fault, start)
        start = at + 1
        node = injected.group(1)
        seen.append(node)
        row = fleet.locator(f'#attention tr[data-node="{node}"]')
        expect(row.locator("td.state-quarantined")).to_have_text("quarantined", timeout=30_000)
        expect(faults.locator("#faults tr[data-fault]", has_text=node)).to_have_count(
            1, timeout=30_000
        )
    assert len(set(seen)) == 4
    for page in (fleet, faults):
        assert page.evaluate("window.notReloaded") is True  # swapped in, never reloaded

    # The Xid node was rebooted and returned: its fault's whole life, as recorded.
    _, exported = output.wait(r"export KUBECONFIG=(\S+)")
    output.wait(r"Press Ctrl-C to stop\.")
    kube = Client(KubeConfig.from_file(exported.group(1)))
    (record,) = [
        dict(r) for r in kube.list(GPUFault) if (r.get("spec") or {}).get("node") == seen[0]
    ]
    name = record["metadata"]["name"]
    page = context.new_page()
    page.goto(f"{url}/console/faults/{name}")

    def timeline_is_the_records() -> bool:
        shown = [
            [cell.inner_text() for cell in row.locator("td").all()]
            for row in page.locator("#timeline tr:has(td)").all()
        ]
        recorded = _timeline(kube.get(GPUFault, name))
        return bool(recorded) and shown == recorded

    wait_for("the timeline as recorded", timeline_is_the_records, timeout_s=30)
    recorded = [row[1] for row in _timeline(kube.get(GPUFault, name))]
    assert {"detect", "taint", "untaint"} <= set(recorded), recorded
    expect(page.locator("#phase")).to_have_text("Resolved")
    # The Deployment's pods it moved: each with its ReplicaSet and the nodes of the
    # pods that ReplicaSet created since (the node itself again, once it returned).
    moved = (record.get("status") or {}).get("evictedPods") or []
    assert moved, record
    rows = page.locator("#moves tr[data-pod]")
    expect(rows).to_have_count(len(moved))
    for row in rows.all():
        assert row.locator("td.owner").inner_text().startswith("ReplicaSet/llm-finetune-")
        where = row.locator("td.where").inner_text()
        assert where and all(n.startswith("gpu-node-") for n in where.split(", ")), where
    # And gpuheal's Events about it, from the controller's Event cache.
    expect(page.locator("#events td.reason", has_text="GPUFaultQuarantined")).to_have_count(1)
    context.close()

    process.send_signal(signal.SIGINT)
    assert exit_code(process, output, DEMO_STOP_S) == 0, output.text()[-3000:]
    output.wait(r"control plane stopped")
    # Nothing of this demo's is left (other gpuheal processes may run beside it).
    kubeconfig = exported.group(1)
    assert [p for p in _gpuheal_processes() if kubeconfig in p] == []


def exit_code(process: subprocess.Popen[str], output: DemoOutput, timeout_s: float) -> int:
    """The demo's exit code; if it is still running after `timeout_s` (CI saw that
    once, after Ctrl-C), fail with what would tell why: its last lines (each step of
    its shutdown is said) and its processes still alive, with their states."""
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        alive = _descendants(process.pid)
        raise AssertionError(
            f"the demo did not end {timeout_s:.0f} s after Ctrl-C; its processes:\n"
            + "\n".join(alive)
            + "\nits last lines:\n"
            + output.text()[-3000:]
        ) from None


def _descendants(root: int) -> list[str]:
    """`pid state command` of `root` and of each process under it, from /proc."""
    rows: dict[int, tuple[int, str]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            argv = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        said = f"{stat.parent.name} {fields[0]} {argv.decode(errors='replace')[:240]}"
        rows[int(stat.parent.name)] = (int(fields[1]), said)
    under = {root}
    for _ in range(8):  # the demo, its components, their children
        under |= {pid for pid, (ppid, _) in rows.items() if ppid in under}
    return [rows[pid][1] for pid in sorted(under) if pid in rows]


def _timeline(record: Any) -> list[list[str]]:
    status = record.get("status") or {}
    return [[a["time"], a["action"], a["result"], a.get("detail", "")] for a in status["actions"]]
