"""A reconcile worker: take a node from the queue, reconcile it, requeue it as
the result says. Several run side by side while this replica leads."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gpuheal.kube.api import NotLeaderError
from gpuheal.kube.workqueue import WorkQueue

log = logging.getLogger(__name__)


async def work(
    queue: WorkQueue,
    reconcile: Callable[[str], Awaitable[float | None]],
    *,
    not_leader_retry_s: float,
) -> None:
    """Run until cancelled (the elector cancels the workers when the lease is lost)."""
    while True:
        key = await queue.get()
        try:
            again = await reconcile(key)
        except NotLeaderError:
            # The lease looked stale for a moment (a renewal slower than the renew
            # deadline) and the write gate refused; nothing was written. Keep the key:
            # if the lease is really lost the workers are cancelled and the next leader
            # starts from every node; if it is not, no event may ever bring it back.
            log.info("write refused: lease not renewed in time", extra={"node": key})
            queue.add_after(key, not_leader_retry_s)
        except asyncio.CancelledError:
            raise
        except Exception:
            delay = queue.add_rate_limited(key)
            log.exception("reconcile failed", extra={"node": key, "retry_s": delay})
        else:
            if again is not None:
                queue.add_after(key, again)
        finally:
            queue.done(key)
