"""NVIDIA's Xid catalogue as NVIDIA publishes it: facts, no decisions.

The data is `nvidia-catalogue.json` beside this module, generated from NVIDIA's
"Xid Catalog" workbook by tools/xid_catalogue.py (never edited by hand; a unit
test regenerates it and compares). What gpuheal does with each of NVIDIA's
actions is `gpuheal/xid/policy.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class NvidiaXid:
    """One row of the catalogue's "Xids" sheet."""

    code: int
    mnemonic: str
    description: str
    applies_to: tuple[str, ...]  # of A100, H100, B100, GB200; () for codes unused there
    immediate: str  # the "Resolution Bucket (Immediate Action)": RESET_GPU, a workflow, or ""
    investigatory: str
    xid154_linkage: str  # "CUDA 12.7; GPU driver R565": also raises an Xid 154 since then

    @property
    def data_centre(self) -> bool:
        return bool(self.applies_to)


@dataclass(frozen=True)
class Nvlink5Rule:
    """One row of the "Xid 144-150 Decode" sheet: how NVIDIA reads an NVLink5 Xid
    from its kernel line's IntrInfo and Error Status fields."""

    xid: int
    subcode: str  # "RLW_REMAP", or "V1 name/V2 name" where the driver renamed it at R575
    intr_info_v1: str  # 32-bit mask, most significant bit first; "-" = any
    intr_info_v2: str
    error_status: tuple[str, ...]  # "0x00000004"; () = any
    action: str  # IGNORE, RESET_GPU, XID_154_EVAL
    action2_intr_info_v1: str  # a promotable error: this mask selects action2
    action2_intr_info_v2: str
    action2: str
    investigatory: str
    severity: str  # NVIDIA's words: Fatal, Non-fatal, Link Fatal, Non-fatal* ...


@dataclass(frozen=True)
class Catalogue:
    version: str  # the day NVIDIA last saved the workbook
    modified: str
    sha256: str
    xids: dict[int, NvidiaXid]
    nvlink5: tuple[Nvlink5Rule, ...]
    buckets: tuple[str, ...]  # every "Guidance Class" the workbook defines
    recovery_actions: dict[int, str]  # nvmlDeviceGpuRecoveryAction_t: value -> name
    recovery_source: str


def _xid(row: dict[str, Any]) -> NvidiaXid:
    return NvidiaXid(
        code=int(row["code"]),
        mnemonic=str(row["mnemonic"]),
        description=str(row["description"]),
        applies_to=tuple(row["appliesTo"]),
        immediate=str(row["immediate"]),
        investigatory=str(row["investigatory"]),
        xid154_linkage=str(row["xid154Linkage"]),
    )


def _rule(row: dict[str, Any]) -> Nvlink5Rule:
    return Nvlink5Rule(
        xid=int(row["xid"]),
        subcode=str(row["subcode"]),
        intr_info_v1=str(row["intrInfoV1"]),
        intr_info_v2=str(row["intrInfoV2"]),
        error_status=tuple(row["errorStatus"]),
        action=str(row["action"]),
        action2_intr_info_v1=str(row["action2IntrInfoV1"]),
        action2_intr_info_v2=str(row["action2IntrInfoV2"]),
        action2=str(row["action2"]),
        investigatory=str(row["investigatory"]),
        severity=str(row["severity"]),
    )


def load(text: str) -> Catalogue:
    document = json.loads(text)
    source = document["source"]
    recovery = document["recoveryActions"]
    return Catalogue(
        version=str(source["version"]),
        modified=str(source["modified"]),
        sha256=str(source["sha256"]),
        xids={x.code: x for x in map(_xid, document["xids"])},
        nvlink5=tuple(map(_rule, document["nvlink5Decode"])),
        buckets=tuple(document["resolutionBuckets"]),
        recovery_actions={int(v): str(k) for k, v in recovery["values"].items()},
        recovery_source=str(recovery["source"]),
    )


NVIDIA = load(resources.files(__package__).joinpath("nvidia-catalogue.json").read_text("utf-8"))
VERSION = NVIDIA.version
