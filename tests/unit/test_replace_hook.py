"""The provider hook's call (gpuheal/controller/replace.py) as a command and as a
webhook that cannot be reached: what is accepted, what the record says, and that a
webhook URL's secret never reaches it. (The webhook that answers: the integration
test, tests/integration/test_repair_replace.py.)"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path

from gpuheal.config import ReplaceConfig
from gpuheal.controller.replace import KEY_ENV, call_hook
from gpuheal.policy.replace import CallReplace
from tests.corpus import EKS_NODES

CALL = CallReplace(EKS_NODES[0], "gf-1", "xid-79-a", "XidCritical79", "", 2, None)


def run(cfg: ReplaceConfig) -> tuple[bool, str]:
    return asyncio.run(call_hook(cfg, CALL))


def test_a_command_gets_the_json_and_the_key_and_exit_0_is_accepted(tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    script = (
        "import json, os, sys; "
        f"json.dump({{'body': json.load(sys.stdin), 'key': os.environ['{KEY_ENV}']}}, "
        f"open({str(seen)!r}, 'w'))"
    )
    accepted, detail = run(ReplaceConfig(command=(sys.executable, "-c", script)))
    assert accepted and detail.endswith("exit 0")
    got = json.loads(seen.read_text())
    assert got == {"body": CALL.body(), "key": CALL.key}


def test_a_failing_or_hanging_command_is_not_accepted_and_says_why() -> None:
    failing = (sys.executable, "-c", "import sys; sys.stderr.write('quota exceeded'); sys.exit(3)")
    accepted, detail = run(ReplaceConfig(command=failing))
    assert not accepted and "exit 3: quota exceeded" in detail
    hanging = (sys.executable, "-c", "import time; time.sleep(30)")
    accepted, detail = run(ReplaceConfig(command=hanging, timeout_seconds=1))
    assert not accepted and "no exit within 1s (killed)" in detail
    accepted, detail = run(ReplaceConfig(command=("/nonexistent/replace-node",)))
    assert not accepted and "not started" in detail


def test_an_unreachable_webhook_fails_and_its_secret_is_not_said() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://user:pa55@127.0.0.1:{port}/hooks/s3cr3t?token=t0k3n"
    accepted, detail = run(ReplaceConfig(webhook=url, timeout_seconds=2))
    assert not accepted and detail.startswith(f"http://127.0.0.1:{port}: ")
    for secret in ("pa55", "s3cr3t", "t0k3n"):
        assert secret not in detail
