"""How the API server serves gpuheal's CRDs against this version's: read at start
and every CRD_CHECK_S, said once per change. A replica never leads over an older
GPUFault schema (its writes would lose fields); a GPURollout schema not this
version's only stops the roll-outs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from gpuheal.kube import crds
from gpuheal.kube.api import KubeApi
from gpuheal.model import GPUFAULT_GROUP

log = logging.getLogger(__name__)

GPUFAULT_CRD = f"gpufaults.{GPUFAULT_GROUP}"
GPUROLLOUT_CRD = f"gpurollouts.{GPUFAULT_GROUP}"
CRD_CHECK_S = 10.0  # how often the served CRDs are compared with this version's


class SchemaCheck:
    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.served: dict[str, crds.Served] = {}
        self.error = ""

    def current(self, crd: str) -> bool:
        """The CRD served is this version's, or could not be read (said, not held)."""
        record = self.served.get(crd)
        return record is None or record.state == crds.CURRENT

    @property
    def faults_ok(self) -> bool:
        """The GPUFault CRD served is this version's (or could not be read: said, not
        held against it). An older one would prune the fields this version writes."""
        return self.current(GPUFAULT_CRD)

    async def check(self) -> None:
        """Read the served CRDs and say, once per change, what is not this version's."""
        found: dict[str, crds.Served] = {}
        try:
            for name, manifest in crds.shipped().items():
                found[name] = await crds.served(self.api, name, manifest)
            self.error = ""
        except Exception as err:  # RBAC or an outage: the check is retried, nothing held
            error = f"cannot read gpuheal's CRDs: {str(err)[:200]}"
            if error != self.error:
                log.warning("CRD check failed", extra={"error": error})
            self.error = error
            return
        for name, now in found.items():
            before = self.served.get(name)
            if before is not None and before.state == now.state:
                continue
            if now.state != crds.CURRENT:
                log.error("CRD not this version's", extra={"crd": name, "detail": now.sentence()})
            elif before is not None:
                log.info("CRD current", extra={"crd": name})
        self.served = found

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(CRD_CHECK_S)
            await self.check()

    def reasons(self, unserved: Iterable[str]) -> list[str]:
        """What is not this version's, for /readyz; a CRD whose informer finds it
        unserved (`unserved`) is said by the caller, with what is off."""
        missing = set(unserved)
        said = [
            s.sentence()
            for s in self.served.values()
            if s.state != crds.CURRENT and not (s.state == crds.MISSING and s.name in missing)
        ]
        return [*said, self.error] if self.error else said
