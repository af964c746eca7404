"""Carry out a repair the controller requested on this node, at most once.

The request is the controller's annotation on this agent's own Node
(policy/repairwire.py). The agent acts on it only when it can verify it: it
names the fault this agent reports, it is not answered yet, and this agent has
not acted on it before. What the agent does is written to its state file
*before* it acts (`started`) and again after (the outcome), so a restart in the
middle never acts twice: a `started` attempt found after a restart is answered
failed, not tried again. The answer is the agent's result annotation.

The means:
- `reset-gpu`: `nvidia-smi -r -i <uuid>` per GPU of the fault (pynvml has no
  reset call; nvmlDeviceResetGpuLockedClocks resets clock limits, not the GPU),
  in the integration tests the NVML stand-in's nvidia-smi (testenv/nvml), in unit
  tests with `nvmlBackend: fake` FakeNvml's `reset_gpu`. Refused while a compute
  process holds one of the GPUs (the agent says which). The GPU's daemons (device
  plugin, DCGM; policy/daemons.py) are stopped first where configured, over rounds
  of the agent's loop, each step on disk before it is taken: `stopping-daemons`
  (deploy labels paused; their pods awaited, bounded), `resetting` (the agent's
  own NVML session shut down for the reset, then a check that each GPU answers),
  `restoring-daemons` (labels back, pods restarted, awaited, bounded), then the
  result. A restart resumes at the step on disk; a restart during `resetting`
  answers failed and still restores the daemons. A daemon that does not stop
  fails the attempt, named, and the daemons are restored.
- `reboot`: `repairRebootMethod`: a sentinel file (kured's /var/run/reboot-required)
  or a command; `none` refuses. The result is written after the node is back (a
  new boot id): a reboot is done when it happened, not when it was asked for.
  The sentinel names the attempt (`gpuheal <key> <time>`) and the agent removes
  its own once the boot id changed, or when an attempt it may have written it for
  is answered failed: a sentinel that outlives its reboot (a path that is not a
  tmpfs) would have the reboot daemon reboot the node again and again. A sentinel
  someone else wrote (a package manager's) is never removed.
"""

from __future__ import annotations

import datetime as dt
import logging
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pynvml

from gpuheal.agent.config import AgentConfig
from gpuheal.agent.daemons import NodeDaemons
from gpuheal.agent.debounce import Report
from gpuheal.agent.statefile import load_state
from gpuheal.clock import iso, parse_time
from gpuheal.model import REPAIR_REQUEST, REPAIR_RESULT
from gpuheal.policy import daemons as policy
from gpuheal.policy.repairwire import (
    Outcome,
    RepairRequest,
    RepairResult,
    decode_request,
    decode_result,
    fault_digest,
)
from gpuheal.xid import Action

log = logging.getLogger(__name__)

STARTED = "started"  # written before acting
SENTINEL_MARK = "gpuheal "  # the first word of a sentinel this agent wrote
REBOOTING = "rebooting"  # the reboot was asked for; answered once the boot id changes
# A reset's steps with the node's GPU daemons (written before each is taken).
STOPPING = "stopping-daemons"
RESETTING = "resetting"
RESTORING = "restoring-daemons"
KEEP = 32  # attempts remembered (a node sees a handful in its life)


class Attempt(msgspec.Struct):
    action: str
    # started | rebooting | stopping-daemons | resetting | restoring-daemons
    # | done | failed | refused
    outcome: str
    time: str
    detail: str = ""
    boot_id: str = ""
    written: bool = False  # the result annotation was written
    # A reset with the GPU's daemons: the GPUs, the labels this attempt paused, the
    # daemons that must come back (selectors) and the pods they may not come back as,
    # the end of the current wait, and the reset's outcome while they are restored.
    devices: list[str] = []
    paused: list[str] = []
    expected: list[dict[str, str]] = []
    old_uids: list[str] = []
    deadline: str = ""
    result: str = ""


class RepairFile(msgspec.Struct):
    attempts: dict[str, Attempt] = {}


class RepairLog:
    """The attempts this node's agent acted on, by request key, on disk."""

    def __init__(self, path: Path, counted: Callable[[], None] = lambda: None) -> None:
        self.path = path
        saved = load_state(path, RepairFile, counted)
        self.attempts: dict[str, Attempt] = dict(saved.attempts) if saved else {}

    def put(self, key: str, attempt: Attempt) -> None:
        self.attempts.pop(key, None)
        self.attempts[key] = attempt  # newest last
        for old in list(self.attempts)[:-KEEP]:
            del self.attempts[old]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.encode(RepairFile(self.attempts)))
        tmp.replace(self.path)

    def unanswered(self) -> bool:
        """An attempt whose result is not on the Node yet (the agent must look)."""
        return any(not a.written for a in self.attempts.values())


class RepairFailedError(Exception):
    def __init__(self, outcome: Outcome, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail


Reset = Callable[[str], None]  # one GPU by UUID; raises RepairFailedError


def smi_reset(command: Sequence[str], timeout_s: float) -> Reset:
    """The reset on a real node: `nvidia-smi -r -i <uuid>` (it refuses while the GPU
    is in use, and says why)."""

    def reset(uuid: str) -> None:
        argv = [*command, "-r", "-i", uuid]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except FileNotFoundError:
            raise RepairFailedError(Outcome.REFUSED, f"{command[0]} not found") from None
        except subprocess.TimeoutExpired:
            raise RepairFailedError(
                Outcome.FAILED, f"{command[0]} -r timed out after {timeout_s:g}s"
            ) from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[:200]
            raise RepairFailedError(
                Outcome.FAILED, f"{command[0]} -r exited {done.returncode}: {said}"
            )

    return reset


def nvml_reset(lib: Any) -> Reset:
    """The fake NVML backend's reset (agent/fakenvml.py), with NVML's answers."""

    def reset(uuid: str) -> None:
        try:
            lib.reset_gpu(uuid)
        except pynvml.NVMLError as err:
            code = int(getattr(err, "value", -1))
            refused = code == pynvml.NVML_ERROR_IN_USE
            raise RepairFailedError(
                Outcome.REFUSED if refused else Outcome.FAILED, f"reset of {uuid}: {err}"
            ) from None

    return reset


def holders(lib: Any | None, uuids: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """The compute processes on each of `uuids` that has any (NVML; without it the
    reset command's own refusal stands)."""
    if lib is None:
        return {}
    held: dict[str, tuple[int, ...]] = {}
    try:
        for index in range(int(lib.nvmlDeviceGetCount())):
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            uuid = lib.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            if uuid in uuids:
                pids = tuple(p.pid for p in lib.nvmlDeviceGetComputeRunningProcesses(handle))
                if pids:
                    held[uuid] = pids
    except pynvml.NVMLError as err:
        log.warning("cannot list GPU processes before a reset", extra={"error": str(err)})
    return held


def _now() -> str:
    return iso(dt.datetime.now(dt.UTC), "seconds")


def _passed(deadline: str) -> bool:
    until = parse_time(deadline)
    return until is None or dt.datetime.now(dt.UTC) >= until


class Repairer:
    """Answers the controller's requests on one node."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        node: str,
        boot_id: str,
        repairs: RepairLog,
        reset: Reset,
        nvml: Any | None,
        on_reset: Callable[[tuple[str, ...]], None] = lambda _: None,
        daemons: NodeDaemons | None = None,
        release_nvml: Callable[[], None] = lambda: None,
        resume_nvml: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.node = node
        self.boot_id = boot_id
        self.log = repairs
        self.reset = reset
        self.nvml = nvml
        self.on_reset = on_reset  # the GPUs reset: their held Xid events are over
        self.daemons = daemons  # None: no daemons to stop (none configured)
        # The agent's own NVML session (probe and event thread) holds the GPU open.
        self.release_nvml = release_nvml
        self.resume_nvml = resume_nvml
        self._sweep_sentinel()

    def _sweep_sentinel(self) -> None:
        """At start: a sentinel of ours that no reboot of this boot waits for is left
        over (the reboot happened, or its attempt was answered): remove it."""
        pending = {
            key
            for key, a in self.log.attempts.items()
            if a.outcome == REBOOTING and a.boot_id == self.boot_id
        }
        key = self._sentinel_key()
        if key is not None and key not in pending:
            self._clear_sentinel(key, "left over from an earlier boot or attempt")

    def _sentinel_key(self) -> str | None:
        """The attempt key of the sentinel on disk, if this agent wrote it."""
        if self.config.repair_reboot_method != "sentinel":
            return None
        try:
            first = self.config.repair_reboot_sentinel.read_text(errors="replace")[:512]
        except OSError:
            return None
        if not first.startswith(SENTINEL_MARK):
            return None
        fields = first.split()
        return fields[1] if len(fields) > 1 else ""

    def _clear_sentinel(self, key: str, why: str) -> None:
        """Remove the sentinel if it is this attempt's (a person's or a package
        manager's stays)."""
        if self._sentinel_key() != key:
            return
        path = self.config.repair_reboot_sentinel
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as err:
            log.warning(
                "reboot sentinel not removed",
                extra={"node": self.node, "path": str(path), "error": str(err)},
            )
            return
        log.info(
            "reboot sentinel removed",
            extra={"node": self.node, "path": str(path), "repair": key, "why": why},
        )

    def answer(self, annotations: Mapping[str, str], report: Report | None) -> RepairResult | None:
        """The result to write for the Node's request now (None: nothing to write),
        acting first if the request is new and verified."""
        request = decode_request(annotations.get(REPAIR_REQUEST))
        if request is None:
            return None
        written = decode_result(annotations.get(REPAIR_RESULT))
        known = self.log.attempts.get(request.key)
        if written is not None and written.answers(request):
            if known is not None and not known.written:
                self.log.put(request.key, msgspec.structs.replace(known, written=True))
            return None
        if known is not None:
            return self._known(request, known)
        refusal = self._refusal(request, report)
        if refusal is not None:
            return self._finish(request, Outcome.REFUSED, refusal)
        # On disk before the act: a restart from here on never acts again.
        self.log.put(request.key, Attempt(request.action.value, STARTED, _now(), "", self.boot_id))
        if request.action is Action.REBOOT:
            return self._reboot(request)
        devices = report.devices if report is not None else ()  # _refusal checked it
        return self._reset(request, devices)

    def written(self, result: RepairResult) -> None:
        known = self.log.attempts.get(result.key)
        if known is not None:
            self.log.put(result.key, msgspec.structs.replace(known, written=True))

    def _known(self, request: RepairRequest, known: Attempt) -> RepairResult | None:
        if known.outcome == STARTED:
            # The agent stopped while acting: what happened is unknown, and acting
            # again could be a second reset or reboot. The controller decides; a
            # sentinel written just before the stop must not reboot the node later.
            self._clear_sentinel(request.key, "its attempt is answered failed")
            return self._finish(
                request, Outcome.FAILED, "the agent restarted during the repair; not tried again"
            )
        if known.outcome in (STOPPING, RESETTING, RESTORING):
            return self._resume_reset(request, known)
        if known.outcome == REBOOTING:
            if known.boot_id == self.boot_id:
                return None  # not rebooted yet
            self._clear_sentinel(request.key, "the node rebooted")
            return self._finish(
                request, Outcome.DONE, f"rebooted (boot {known.boot_id[:8]} -> {self.boot_id[:8]})"
            )
        return RepairResult(
            request.action, request.fault, request.attempt, Outcome(known.outcome),
            known.time, known.detail,
        )  # fmt: skip

    def _refusal(self, request: RepairRequest, report: Report | None) -> str | None:
        if report is None:
            return "this node reports no fault now"
        if fault_digest(report.fault_id) != request.fault:
            return f"not the fault this node reports ({report.fault_id})"
        if request.action is Action.RESET_GPU:
            if not report.devices:
                return "the fault names no GPU to reset"
            held = holders(self.nvml, report.devices)
            if held:
                said = "; ".join(
                    f"{uuid} by pid {', '.join(map(str, pids))}" for uuid, pids in held.items()
                )
                return f"GPU in use: {said}"
        if request.action is Action.REBOOT and self.config.repair_reboot_method == "none":
            return "no reboot method on this node (repairRebootMethod: none)"
        return None

    # -- the reset, with the GPU's daemons -----------------------------------------

    def _deadline(self) -> str:
        until = dt.datetime.now(dt.UTC) + dt.timedelta(
            seconds=self.config.repair_daemon_timeout_seconds
        )
        return iso(until, "seconds")

    def _step(
        self, request: RepairRequest, known: Attempt, outcome: str, **changes: Any
    ) -> Attempt:
        """Write the attempt's next step (before it is taken)."""
        if outcome != known.outcome and "deadline" not in changes:
            changes["deadline"] = self._deadline()
        step = msgspec.structs.replace(known, outcome=outcome, time=_now(), **changes)
        self.log.put(request.key, step)
        log.info(
            "repair step",
            extra={"node": self.node, "repair": request.key, "step": outcome,
                   "detail": step.detail},
        )  # fmt: skip
        return step

    def _reset(self, request: RepairRequest, uuids: tuple[str, ...]) -> RepairResult | None:
        config, daemons = self.config, self.daemons
        started = self.log.attempts[request.key]
        if daemons is None:
            return self._reset_now(request, started, list(uuids))
        # What to pause and what must come back, on disk before the first label moves.
        paused = list(policy.to_pause(daemons.labels(), config.repair_pause_labels))
        pods = daemons.pods()
        selectors = [*config.repair_daemon_pods]
        step = self._step(
            request, started, STOPPING,
            devices=list(uuids), paused=paused,
            expected=[dict(s) for s in policy.present(pods, selectors)],
            old_uids=[p.uid for p in policy.running(pods, selectors)],
        )  # fmt: skip
        return self._stopping(request, step)

    def _resume_reset(self, request: RepairRequest, known: Attempt) -> RepairResult | None:
        """Go on with a reset at the step on disk (the last round's, or the one the
        agent stopped in)."""
        if known.outcome == STOPPING:
            return self._stopping(request, known)
        if known.outcome == RESETTING:
            # Stopped mid-reset: whether it happened is unknown; never a second one.
            known = self._step(
                request, known, RESTORING, result=Outcome.FAILED.value,
                detail="the agent restarted during the reset; not tried again",
            )  # fmt: skip
        return self._restoring(request, known)

    def _stopping(self, request: RepairRequest, known: Attempt) -> RepairResult | None:
        daemons = self.daemons
        if daemons is None:  # configured away across a restart: nothing to wait for
            return self._reset_now(request, known, known.devices)
        # Again after a restart: a pause written to disk but not yet to the Node.
        labels = daemons.labels()
        daemons.set_labels({k: policy.PAUSED for k in known.paused if labels.get(k) == policy.ON})
        holding = policy.running(daemons.pods(), self.config.repair_daemon_pods)
        if not holding:
            return self._reset_now(request, known, known.devices)
        if not _passed(known.deadline):
            return None  # the daemons are stopping: look again next round
        names = ", ".join(f"{daemons.namespace}/{p.name}" for p in holding)
        wait = self.config.repair_daemon_timeout_seconds
        staying = {p.uid for p in holding}  # never went: back as they are
        return self._restoring(
            request,
            self._step(
                request, known, RESTORING, result=Outcome.FAILED.value,
                detail=f"the GPU's daemons did not stop within {wait:g}s: {names}; not reset",
                old_uids=[u for u in known.old_uids if u not in staying],
            ),
        )  # fmt: skip

    def _reset_now(
        self, request: RepairRequest, known: Attempt, uuids: list[str]
    ) -> RepairResult | None:
        step = self._step(request, known, RESETTING)
        self.release_nvml()
        outcome, detail = Outcome.DONE, f"reset {', '.join(uuids)}"
        try:
            for uuid in uuids:
                self.reset(uuid)
        except RepairFailedError as err:
            outcome, detail = err.outcome, err.detail
        finally:
            self.resume_nvml()
        if outcome is Outcome.DONE:
            self.on_reset(tuple(uuids))
            silent = self._silent(uuids)
            if silent:
                outcome, detail = Outcome.FAILED, f"{detail}, but {silent}"
        if self.daemons is None:
            return self._finish(request, outcome, detail)
        step = self._step(request, step, RESTORING, result=outcome.value, detail=detail)
        # Restarted after the reset: the device plugin marks a device Unhealthy until it
        # restarts (the paused ones are new pods already).
        pods = self.daemons.pods()
        restart = policy.running(pods, self.config.repair_restart_pods)
        for pod in restart:
            self.daemons.delete(pod)
        if restart:
            again = policy.present(pods, self.config.repair_restart_pods)
            step = self._step(
                request, step, RESTORING,
                expected=[*step.expected, *(dict(s) for s in again if s not in step.expected)],
                old_uids=[*step.old_uids, *(p.uid for p in restart)],
            )  # fmt: skip
        return self._restoring(request, step)

    def _silent(self, uuids: list[str]) -> str:
        """After a reset: which GPU does not answer NVML ("" when each does)."""
        lib = self.nvml
        if lib is None:
            return ""
        try:
            lib.nvmlInit()
        except pynvml.NVMLError as err:
            return f"NVML does not initialise after it: {err}"
        try:
            for uuid in uuids:
                try:
                    lib.nvmlDeviceGetName(lib.nvmlDeviceGetHandleByUUID(uuid))
                except pynvml.NVMLError as err:
                    return f"{uuid} does not answer after it: {err}"
        finally:
            lib.nvmlShutdown()
        return ""

    def _restoring(self, request: RepairRequest, known: Attempt) -> RepairResult | None:
        outcome = Outcome(known.result or Outcome.FAILED.value)
        daemons = self.daemons
        if daemons is None:
            return self._finish(request, outcome, known.detail)
        daemons.set_labels(policy.to_restore(daemons.labels(), known.paused))
        missing = policy.not_back(daemons.pods(), known.expected, known.old_uids)
        if not missing:
            back = "; the GPU's daemons are back" if known.expected else ""
            return self._finish(request, outcome, known.detail + back)
        if not _passed(known.deadline):
            return None  # coming back: look again next round
        wait = self.config.repair_daemon_timeout_seconds
        detail = f"{known.detail}; not back within {wait:g}s: {', '.join(missing)}"
        return self._finish(request, outcome, detail)

    def _reboot(self, request: RepairRequest) -> RepairResult | None:
        config = self.config
        try:
            if config.repair_reboot_method == "sentinel":
                path = config.repair_reboot_sentinel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(f"gpuheal {request.key} {request.time}\n")
                said = f"wrote {path} for the reboot daemon"
            else:
                command = config.repair_reboot_command
                done = subprocess.run(
                    list(command),
                    capture_output=True,
                    text=True,
                    timeout=config.repair_reset_timeout_seconds,
                    check=False,
                )
                if done.returncode != 0:
                    out = (done.stderr or done.stdout).strip()[:200]
                    return self._finish(
                        request, Outcome.FAILED, f"{command[0]} exited {done.returncode}: {out}"
                    )
                said = f"ran {command[0]}"
        except (OSError, subprocess.TimeoutExpired) as err:
            return self._finish(request, Outcome.FAILED, f"reboot not requested: {err}")
        self.log.put(
            request.key, Attempt(request.action.value, REBOOTING, _now(), said, self.boot_id)
        )
        log.warning(
            "reboot requested", extra={"node": self.node, "repair": request.key, "how": said}
        )
        return None  # answered after the reboot

    def _finish(self, request: RepairRequest, outcome: Outcome, detail: str) -> RepairResult:
        at = _now()
        self.log.put(
            request.key, Attempt(request.action.value, outcome.value, at, detail, self.boot_id)
        )
        log.warning(
            "repair",
            extra={
                "node": self.node,
                "repair": request.key,
                "action": request.action.value,
                "outcome": outcome.value,
                "detail": detail,
            },
        )
        return RepairResult(request.action, request.fault, request.attempt, outcome, at, detail)
