"""What every operator command is given: the client, the config, the output."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.console import Console

from gpuheal.config import Config

if TYPE_CHECKING:
    from gpuheal.kube.api import KubeApi


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(kw_only=True)
class Context:
    """An operator command's world: kube/'s raw JSON client, whose answers decode
    into projections (kube/projections.py, kube/details.py) and which writes merge
    patches; the CLI opens and closes it around the command's coroutine. The
    leader builds one too when it runs maintenance's steps for a request or a
    roll-out (controller/maintenance.py, controller/rollouts.py)."""

    api: KubeApi
    config: Config
    output: str = "table"  # table | json | yaml (ops/output.py)
    # Results go to stdout; progress and warnings to stderr, so -o json stays parseable.
    out: Console = field(default_factory=lambda: Console(soft_wrap=True))
    err: Console = field(default_factory=lambda: Console(stderr=True, soft_wrap=True))
    now: Callable[[], dt.datetime] = _utcnow
    # Who is acting, for Events and annotations (the kubeconfig user, else "gpuheal-cli").
    actor: str = "gpuheal-cli"
    # The Events' reportingController: the controller's own when it drives a roll-out.
    reporting_controller: str = "gpuheal.io/cli"
