"""The leader's record collector: closed GPUFault records are deleted by age and
by a count per node (gpuheal.policy.retention decides which), never an open one.

It stays out of remediation's way: it reads the informer cache (no LIST), runs
on its own task every `retention.intervalSeconds`, and deletes one record at a
time at `retention.deletesPerSecond`. Every delete goes through the API layer's
write gate like any write (a replica that loses the lease stops at once) and
carries the record's resourceVersion as a precondition: a record that changed
since it was read is left for the next pass. A delete the API server refuses
(RBAC, an outage) ends the pass with one warning: the next one tries again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable

from gpuheal.config import Config
from gpuheal.kube.api import ApiError, KubeApi, NotLeaderError, gpufault_path
from gpuheal.kube.failures import describe, failure_reason
from gpuheal.metrics.controller import ControllerMetrics
from gpuheal.model import FaultRecord, fault_record_name
from gpuheal.policy.retention import Collectable, collectable

log = logging.getLogger(__name__)


class RecordCollector:
    def __init__(
        self,
        api: KubeApi,
        *,
        records: Callable[[], Iterable[FaultRecord]],
        config: Callable[[], Config],
        reported: Callable[[str], Iterable[str]],
        metrics: ControllerMetrics,
    ) -> None:
        self.api = api
        self.records = records
        self.config = config
        # The fault ids a node reports now: their records are kept, or the fault
        # would look new without them.
        self.reported = reported
        self.metrics = metrics
        self.passes = 0

    async def run(self) -> None:
        """Sweep now, then every interval, until cancelled (the leader stepping down)."""
        while True:
            try:
                await self.collect()
            except NotLeaderError:
                log.info("retention pass stopped: not the leader")
            await asyncio.sleep(self.config().retention.interval_seconds)

    async def collect(self) -> int:
        """Delete what is due now; returns how many records were deleted."""
        cfg = self.config().retention
        if not cfg.enabled:
            return 0
        self.passes += 1
        records = list(self.records())
        nodes = {r.node for r in records if not r.open}
        keep = {fault_record_name(n, f) for n in nodes for f in self.reported(n)}
        due = collectable(records, cfg, dt.datetime.now(dt.UTC), keep=keep)
        if not due:
            return 0
        started, deleted = time.monotonic(), 0
        for item in due:
            began = time.monotonic()
            result = await self._delete(item)
            if result is None:
                break
            deleted += result
            pause = 1.0 / self.config().retention.deletes_per_second
            await asyncio.sleep(max(0.0, pause - (time.monotonic() - began)))
        log.info(
            "retention pass",
            extra={
                "due": len(due),
                "deleted": deleted,
                "duration_s": round(time.monotonic() - started, 1),
            },
        )
        return deleted

    async def _delete(self, item: Collectable) -> int | None:
        """1 when deleted, 0 when it needs no delete (gone, or changed since read),
        None when the pass must stop."""
        body = {"preconditions": {"resourceVersion": item.resource_version}}
        try:
            await self.api.delete(gpufault_path(item.name), body)
        except ApiError as err:
            if err.code in (404, 409):
                return 0
            self._failed(item, err)
            return None
        except NotLeaderError:
            raise
        except Exception as err:  # no answer (timeout, connection): the next pass retries
            self._failed(item, err)
            return None
        self.metrics.records_collected.labels(item.why).inc()
        return 1

    def _failed(self, item: Collectable, err: Exception) -> None:
        reason = failure_reason(err)
        self.metrics.records_collect_errors.labels(reason).inc()
        log.warning(
            "retention pass stopped: a delete failed; retrying at the next pass",
            extra={
                "record": item.name,
                "node": item.node,
                "reason": reason,
                "error": describe(err),
            },
        )
