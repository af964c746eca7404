"""One control-plane component as a child process: start, wait until ready, stop.

Each upstream command installs a process-wide signal handler that may be set up
only once, so every component runs in its own process. Children are started in
their own session (a Ctrl-C reaches only us, and we stop them in order) and with
PR_SET_PDEATHSIG, so they die with us even when we are SIGKILLed.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1
_LOG_TAIL_LINES = 25


class ControlPlaneError(RuntimeError):
    """A component failed to start or to become ready. The message names it and its log."""


def free_port() -> int:
    """A loopback TCP port that is free right now.

    The port is handed to a child that binds it a moment later; a clash is
    possible in principle and shows up as a clear start error naming the port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_ok(
    url: str, *, ssl_context: ssl.SSLContext | None = None, token: str | None = None
) -> bool:
    """True if GET `url` answers 200 within 2 s; any failure is False."""
    request = urllib.request.Request(url)  # noqa: S310 -- loopback URLs we built
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with (
        contextlib.suppress(OSError, urllib.error.URLError),
        urllib.request.urlopen(request, timeout=2, context=ssl_context) as response,  # noqa: S310
    ):
        return bool(response.status == 200)
    return False


def http_json(
    url: str, *, ssl_context: ssl.SSLContext | None = None, token: str | None = None
) -> Any:
    """GET `url` (within 5 s) and its JSON body; errors raise."""
    request = urllib.request.Request(url)  # noqa: S310 -- loopback URLs we built
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=5, context=ssl_context) as response:  # noqa: S310
        return json.loads(response.read())


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class Component:
    """A named child process writing to its own log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        # Added to this process's environment at every start (and `start(env)`'s on top).
        self.env = dict(env or {})
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, env: Mapping[str, str] | None = None) -> None:
        """Start the process; `env` adds to (not replaces) this process's environment
        and the component's own."""
        env = {**self.env, **(env or {})}
        binary = Path(self.argv[0])
        if not binary.is_file():
            raise ControlPlaneError(
                f"{self.name}: binary {binary} is missing; build it with `make testenv`"
            )
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **env} if env else None,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 -- only prctl, no locks
            )

    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def failure(self, what: str) -> ControlPlaneError:
        tail = log_tail(self.log_path)
        return ControlPlaneError(
            f"{self.name} {what}; log: {self.log_path}\n--- last lines of the log ---\n{tail}"
        )

    def wait_ready(self, probe: Callable[[], bool], deadline: float) -> None:
        """Poll `probe` until it returns True; fail fast if the process exits."""
        while True:
            code = self.exit_code()
            if code is not None:
                raise self.failure(f"exited with code {code} before it was ready")
            if probe():
                return
            if time.monotonic() >= deadline:
                raise self.failure("did not become ready before the timeout")
            time.sleep(0.1)

    def signal(self, sig: signal.Signals) -> None:
        if self._proc and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, sig)

    def wait_stopped(self, timeout: float) -> bool:
        if self._proc is None:
            return True
        try:
            self._proc.wait(timeout=max(timeout, 0))
        except subprocess.TimeoutExpired:
            return False
        return True


def stop_all(components: Sequence[Component], grace: float) -> None:
    """SIGTERM the group, wait up to `grace` seconds, then SIGKILL whoever is left."""
    for component in components:
        component.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for component in components:
        if not component.wait_stopped(deadline - time.monotonic()):
            component.signal(signal.SIGKILL)
            component.wait_stopped(5)
