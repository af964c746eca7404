"""Starting and stopping the control plane: clear errors, no child left behind."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuheal.sim import ControlPlane, ControlPlaneConfig, ControlPlaneError
from gpuheal.sim.process import log_tail
from tests.helpers import pid_alive, wait_for

pytestmark = pytest.mark.timeout(180)

MINIMAL = {"scheduler": False, "controller_manager": False, "kwok": False}


@pytest.mark.parametrize(
    ("component", "options"),
    [
        ("kube-apiserver", MINIMAL),
        # A component started after the apiserver: everything before it must go too.
        ("kube-scheduler", {"controller_manager": False, "kwok": False}),
    ],
)
def test_broken_flag_fails_fast_naming_component_and_log(
    component: str, options: dict[str, bool]
) -> None:
    config = ControlPlaneConfig(
        **options,  # type: ignore[arg-type]
        extra_args={component: ["--gpuheal-no-such-flag=1"]},
        start_timeout_s=60,
    )
    cp = ControlPlane(config)
    started = time.monotonic()
    with pytest.raises(ControlPlaneError) as err:
        cp.start()
    elapsed = time.monotonic() - started

    message = str(err.value)
    log_path = cp.log_path(component)
    assert message.startswith(f"{component} exited with code")
    assert str(log_path) in message
    assert "gpuheal-no-such-flag" in message  # the log tail shows the cause
    assert log_path.is_file()
    assert elapsed < 60

    assert "etcd" in cp.pids and component in cp.pids
    leftovers = {name: pid for name, pid in cp.pids.items() if pid_alive(pid)}
    assert leftovers == {}
    cp.stop()


# The child handles Ctrl-C as on a terminal even when the test runs as a background
# job (a shell without job control starts those with SIGINT ignored, and Python
# then installs no KeyboardInterrupt handler).
CHILD = """
import json, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from gpuheal.sim import ControlPlane, ControlPlaneConfig
cp = ControlPlane(ControlPlaneConfig(scheduler=False, controller_manager=False, kwok=False))
cp.start()
print(json.dumps({"pids": cp.pids, "workdir": str(cp.workdir)}), flush=True)
try:
    time.sleep(600)
finally:
    cp.stop()
"""


def _start_child() -> tuple[subprocess.Popen[str], dict[str, int], Path]:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        child.wait(10)
        pytest.fail(f"child exited with {child.returncode} before reporting its PIDs")
    report = json.loads(line)
    pids: dict[str, int] = report["pids"]
    assert set(pids) == {"etcd", "kube-apiserver"}
    assert all(pid_alive(pid) for pid in pids.values())
    return child, pids, Path(report["workdir"])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_children_die_with_their_parent(sig: signal.Signals) -> None:
    child, pids, workdir = _start_child()
    child.send_signal(sig)
    # The stop itself may take 2 x (10 s grace + 5 s after SIGKILL) on a loaded
    # machine: the apiserver, then etcd. The point here is that it ends, not how fast.
    try:
        child.wait(60)
    except subprocess.TimeoutExpired:
        child.kill()
        alive = {name: pid for name, pid in pids.items() if pid_alive(pid)}
        tails = "\n".join(
            f"--- {log.name} ---\n{log_tail(log)}" for log in sorted(workdir.glob("*.log"))
        )
        pytest.fail(f"the parent did not exit within 60 s of {sig.name}; alive: {alive}\n{tails}")
    # SIGINT runs our cleanup; SIGKILL leaves it to PR_SET_PDEATHSIG.
    wait_for(
        "every control-plane process to exit",
        lambda: not any(pid_alive(pid) for pid in pids.values()),
        timeout_s=20,
    )
    shutil.rmtree(workdir, ignore_errors=True)  # a SIGKILLed parent cannot clean up
