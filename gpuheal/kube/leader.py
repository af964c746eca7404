"""Lease leader election (coordination.k8s.io/v1), as client-go does it.

Expiry is judged on this process's monotonic clock from the moment the lease
record last changed, never by comparing another host's timestamps with ours.
The leader may write only while its last renewal is younger than the renew
deadline; a replica that cannot renew in time stops writing at once, before
any other replica can acquire (renew deadline < lease duration).

A lease that cannot be read or written (its namespace missing, no RBAC on
leases, the API server refusing) keeps this replica from leading, so it is
said at warning level, with the reason (again when the reason changes, else
once per `repeat_s`), counted, and kept in `problem` for /readyz to show.
A lost race with another replica (409) is no problem.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gpuheal.clock import iso
from gpuheal.kube.api import ApiError, KubeApi
from gpuheal.kube.failures import Streaks, describe, failure_reason

log = logging.getLogger(__name__)


def _micro_time(moment: dt.datetime) -> str:
    return iso(moment, "microseconds")


# Where the holder serves its API (http://<pod IP>:<port>), on the Lease: a standby
# forwards what only the leader may do there (api/forward.py).
ADDRESS_ANNOTATION = "gpuheal.io/leader-address"


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_s: float,
        renew_deadline_s: float,
        retry_s: float,
        on_started: Callable[[], Awaitable[None]],
        on_stopped: Callable[[], Awaitable[None]],
        counted: Callable[[str], None] = lambda _: None,
        repeat_s: float = 300.0,
    ) -> None:
        self.api = api
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.create_path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_s = lease_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_s = retry_s
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._leading = False
        self._last_renew = 0.0
        self._observed: tuple[str, str] = ("", "")  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._released = False
        self.transitions = 0
        self._counted = counted  # told the reason of every failed lease request
        self._streaks = Streaks(repeat_s)
        self.problem: str | None = None  # why the lease cannot be used, while it cannot
        # This replica's API address, written on the Lease while it leads ("": none).
        self.address = ""
        # The current holder's, as its Lease says (""; unknown, expired, or us).
        self.leader_address = ""

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def is_leader(self) -> bool:
        return self._leading and time.monotonic() - self._last_renew < self.renew_deadline_s

    def may_write(self) -> bool:
        """The controller's write gate (docs/architecture.md#the-write-gate)."""
        return self.is_leader

    def _is_released(self) -> bool:
        return self._released

    async def run(self) -> None:
        try:
            while not self._is_released():
                acquired = await self._try_acquire_or_renew()
                if self._is_released():  # release() ran while we were talking to the API
                    break
                now = time.monotonic()
                if acquired:
                    self._last_renew = now
                    if not self._leading:
                        self._leading = True
                        self.transitions += 1
                        log.info("became leader", extra={"identity": self.identity})
                        await self._on_started()
                elif self._leading and now - self._last_renew >= self.renew_deadline_s:
                    await self._stop_leading("renew deadline passed")
                await asyncio.sleep(self.retry_s)
        finally:
            if self._leading:
                self._leading = False
                await self._on_stopped()

    async def _stop_leading(self, why: str) -> None:
        self._leading = False
        log.warning("lost leadership", extra={"identity": self.identity, "reason": why})
        await self._on_stopped()

    async def _try_acquire_or_renew(self) -> bool:
        now = dt.datetime.now(dt.UTC)
        try:
            raw = await self.api.get(self.path)
        except ApiError as err:
            if err.code != 404:
                self._failed("read", err)
                return False
            return await self._create(now)
        except Exception as err:
            self._failed("read", err)
            return False
        lease: dict[str, Any] = json.loads(raw)
        spec = lease.setdefault("spec", {})
        holder = spec.get("holderIdentity") or ""
        observed = (holder, spec.get("renewTime") or "")
        mono = time.monotonic()
        if observed != self._observed:
            self._observed, self._observed_at = observed, mono
        duration = float(spec.get("leaseDurationSeconds") or self.lease_s)
        annotations = lease.setdefault("metadata", {}).setdefault("annotations", {}) or {}
        if holder and holder != self.identity and mono - self._observed_at < duration:
            self.leader_address = str(annotations.get(ADDRESS_ANNOTATION) or "")
            self._working()  # read fine; someone else leads
            return False
        self.leader_address = ""
        # Ours, or none: a former holder's address must not outlive its term.
        if self.address:
            annotations[ADDRESS_ANNOTATION] = self.address
        else:
            annotations.pop(ADDRESS_ANNOTATION, None)
        lease["metadata"]["annotations"] = annotations
        if holder != self.identity:
            spec["acquireTime"] = _micro_time(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = int(self.lease_s)
        spec["renewTime"] = _micro_time(now)
        if not await self._write("update", self.api.update(self.path, lease, ungated=True)):
            return False
        self._observed, self._observed_at = (self.identity, spec["renewTime"]), mono
        return True

    async def _create(self, now: dt.datetime) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                **({"annotations": {ADDRESS_ANNOTATION: self.address}} if self.address else {}),
            },
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.lease_s),
                "acquireTime": _micro_time(now),
                "renewTime": _micro_time(now),
                "leaseTransitions": 0,
            },
        }
        return await self._write("create", self.api.create(self.create_path, body, ungated=True))

    async def _write(self, step: str, request: Awaitable[object]) -> bool:
        """Send a lease write: False (told by _failed) when it fails, True when it worked."""
        try:
            await request
        except Exception as err:
            self._failed(step, err)
            return False
        self._working()
        return True

    def _failed(self, step: str, err: Exception) -> None:
        if isinstance(err, ApiError) and err.code == 409:
            # Another replica wrote first (AlreadyExists / Conflict): we read again next round.
            log.debug("lease race lost", extra={"lease": self.lease, "step": step})
            return
        reason, error = failure_reason(err), describe(err)
        self._counted(reason)
        self.problem = f"lease {self.lease}: {step} failed: {error}"
        report = self._streaks.failed(self.lease, reason, error)
        if report is None:
            return
        extra = {
            "lease": self.lease,
            "namespace": self.namespace,
            "step": step,
            "reason": reason,
            "error": error,
            "identity": self.identity,
        }
        if report.first:
            log.warning("lease request failed: cannot lead until it works", extra=extra)
        else:
            log.warning(
                "lease requests still failing",
                extra={**extra, "failures": report.streak.failures, "untold": report.repeats},
            )

    def _working(self) -> None:
        self.problem = None
        streak = self._streaks.succeeded(self.lease)
        if streak is not None:
            log.info(
                "lease works again",
                extra={"lease": self.lease, "identity": self.identity, "failures": streak.failures},
            )

    async def release(self) -> None:
        """Give the lease up (on SIGTERM) so a standby takes over without waiting it out.

        Writes stop first (the gate closes with `_leading`), then the lease is freed.
        """
        self._released = True
        if not self._leading:
            return
        self._leading = False
        await self._on_stopped()
        try:
            lease = json.loads(await self.api.get(self.path))
            spec = lease.setdefault("spec", {})
            if spec.get("holderIdentity") == self.identity:
                spec["holderIdentity"] = ""
                spec["leaseDurationSeconds"] = 1
                spec["renewTime"] = _micro_time(dt.datetime.now(dt.UTC))
                await self.api.update(self.path, lease, ungated=True)
                log.info("released the lease", extra={"identity": self.identity})
        except Exception as err:
            log.warning("lease release failed", extra={"error": str(err)})
