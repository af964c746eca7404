"""docs/architecture.md is the source of truth for layers and contracts, so it must
stay true to the code: every path, `path::name` and module it cites exists, its
layer list is the import-linter contract, its metric names, Event reasons and
annotation keys are the code's (all of them), and every link into it or out of
it lands on a heading that exists."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import tomllib
from pathlib import Path

from gpuheal.vocabulary import Reason
from tests.unit.test_deploy_files import metric_names

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
DOC = DOCS / "architecture.md"
TEXT = DOC.read_text()
VOCABULARY = "gpuheal/vocabulary.py"

_PATH = re.compile(
    r"(?<![\w/.-])((?:gpuheal|tests|docs|deploy|bench)/[\w./-]*[\w/])(?:::([\w.]+))?"
)
_MODULE = re.compile(r"(?<![\w/.-])(gpuheal(?:\.[a-z_]\w*)+)(?![\w/.-])")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)
# An Event reason constant: GPUFaultHeld, not GPUHEAL_CRASH_AFTER.
_REASON = re.compile(r'^[A-Z_]+ = "(GPU[A-Z][a-z][A-Za-z]*)"', re.MULTILINE)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in _HEADING.findall(path.read_text())}


def section(heading: str) -> str:
    """The text under `## heading` (or deeper) up to the next heading of its level."""
    level = re.match(r"#+", heading)
    assert level is not None
    start = TEXT.index(f"\n{heading}\n")
    end = TEXT.find(f"\n{level.group()} ", start + 1)
    return TEXT[start : end if end != -1 else len(TEXT)]


def defines(source: Path, name: str) -> bool:
    """`name` (or `Class.member`) is defined at the top of `source`."""
    body: list[ast.stmt] = ast.parse(source.read_text()).body
    for part in name.split("."):
        found = next((node for node in body if part in _names(node)), None)
        if found is None:
            return False
        body = found.body if isinstance(found, ast.ClassDef) else []
    return True


def _names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def importable(name: str) -> bool:
    """A module, or an attribute of one (`gpuheal.model.Phase`)."""
    if importlib.util.find_spec(name) is not None:
        return True
    parent, _, attribute = name.rpartition(".")
    if not parent or not importable(parent):
        return False
    return hasattr(importlib.import_module(parent), attribute)


def test_every_cited_path_and_name_exists() -> None:
    cited = _PATH.findall(TEXT)
    assert len(cited) > 50
    missing = [p for p, _ in cited if not (ROOT / p).exists()]
    assert not missing, f"paths in docs/architecture.md that do not exist: {missing}"
    undefined = [f"{p}::{n}" for p, n in cited if n and not defines(ROOT / p, n)]
    assert not undefined, f"names in docs/architecture.md not defined there: {undefined}"


def test_every_cited_module_exists() -> None:
    modules = set(_MODULE.findall(TEXT))
    assert "gpuheal.policy" in modules
    absent = sorted(m for m in modules if not importable(m))
    assert not absent, f"modules in docs/architecture.md that do not exist: {absent}"


def test_the_layers_are_the_import_linter_contract() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    # The package's layers (the plan's stages have a layers contract of their own).
    (layers,) = [
        c["layers"]
        for c in contracts["contracts"]
        if c["type"] == "layers" and "gpuheal.cli" in c["layers"]
    ]
    block = re.search(r"```\n(.*?)```", section("## Layers"), re.DOTALL)
    assert block is not None, "no layer list under ## Layers"
    assert block.group(1).splitlines() == layers


def collected_at_scrape() -> set[str]:
    """The families of custom collectors (read at scrape time), as exposed: a
    collector needs its program's live objects, so it is read from the source."""
    found = re.findall(
        r'(Counter|Gauge|Histogram)MetricFamily\(\s*"(gpuheal_\w+)"',
        "".join(p.read_text() for p in (ROOT / "gpuheal").rglob("*.py")),
    )
    return {name for _, name in found} | {f"{n}_total" for kind, n in found if kind == "Counter"}


def test_the_metrics_are_the_programs_metrics() -> None:
    # Each family's name, and with _total and _bucket.
    known = metric_names() | collected_at_scrape()
    families = {
        m
        for m in known
        if not m.endswith("_bucket") and not (m.endswith("_total") and m[: -len("_total")] in known)
    }
    cited = set(re.findall(r"\bgpuheal_[a-z_]+", section("### Metrics")))
    assert cited <= known, f"not metrics of any program: {sorted(cited - known)}"
    untold = sorted(f for f in families if f not in cited and f"{f}_total" not in cited)
    assert not untold, f"metrics docs/architecture.md does not name: {untold}"


def test_the_event_reasons_are_the_vocabularys_and_sent_where_it_says() -> None:
    """Every reason is a member of gpuheal/vocabulary.py::Reason (no reason constant
    elsewhere), the table names them all, and the module it names sends it."""
    senders: dict[str, set[str]] = {reason.value: set() for reason in Reason}
    stray: list[str] = []
    for source in sorted((ROOT / "gpuheal").rglob("*.py")):
        relative = source.relative_to(ROOT).as_posix()
        if relative.startswith("gpuheal/sim/") or relative in ("gpuheal/model.py", VOCABULARY):
            continue  # the model names the kind GPUFault and the GPUHealthy condition
        text = source.read_text()
        stray += [f"{relative}: {r}" for r in _REASON.findall(text)]
        for member in re.findall(r"\bReason\.([A-Z_]+)\b", text):
            senders[Reason[member].value].add(relative)
    assert not stray, f"Event reasons defined outside {VOCABULARY}: {stray}"
    in_doc: dict[str, str] = {}
    for reasons, where in re.findall(r"^\| (`GPU.*?) \| `(gpuheal/[\w/.]+)` \|$", TEXT, re.M):
        for reason in re.findall(r"`(\w+)`", reasons):
            in_doc[reason] = where
    assert sorted(in_doc) == sorted(senders), "the table of reasons is not Reason's members"
    # A package (a path ending in "/") sends what any of its modules sends.
    wrong = {
        r: (where, sorted(senders[r]))
        for r, where in in_doc.items()
        if not any(s == where or (where.endswith("/") and s.startswith(where)) for s in senders[r])
    }
    assert not wrong, f"reasons the named module does not send: {wrong}"


def test_every_contract_key_of_the_model_is_described() -> None:
    model = (ROOT / "gpuheal/model.py").read_text()
    keys = set(re.findall(r'^[A-Z_]+ = "(gpuheal\.io/[\w-]+)"', model, re.M))
    assert len(keys) > 30
    untold = sorted(k for k in keys if f"`{k}" not in TEXT)
    assert not untold, f"contract keys docs/architecture.md does not describe: {untold}"
    code = "".join(p.read_text() for p in (ROOT / "gpuheal").rglob("*.py"))
    unknown = sorted(
        k for k in set(re.findall(r"gpuheal\.io/[a-z][\w-]*", TEXT)) if f'"{k}' not in code
    )
    assert not unknown, f"keys docs/architecture.md names that the code does not: {unknown}"


def test_links_out_of_the_document_land_on_a_heading() -> None:
    broken = []
    for target in _LINK.findall(TEXT):
        if target.startswith(("http://", "https://")):
            continue
        file, _, anchor = target.partition("#")
        path = DOCS / file if file else DOC
        if not path.exists() or (anchor and anchor not in anchors(path)):
            broken.append(target)
    assert not broken, f"links in docs/architecture.md that land nowhere: {broken}"


def test_references_into_the_document_land_on_a_heading() -> None:
    """The code's comments point here for the invariants and contracts they rely on."""
    sources = [ROOT / "README.md", *(ROOT / "gpuheal").rglob("*.py"), *DOCS.glob("*.md")]
    cited = {
        f"{source.relative_to(ROOT).as_posix()}#{anchor}"
        for source in sources
        for anchor in re.findall(r"architecture\.md#([\w-]+)", source.read_text())
    }
    assert cited, "nothing points into docs/architecture.md"
    headings = anchors(DOC)
    broken = sorted(c for c in cited if c.rpartition("#")[2] not in headings)
    assert not broken, f"references to headings docs/architecture.md lacks: {broken}"
