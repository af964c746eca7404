"""What probes find, and the verdict of one probe round. Pure data and functions."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpuheal.model import Severity
from gpuheal.policy.access import NO_GPUS_VISIBLE, Problem

# Severities that make a node faulty; P2 findings are warnings.
NODE_FAULT = frozenset({Severity.P0, Severity.P1})


@dataclass(frozen=True)
class ProbeFinding:
    """One problem a probe saw."""

    reason: str  # e.g. XidCritical79, EccUncorrectable, GpuMissing, GpuLost, NvlinkDown
    severity: Severity
    message: str
    devices: tuple[str, ...] = ()
    # A P0 Xid event: may be reported without waiting for the debounce rounds.
    immediate: bool = False


@dataclass(frozen=True)
class ProbeResult:
    probe: str
    ran: bool  # False: the probe itself could not run (timeout, library missing, ...)
    # A level probe (NVML, nvidia-smi) can vouch for the GPUs being healthy; event
    # sources (kernel log, Xid events) and environment checks only add findings.
    level: bool = False
    findings: tuple[ProbeFinding, ...] = ()
    warnings: tuple[str, ...] = ()
    error: str = ""
    hung: bool = False  # it did not run because a call of it has not returned


HEALTHY_REASON = "GPUsHealthy"
HEALTHY_MESSAGE = "all GPU probes passed"
UNKNOWN_REASON = "ProbesFailed"
# Unknown because a level probe's driver call hangs (agent/timeouts.py): said apart
# from a probe that failed, for a hang is the driver's fault, not the agent's access.
HUNG_REASON = "DriverUnresponsive"


class Health(StrEnum):
    HEALTHY = "True"
    FAULTY = "False"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class Verdict:
    health: Health
    reason: str = ""
    message: str = ""
    devices: tuple[str, ...] = ()
    severity: Severity | None = None
    immediate: bool = False


def verdict(results: list[ProbeResult]) -> Verdict:
    """Combine one round of probe results.

    Faulty when any probe found a node fault (P0/P1): the reason is the most
    severe finding's. Unknown when there are level probes and none of them could
    run: nobody can vouch for the GPUs, and Unknown is not Unhealthy (the reason
    says whether a driver call hangs). Otherwise healthy.
    """
    faults = sorted(
        (f for r in results for f in r.findings if f.severity in NODE_FAULT),
        key=lambda f: f.severity.rank,
    )
    if faults:
        devices = tuple(dict.fromkeys(d for f in faults for d in f.devices))
        message = "; ".join(dict.fromkeys(f.message for f in faults))
        return Verdict(
            Health.FAULTY,
            reason=faults[0].reason,
            message=message[:1024],
            devices=devices,
            severity=faults[0].severity,
            immediate=any(f.immediate for f in faults),
        )
    levels = [r for r in results if r.level]
    if levels and not any(r.ran for r in levels):
        errors = "; ".join(f"{r.probe}: {r.error}" for r in levels)
        reason = HUNG_REASON if any(r.hung for r in levels) else UNKNOWN_REASON
        return Verdict(Health.UNKNOWN, reason=reason, message=errors[:1024])
    return Verdict(Health.HEALTHY, reason=HEALTHY_REASON, message=HEALTHY_MESSAGE)


def with_access(seen: Verdict, problems: tuple[Problem, ...]) -> Verdict:
    """The round's verdict told with what the agent cannot reach (policy/access.py):
    a fault stays the fault; otherwise the worst problem is the condition's reason.
    NVML seeing no GPU vouches for none: Unknown. A missing piece besides a probe
    that vouched (the kernel log; NVML where nvidia-smi's fallback ran) leaves the
    GPUs healthy, the reason saying what is missing."""
    if not problems or seen.health is Health.FAULTY:
        return seen
    message = "; ".join(p.message for p in problems)
    if seen.health is Health.UNKNOWN:
        probes = f" ({seen.message})" if seen.message else ""
        return Verdict(Health.UNKNOWN, problems[0].reason, (message + probes)[:1024])
    if any(p.reason == NO_GPUS_VISIBLE for p in problems):
        return Verdict(Health.UNKNOWN, NO_GPUS_VISIBLE, message[:1024])
    return Verdict(Health.HEALTHY, problems[0].reason, f"{HEALTHY_MESSAGE}; {message}"[:1024])
