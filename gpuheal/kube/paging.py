"""LIST in pages (`limit` and `continue`), the one loop every reader of a list uses:
the informers' relists, the commands' snapshots, the drain's pods of a node."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpuheal.kube.api import KubeApi


async def each_page(
    api: KubeApi, path: str, params: Mapping[str, str], take: Callable[[bytes], str]
) -> None:
    """GET `path` with `params` (which hold the `limit`), then each following page:
    `take` reads a page and answers its `continue` token, "" after the last. The
    caller decodes each page once, as it needs (items, and the resourceVersion of
    the list for an informer)."""
    query = dict(params)
    while True:
        token = take(await api.get(path, query))
        if not token:
            return
        query["continue"] = token
