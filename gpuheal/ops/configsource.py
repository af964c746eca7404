"""Which config an operator command judges with: the running controller's.

Pools, the health gate, maintenance and roll-out defaults are the controller's
config; a CLI judging a node with its built-in defaults while the controller runs
with others would pass a node the controller holds, or put a node in the wrong
pool. So a command reads the controller's ConfigMap (the chart's
`<release>-controller`, key `config.yaml`) unless it is given `--config FILE`,
and says on stderr which it used. No ConfigMap (no chart installed, or another
name) or no right to read it: the built-in defaults, said as such. A ConfigMap
whose document is not a valid config is an error: the controller itself refuses
that document, so nothing the CLI judged with it would match what runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from gpuheal.config import Config, ConfigError, load_config, parse_config
from gpuheal.config.keys import loads_yaml
from gpuheal.kube.api import ApiError, KubeApi, configmap_path
from gpuheal.kube.projections import Meta

KEY = "config.yaml"  # deploy/helm/gpuheal/templates/controller.yaml


class ConfigMapJson(msgspec.Struct):
    metadata: Meta
    data: dict[str, str] = {}


@dataclass(frozen=True)
class Source:
    """The config a command runs with, and the words that say where it came from."""

    config: Config
    said: str


def parse_ref(ref: str) -> tuple[str, str]:
    """NAMESPACE/NAME, both non-empty; ConfigError naming the flag otherwise."""
    namespace, sep, name = ref.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ConfigError(f"--controller-config {ref!r} is not NAMESPACE/NAME")
    return namespace, name


async def resolve(api: KubeApi, path: Path | None, ref: str) -> Source:
    """`--config FILE` when given, else the ConfigMap `ref`, else the defaults.
    Raises ConfigError for a bad reference or a ConfigMap holding a bad config."""
    if path is not None:
        return Source(load_config(path), f"config: {path} (--config)")
    namespace, name = parse_ref(ref)
    shown = f"ConfigMap {namespace}/{name}"
    try:
        raw = await api.get(configmap_path(namespace, name))
    except ApiError as err:
        if err.code == 404:
            why = f"no {shown}; --controller-config names the controller's"
        elif err.code == 403:
            why = (
                f"not allowed to read {shown}: bind the chart's Role "
                f"<release>-operator-config in {namespace}"
            )
        else:
            raise
        return Source(Config(), f"config: built-in defaults ({why})")
    configmap = msgspec.json.decode(raw, type=ConfigMapJson)
    if KEY not in configmap.data:
        raise ConfigError(f"{shown} has no {KEY} key: not a gpuheal controller's config")
    where = f"{shown} key {KEY}"
    document = loads_yaml(configmap.data[KEY], where)
    try:
        config = parse_config(document)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from err
    version = configmap.metadata.resourceVersion
    return Source(config, f"config: {shown} (the controller's, resourceVersion {version})")
