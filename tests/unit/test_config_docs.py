"""Every config key the docs list is one the code accepts and reads, and every key
it accepts is documented: the docs are the operators' reference, and a key in one
but not the other is a promise the code does not keep (or a feature nobody finds)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal import config as controller_config
from gpuheal.agent import config as agent_config
from gpuheal.config.keys import keys_of, sections_of

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SOURCES = sorted((ROOT / "gpuheal").rglob("*.py"))
# Where the keys are declared: a read there counts only in a method of the config
# itself (`self.mode_by_reason`), not in a check across keys nor in the machinery.
CONFIG_SOURCES = {ROOT / "gpuheal/config/__init__.py", ROOT / "gpuheal/agent/config.py"}
TOP_KEYS = set(controller_config.SCHEMAS[""])


def section_of(path: Path, heading: str) -> str:
    """The text of `## heading` up to the next `## ` heading."""
    text = path.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def rows_of(text: str, header: str) -> dict[str, list[list[str]]]:
    """Section name -> the cells of each row of its table. A table's section is
    named by the line before it (`` `deviceHealth` keys ...``); the first, unnamed."""
    found: dict[str, list[list[str]]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() != header:
            continue
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        named = re.match(r"^`([^`]+)` keys", before)
        section = named[1] if named else ""
        assert section not in found, f"two tables for {section or 'the top level'}"
        found[section] = []
        for row in lines[i + 2 :]:
            if not row.startswith("|"):
                break
            found[section].append([cell.strip() for cell in row.split("|")[1:-1]])
    return found


def tables(text: str, header: str) -> dict[str, list[str]]:
    """Section name -> the keys in the first column of its table."""
    return {
        section: [key for row in rows for key in re.findall(r"`([^`]+)`", row[0])]
        for section, rows in rows_of(text, header).items()
    }


def test_the_controller_reference_lists_exactly_the_keys_the_parser_accepts() -> None:
    documented = tables(
        section_of(DOCS / "controller.md", "Configuration"), "| key | default | meaning |"
    )
    accepted = {s: set(schema) for s, schema in controller_config.SCHEMAS.items()}
    accepted[""] = TOP_KEYS
    assert set(documented) == set(accepted), "a section without its table, or a table too many"
    for section, keys in documented.items():
        where = section or "top level"
        assert len(keys) == len(set(keys)), f"{where}: a key listed twice: {keys}"
        assert set(keys) - accepted[section] == set(), f"{where}: documented, not accepted"
        assert accepted[section] - set(keys) == set(), f"{where}: accepted, not documented"


def test_the_agent_reference_lists_exactly_the_keys_the_parser_accepts() -> None:
    documented = tables(
        section_of(DOCS / "agent.md", "Configuration"), "| key | default | meaning |"
    )
    assert set(documented) == {""}
    keys = documented[""]
    assert set(keys) == set(agent_config.SCHEMA), (
        f"documented, not accepted: {set(keys) - set(agent_config.SCHEMA)}; "
        f"accepted, not documented: {set(agent_config.SCHEMA) - set(keys)}"
    )


def test_the_keys_doctor_names_are_accepted() -> None:
    documented = tables(
        section_of(DOCS / "cli-doctor.md", "Config keys it uses"), "| key | default | used for |"
    )
    last = ""
    for token in documented[""]:
        # `.driverVersion` after `pools.byName.<pool>.gpusPerNode`: the same section.
        full = last.rsplit(".", 1)[0] + token if token.startswith(".") else token
        last = full
        section, _, key = full.rpartition(".")
        accepted = TOP_KEYS if not section else set(controller_config.SCHEMAS.get(section, {}))
        assert key in accepted, f"cli-doctor.md names {full}: no such key"


def yaml_blocks(path: Path) -> list[Any]:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", path.read_text(), re.S)]


CONTROLLER_DOCS = [DOCS / "controller.md", *sorted(DOCS.glob("cli-*.md"))]


@pytest.mark.parametrize("path", CONTROLLER_DOCS, ids=lambda p: p.name)
def test_every_config_example_is_one_the_controller_accepts(path: Path) -> None:
    """A block that looks like the controller's config (any known top-level key)
    parses: no unknown key, no value the parser refuses."""
    for block in yaml_blocks(path):
        if isinstance(block, dict) and set(block) & TOP_KEYS:
            controller_config.parse_config(block)


def test_every_agent_config_example_is_one_the_agent_accepts() -> None:
    blocks = [b for b in yaml_blocks(DOCS / "agent.md") if isinstance(b, dict)]
    assert blocks
    for block in blocks:
        agent_config.parse_agent_config(block)


def _read_in_code(field: str) -> bool:
    read = re.compile(rf"\.{re.escape(field)}\b")
    read_by_itself = re.compile(rf"\bself\.{re.escape(field)}\b")
    return any(
        (read_by_itself if source in CONFIG_SOURCES else read).search(source.read_text())
        for source in SOURCES
        if source != ROOT / "gpuheal/config/keys.py"
    )


def test_every_accepted_key_is_read_by_the_code() -> None:
    """A key the parser accepts but nothing reads is documented behaviour that does
    not happen (the attribute is read somewhere besides its definition)."""
    schemas = [*controller_config.SCHEMAS.values(), agent_config.SCHEMA]
    fields = {field for schema in schemas for field, _ in schema.values()}
    unread = {f for f in fields if not _read_in_code(f)}
    assert not unread, f"accepted but never read: {sorted(unread)}"


# -- the documented defaults --------------------------------------------------------------

PROSE = object()  # a default the docs say in words ("unset", "see below"): not compared


def split_cell(cell: str) -> list[str]:
    """`a` / `b` and `a`, `b`: one value per key of the row (not inside backticks)."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(cell):
        depth ^= char == "`"
        if not depth and cell.startswith((" / ", ", "), i):
            parts.append(cell[start:i])
            start = i + 3 if cell.startswith(" / ", i) else i + 2
    return [p.strip() for p in [*parts, cell[start:]]]


def documented_value(cell: str) -> object:
    """The value a default cell gives: a literal in backticks, a number, true or false
    (a remark in parentheses after it aside), else PROSE."""
    value = re.sub(r"\s*\(.*\)$", "", cell)
    if literal := re.fullmatch(r"`([^`]*)`", value):
        return yaml.safe_load(literal[1])
    if re.fullmatch(r"-?\d+(\.\d+)?|true|false", value):
        return yaml.safe_load(value)
    return PROSE


def as_yaml(value: object) -> object:
    """A default as the document would write it; a section or a rule: PROSE."""
    if dataclasses.is_dataclass(value):
        return PROSE
    if isinstance(value, tuple):
        items = [as_yaml(v) for v in value]
        return PROSE if PROSE in items else items
    if isinstance(value, Mapping):
        return {k: as_yaml(v) for k, v in value.items()}
    if isinstance(value, Enum):
        return value.value
    return str(value) if isinstance(value, Path) else value


def default_of(f: dataclasses.Field[Any]) -> object:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return PROSE if f.default is dataclasses.MISSING else f.default


# How many defaults each page states as a value: the check does compare something.
MIN_COMPARED = {"controller.md": 80, "agent.md": 25}
DEFAULT_TABLES = [
    ("controller.md", controller_config.Config),
    ("agent.md", agent_config.AgentConfig),
]


@pytest.mark.parametrize(("page", "kind"), DEFAULT_TABLES, ids=[p for p, _ in DEFAULT_TABLES])
def test_every_default_the_reference_gives_as_a_value_is_the_codes(page: str, kind: type) -> None:
    text = section_of(DOCS / page, "Configuration")
    sections = sections_of(kind)
    compared = 0
    for section, rows in rows_of(text, "| key | default | meaning |").items():
        keys = keys_of(sections[section])
        for row in rows:
            names, values = re.findall(r"`([^`]+)`", row[0]), split_cell(row[1])
            if len(values) != len(names):
                values = [row[1]] * len(names)
            for name, value in zip(names, values, strict=True):
                documented, code = documented_value(value), as_yaml(default_of(keys[name]))
                if documented is PROSE or code is PROSE:
                    continue
                compared += 1
                where = f"{page}: {section or 'top level'}.{name}"
                assert documented == code, f"{where}: documented {value}, code {code!r}"
    assert compared >= MIN_COMPARED[page], compared
