"""List+watch caches of slim views, like client-go's informers.

LIST (paged) fills the store and marks it synced; WATCH from the list's
resourceVersion keeps it current, resuming from the last seen version after a
dropped connection. 410 Gone means the version is too old: relist, and tell
the handlers about objects that vanished meanwhile. Bookmarks keep the version
fresh on quiet streams; a stream silent for longer than the inactivity limit
is treated as stalled and reopened (a half-open TCP connection never errors).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

import httpx2
import msgspec

from gpuheal.kube.api import ApiError, KubeApi

log = logging.getLogger(__name__)

J = TypeVar("J", bound=msgspec.Struct)  # the JSON projection type
V = TypeVar("V")  # the view kept in the store

V_co = TypeVar("V_co", covariant=True)

Handler = Callable[[Any, Any], None]  # (old view | None, new view | None)


class Store(Protocol[V_co]):
    """What consumers of an informer need: lookups and change handlers."""

    @property
    def handlers(self) -> list[Handler]: ...

    def get(self, key: str) -> V_co | None: ...


class _Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""  # noqa: N815
    # "continue" is a Python keyword: map it.
    next_page: str = msgspec.field(default="", name="continue")


class _Status(msgspec.Struct):
    code: int = 0
    reason: str = ""
    message: str = ""


class _BookmarkMeta(msgspec.Struct):
    resourceVersion: str = ""  # noqa: N815


class _Bookmark(msgspec.Struct):
    metadata: _BookmarkMeta


def newer_or_equal(candidate: str, current: str) -> bool:
    """resourceVersions are opaque, but every API server stores etcd revisions:
    compare as integers when both parse, else trust the newest arrival."""
    try:
        return int(candidate) >= int(current)
    except ValueError:
        return True


TOMBSTONES_KEPT = 10_000


class Informer(Generic[J, V]):
    def __init__(
        self,
        api: KubeApi,
        path: str,
        json_type: type[J],
        to_view: Callable[[J], V],
        key: Callable[[V], str],
        *,
        name: str,
        field_selector: str = "",
        label_selector: str = "",
        page_size: int = 500,
        watch_timeout_s: int = 300,
        inactivity_s: float = 90.0,
    ) -> None:
        self.api = api
        self.path = path
        self.name = name
        self._json_type = json_type
        self._to_view = to_view
        self._key = key
        self._params = {
            k: v
            for k, v in {"fieldSelector": field_selector, "labelSelector": label_selector}.items()
            if v
        }
        self._page_size = page_size
        self._watch_timeout_s = watch_timeout_s
        self._inactivity_s = inactivity_s
        self._list_type = msgspec.defstruct(
            f"{json_type.__name__}List",
            [("metadata", _ListMeta), ("items", list[json_type])],  # type: ignore[valid-type]
        )
        self.store: dict[str, V] = {}
        self._versions: dict[str, str] = {}
        # key -> resourceVersion of its deletion, so a late write-through of an object
        # the watch already deleted cannot bring it back (bounded, oldest dropped).
        self._tombstones: dict[str, str] = {}
        self._handlers: list[Handler] = []
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0
        self.stalls = 0

    @property
    def handlers(self) -> list[Handler]:
        return self._handlers

    def get(self, key: str) -> V | None:
        return self.store.get(key)

    def values(self) -> Iterable[V]:
        return self.store.values()

    def upsert(self, view: V, resource_version: str) -> None:
        """Apply an object we just wrote (write-through), unless the cache has newer."""
        key = self._key(view)
        current = self._versions.get(key)
        if current is not None and not newer_or_equal(resource_version, current):
            return
        deleted = self._tombstones.get(key)
        if deleted is not None and newer_or_equal(deleted, resource_version):
            return  # e.g. an evicted pod whose deletion the watch delivered first
        self._apply(key, view, resource_version)

    def _apply(self, key: str, view: V | None, resource_version: str) -> None:
        old = self.store.get(key)
        if view is None:
            self.store.pop(key, None)
            self._versions.pop(key, None)
            self._tombstones[key] = resource_version
            if len(self._tombstones) > TOMBSTONES_KEPT:
                del self._tombstones[next(iter(self._tombstones))]
        else:
            self.store[key] = view
            self._versions[key] = resource_version
            self._tombstones.pop(key, None)
        for handler in self._handlers:
            try:
                handler(old, view)
            except Exception:
                log.exception("informer handler failed", extra={"informer": self.name})

    async def run(self) -> None:
        backoff = 0.5
        while True:
            try:
                await self._list()
                backoff = 0.5
                while await self._watch():
                    pass
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning(
                    "informer failed, relisting",
                    extra={"informer": self.name, "error": str(err)},
                )
                await asyncio.sleep(backoff + random.uniform(0, backoff))  # noqa: S311
                backoff = min(backoff * 2, 30.0)

    async def _list(self) -> None:
        seen: dict[str, tuple[Any, str]] = {}
        params = {**self._params, "limit": str(self._page_size)}
        while True:
            raw = await self.api.get(self.path, params)
            page = msgspec.json.decode(raw, type=self._list_type)
            for item in page.items:  # type: ignore[attr-defined]
                view = self._to_view(item)
                seen[self._key(view)] = (view, item.metadata.resourceVersion)
            meta: _ListMeta = page.metadata  # type: ignore[attr-defined]
            if not meta.next_page:
                self.resource_version = meta.resourceVersion
                break
            params["continue"] = meta.next_page
        for key in [k for k in self.store if k not in seen]:
            self._apply(key, None, self.resource_version)
        for key, (view, rv) in seen.items():
            if self._versions.get(key) != rv:
                self._apply(key, view, rv)
        self.relists += 1
        self.synced.set()

    async def _watch(self) -> bool:
        """Watch until the server ends the stream (True: watch again) or the
        version expired (False: relist)."""
        params = {
            **self._params,
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": "true",
            # Spread reconnects of many watchers, as client-go does.
            "timeoutSeconds": str(int(self._watch_timeout_s * random.uniform(1.0, 1.5))),  # noqa: S311
        }
        try:
            async for line in self.api.watch(self.path, params, self._inactivity_s):
                event = msgspec.json.decode(line, type=_Event)
                if event.type == "ERROR":
                    status = msgspec.json.decode(event.object, type=_Status)
                    if status.code == 410:
                        return False
                    raise ApiError(status.code, status.reason, status.message)
                if event.type == "BOOKMARK":
                    rv = msgspec.json.decode(event.object, type=_Bookmark).metadata.resourceVersion
                    self.resource_version = rv or self.resource_version
                    continue
                item = msgspec.json.decode(event.object, type=self._json_type)
                rv = item.metadata.resourceVersion  # type: ignore[attr-defined]
                view = self._to_view(item)
                key = self._key(view)
                current = self._versions.get(key)
                if event.type == "DELETED":
                    self._apply(key, None, rv)
                elif current != rv and (current is None or newer_or_equal(rv, current)):
                    # Equal: the echo of our own write, already applied by upsert().
                    self._apply(key, view, rv)
                self.resource_version = rv
        except httpx2.ReadTimeout:
            self.stalls += 1
            log.warning("watch silent too long, reopening", extra={"informer": self.name})
        except ApiError as err:
            if err.code == 410:
                return False
            raise
        return True
