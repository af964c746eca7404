"""kubectl's equality-based label selectors (-l k=v,k2!=v2,k3,!k4), applied to
the nodes of a snapshot (one list of everything, filtered here, so a command
that needs every pod still makes one request per kind)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


class SelectorError(ValueError):
    """The selector text is not key=value, key!=value, key or !key terms."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # = | != | exists | !exists
    value: str = ""

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "=":
            return labels.get(self.key) == self.value
        return labels.get(self.key) != self.value


def _term(text: str) -> Requirement:
    if "!=" in text:
        key, value = text.split("!=", 1)
        op = "!="
    elif "=" in text:
        key, value = text.split("==", 1) if "==" in text else text.split("=", 1)
        op = "="
    elif text.startswith("!"):
        key, value, op = text[1:], "", "!exists"
    else:
        key, value, op = text, "", "exists"
    key, value = key.strip(), value.strip()
    if not key or any(c in key + value for c in "=! ") or (op in ("=", "!=") and "," in value):
        raise SelectorError(f"cannot read the label selector term {text!r}")
    return Requirement(key, op, value)


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """ "k=v,k2!=v2,k3,!k4" (set-based "in (...)" terms are not supported)."""
    if not text.strip():
        return ()
    return tuple(_term(term.strip()) for term in text.split(","))


def selected(labels: Mapping[str, str], selector: tuple[Requirement, ...]) -> bool:
    return all(r.matches(labels) for r in selector)
