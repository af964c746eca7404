"""Write node-problem-detector's system log monitor config for NVIDIA's kernel lines
(deploy/npd/nvidia-monitor.json, and the chart's copy the ConfigMap is made of).

    .venv/bin/python tools/npd_config.py            # writes both files
    .venv/bin/python tools/npd_config.py --check    # exit 1 when a committed file differs

The rules' patterns are made from gpuheal.xid (gpuheal/sources/npd.py says how and
why): NPD cannot ask gpuheal which Xids are node faults, so the lists are generated
from the catalogue. tests/unit/test_deploy_files.py checks the committed files are
what this script writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuheal.sources.npd import monitor_config  # noqa: E402

FILES = (
    ROOT / "deploy" / "npd" / "nvidia-monitor.json",
    ROOT / "deploy" / "helm" / "gpuheal" / "files" / "nvidia-monitor.json",
)


def render() -> str:
    return json.dumps(monitor_config(), indent=2) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a file differs")
    args = parser.parse_args()
    wanted = render()
    if args.check:
        stale = [f for f in FILES if not f.exists() or f.read_text() != wanted]
        for path in stale:
            print(f"{path} is not what tools/npd_config.py writes: run it", file=sys.stderr)
        return 1 if stale else 0
    for path in FILES:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
