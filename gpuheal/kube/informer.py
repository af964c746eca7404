"""List+watch caches of slim views, like client-go's informers.

LIST (paged) fills the store and marks it synced; WATCH from the list's
resourceVersion keeps it current, resuming from the last seen version after a
dropped connection. 410 Gone means the version is too old: relist, and tell
the handlers about objects that vanished meanwhile. Bookmarks keep the version
fresh on quiet streams; a stream silent for longer than the inactivity limit
is treated as stalled and reopened (a half-open TCP connection never errors).

Objects are decoded one at a time: an object the projection cannot take (a
shape the API allows but the projection does not, or a stored object older
than the schema) is skipped and reported once per version (a warning naming
it, and `on_decode_error`), and the cache keeps what it had for it. The rest
of the list and the stream go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from gpuheal.kube.api import ApiError, KubeApi, WatchStalledError
from gpuheal.kube.paging import each_page

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


class _IdentityMeta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    resourceVersion: str = ""  # noqa: N815


class _Identity(msgspec.Struct):
    """Just enough of any object to name it when its projection fails."""

    metadata: _IdentityMeta = msgspec.field(default_factory=_IdentityMeta)


def _identity(raw: bytes | msgspec.Raw) -> _IdentityMeta:
    try:
        return msgspec.json.decode(raw, type=_Identity).metadata
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _IdentityMeta()


def default_key_of(namespace: str, name: str) -> str:
    """The store key from an object's metadata, for objects that have no view:
    name for cluster-scoped objects, namespace/name (PodView.key) otherwise."""
    return f"{namespace}/{name}" if namespace else name


def newer_or_equal(candidate: str, current: str) -> bool:
    """resourceVersions are opaque, but every API server stores etcd revisions:
    compare as integers when both parse, else trust the newest arrival."""
    try:
        return int(candidate) >= int(current)
    except ValueError:
        return True


TOMBSTONES_KEPT = 10_000
# Versions of undecodable objects already reported (bounded, oldest dropped).
REPORTED_KEPT = 10_000


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
        key_of: Callable[[str, str], str] = default_key_of,
        on_decode_error: Callable[[], None] = lambda: None,
        optional: bool = False,
        missing_retry_s: float = 30.0,
        join: Callable[[V], V] | None = None,
    ) -> None:
        self.api = api
        # What another cache adds to each view (controller/dra.py): applied to every
        # view stored, decoded from a watch or written through by upsert.
        self._join = join
        # An optional resource the API server may not serve (a CRD a chart upgrade did
        # not install): its absence is an empty cache, synced, and looked for again
        # every `missing_retry_s`, not a failure that holds readiness.
        self.optional = optional
        self.missing_retry_s = missing_retry_s
        self.missing = False
        self.forbidden = False  # missing because this identity may not list it (403)
        self.path = path
        self.name = name
        self._json_type = json_type
        self._to_view = to_view
        self._key = key
        # (namespace, name) -> store key: what `key` gives for the object's view.
        self._key_of = key_of
        self._on_decode_error = on_decode_error
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
            [("metadata", _ListMeta), ("items", list[msgspec.Raw])],
        )
        self.store: dict[str, V] = {}
        self._versions: dict[str, str] = {}
        # key -> resourceVersion of its deletion, so a late write-through of an object
        # the watch already deleted cannot bring it back (bounded, oldest dropped).
        self._tombstones: dict[str, str] = {}
        self._handlers: list[Handler] = []
        # key -> resourceVersion of the undecodable version already reported.
        self._reported: dict[str, str] = {}
        self.decode_errors = 0
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
        if self._join is not None:
            view = self._join(view)
        key = self._key(view)
        current = self._versions.get(key)
        if current is not None and not newer_or_equal(resource_version, current):
            return
        deleted = self._tombstones.get(key)
        if deleted is not None and newer_or_equal(deleted, resource_version):
            return  # e.g. an evicted pod whose deletion the watch delivered first
        self._apply(key, view, resource_version)

    def refresh(self, key: str, change: Callable[[V], V]) -> None:
        """Re-derive a cached view from what another cache says (a join: a node's DRA
        devices, a pod's claims), the handlers told as of any change; the object's
        version stays, so its next event still replaces the view."""
        old = self.store.get(key)
        if old is None:
            return
        new = change(old)
        if new != old:
            self._apply(key, new, self._versions.get(key, ""))

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
            except ApiError as err:
                if not (self.optional and err.code in (403, 404)):
                    await self._failed(err, backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                self._not_served(forbidden=err.code == 403)
                await asyncio.sleep(self.missing_retry_s)
            except Exception as err:
                await self._failed(err, backoff)
                backoff = min(backoff * 2, 30.0)

    async def _failed(self, err: Exception, backoff: float) -> None:
        log.warning(
            "informer failed, relisting",
            extra={"informer": self.name, "error": str(err)},
        )
        await asyncio.sleep(backoff + random.uniform(0, backoff))  # noqa: S311

    def _not_served(self, *, forbidden: bool = False) -> None:
        """The optional resource is not served, or this identity may not list it: said
        once per absence, the cache emptied (a CRD deleted meanwhile takes its objects
        with it), and synced."""
        if not self.missing or forbidden != self.forbidden:
            log.warning(
                "resource not readable (forbidden): the features that need it are off "
                "until list and watch are granted"
                if forbidden
                else "resource not served: the features that need it are off until it is",
                extra={"informer": self.name, "path": self.path},
            )
        self.missing = True
        self.forbidden = forbidden
        for key in list(self.store):
            self._apply(key, None, self.resource_version)
        self.synced.set()

    async def _list(self) -> None:
        seen: dict[str, tuple[Any, str]] = {}
        skipped: set[str] = set()
        params = {**self._params, "limit": str(self._page_size)}

        def take(raw: bytes) -> str:
            meta = self._take_page(raw, seen, skipped)
            if not meta.next_page:
                self.resource_version = meta.resourceVersion  # the list's, on its last page
            return meta.next_page

        await each_page(self.api, self.path, params, take)
        # A skipped object is still there: keep what the cache had for it.
        for key in [k for k in self.store if k not in seen and k not in skipped]:
            self._apply(key, None, self.resource_version)
        for key, (view, rv) in seen.items():
            if self._versions.get(key) != rv:
                self._apply(key, view, rv)
        self.relists += 1
        if self.missing:
            self.missing = self.forbidden = False
            log.info("resource served again", extra={"informer": self.name, "path": self.path})
        self.synced.set()

    def _take_page(
        self, raw: bytes, seen: dict[str, tuple[Any, str]], skipped: set[str]
    ) -> _ListMeta:
        """Decode one LIST page item by item into `seen`; the keys of items that
        cannot be projected go to `skipped`."""
        page = msgspec.json.decode(raw, type=self._list_type)
        for item in page.items:  # type: ignore[attr-defined]
            decoded = self._project(item)
            if isinstance(decoded, str):
                skipped.add(decoded)
            else:
                key, view, rv = decoded
                seen[key] = (view, rv)
        meta: _ListMeta = page.metadata  # type: ignore[attr-defined]
        return meta

    def _project(
        self, raw: bytes | msgspec.Raw, *, report: bool = True
    ) -> tuple[str, V, str] | str:
        """(key, view, resourceVersion), or the key of an object that could not be
        projected (reported once per version, unless `report` is False)."""
        try:
            item = msgspec.json.decode(raw, type=self._json_type)
            view = self._to_view(item)
            if self._join is not None:
                view = self._join(view)
        except Exception as err:  # any failure skips just this object
            if not report:
                meta = _identity(raw)
                return self._key_of(meta.namespace, meta.name)
            return self._skip(raw, err)
        key = self._key(view)
        self._reported.pop(key, None)
        return key, view, item.metadata.resourceVersion  # type: ignore[attr-defined]

    def _skip(self, raw: bytes | msgspec.Raw, err: Exception) -> str:
        meta = _identity(raw)
        key = self._key_of(meta.namespace, meta.name)
        if self._reported.get(key) == meta.resourceVersion:
            return key
        self._reported[key] = meta.resourceVersion
        if len(self._reported) > REPORTED_KEPT:
            del self._reported[next(iter(self._reported))]
        self.decode_errors += 1
        self._on_decode_error()
        log.warning(
            "object skipped: cannot decode it",
            extra={
                "informer": self.name,
                # Not "name": a LogRecord attribute (the logger's name).
                "object": meta.name,
                "namespace": meta.namespace,
                "resource_version": meta.resourceVersion,
                "error": str(err)[:300],
            },
        )
        return key

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
            # aclosing: a relist gives the stream's connection back now, not at GC.
            stream = self.api.watch(self.path, params, self._inactivity_s)
            async with contextlib.aclosing(stream) as lines:
                async for line in lines:
                    if not self._take_event(line):
                        return False
        except WatchStalledError:
            self.stalls += 1
            log.warning("watch silent too long, reopening", extra={"informer": self.name})
        except ApiError as err:
            if err.code == 410:
                return False
            raise
        return True

    def _take_event(self, line: bytes) -> bool:
        """Apply one watch event; False: the version expired (relist)."""
        event = msgspec.json.decode(line, type=_Event)
        if event.type == "ERROR":
            status = msgspec.json.decode(event.object, type=_Status)
            if status.code == 410:
                return False
            raise ApiError(status.code, status.reason, status.message)
        if event.type == "BOOKMARK":
            rv = msgspec.json.decode(event.object, type=_Bookmark).metadata.resourceVersion
            self.resource_version = rv or self.resource_version
            return True
        # A deletion needs only the key: an undecodable object leaving is not news.
        decoded = self._project(event.object, report=event.type != "DELETED")
        if isinstance(decoded, str):
            rv = _identity(event.object).resourceVersion
            if event.type == "DELETED" and decoded:
                self._reported.pop(decoded, None)
                self._apply(decoded, None, rv)
            # Else skipped: the cache keeps the object's last good version.
            self.resource_version = rv or self.resource_version
            return True
        key, view, rv = decoded
        current = self._versions.get(key)
        if event.type == "DELETED":
            self._apply(key, None, rv)
        elif current != rv and (current is None or newer_or_equal(rv, current)):
            # Equal: the echo of our own write, already applied by upsert().
            self._apply(key, view, rv)
        self.resource_version = rv
        return True
