"""Writes (or checks, --check) the chart's values.schema.json, so `helm install`,
`upgrade`, `template` and `lint` refuse a mistyped key before anything reaches a
cluster.

What it holds, from two sources that cannot drift from it (the unit test runs
--check):
- the chart's own values: every map in values.yaml with keys is closed to the
  keys it has; an empty map (`{}`: nodeSelector, labels, affinity, a security
  context) stays open, as its keys are Kubernetes' or the user's;
- `controller.config` and `agent.config`: the programs' config declarations
  (gpuheal.config.Config, gpuheal.agent.config.AgentConfig) — each section closed
  to its keys, a map of sections (pools.byName.<pool>) and a list of them
  (conditions[]) as such. The types of the leaves are the programs' to check
  (they say which key is wrong, and the pod never starts on a bad file): the
  schema closes the keys, where a typo hides.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuheal.agent.config import AgentConfig  # noqa: E402
from gpuheal.config import Config  # noqa: E402
from gpuheal.config.keys import _PARSE, ListOf, MapOf, Section, keys_of  # noqa: E402

CHART = ROOT / "deploy" / "helm" / "gpuheal"
SCHEMA = CHART / "values.schema.json"
# Where the programs' config documents sit in the chart's values.
CONFIGS = {("controller", "config"): Config, ("agent", "config"): AgentConfig}


def section(kind: type[Any]) -> dict[str, Any]:
    """A config section: its keys, closed; sections below it as sections."""
    properties: dict[str, Any] = {}
    for key, f in sorted(keys_of(kind).items()):
        parse = f.metadata[_PARSE]
        if isinstance(parse, ListOf):
            properties[key] = {"type": "array", "items": section(parse.kind)}
        elif isinstance(parse, MapOf):
            properties[key] = {"type": "object", "additionalProperties": section(parse.kind)}
        elif isinstance(parse, Section):
            properties[key] = section(parse.kind)
        else:
            properties[key] = {}
    return {"type": "object", "properties": properties, "additionalProperties": False}


def values(value: Any, at: tuple[str, ...] = ()) -> dict[str, Any]:
    """The schema of one value of values.yaml."""
    if at in CONFIGS:
        return section(CONFIGS[at])
    if isinstance(value, dict):
        if not value:
            return {"type": "object"}  # open: Kubernetes' keys or the user's
        return {
            "type": "object",
            "properties": {k: values(v, (*at, k)) for k, v in sorted(value.items())},
            "additionalProperties": False,
        }
    if isinstance(value, list):
        return {"type": "array"}
    return {}  # a scalar: the templates and the programs say what it must be


def render() -> str:
    document = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", **values(document)}
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main(check: bool) -> int:
    wanted = render()
    if check:
        if not SCHEMA.exists() or SCHEMA.read_text() != wanted:
            print("values.schema.json is not current: run python tools/values_schema.py")
            return 1
        return 0
    SCHEMA.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main("--check" in sys.argv[1:]))
