"""What every operator command is given: the client, the config, the output."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.console import Console

from gpuheal.config import Config

if TYPE_CHECKING:  # the read commands must not pay for lightkube's models
    from lightkube import Client

    from gpuheal.kube.api import KubeApi


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(kw_only=True)
class Session:
    config: Config
    output: str = "table"  # table | json | yaml (ops/output.py)
    # Results go to stdout; progress and warnings to stderr, so -o json stays parseable.
    out: Console = field(default_factory=lambda: Console(soft_wrap=True))
    err: Console = field(default_factory=lambda: Console(stderr=True, soft_wrap=True))
    now: Callable[[], dt.datetime] = _utcnow
    # Who is acting, for Events and annotations (the kubeconfig user, else "gpuheal-cli").
    actor: str = "gpuheal-cli"


@dataclass(kw_only=True)
class Context(Session):
    """For the commands that read and write through lightkube's client."""

    client: Client


@dataclass(kw_only=True)
class ReadContext(Session):
    """For the commands on kube/'s client (`status`, `audit`, `gate`, `doctor`,
    `approve`, `reject`): the raw JSON client, whose answers decode into slim projections
    (kube/snapshot.py). The CLI opens and closes it around the command's coroutine."""

    api: KubeApi
