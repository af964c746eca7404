"""Writes (or checks, --check) each shipped CRD's schema digest annotation
(gpuheal.io/schema-digest, gpuheal/kube/crds.py) into gpuheal/crds/*.yaml, and
copies the files to deploy/crds/ and the chart's crds/, which must be identical.

Run after changing a CRD: python tools/crd_digest.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuheal.kube.crds import DIGEST_ANNOTATION, digest  # noqa: E402

SOURCE = ROOT / "gpuheal" / "crds"
COPIES = (ROOT / "deploy" / "crds", ROOT / "deploy" / "helm" / "gpuheal" / "crds")
_LINE = re.compile(
    r"^  annotations: \{" + re.escape(DIGEST_ANNOTATION) + r': "[0-9a-f]+"\}\n', re.MULTILINE
)


def with_digest(text: str) -> str:
    """The file with its annotation line set to its spec's digest."""
    spec = yaml.safe_load(text)["spec"]
    line = f'  annotations: {{{DIGEST_ANNOTATION}: "{digest(spec)}"}}\n'
    if _LINE.search(text):
        return _LINE.sub(line, text, count=1)
    head, sep, rest = text.partition("\nmetadata:\n")
    first, nl, tail = rest.partition("\n")
    return f"{head}{sep}{first}{nl}{line}{tail}"


def main(check: bool) -> int:
    stale = []
    for path in sorted(SOURCE.glob("*.yaml")):
        text = path.read_text()
        wanted = with_digest(text)
        targets = [path, *(copy / path.name for copy in COPIES)]
        for target in targets:
            current = target.read_text() if target.exists() else ""
            if current != wanted:
                stale.append(str(target.relative_to(ROOT)))
                if not check:
                    target.write_text(wanted)
    if check and stale:
        print(f"not current, run python tools/crd_digest.py: {', '.join(stale)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main("--check" in sys.argv[1:]))
