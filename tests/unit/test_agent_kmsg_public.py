"""The kernel-log parser over other projects' PUBLIC test data: NVSentinel's, GPUd's,
DCGM's and GCM's NVIDIA driver lines, kept verbatim as /dev/kmsg records in
tests/unit/data/kmsg_public.txt (each group names its repository, path and commit).

Every record's outcome is written down here (`OUTCOME`): the event it is and what
gpuheal makes of it, or that it is nothing, an attached SXid line, or a user-space
write. The other tests say why the outcomes are right."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuheal.agent.app import Agent
from gpuheal.agent.config import AgentConfig
from gpuheal.agent.kmsg import (
    Continuations,
    GpuAt,
    KernelEvent,
    KmsgFollower,
    KmsgRecord,
    OffTheBus,
    SxidEvent,
    XidEvent,
    message_text,
    parse_message,
    parse_record,
)
from gpuheal.metrics.agent import AgentMetrics
from gpuheal.model import Severity
from gpuheal.xid import Action, Kind, classify
from gpuheal.xid.nic import NicEvent
from gpuheal.xid.sxid import classify_sxid

PUBLIC = Path(__file__).parent / "data" / "kmsg_public.txt"


def groups() -> dict[str, list[str]]:
    """The fixture's records by "# GROUP:"."""
    found: dict[str, list[str]] = {}
    name = ""
    for line in PUBLIC.read_text().splitlines():
        if line.startswith("# GROUP:"):
            name = line.removeprefix("# GROUP:").strip()
            found[name] = []
        elif line and not line.startswith("#"):
            found[name].append(line)
    return found


def records() -> list[KmsgRecord]:
    parsed = [parse_record(raw) for lines in groups().values() for raw in lines]
    assert all(parsed), "every line of the fixture is a /dev/kmsg record"
    return cast("list[KmsgRecord]", parsed)


def by_seq(seq: int) -> KmsgRecord:
    (record,) = [r for r in records() if r.seq == seq]
    return record


def event_of(seq: int) -> KernelEvent | None:
    return parse_message(by_seq(seq).message)


def verdict(event: KernelEvent | None) -> str:
    """An event and gpuheal's row for it, in one line."""
    match event:
        case None:
            return "-"
        case XidEvent():
            row = classify(event.xid, None, event.recovery_action, detail=event.detail)
            return (
                f"Xid {event.xid} {event.pci} {row.reason} {row.severity.value} {row.action.value}"
            )
        case SxidEvent():
            row = classify_sxid(event.sxid, event.fatal)
            return (
                f"SXid {event.sxid} {event.switch} {event.pci} {event.fatal} "
                f"{row.reason} {row.severity.value}"
            )
        case OffTheBus():
            return f"OffTheBus {event.pci or '?'}"
        case GpuAt():
            return f"GpuAt {event.pci} {event.uuid}"
        case NicEvent():
            return f"Nic {event.device} {event.reason} {event.severity.value}"


def outcomes() -> dict[int, str]:
    """What the agent's follower makes of each record, read in order."""
    joined = Continuations()
    seen: dict[int, str] = {}
    for record in records():
        if record.facility != 0:
            seen[record.seq] = "user space"
            continue
        attached = joined.attached
        event = joined.event(record)
        seen[record.seq] = "attached" if joined.attached > attached else verdict(event)
    return seen


# What each public record is, and gpuheal's row for it (Xid: reason, severity, repair;
# SXid: the line's word, reason, severity). "-": no event.
OUTCOME: dict[int, str] = {
    # nvsentinel-xid-parser
    1101: "Xid 149 0018:01:00 NetirError149 P0 reset-gpu",
    1102: "Xid 13 0000:b5:00 XidApplication13 P2 none",
    1103: "Xid 13 0000:b5:00 XidApplication13 P2 none",
    1104: "Xid 74 0003:00:00 NvlinkError74 P0 reset-gpu",
    1105: "Xid 32 0000:66:00 XidApplication32 P2 none",
    1106: "Xid 46 0000:3f:00 GpuTimeoutError46 P0 reset-gpu",
    1107: "Xid 69 0001:ab:cd XidApplication69 P2 none",
    1108: "Xid 8 0000:9b:00 XidGpuStoppedProcessing8 P2 none",
    1109: "Xid 999 0000:66:00 XidUnknown999 P1 contact-support",
    1110: "GpuAt 0000:66:00 GPU-12345678-1234-5678-9abc-def012345678",
    1111: "-",
    1112: "-",
    1113: "-",
    1114: "Xid 154 0008:01:00 GpuResetRequired154 P0 reset-gpu",
    1115: "Xid 154 0000:01:00 RecoveryActionUnknown154 P1 contact-support",
    1116: "Xid 145 0000:00:08 RlwError145 P0 reset-gpu",
    1117: "Xid 145 0000:00:08 RlwError145 P0 reset-gpu",
    # nvsentinel-xid-sidecar
    1201: "-",
    1202: "Xid 32 0000:66:00 XidApplication32 P2 none",
    1203: "Xid 46 0000:9b:00 GpuTimeoutError46 P0 reset-gpu",
    # nvsentinel-xid-handler
    1301: "-",
    1302: "-",
    1303: "GpuAt 0000:00:08 GPU-12345678-1234-1234-1234-123456789012",
    1304: "Xid 79 0000:00:08 XidCritical79 P0 reboot",
    # nvsentinel-gpufallen
    1401: "OffTheBus 0000:b3:00",
    1402: "OffTheBus 0000:b3:00",
    1403: "Xid 79 0000:b3:00 XidCritical79 P0 reboot",
    1404: "OffTheBus 0000:b3:00",
    1405: "-",
    1406: "Xid 79 0000:b3:00 XidCritical79 P0 reboot",
    1407: "Xid 79 0000:b3:00 XidCritical79 P0 reboot",
    1408: "OffTheBus 0000:b3:00",
    1409: "Xid 79 0000:b3:00 XidCritical79 P0 reboot",
    1410: "OffTheBus 0000:b4:00",
    1411: "Xid 79 0000:b3:00 XidCritical79 P0 reboot",
    1412: "-",
    1413: "Xid 79 0000:b4:00 XidCritical79 P0 reboot",
    1414: "Xid 79 0000:b5:00 XidCritical79 P0 reboot",
    # nvsentinel-sxid
    1501: "SXid 28006 nvidia-nvswitch3 0000:c1:00 False NvswitchNonFatal28006 P2",
    1502: "SXid 20009 nvidia-nvswitch0 0000:06:00 False NvswitchNonFatal20009 P2",
    1503: "SXid 24007 nvidia-nvswitch0 0000:c3:00 True NvswitchFatal24007 P0",
    1504: "SXid 26008 nvidia-nvswitch0 0004:00:00 None NvswitchNonFatal26008 P2",
    1505: "SXid 26006 nvidia-nvswitch0 0004:00:00 None NvswitchNonFatal26006 P2",
    1506: "SXid 26007 nvidia-nvswitch0 0004:00:00 None NvswitchNonFatal26007 P2",
    1507: "attached",
    1508: "SXid 20009 nvidia-nvswitch1 0000:06:00 False NvswitchNonFatal20009 P2",
    1509: "SXid 12033 nvidia-nvswitch0 0000:c3:00 True NvswitchFatal12033 P0",
    1510: "SXid 20009 nvidia-nvswitch1 0000:06:00 False NvswitchNonFatal20009 P2",
    # nvsentinel-syslog-monitor
    1601: "Xid 48 0008:06:00 EccDoubleBit48 P0 reset-gpu",
    # nvsentinel-e2e
    1701: "Xid 119 0002:00:00 GspTimeout119 P0 reset-gpu",
    1702: "Xid 94 0000:17:00 EccContained94 P2 none",
    1703: "Xid 13 0002:00:00 XidApplication13 P2 none",
    1704: "Xid 31 0001:00:00 XidApplication31 P2 none",
    1705: "Xid 145 0001:00:00 RlwError145 P0 reset-gpu",
    1706: "Xid 145 0002:00:00 RlwError145 P0 reset-gpu",
    1707: "Xid 119 0001:00:00 GspTimeout119 P0 reset-gpu",
    1708: "Xid 119 0000:17:00 GspTimeout119 P0 reset-gpu",
    1709: "Xid 119 0000:19:00 GspTimeout119 P0 reset-gpu",
    1710: "Xid 79 0001:00:00 XidCritical79 P0 reboot",
    1711: "Xid 79 0002:00:00 XidCritical79 P0 reboot",
    1712: "Xid 79 0000:17:00 XidCritical79 P0 reboot",
    1713: "Xid 79 0000:19:00 XidCritical79 P0 reboot",
    1714: "Xid 119 0002:00:00 GspTimeout119 P0 reset-gpu",
    1715: "Xid 94 0001:00:00 EccContained94 P2 none",
    1716: "Xid 79 0000:17:00 XidCritical79 P0 reboot",
    1717: "SXid 20009 nvidia-nvswitch0 0000:c3:00 False NvswitchNonFatal20009 P2",
    1718: "SXid 28006 nvidia-nvswitch0 0000:c3:00 False NvswitchNonFatal28006 P2",
    1719: "SXid 24007 nvidia-nvswitch0 0000:c3:00 True NvswitchFatal24007 P0",
    # nvsentinel-e2e-cancellation
    1801: "Xid 94 0002:00:00 EccContained94 P2 none",
    1802: "Xid 79 0002:00:00 XidCritical79 P0 reboot",
    # nvsentinel-design-xid13
    1901: "Xid 13 0009:01:00 XidApplication13 P2 none",
    # nvsentinel-uat-user-space
    2001: "user space",
    # gpud-xid-kmsg
    2101: "-",
    2102: "Xid 79 0000:05:00 XidCritical79 P0 reboot",
    2103: "Xid 79 0000:01:00 XidCritical79 P0 reboot",
    2104: "Xid 14 0000:03:00 FakeError14 P2 none",
    2105: "-",
    2106: "OffTheBus 0000:18:00",
    2107: "OffTheBus 0000:29:00",
    2108: "OffTheBus 0000:18:00",
    2109: "OffTheBus ?",
    2110: "Xid 149 0009:01:00 NetirError149 P0 reset-gpu",
    2111: "Xid 154 0009:01:00 DrainAndReset154 P0 reset-gpu",
    2112: "Xid 149 0008:01:00 NetirError149 P0 reset-gpu",
    2113: "Xid 154 0019:01:00 GpuResetRequired154 P0 reset-gpu",
    2114: "Xid 149 0009:01:00 NetirError149 P0 reset-gpu",
    2115: "Xid 149 0009:01:00 NetirError149 P0 reset-gpu",
    2116: "Xid 149 0008:01:00 NetirError149 P0 reset-gpu",
    2117: "Xid 154 0018:01:00 GpuResetRequired154 P0 reset-gpu",
    2118: "Xid 154 0008:01:00 GpuResetRequired154 P0 reset-gpu",
    2119: "Xid 99999 0000:05:00 XidUnknown99999 P1 contact-support",
    # gpud-xid-nvlink5
    2201: "Xid 149 0018:01:00 NetirError149 P2 none",
    2202: "Xid 145 0018:01:00 RlwError145 P2 none",
    2203: "Xid 145 0019:01:00 RlwError145 P2 none",
    2204: "Xid 149 0008:01:00 NetirError149 P2 none",
    2205: "Xid 145 0019:01:00 RlwError145 P2 none",
    2206: "Xid 149 0019:01:00 NetirError149 P0 reset-gpu",
    2207: "Xid 145 0008:01:00 RlwError145 P2 none",
    2208: "Xid 145 0008:01:00 RlwError145 P2 none",
    2209: "Xid 145 0018:01:00 RlwError145 P2 none",
    2210: "Xid 145 0008:01:00 RlwError145 P2 none",
    2211: "Xid 149 0008:01:00 NetirError149 P0 reset-gpu",
    2212: "Xid 149 0008:01:00 NetirError149 P0 reset-gpu",
    2213: "Xid 149 0018:01:00 NetirError149 P0 reset-gpu",
    2214: "Xid 149 0018:01:00 NetirError149 P0 reset-gpu",
    2215: "Xid 149 0018:01:00 NetirError149 P1 contact-support",
    2216: "Xid 145 0000:04:00 RlwError145 P2 none",
    2217: "Xid 145 0000:04:00 RlwError145 P2 none",
    2218: "Xid 144 0000:04:00 SawError144 P2 none",  # Nonfatal, no decode row: counted
    2219: "Xid 144 0000:04:00 SawError144 P2 none",  # Nonfatal, no decode row: counted
    # gpud-xid-nvlink-logs
    2301: "Xid 144 0000:04:00 SawError144 P2 none",
    2302: "Xid 144 0000:04:00 SawError144 P0 reset-gpu",
    2303: "Xid 145 0000:04:00 RlwError145 P0 reset-gpu",
    2304: "Xid 145 0000:04:00 RlwError145 P2 none",
    2305: "Xid 145 0000:04:00 RlwError145 P2 none",
    2306: "Xid 145 0000:04:00 RlwError145 P0 reset-gpu",
    2307: "Xid 145 0000:04:00 RlwError145 P2 none",
    2308: "Xid 145 0000:04:00 RlwError145 P0 reset-gpu",
    2309: "Xid 145 0000:04:00 RlwError145 P2 none",
    2310: "Xid 145 0000:04:00 RlwError145 P2 none",
    2311: "Xid 145 0000:04:00 RlwError145 P2 none",
    2312: "Xid 145 0000:04:00 RlwError145 P0 reset-gpu",
    2313: "Xid 146 0000:04:00 TlwError146 P2 none",
    2314: "Xid 146 0000:04:00 TlwError146 P0 reset-gpu",
    2315: "Xid 146 0000:04:00 TlwError146 P2 none",
    2316: "Xid 146 0000:04:00 TlwError146 P0 reset-gpu",
    2317: "Xid 146 0000:04:00 TlwError146 P2 none",
    2318: "Xid 146 0000:04:00 TlwError146 P0 reset-gpu",
    2319: "Xid 146 0000:04:00 TlwError146 P2 none",
    2320: "Xid 146 0000:04:00 TlwError146 P0 reset-gpu",
    2321: "Xid 146 0000:04:00 TlwError146 P2 none",
    2322: "Xid 146 0000:04:00 TlwError146 P0 reset-gpu",
    2323: "Xid 147 0000:04:00 TrexError147 P2 none",
    2324: "Xid 148 0000:04:00 NvlpwCtrlError148 P2 none",
    2325: "Xid 149 0000:04:00 NetirError149 P0 reset-gpu",
    2326: "Xid 149 0000:04:00 NetirError149 P2 none",
    2327: "Xid 149 0000:04:00 NetirError149 P2 none",
    2328: "Xid 149 0000:04:00 NetirError149 P0 reset-gpu",
    2329: "Xid 149 0000:04:00 NetirError149 P2 none",
    2330: "Xid 149 0000:04:00 NetirError149 P0 reset-gpu",
    2331: "Xid 149 0000:04:00 NetirError149 P0 reset-gpu",
    2332: "Xid 149 0000:04:00 NetirError149 P0 reset-gpu",
    2333: "Xid 150 0000:04:00 MseError150 P0 reset-gpu",
    # gpud-xid-health-state
    2401: "Xid 149 0000:00:00 NetirError149 P0 reset-gpu",
    2402: "Xid 149 0000:00:00 NetirError149 P2 none",
    2403: "Xid 144 0000:01:00 SawError144 P2 none",
    2404: "Xid 144 0000:04:00 SawError144 P2 none",
    2405: "Xid 149 0000:04:00 NetirError149 P0 reset-gpu",
    2406: "Xid 149 0000:04:00 NetirError149 P2 none",
    2407: "Xid 149 0000:04:00 NetirError149 P0 reset-gpu",
    2408: "Xid 145 0008:06:00 RlwError145 P2 none",
    2409: "Xid 145 0008:06:00 RlwError145 P0 reset-gpu",
    # gpud-xid-component
    2501: "Xid 31 0000:01:00 XidApplication31 P2 none",
    2502: "Xid 63 0000:01:00 RowRemapEvent63 P2 none",
    2503: "Xid 64 0000:02:00 RowRemapFailure64 P0 reset-gpu",
    2504: "Xid 31 0000:03:00 XidApplication31 P2 none",
    2505: "Xid 63 0000:04:00 RowRemapEvent63 P2 none",
    2506: "Xid 31 0000:01:00 XidApplication31 P2 none",
    2507: "Xid 63 0000:02:00 RowRemapEvent63 P2 none",
    2508: "Xid 79 0000:03:00 XidCritical79 P0 reboot",
    2509: "Xid 64 0000:04:00 RowRemapFailure64 P0 reset-gpu",
    2510: "Xid 94 0000:05:00 EccContained94 P2 none",
    2511: "Xid 102 0000:01:00 Nvjpg4Error102 P2 none",
    2512: "Xid 31 0000:01:00 XidApplication31 P2 none",
    2513: "Xid 31 0000:02:00 XidApplication31 P2 none",
    2514: "Xid 64 0000:03:00 RowRemapFailure64 P0 reset-gpu",
    2515: "Xid 79 0000:04:00 XidCritical79 P0 reboot",
    2516: "Xid 63 0000:05:00 RowRemapEvent63 P2 none",
    # gpud-xid-mock
    2601: "Xid 31 0000:03:00 XidApplication31 P2 none",
    # gpud-xid-mock-coverage
    2701: "Xid 31 0000:01:00 XidApplication31 P2 none",
    # gpud-dmesg-xid-119
    2801: "GpuAt 0000:9b:00 GPU-509665ad-b600-ac93-3616-d754b23d636d",
    2802: "-",
    2803: "Xid 119 0000:9b:00 GspTimeout119 P0 reset-gpu",
    2804: "-",
    2805: "-",
    2806: "-",
    2807: "-",
    2808: "-",
    2809: "-",
    2810: "-",
    2811: "-",
    2812: "-",
    2813: "-",
    2814: "-",
    2815: "-",
    2816: "-",
    2817: "-",
    2818: "-",
    2819: "-",
    2820: "-",
    2821: "-",
    2822: "-",
    2823: "-",
    2824: "-",
    2825: "-",
    2826: "-",
    2827: "-",
    2828: "-",
    2829: "-",
    2830: "-",
    2831: "-",
    2832: "-",
    2833: "-",
    2834: "-",
    2835: "-",
    2836: "-",
    2837: "-",
    2838: "Xid 119 0000:9b:00 GspTimeout119 P0 reset-gpu",
    2839: "-",
    2840: "Xid 119 0000:9b:00 GspTimeout119 P0 reset-gpu",
    2841: "-",
    2842: "Xid 119 0000:9b:00 GspTimeout119 P0 reset-gpu",
    2843: "Xid 119 0000:9b:00 GspTimeout119 P0 reset-gpu",
    # gpud-dmesg-decode
    2901: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2902: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2903: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2904: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2905: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2906: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2907: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2908: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2909: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2910: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2911: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2912: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2913: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2914: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2915: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2916: "Xid 13 0000:38:00 XidApplication13 P2 none",
    2917: "Xid 43 0000:38:00 XidApplication43 P2 none",
    # gpud-sxid-kmsg
    3001: "SXid 12028 nvidia-nvswitch3 0000:05:00 False NvswitchFatal12028 P0",
    3002: "SXid 20034 nvidia-nvswitch0 0000:00:00 True NvswitchFatal20034 P0",
    3003: "SXid 12028 nvidia-nvswitch3 0000:05:00 False NvswitchFatal12028 P0",
    3004: "-",
    3005: "-",
    3006: "SXid 20034 nvidia-nvswitch0 0000:a9:00 None NvswitchFatal20034 P0",
    3007: "SXid 11111 nvidia-nvswitch0 0000:a9:00 None NvswitchNonFatal11111 P2",
    3008: "-",
    3009: "-",
    # gpud-sxid-component
    3101: "SXid 12028 nvidia-nvswitch3 0000:05:00 False NvswitchFatal12028 P0",
    3102: "SXid 20123 nvidia-nvswitch3 0000:05:00 None NvswitchNonFatal20123 P2",
    3103: "SXid 22013 nvidia-nvswitch1 0000:0a:00 False NvswitchNonFatal22013 P2",
    # gpud-sxid-mock
    3201: "SXid 99999 nvidia-nvswitch3 0000:05:00 None NvswitchNonFatal99999 P2",
    3202: "SXid 12028 nvidia-nvswitch3 0000:05:00 False NvswitchFatal12028 P0",
    3203: "SXid 12028 nvidia-nvswitch3 0000:05:00 None NvswitchFatal12028 P0",
    # gpud-sxid-readme
    3301: "GpuAt 0000:91:00 GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b",
    3302: "-",
    3303: "Xid 79 0000:91:00 XidCritical79 P0 reboot",
    3304: "OffTheBus 0000:91:00",
    3305: "-",
    3306: "SXid 20034 nvidia-nvswitch1 0000:06:00 True NvswitchFatal20034 P0",
    3307: "SXid 20034 nvidia-nvswitch0 0000:05:00 True NvswitchFatal20034 P0",
    3308: "SXid 20034 nvidia-nvswitch2 0000:07:00 True NvswitchFatal20034 P0",
    3309: "attached",
    3310: "SXid 20034 nvidia-nvswitch2 0000:07:00 True NvswitchFatal20034 P0",
    3311: "SXid 20034 nvidia-nvswitch0 0000:05:00 True NvswitchFatal20034 P0",
    3312: "attached",
    3313: "attached",
    # gpud-nvlink-kmsg
    3401: "-",
    3402: "-",
    3403: "-",
    3404: "-",
    # gpud-pstore-dmesg
    3501: "-",
    3502: "-",
    3503: "-",
    3504: "-",
    # dcgm-kmsg-records
    3601: "Xid 43 0000:01:00 XidApplication43 P2 none",
    3602: "-",
    3603: "Xid 43 0000:01:00 XidApplication43 P2 none",
    # dcgm-kmsg-pipe
    3701: "-",
    3702: "-",
    3703: "GpuAt 0000:01:00 GPU-aeab3757-56a6-7e30-3f7c-1f322454bde2",
    3704: "-",
    3705: "Xid 119 0000:00:16 GspTimeout119 P0 reset-gpu",
    3706: "Xid 43 0000:01:00 XidApplication43 P2 none",
    3707: "Xid 79 0000:2a:00 XidCritical79 P0 reboot",
    3708: "Xid 119 0000:00:16 GspTimeout119 P0 reset-gpu",
    # dcgm-user-space
    3801: "user space",
    # gcm-syslogs
    3901: "Xid 31 000d:00:00 XidApplication31 P2 none",
    3902: "Xid 48 000d:00:00 EccDoubleBit48 P0 reset-gpu",
}


def test_the_fixture_holds_the_public_lines_of_four_projects() -> None:
    text = PUBLIC.read_text()
    sources = re.findall(r"^# SOURCE: (\S+)", text, re.MULTILINE)
    assert {s.split("/")[0] for s in sources} == {"NVIDIA", "leptonai", "facebookresearch"}
    assert len(records()) == len(OUTCOME) >= 250
    seqs = [r.seq for r in records()]
    assert seqs == sorted(set(seqs)), "one stream: the follower reads every record once"


def test_every_public_record_is_what_it_means() -> None:
    assert outcomes() == OUTCOME


def _after_code(message: str, code: int) -> str:
    """The text after "): <code>" and its ", " (the definition of `detail`)."""
    text = message_text(message)
    return text.split(f"): {code}", 1)[1].lstrip(", ")


def test_every_xid_line_gives_its_code_address_and_the_text_after_the_code() -> None:
    xids = 0
    for record in records():
        text = message_text(record.message)
        code = re.search(
            r"NVRM: Xid \((?:PCI:)?([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})[^)]*\): (\d+)(,|\s*\(|$)",
            text,
        )
        event = parse_message(record.message)
        if code is None:
            assert not isinstance(event, XidEvent), text
            continue
        xids += 1
        assert isinstance(event, XidEvent), text
        assert (event.xid, event.pci) == (int(code.group(2)), code.group(1))
        assert event.detail == _after_code(record.message, event.xid)
        if pid := re.search(r"pid='?(\d+|<unknown>)", text):
            assert event.pid == pid.group(1)
    assert xids >= 160


def test_every_sxid_line_gives_its_word_detail_and_data() -> None:
    sxids = 0
    for record in records():
        text = message_text(record.message)
        head = re.search(
            r"(nvidia-nvswitch\d+): SXid \(PCI:([0-9a-f:.]+)\): (\d+)(?:, |$)(.*)", text
        )
        event = parse_message(record.message)
        if head is None:
            assert not isinstance(event, SxidEvent), text
            continue
        sxids += 1
        assert isinstance(event, SxidEvent), text
        assert (event.switch, event.sxid) == (head.group(1), int(head.group(3)))
        rest = head.group(4)
        word = re.match(r"(Fatal|Non-fatal)\b,? ?", rest)
        severity = re.match(r"Severity ([01]) Engine instance", rest)
        if word:
            assert event.fatal is (word.group(1) == "Fatal")
            assert event.detail == rest[word.end() :]
        else:
            # No word: the driver's severity number (1: fatal) or nothing to say.
            assert event.fatal is (severity.group(1) == "1" if severity else None)
            assert event.detail == rest
        data = re.match(r"Data \{(.*)\}", rest)
        assert event.data == (data.group(1) if data else "")
        assert event.continuation is bool(data or severity or rest.startswith("SOE HALT data["))
    assert sxids >= 30


@pytest.mark.parametrize(
    ("seq", "reason", "action"),
    [
        (
            1101,
            "NetirError149",
            Action.RESET_GPU,
        ),  # NVSentinel: "149, NETIR_LINK_EVT Fatal XC0 i0 Link 09 (0x025525c6 …)"
        (
            1104,
            "NvlinkError74",
            Action.RESET_GPU,
        ),  # NVSentinel: "74 … link 14(0x0, 0x0, 0x10000, …)"
        (2111, "DrainAndReset154", Action.RESET_GPU),  # GPUd: "154, … to 0x4 (Drain and Reset)"
        (
            2113,
            "GpuResetRequired154",
            Action.RESET_GPU,
        ),  # GPUd: "… from 0x4 (Drain and Reset) to 0x1 (GPU Reset Required)"
        (
            2206,
            "NetirError149",
            Action.RESET_GPU,
        ),  # GPUd: "149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 …)"
    ],
)
def test_nvidias_decoding_of_the_kernel_line_is_what_the_agent_acts_on(
    seq: int, reason: str, action: Action
) -> None:
    event = event_of(seq)
    assert isinstance(event, XidEvent)
    row = classify(event.xid, None, event.recovery_action, detail=event.detail)
    assert (row.reason, row.severity, row.action) == (reason, Severity.P0, action)
    # Before the detail reached classify, NVLink5 Xids were "not decoded" (P1) and
    # Xid 74 was reset without reading its registers.
    if event.xid == 74:
        assert "reg3:[16]" in row.nvidia
    if event.xid == 149:
        bare = classify(event.xid)
        assert (bare.severity, bare.action) == (Severity.P1, Action.CONTACT_SUPPORT)


def test_the_nonfatal_nvlink5_lines_nvidia_says_to_ignore_are_not_node_faults() -> None:
    # GPUd: "149, NETIR_BER_EVENT Nonfatal … (0x00086226 0x00000001 …)", "145, pid=876767,
    # name=ray::WorkerDict, RLW_RXPIPE Nonfatal …": NVIDIA's decode sheet says IGNORE.
    for seq in (2201, 2202, 2203, 2204):
        event = event_of(seq)
        assert isinstance(event, XidEvent)
        row = classify(event.xid, None, detail=event.detail)
        assert not row.node_fault and row.kind is Kind.INFORMATIONAL, seq
    assert isinstance(ray := event_of(2202), XidEvent) and ray.process == "ray::WorkerDict"


def test_application_xids_13_31_43_are_never_node_faults() -> None:
    seen = 0
    for record in records():
        event = parse_message(record.message)
        if isinstance(event, XidEvent) and event.xid in (13, 31, 43):
            seen += 1
            assert not classify(event.xid, None, detail=event.detail).node_fault, record.message
    assert seen >= 30


def test_the_fabric_manager_guide_decides_an_sxid_over_its_word() -> None:
    # GPUd: "12028, Non-fatal, Link 32 egress non-posted PRIV error": GPU access hangs (P0).
    for seq in (3001, 3003, 3101, 3202, 3203):
        event = event_of(seq)
        assert isinstance(event, SxidEvent) and event.sxid == 12028
        row = classify_sxid(event.sxid, event.fatal)
        assert (row.severity, row.action) == (Severity.P0, Action.REBOOT), seq
    assert isinstance(words := event_of(3001), SxidEvent) and words.fatal is False
    assert words.detail == "Link 32 egress non-posted PRIV error (First)"
    # The guide's non-fatal ones stay counted, whatever else the line says.
    for seq in (1501, 1502, 1508, 1510, 1717, 1718, 3103):
        event = event_of(seq)
        assert isinstance(event, SxidEvent) and event.fatal is False
        assert not classify_sxid(event.sxid, event.fatal).node_fault, seq
    # No public data holds an 11012 line; one in the driver's words: single-bit ECC, corrected.
    ecc = parse_message(
        "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 11012, Non-fatal, Link 12 ingress NCISOC HDR ECC limit"
    )
    assert isinstance(ecc, SxidEvent) and ecc.fatal is False
    assert not classify_sxid(ecc.sxid, ecc.fatal).node_fault


def test_an_xid_code_followed_by_a_parenthesis_or_nothing_is_an_xid() -> None:
    cut = event_of(1115)  # NVSentinel: "NVRM: Xid (PCI:0000:01:00): 154 ("
    assert isinstance(cut, XidEvent) and (cut.xid, cut.detail, cut.recovery_action) == (
        154,
        "(",
        None,
    )
    # NVSentinel's verdict too: an Xid 154 that names no action is CONTACT_SUPPORT.
    assert classify(154, None, detail=cut.detail).action is Action.CONTACT_SUPPORT
    bare = event_of(1106)  # "NVRM: Xid (PCI:0000:3f:00): 46"
    assert isinstance(bare, XidEvent) and (bare.xid, bare.detail) == (46, "")


def test_lines_that_are_no_event_stay_none() -> None:
    # Malformed or foreign (NVSentinel, GPUd, DCGM): no parentheses, no code, a word for
    # a code, a UUID too short to be one, GSP RPC history, NVLink training notes.
    for seq in (1111, 1112, 1113, 1201, 1301, 1302, 1405, 1412, 2101, 2105, 3005, 3009, 3602):
        assert event_of(seq) is None, by_seq(seq).message
    history = [r for r in records() if 2804 <= r.seq <= 2837 or 3401 <= r.seq <= 3504]
    assert history and all(parse_message(r.message) is None for r in history)


def test_the_multi_line_fallen_off_the_bus_record_is_one_event_with_its_address() -> None:
    record = by_seq(1401)  # NVSentinel's dmesg view of one record, as /dev/kmsg gives it
    assert record.message.count(r"\x0a") == 2
    assert parse_message(record.message) == OffTheBus("0000:b3:00", message_text(record.message))
    # The same lines as records of their own: one event, with the first record's address.
    joined = Continuations()
    parts = record.message.split(r"\x0a")
    split = [
        joined.event(KmsgRecord(0, 4, record.seq + i, record.usec + i, part))
        for i, part in enumerate(parts)
    ]
    assert split[:2] == [None, None]
    assert isinstance(split[2], OffTheBus) and split[2].pci == "0000:b3:00"
    # Alone (its first record scrolled off) the last line is still a GPU off the bus.
    alone = Continuations().event(KmsgRecord(0, 4, 1, 1, parts[2]))
    assert isinstance(alone, OffTheBus) and alone.pci == ""


def test_an_sxid_data_line_is_attached_to_its_sxid_and_alone_it_is_an_event() -> None:
    readme = [r for r in records() if 3306 <= r.seq <= 3313]  # GPUd's README: a real log
    joined = Continuations()
    events = {r.seq: joined.event(r) for r in readme}
    assert [seq for seq, e in events.items() if e is not None] == [3306, 3307, 3308, 3310, 3311]
    assert joined.attached == 3  # nvswitch0's Data and Severity lines, nvswitch2's Severity line
    # nvswitch2's Severity line follows no first line in the excerpt: its own event, fatal
    # by the driver's severity number, and fatal by the guide (20034, LTSSM Fault Up).
    orphan = events[3308]
    assert isinstance(orphan, SxidEvent) and orphan.continuation and orphan.fatal is True
    # GPUd's "20034, Data {0x50610002, 0x10100030}" whose first line is not there.
    data = event_of(3006)
    assert isinstance(data, SxidEvent) and data.fatal is None
    assert data.data == "0x50610002, 0x10100030"
    assert classify_sxid(data.sxid, data.fatal).severity is Severity.P0
    # A Data line too far after its first line (in records, or in kernel time) stands alone.
    first = by_seq(3307)
    line = by_seq(3309)
    for seq, usec in ((first.seq + 17, line.usec), (line.seq, first.usec + 1_000_001)):
        late = Continuations()
        assert late.event(first) is not None
        assert late.event(KmsgRecord(0, 3, seq, usec, line.message)) is not None
        assert late.attached == 0


def test_dictionary_lines_are_dropped_and_message_lines_kept() -> None:
    raw = (
        "4,7,100,c;NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        " SUBSYSTEM=pci\n"
        "NVRM: fallen off the bus and is not responding to commands.\n"
        " DEVICE=+pci:0000:b3:00.0\n"
    )
    record = parse_record(raw)
    assert record is not None and "SUBSYSTEM" not in record.message
    assert parse_message(record.message) == OffTheBus(
        "0000:b3:00",
        "NVRM: The NVIDIA GPU 0000:b3:00.0 NVRM: fallen off the bus and is not responding to commands.",
    )
    trace = parse_record("6,2829,28000029000,-; show_stack+0x52/0x5c")  # dump_stack's own indent
    assert trace is not None and trace.message == " show_stack+0x52/0x5c"


def _follow(source: Path, state: Path, last: int) -> tuple[list[KernelEvent], KmsgFollower]:
    seen: list[KernelEvent] = []
    follower = KmsgFollower(source, state, "boot-1", seen.append)
    follower.start()
    deadline = time.monotonic() + 10
    while follower.cursor.seq < last and time.monotonic() < deadline:
        time.sleep(0.05)
    follower.stop()
    return seen, follower


def test_the_follower_reads_the_fixture_once_attaches_data_lines_and_ignores_user_space(
    tmp_path: Path,
) -> None:
    source = tmp_path / "kmsg"
    source.write_text(PUBLIC.read_text())  # comments and blank lines: not records, counted
    last = max(OUTCOME)
    metrics = AgentMetrics()
    seen, follower = _follow(source, tmp_path / "state.json", last)
    metrics.follow_kmsg(follower)
    assert [verdict(e) for e in seen] == [
        v for v in OUTCOME.values() if v not in ("-", "attached", "user space")
    ]
    sxids = [e for e in seen if isinstance(e, SxidEvent)]
    lines = [r for r in records() if isinstance(parse_message(r.message), SxidEvent)]
    # One event per SXid, not one per line: the 4 attached lines (NVSentinel's SOE trace
    # line, GPUd's README: a Data and two Severity lines) make none.
    assert len(lines) == 32 and len(sxids) == len(lines) - 4
    # NVSentinel's UAT and DCGM's test write their fake Xids from user space: ignored.
    assert not any(isinstance(e, XidEvent) and e.xid == 999 and e.pci == "0000:01:00" for e in seen)
    assert sum(isinstance(e, XidEvent) and e.pci == "0002:00:00" and e.xid == 79 for e in seen) == 2
    text = generate_latest(metrics.registry).decode()
    scraped = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert scraped["gpuheal_agent_kmsg_sxid_continuations_total"] == 4
    assert scraped["gpuheal_agent_kmsg_records_total"] == len(OUTCOME)
    again, _ = _follow(source, tmp_path / "state.json", last)  # a restart, same boot
    assert again == []


def _agent(tmp_path: Path) -> Agent:
    (tmp_path / "boot_id").write_text("boot-1\n")
    config = AgentConfig(
        nvml_enabled=False,
        kmsg_enabled=False,
        env_enabled=False,
        state_path=tmp_path / "agent-state.json",
        boot_id_path=tmp_path / "boot_id",
    )
    return Agent(config, "node-a", cast("Any", None), None)


def test_the_agent_holds_node_fault_sxids_and_counts_every_sxid(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    for seq in (3001, 1501, 1502, 3006, 3007, 1503):
        event = event_of(seq)
        assert event is not None
        agent.intake.on_kernel(event)
    held = {(f.reason, f.severity, f.devices) for f in agent.sticky.current()}
    assert held == {
        ("NvswitchFatal12028", Severity.P0, ("nvidia-nvswitch3",)),  # "Non-fatal" on the line
        ("NvswitchFatal20034", Severity.P0, ("nvidia-nvswitch0",)),  # a Data line alone
        ("NvswitchFatal24007", Severity.P0, ("nvidia-nvswitch0",)),
    }
    (hang,) = [f for f in agent.sticky.current() if f.reason == "NvswitchFatal12028"]
    assert hang.message == (
        "nvidia-nvswitch3: NVSwitch SXid 12028: egress nonposted PRIV error"
        " (guide: non-fatal, but GPU access hangs or a fatal SXid follows)"
    )
    text = generate_latest(agent.metrics.registry).decode()
    counted = {
        (s.labels["sxid"], s.labels["kind"]): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "gpuheal_agent_sxid_total"
    }
    assert counted == {
        ("12028", "node"): 1,
        ("28006", "informational"): 1,
        ("20009", "informational"): 1,
        ("20034", "node"): 1,
        ("11111", "informational"): 1,
        ("24007", "node"): 1,
    }


def test_the_agent_classifies_an_xid_by_its_kernel_line(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    for seq in (1101, 2201, 1102):  # 149 NETIR_LINK_EVT Fatal; 149 NETIR_BER_EVENT Nonfatal; 13
        event = event_of(seq)
        assert event is not None
        agent.intake.on_kernel(event)
    (held,) = agent.sticky.current()
    assert (held.reason, held.severity, held.devices) == (
        "NetirError149",
        Severity.P0,
        ("0018:01:00",),
    )
    assert held.immediate
