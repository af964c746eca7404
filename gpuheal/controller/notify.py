"""Tell people: a POST to each configured webhook sink after each remediation step.

Sending runs on its own task behind a queue: a slow or failing sink is retried
with backoff and never delays a remediation. A message that still fails after
the retries is dropped with a log line and a metric (the Events and the
GPUFault record stay the audit trail).

A sink's URL is a secret (a Slack webhook's is in its path, others in the
query or user info): logs name a sink by its scheme and host only, and an HTTP
client's error message is scrubbed of the rest of the URL before it is logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from gpuheal.config import NotificationSink, without_url_secrets
from gpuheal.policy.backoff import backoff_delay

log = logging.getLogger(__name__)

ATTEMPTS = 5


@dataclass(frozen=True)
class Notice:
    node: str
    fault_id: str
    actions: tuple[str, ...]
    evicted: tuple[str, ...] = ()
    summary: str = ""

    def json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "faultId": self.fault_id,
            "actions": list(self.actions),
            "evictedPods": list(self.evicted),
            "summary": self.summary,
        }

    def slack(self) -> dict[str, Any]:
        if self.summary:
            return {"text": f"gpuheal: {self.summary} (fault {self.fault_id})"}
        evicted = f", evicted {len(self.evicted)} GPU pods" if self.evicted else ""
        text = f"gpuheal: {self.node} fault {self.fault_id}: {', '.join(self.actions)}{evicted}"
        return {"text": text}


class Notifier:
    def __init__(
        self,
        sinks: tuple[NotificationSink, ...],
        *,
        counted: Callable[[str], None] = lambda _result: None,
        retry_base_s: float = 1.0,
    ) -> None:
        self.sinks = sinks
        self.counted = counted  # by result: sent, failed, dropped
        self.retry_base_s = retry_base_s
        self.queue: asyncio.Queue[Notice] = asyncio.Queue(maxsize=10_000)

    def notify(self, notice: Notice) -> None:
        if not self.sinks:
            return
        try:
            self.queue.put_nowait(notice)
        except asyncio.QueueFull:
            self.counted("dropped")
            log.warning("notification queue full", extra={"node": notice.node})

    async def run(self) -> None:
        """Send the queued notices until cancelled (the controller's supervisor runs it)."""
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                notice = await self.queue.get()
                await asyncio.gather(*(self._send(session, sink, notice) for sink in self.sinks))

    async def _send(
        self, session: aiohttp.ClientSession, sink: NotificationSink, notice: Notice
    ) -> None:
        body = notice.slack() if sink.format == "slack" else notice.json()
        for attempt in range(1, ATTEMPTS + 1):
            try:
                async with session.post(sink.url, json=body) as response:
                    if response.status < 300:
                        self.counted("sent")
                        return
                    why = f"HTTP {response.status}"
            except (aiohttp.ClientError, TimeoutError, ValueError) as err:
                # Some errors quote the URL (InvalidURL, a redirect to a bad one).
                why = without_url_secrets(str(err), sink.url) or type(err).__name__
            if attempt < ATTEMPTS:
                await asyncio.sleep(backoff_delay(attempt, self.retry_base_s, 60.0))
        self.counted("failed")
        log.warning(
            "notification failed",
            extra={"node": notice.node, "sink": sink.shown, "error": why},
        )
