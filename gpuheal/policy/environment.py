"""The node-environment fact (`gpuheal.io/node-environment`): the start-order facts
the runbooks check after a reboot, as the agent writes them and the health gate
reads them. Pure: the agent's probe (agent/environment.py) finds the facts.

The value is `name=state` per fact, joined by ";", in ENVIRONMENT_FACTS order, e.g.
`modules=missing:nvidia_uvm;persistenced=ok;fabricmanager=n/a;runtimehook=unknown`.
A state is `ok`, `n/a` (not needed on this node: Fabric Manager without NVSwitches),
`unknown` (the agent could not see it: a host path not mounted or unreadable) or a
bad one, `missing` or `stopped`; `:` adds the names it is about (the modules not
loaded). Unknown is not bad: a cluster whose agent cannot see a host file must not
be held by it (healthGate.environmentRequired says otherwise, per fact).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuheal.model import ENVIRONMENT_FACTS

OK = "ok"
NOT_NEEDED = "n/a"
UNKNOWN = "unknown"
MISSING = "missing"
STOPPED = "stopped"

MODULES, PERSISTENCED, FABRIC_MANAGER, RUNTIME_HOOK = ENVIRONMENT_FACTS

# A detail is a kernel module's name (the agent's config holds it to this shape).
DETAIL = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_DETAILS = 8
_NAME = re.compile(r"[a-z]{1,32}")
_STATE = re.compile(r"[a-z/]{1,16}")

_WHAT = {
    MODULES: "the NVIDIA kernel modules",
    PERSISTENCED: "the persistence daemon (nvidia-persistenced)",
    FABRIC_MANAGER: "Fabric Manager (nv-fabricmanager)",
    RUNTIME_HOOK: "the container runtime's NVIDIA hook (nvidia-container-runtime)",
}


@dataclass(frozen=True)
class Fact:
    state: str
    detail: tuple[str, ...] = ()

    @property
    def bad(self) -> bool:
        return self.state not in (OK, NOT_NEEDED, UNKNOWN)

    @property
    def unknown(self) -> bool:
        return self.state == UNKNOWN

    def text(self) -> str:
        return f"{self.state}:{','.join(self.detail)}" if self.detail else self.state


def encode(facts: Mapping[str, Fact]) -> str:
    """The annotation's value, valid by construction: the known facts in their order,
    detail words of DETAIL's shape only (at most MAX_DETAILS; others dropped)."""
    parts = []
    for name in ENVIRONMENT_FACTS:
        fact = facts.get(name)
        if fact is None:
            continue
        detail = tuple(d for d in fact.detail if DETAIL.fullmatch(d))[:MAX_DETAILS]
        parts.append(f"{name}={Fact(fact.state, detail).text()}")
    return ";".join(parts)


def parse(value: str) -> dict[str, Fact]:
    """The facts of an annotation value; ValueError saying what is wrong. Names this
    version does not know are skipped (a newer agent may report more)."""
    facts: dict[str, Fact] = {}
    for part in value.strip().split(";"):
        name, sep, text = part.strip().partition("=")
        state, _, detail = text.partition(":")
        if not sep or not _NAME.fullmatch(name) or not _STATE.fullmatch(state):
            raise ValueError(f"{part[:64]!r} is not name=state")
        details = tuple(d for d in detail.split(",") if d)
        if not all(DETAIL.fullmatch(d) for d in details):
            raise ValueError(f"{part[:64]!r} has a detail that is not a name")
        if name in ENVIRONMENT_FACTS:
            facts[name] = Fact(state, details)
    return facts


# What a bad state means, in words, where more can be said than "<what>: <state>".
_BAD = {
    (FABRIC_MANAGER, STOPPED): "is not running on an NVSwitch system",
    (PERSISTENCED, STOPPED): "is not running",
    (RUNTIME_HOOK, MISSING): "is not configured: no runtime config names it",
}


def describe(name: str, fact: Fact) -> str:
    """One phrase about a fact, for the gate's reason and the agent's log."""
    if not fact.bad:
        why = {NOT_NEEDED: " (no NVSwitch)" if name == FABRIC_MANAGER else ""}.get(fact.state, "")
        if fact.unknown:
            why = " (the agent cannot see it)"
        return f"{name} {fact.state}{why}"
    if name == MODULES and fact.detail:
        return f"kernel modules not loaded: {', '.join(fact.detail)}"
    what = _WHAT.get(name, name)
    said = _BAD.get((name, fact.state))
    return f"{what} {said}" if said else f"{what}: {fact.text()}"
