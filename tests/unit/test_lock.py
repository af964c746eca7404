"""deploy/docker/requirements.lock is what the image installs and what the tests run
on: complete (every runtime requirement, transitively), within pyproject.toml's
ranges, every file hashed, and the test environment at exactly its versions."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "deploy" / "docker" / "requirements.lock"
_ENTRY = re.compile(
    r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>[^ ;\\]+)(?: ; (?P<marker>[^\\]+?))? \\$"
)


def locked() -> dict[str, tuple[str, Marker | None, int]]:
    """name -> (version, marker, number of hashes)."""
    entries: dict[str, tuple[str, Marker | None, int]] = {}
    name = ""
    for line in LOCK.read_text().splitlines():
        match = _ENTRY.match(line)
        if match is not None:
            name = canonicalize_name(match["name"])
            assert name not in entries, f"{name} locked twice"
            marker = Marker(match["marker"]) if match["marker"] else None
            entries[name] = (match["version"], marker, 0)
        elif line.strip().startswith("--hash=sha256:"):
            version, marker, hashes = entries[name]
            entries[name] = (version, marker, hashes + 1)
    return entries


def runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def test_every_runtime_dependency_is_locked_within_its_range_and_hashed() -> None:
    lock = locked()
    assert len(lock) > 20  # the closure, not only the direct dependencies
    for requirement in runtime_requirements():
        version, _, _ = lock[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(version), (requirement, version)
    unhashed = [name for name, (_, _, hashes) in lock.items() if hashes == 0]
    assert not unhashed


def test_the_lock_is_complete_and_the_tests_run_on_its_versions() -> None:
    lock = locked()
    seen: set[str] = set()
    visited: set[tuple[str, str]] = set()  # (package, extra): an extra asks for more
    todo = [r for r in runtime_requirements() if r.marker is None or r.marker.evaluate()]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        extras = {"", *requirement.extras}
        if all((name, e) in visited for e in extras):
            continue
        seen.add(name)
        assert name in lock, f"{name} (needed through {requirement}) is not locked: make lock"
        installed = metadata.version(name)
        assert installed == lock[name][0], f"{name} {installed} installed, {lock[name][0]} locked"
        for extra in extras - {e for n, e in visited if n == name}:
            visited.add((name, extra))
            for child in metadata.requires(name) or []:
                dependency = Requirement(child)
                if dependency.marker is None or dependency.marker.evaluate({"extra": extra}):
                    todo.append(dependency)
    # And nothing locked that applies here but nothing needs (a stale entry).
    applies = {n for n, (_, marker, _) in lock.items() if marker is None or marker.evaluate()}
    assert applies <= seen, f"locked, needed by nothing: {sorted(applies - seen)}"
