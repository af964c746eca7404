"""Config keys, each declared once: a dataclass field carries the parser of its
YAML value (and its YAML name, when that is not the field's name in camelCase).
The loader, the schema views and the docs check are derived from the dataclasses,
so a key cannot be accepted without a field, nor a field lack a key.

A parser takes a decoded YAML value and returns the field's value, or raises
ValueError with a short reason; the loader adds the dotted path of the key.
Every number is finite (YAML's `.nan` and `.inf`, and `1e400`, are refused) and
within a sane bound: a counter, a size or a duration past any plausible setting
is a typo, not a request. Unknown keys are errors too: a typo must not silently
fall back to a default.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpuheal.model import Mode, Severity

Parser = Callable[[Any], Any]
Schema = dict[str, tuple[str, Parser]]  # YAML key -> (field name, parser)

T = TypeVar("T")

_PARSE = "gpuheal.parse"
_KEY = "gpuheal.key"


class ConfigError(ValueError):
    """The configuration is invalid; the message names every bad key."""


def setting(
    parse: Parser,
    default: Any = dataclasses.MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    key: str = "",
) -> Any:
    """A dataclass field that is a config key: `default` (or `factory()`) when the
    document leaves it out, `parse` when it sets it; `key`: its YAML name, when
    not the field's name in camelCase. Without a default the key is required."""
    metadata = {_PARSE: parse, _KEY: key}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(kind: type[Any]) -> Any:
    """A field holding a nested map of keys, the dataclass `kind`."""
    return setting(Section(kind), factory=kind)


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def keys_of(kind: type[Any]) -> dict[str, dataclasses.Field[Any]]:
    """YAML key -> the dataclass field it sets."""
    return {
        f.metadata[_KEY] or camel(f.name): f
        for f in dataclasses.fields(kind)
        if _PARSE in f.metadata
    }


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


class SectionError(ValueError):
    """Several bad keys below one value: (path below it, reason) each."""

    def __init__(self, found: list[tuple[str, str]]) -> None:
        super().__init__(found)
        self.found = found


def _below(where: str, err: ValueError) -> list[tuple[str, str]]:
    if isinstance(err, SectionError):
        return [(where + below, why) for below, why in err.found]
    return [(where, str(err))]


def _each(parse: Parser, parts: Iterable[tuple[str, Any]]) -> list[Any]:
    """Every (path, value) parsed; a SectionError naming each one that is not."""
    parsed: list[Any] = []
    found: list[tuple[str, str]] = []
    for where, value in parts:
        try:
            parsed.append(parse(value))
        except ValueError as err:
            found += _below(where, err)
    if found:
        raise SectionError(found)
    return parsed


# Keys a release moved elsewhere: an old config is refused with where they went.
MOVED = {
    "contactSupportAfter": "repeatOffenders.faults",
    "contactSupportWindowSeconds": "repeatOffenders.windowSeconds",
}


@dataclasses.dataclass(frozen=True)
class Section:
    """Parses a map of keys into the dataclass `kind`, reporting every bad key."""

    kind: type[Any]

    def path(self, where: str) -> str:
        return where

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError(f"must be a map, got {type(value).__name__}")
        keys = keys_of(self.kind)
        values: dict[str, Any] = {}
        found: list[tuple[str, str]] = []
        for key, item in value.items():
            f = keys.get(key)
            if f is None:
                moved = MOVED.get(key)
                said = f"moved to {moved}" if moved else f"known: {', '.join(sorted(keys))}"
                found.append((f".{key}", f"unknown key ({said})"))
                continue
            try:
                values[f.name] = f.metadata[_PARSE](item)
            except ValueError as err:
                found += _below(f".{key}", err)
        found += [(f".{k}", "required") for k, f in keys.items() if _required(f) and k not in value]
        if found:
            raise SectionError(found)
        return self.kind(**values)


@dataclasses.dataclass(frozen=True)
class ListOf(Section):
    """Parses a list of maps, each into the dataclass `kind`; a tuple."""

    def path(self, where: str) -> str:
        return f"{where}[]"

    def __call__(self, value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise ValueError(f"must be a list, got {type(value).__name__}")
        return tuple(_each(Section(self.kind), ((f"[{i}]", v) for i, v in enumerate(value))))


@dataclasses.dataclass(frozen=True)
class MapOf(Section):
    """Parses a map of names (of an `entry`: a pool) to maps, each into `kind`."""

    entry: str = ""

    def path(self, where: str) -> str:
        return f"{where}.<{self.entry}>"

    def __call__(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            what = f"{self.entry} name to {self.entry}"
            raise ValueError(f"must be a map of {what}, got {type(value).__name__}")
        parsed = _each(Section(self.kind), ((f".{name}", v) for name, v in value.items()))
        return dict(zip(map(str, value), parsed, strict=True))


def schema_of(kind: type[Any]) -> Schema:
    return {key: (f.name, f.metadata[_PARSE]) for key, f in keys_of(kind).items()}


def sections_of(kind: type[Any], path: str = "") -> dict[str, type[Any]]:
    """Every section's dataclass by its place in the document (`pools.byName.<pool>`,
    `conditions[]`; "": the top level)."""
    found: dict[str, type[Any]] = {path: kind}
    for key, f in keys_of(kind).items():
        parse = f.metadata[_PARSE]
        if isinstance(parse, Section):
            found |= sections_of(parse.kind, parse.path(f"{path}.{key}" if path else key))
    return found


def schemas_of(kind: type[Any]) -> dict[str, Schema]:
    """Every section's keys by its place in the document: the docs have one table
    per section (tests/unit/test_config_docs.py)."""
    return {place: schema_of(section) for place, section in sections_of(kind).items()}


def refuse(title: str, problems: list[str]) -> None:
    """A ConfigError naming each problem, under `title`, if there is one."""
    if problems:
        raise ConfigError(f"{title}:\n  " + "\n  ".join(problems))


def no_checks(_: Any) -> list[str]:
    return []


def parse_document(
    kind: type[T], raw: Any, title: str, checks: Callable[[T], list[str]] = no_checks
) -> T:
    """A decoded YAML document (None: empty) as the dataclass `kind`, then its
    `checks` across keys; a ConfigError naming every bad key by its dotted path."""
    try:
        parsed: T = Section(kind)({} if raw is None else raw)
    except SectionError as err:
        problems = [f"{where[1:]}: {why}" for where, why in err.found]
    except ValueError as err:
        problems = [f"<root>: {err}"]
    else:
        problems = checks(parsed)
    refuse(title, problems)
    return parsed


def load_yaml(path: Path) -> Any:
    """Read a YAML file; ConfigError (not a traceback) when it is unreadable or broken."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from err
    return loads_yaml(text, f"config file {path}")


def loads_yaml(text: str, where: str) -> Any:
    """Parse a YAML document read elsewhere (`where` names it: a file, a ConfigMap's
    key); ConfigError when it is broken."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{where} is not valid YAML: {_yaml_problem(err)}") from err


def _yaml_problem(err: yaml.YAMLError) -> str:
    """What is wrong and where, without the excerpt of the line PyYAML quotes:
    that line may hold a webhook URL or another secret."""
    if not isinstance(err, yaml.MarkedYAMLError):
        return str(err)  # a reader error: a character and its position
    where = err.problem_mark or err.context_mark
    at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
    return " ".join(p for p in (err.context, err.problem) if p) + at


# -- parsers ----------------------------------------------------------------------------

# Upper bounds for durations (seconds): a delay or timeout, and a window of history.
MAX_DELAY_S = 30 * 86400.0
MAX_WINDOW_S = 365 * 86400.0
MAX_WORKERS = 64
MAX_NODES = 1_000_000  # more than any cluster holds
MAX_RATE = 1_000_000.0  # per second (per minute for device evictions): "unlimited"
MAX_BURST = 1_000_000
MAX_BODY_BYTES = 64 << 20
MAX_CELSIUS = 200
MAX_COUNT = 1000  # faults, rounds: "after this many" thresholds
MAX_GPUS = 1024  # per node, MIG instances included


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r}")
    return value


def number(low: float, high: float) -> Parser:
    def parse(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"must be between {low:g} and {high:g}, got {value!r}")
        return float(value)

    return parse


def integer(low: int, high: int) -> Parser:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be an integer, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}, got {value}")
        return value

    return parse


def string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value


def strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def lowercase_strings(value: Any) -> tuple[str, ...]:
    return tuple(v.lower() for v in strings(value))


def file_path(value: Any) -> Path:
    return Path(string(value))


def file_paths(value: Any) -> tuple[Path, ...]:
    return tuple(Path(p) for p in strings(value))


def string_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"must be a map of strings to strings, got {value!r}")
    return dict(value)


def bool_map(value: Any) -> dict[str, bool]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and isinstance(v, bool) for k, v in value.items()
    ):
        raise ValueError(f"must be a map of strings to true or false, got {value!r}")
    return dict(value)


def enum_of(kind: type[Mode] | type[Severity]) -> Parser:
    def parse(value: Any) -> Any:
        try:
            return kind(value)
        except ValueError:
            choices = ", ".join(m.value for m in kind)
            raise ValueError(f"must be one of {choices}, got {value!r}") from None

    return parse


def mode_map(value: Any) -> dict[str, Mode]:
    return {reason: enum_of(Mode)(mode) for reason, mode in string_map(value).items()}


def one_of(*choices: str) -> Parser:
    """One of a few words: "must be a, b or c"."""
    said = f"{', '.join(choices[:-1])} or {choices[-1]}"

    def parse(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"must be {said}, got {value!r}")
        return str(value)

    return parse


def optional(parse: Parser) -> Parser:
    return lambda value: None if value is None else parse(value)
