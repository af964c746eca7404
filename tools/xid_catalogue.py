"""Regenerate gpuheal's copy of NVIDIA's Xid catalogue from NVIDIA's own file.

    .venv/bin/python tools/xid_catalogue.py            # writes gpuheal/xid/nvidia-catalogue.json
    .venv/bin/python tools/xid_catalogue.py --check    # exit 1 when the committed file differs

The source is NVIDIA's "Xid Catalog" workbook (third_party/nvidia/Xid-Catalog.xlsx;
third_party/nvidia/README.md says where it comes from). Its sheets are read with the
standard library only (an .xlsx is a zip of XML parts):

- "Xids": one row per Xid code: mnemonic, description, the GPUs it applies to,
  NVIDIA's immediate and investigatory actions, its Xid 154 linkage;
- "Xid 144-150 Decode": NVIDIA's decode of the NVLink5 Xids by the fields of the
  kernel line (IntrInfo masks before and from R575, Error Status, actions, severity).

Xid 154 names a recovery action by the value of NVML's `nvmlDeviceGpuRecoveryAction_t`;
those values are taken from NVML as it ships in the installed `pynvml`
(nvidia-ml-py), not from the workbook's prose.

Nothing here decides anything: the output is NVIDIA's facts. What gpuheal does with
each NVIDIA action is gpuheal/xid/policy.py, and tests/unit/test_xid_catalogue.py
checks that the committed JSON is exactly what this script makes of its sources.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "third_party/nvidia/Xid-Catalog.xlsx"
OUTPUT = ROOT / "gpuheal/xid/nvidia-catalogue.json"

_MAIN = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_RELS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_CORE = {
    "cp": "http://schemas.openxmlformats.org/package/2006/metadata/core-properties",
    "dcterms": "http://purl.org/dc/terms/",
}
_CELL = re.compile(r"([A-Z]+)(\d+)")
# The workbook's columns, by header, for the GPUs NVIDIA lists.
GPUS = ("A100", "H100", "B100", "GB200")


class CatalogueError(ValueError):
    """The workbook does not have the shape this script reads; the message says where."""


def _shared_strings(book: zipfile.ZipFile) -> list[str]:
    if "xl/sharedStrings.xml" not in book.namelist():
        return []
    root = ET.fromstring(book.read("xl/sharedStrings.xml"))  # noqa: S314 -- NVIDIA's file, in the repo
    return ["".join(t.text or "" for t in si.iter(f"{{{_MAIN}}}t")) for si in root]


def _sheets(book: zipfile.ZipFile) -> dict[str, str]:
    """Sheet name -> its part in the zip."""
    workbook = ET.fromstring(book.read("xl/workbook.xml"))  # noqa: S314
    rels = ET.fromstring(book.read("xl/_rels/workbook.xml.rels"))  # noqa: S314
    targets = {rel.get("Id"): rel.get("Target", "") for rel in rels}
    found = {}
    for sheet in workbook.iter(f"{{{_MAIN}}}sheet"):
        target = targets.get(sheet.get(f"{{{_RELS}}}id"), "")
        found[sheet.get("name", "")] = "xl/" + target.removeprefix("/xl/")
    return found


def _rows(book: zipfile.ZipFile, part: str, strings: list[str]) -> list[dict[str, str]]:
    """A sheet as rows of column letter -> cell text (whitespace at the ends stripped)."""
    sheet = ET.fromstring(book.read(part))  # noqa: S314
    rows = []
    for row in sheet.iter(f"{{{_MAIN}}}row"):
        cells: dict[str, str] = {}
        for cell in row.iter(f"{{{_MAIN}}}c"):
            match = _CELL.fullmatch(cell.get("r", ""))
            if match is None:
                continue
            kind, value = cell.get("t"), cell.find(f"{{{_MAIN}}}v")
            if kind == "s" and value is not None and value.text is not None:
                text = strings[int(value.text)]
            elif kind == "inlineStr":
                text = "".join(t.text or "" for t in cell.iter(f"{{{_MAIN}}}t"))
            else:
                text = value.text if value is not None and value.text is not None else ""
            cells[match.group(1)] = text.strip()
        rows.append(cells)
    return rows


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _header(row: dict[str, str], column: str, starts: str, sheet: str) -> None:
    if not _one_line(row.get(column, "")).startswith(starts):
        raise CatalogueError(
            f"sheet {sheet!r}: column {column} is {row.get(column)!r}, expected {starts!r}…"
        )


def _xids(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    head = rows[0]
    for column, starts in (
        ("B", "Code"),
        ("C", "Mnemonic"),
        ("D", "Description"),
        ("E", "Applies to A100"),
        ("F", "Applies to H100"),
        ("G", "Applies to B100"),
        ("H", "Applies to GB200"),
        ("I", "Resolution Bucket (Immediate Action)"),
        ("J", "Resolution Bucket (Investigatory Action)"),
        ("K", "Xid 154 linkage"),
    ):
        _header(head, column, starts, "Xids")
    xids = []
    for row in rows[1:]:
        if row.get("A") != "XID":
            continue
        applies = [
            gpu for gpu, column in zip(GPUS, "EFGH", strict=True) if row.get(column) == "YES"
        ]
        xids.append(
            {
                "code": int(row["B"]),
                # Two mnemonics share code 13 ("A /\nB"): kept as NVIDIA writes them, one line.
                "mnemonic": _one_line(row.get("C", "")),
                "description": _one_line(row.get("D", "")),
                "appliesTo": applies,
                "immediate": _one_line(row.get("I", "")),
                "investigatory": _one_line(row.get("J", "")),
                "xid154Linkage": _one_line(row.get("K", "")),
            }
        )
    codes = [x["code"] for x in xids]
    if len(set(codes)) != len(codes):
        raise CatalogueError("sheet 'Xids': a code appears twice")
    return sorted(xids, key=lambda x: x["code"])


def _mask(text: str) -> str:
    mask = text.replace(" ", "")
    if mask and (len(mask) != 32 or set(mask) - set("01-")):
        raise CatalogueError(f"sheet 'Xid 144-150 Decode': {text!r} is no 32-bit mask")
    return mask


def _nvlink5(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    head = rows[0]
    for column, starts in (
        ("A", "Xid"),
        ("B", "Subcode"),
        ("C", "(V1(<R575)) IntrInfo decode"),
        ("D", "(V2(>=R575)) IntrInfo decode"),
        ("E", "Error Status"),
        ("F", "Resolution Bucket (Data Center Recovery Action)"),
        ("G", "(V1(<R575)) Decode for action 2"),
        ("H", "(V2(>=R575)) Decode for action 2"),
        ("I", "Action 2"),
        ("J", "Resolution Bucket (Investigatory Action)"),
        ("K", "Severity"),
    ):
        _header(head, column, starts, "Xid 144-150 Decode")
    rules = []
    for row in rows[1:]:
        if not row.get("A", "").isdigit():
            continue
        # "0x00000000/0xFFFFFFFF": either value; "" matches any status.
        statuses = [s.strip().lower() for s in row.get("E", "").split("/") if s.strip()]
        rules.append(
            {
                "xid": int(row["A"]),
                "subcode": _one_line(row.get("B", "")),
                "intrInfoV1": _mask(row.get("C", "")),
                "intrInfoV2": _mask(row.get("D", "")),
                "errorStatus": [f"0x{int(s, 16):08x}" for s in statuses],
                "action": _one_line(row.get("F", "")),
                "action2IntrInfoV1": _mask(row.get("G", "")),
                "action2IntrInfoV2": _mask(row.get("H", "")),
                "action2": _one_line(row.get("I", "")),
                "investigatory": _one_line(row.get("J", "")),
                "severity": _one_line(row.get("K", "")),
            }
        )
    return rules


def _buckets(rows: list[dict[str, str]]) -> list[str]:
    _header(rows[0], "A", "Guidance Class", "Resolution Buckets")
    return sorted({_one_line(row["A"]) for row in rows[1:] if row.get("A")})


def _modified(book: zipfile.ZipFile) -> str:
    core = ET.fromstring(book.read("docProps/core.xml"))  # noqa: S314
    found = core.find("dcterms:modified", _CORE)
    if found is None or not found.text:
        raise CatalogueError("docProps/core.xml has no dcterms:modified: no version to record")
    return found.text


def recovery_actions() -> dict[str, int]:
    """NVML's `nvmlDeviceGpuRecoveryAction_t`, as the installed pynvml ships it."""
    import pynvml  # noqa: PLC0415 -- only the generator reads NVML's enum

    prefix = "NVML_GPU_RECOVERY_ACTION_"
    return dict(
        sorted(
            (
                (name.removeprefix(prefix), int(getattr(pynvml, name)))
                for name in dir(pynvml)
                if name.startswith(prefix)
            ),
            key=lambda item: item[1],
        )
    )


def catalogue(source: Path = SOURCE) -> dict[str, Any]:
    """The JSON document for `source`."""
    data = source.read_bytes()
    with zipfile.ZipFile(source) as book:
        strings = _shared_strings(book)
        parts = _sheets(book)
        missing = {"Xids", "Xid 144-150 Decode", "Resolution Buckets"} - parts.keys()
        if missing:
            raise CatalogueError(f"{source}: no sheet {', '.join(sorted(missing))}")
        xids = _xids(_rows(book, parts["Xids"], strings))
        nvlink5 = _nvlink5(_rows(book, parts["Xid 144-150 Decode"], strings))
        buckets = _buckets(_rows(book, parts["Resolution Buckets"], strings))
        modified = _modified(book)
    return {
        "source": {
            "title": "NVIDIA Xid Catalog",
            "file": source.relative_to(ROOT).as_posix()
            if source.is_relative_to(ROOT)
            else source.name,
            "sha256": hashlib.sha256(data).hexdigest(),
            "modified": modified,
            # gpuheal names a catalogue by the day NVIDIA last saved it.
            "version": modified[:10],
            "gpus": list(GPUS),
        },
        "xids": xids,
        "nvlink5Decode": nvlink5,
        "resolutionBuckets": buckets,
        "recoveryActions": {
            "source": f"nvidia-ml-py {_version('nvidia-ml-py')}: nvmlDeviceGpuRecoveryAction_t",
            "values": recovery_actions(),
        },
    }


def _version(distribution: str) -> str:
    from importlib.metadata import version  # noqa: PLC0415

    return version(distribution)


def render(document: dict[str, Any]) -> str:
    """One JSON value per row, so a new catalogue reads as a diff of rows."""
    lines = ["{"]
    keys = list(document)
    for index, key in enumerate(keys):
        value = document[key]
        comma = "," if index < len(keys) - 1 else ""
        if isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f"  {json.dumps(key)}: [")
            lines.extend(
                f"    {json.dumps(item, ensure_ascii=False)}{',' if i < len(value) - 1 else ''}"
                for i, item in enumerate(value)
            )
            lines.append(f"  ]{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=SOURCE)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    text = render(catalogue(args.source))
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} differs from {args.source}: run tools/xid_catalogue.py")
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
