"""Fleet hygiene as a loop: every `hygiene.intervalSeconds`, `gpuheal audit`'s checks
(gpuheal/policy/hygiene.py) over the informer caches, so no request beyond what
the informers hold. The latest examination is what gpuheal_hygiene_* export when
scraped; the findings `hygiene.signals` names become fault signals of the
`hygiene` source once they have lasted `hygiene.signalAfterSeconds`.

Every replica runs it once its caches have synced (a standby's signals are warm
when it leads, as the DCGM source's are). Until its first examination the
source is unsettled: a restarted controller's silence does not clear a fault.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from gpuheal.clock import parse_time
from gpuheal.config import Config
from gpuheal.controller.signals import SignalPort
from gpuheal.model import HYGIENE_SIGNAL_KINDS, FaultRecord, NodeView, PodView
from gpuheal.policy.hygiene import Examination, Examined, examine, explained
from gpuheal.sources import hygiene

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (node, kind)


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class HygieneLoop:
    def __init__(
        self,
        config: Callable[[], Config],
        *,
        nodes: Callable[[], Iterable[NodeView]],
        pod: Callable[[str], PodView | None],
        pods_by_node: Mapping[str, Iterable[str]],
        records: Callable[[], Iterable[FaultRecord]],
        port: SignalPort,
        clock: Callable[[], dt.datetime] = _utcnow,
    ) -> None:
        self.config = config
        self.nodes = nodes
        self.pod = pod
        self.pods_by_node = pods_by_node
        self.records = records
        self.port = port
        self.clock = clock
        self.last: Examined | None = None
        self._since: dict[Key, dt.datetime] = {}  # when an unusable finding was first seen
        self._signalled: dict[Key, tuple[str, dt.datetime]] = {}  # its fault and start

    async def run(self, ready: asyncio.Event) -> None:
        """Examine on the interval, after the caches have synced (an empty cache
        has no findings, and would settle the source on nothing)."""
        await ready.wait()
        while True:
            try:
                self.examine_once()
            except Exception:  # one bad run must not end the loop
                log.exception("hygiene examination failed")
            await asyncio.sleep(self.config().hygiene.interval_seconds)

    def examine_once(self) -> Examination:
        config, now, started = self.config(), self.clock(), time.monotonic()
        pods = {
            node: [p for key in tuple(keys) if (p := self.pod(key)) is not None]
            for node, keys in tuple(self.pods_by_node.items())
        }
        nodes = {n.name: n for n in self.nodes()}
        seen = examine(nodes.values(), pods, config, now)
        self._signal(seen, nodes, config, now)
        self.last = Examined(seen, now.timestamp(), time.monotonic() - started)
        self.port.settled()
        log.debug("hygiene examined", extra={"nodes": seen.nodes, "findings": len(seen.findings)})
        return seen

    def _signal(
        self, seen: Examination, nodes: Mapping[str, NodeView], config: Config, now: dt.datetime
    ) -> None:
        wanted = config.hygiene.signals
        present = {
            (f.node, f.kind)
            for f in seen.findings
            if f.kind in HYGIENE_SIGNAL_KINDS and self.port.managed(f.node)
        }
        self._since = {k: v for k, v in self._since.items() if k in present}
        for key, (fault, _) in list(self._signalled.items()):
            if key not in present or key[1] not in wanted:
                self.port.resolve(key[0], fault)
                del self._signalled[key]
                log.info("hygiene finding ended", extra={"node": key[0], "fault_id": fault})
        records = tuple(self.records())
        for node, kind in sorted(present):
            severity = wanted.get(kind)
            if severity is None:
                continue
            key = (node, kind)
            if key not in self._signalled and not self._start(
                key, nodes[node], records, config, now
            ):
                continue
            fault, began = self._signalled[key]
            # Submitted every run: a held signal lasts the external TTL from its last sight.
            self.port.submit(hygiene.signal_for(node, kind, severity, fault, began))

    def _start(
        self,
        key: Key,
        node: NodeView,
        records: tuple[FaultRecord, ...],
        config: Config,
        now: dt.datetime,
    ) -> bool:
        """Whether a finding not signalled yet is a fault now: the open record's a
        restarted controller finds, else once it has lasted signalAfterSeconds with
        nothing explaining it (policy/hygiene.explained), timed from then."""
        name, kind = key
        record = hygiene.adopted(records, name, kind)
        if record is not None:  # a fault a restarted controller finds open
            self._signalled[key] = (record.fault_id, parse_time(record.detected_at) or now)
            return True
        why = explained(node, records)
        if why is not None:
            self._since.pop(key, None)
            log.debug("hygiene finding explained", extra={"node": name, "why": why})
            return False
        since = self._since.setdefault(key, now)
        if (now - since).total_seconds() < config.hygiene.signal_after_seconds:
            return False
        self._signalled[key] = (hygiene.fault_id(kind, since), since)
        log.info(
            "hygiene finding is a fault",
            extra={"node": name, "fault_id": self._signalled[key][0], "kind": kind},
        )
        return True
