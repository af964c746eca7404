"""What gpuheal writes to the API server, valid by construction.

Fault ids, reasons, node names and device ids arrive from outside (an agent's
annotation, an alert's labels, a person's kubectl, a cloud's node names) and
end up in taint values, label values, object names and CRD fields, each with
its own limit. Every such value passes through one function here on its way
out, so the API server never refuses a write for what an input looked like.

Pure and dependency-free: the lowest layer, usable by the policy and the CLI.
The limits are the API server's (apimachinery validation) and the GPUFault
CRD's (deploy/crds/gpufaults.gpuheal.io.yaml); tests/integration/test_values.py
proves them against the real API server.
"""

from __future__ import annotations

import hashlib
import re

# apimachinery: a label (and taint) value is at most 63 characters, empty or
# alphanumeric at both ends with [-_.] allowed inside.
LABEL_VALUE_MAX = 63
# A DNS-1123 subdomain (object names, node names): 253 characters.
NAME_MAX = 253
# The GPUFault CRD's maxLength for spec.faultID, reason, source, device ids.
FIELD_MAX = 256
TIME_MAX = 64  # spec.detectedAt, expiry
DEVICES_MAX = 64  # spec.devices maxItems
SUPERSEDES_MAX = 16  # spec.supersedes maxItems
DETAIL_MAX = 1024  # status.actions[].detail
# events.k8s.io/v1: note at most 1 KiB, reason, action and reportingInstance 128
# (bytes, all: Go counts a string's length in bytes).
EVENT_NOTE_MAX_BYTES = 1024
EVENT_WORD_MAX = 128

DIGEST_CHARS = 10
ELLIPSIS = "…"

_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_LABEL_UNSAFE = re.compile(r"[^-A-Za-z0-9_.]+")
_NAME_UNSAFE = re.compile(r"[^a-z0-9.-]+")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# C0/C1 controls, DEL, and line/paragraph separators: never part of an identity a
# person can read back, and the cause of log and terminal injection.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def digest(text: str, chars: int = DIGEST_CHARS) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:chars]


def is_label_value(value: str) -> bool:
    return len(value) <= LABEL_VALUE_MAX and _LABEL_VALUE.fullmatch(value) is not None


def is_subdomain(value: str) -> bool:
    return 0 < len(value) <= NAME_MAX and _SUBDOMAIN.fullmatch(value) is not None


def is_label_key(key: str) -> bool:
    """A qualified name: an optional DNS subdomain prefix and `/`, then a name of at
    most 63 characters, alphanumeric at both ends with [-_.] inside."""
    prefix, _, name = key.rpartition("/")
    if prefix and not is_subdomain(prefix):
        return False
    return 0 < len(name) <= LABEL_VALUE_MAX and _LABEL_VALUE.fullmatch(name) is not None


def label_text(value: str, max_chars: int = LABEL_VALUE_MAX) -> str:
    """Text for people as a label value: unsafe runs become `-`, cut to `max_chars`,
    alphanumeric at both ends; "" when nothing is left. Not an identity: two texts
    may give one value (use label_value for that)."""
    return _LABEL_UNSAFE.sub("-", value).strip("-_.")[:max_chars].strip("-_.")


def label_value(value: str) -> str:
    """`value` itself when it is a valid label value, else a readable prefix and a
    digest of the whole: distinct inputs stay distinct, and the result is valid."""
    if is_label_value(value):
        return value
    prefix = label_text(value, LABEL_VALUE_MAX - DIGEST_CHARS - 1)
    return f"{prefix}-{digest(value)}" if prefix else digest(value)


def taint_value(fault_id: str) -> str:
    """The gpuheal taint's value for a fault: the fault id when it fits (people read
    it in `kubectl describe node`), else its label-safe digest form. The full id is
    in the node's annotations and the GPUFault record."""
    return label_value(fault_id)


def node_label(node: str) -> str:
    """The `gpuheal.io/node` label of a node's GPUFault records. Node names are up
    to 253 characters; the label, 63. Select records with this, then check spec.node."""
    return label_value(node)


def name_prefix(value: str, max_chars: int) -> str:
    """A DNS-1123 subdomain fragment made from any text (lower case, `[a-z0-9.-]`,
    alphanumeric at both ends), at most `max_chars`; "" when nothing is left."""
    cut = _NAME_UNSAFE.sub("-", value.lower())[:max_chars]
    # A dot next to a dash or another dot is not a valid label boundary.
    cut = re.sub(r"[-.]*\.[-.]*", ".", cut)
    return cut.strip("-.")


def object_name(prefix: str, suffix: str) -> str:
    """`<prefix>.<suffix>` (client-go's Event naming) within NAME_MAX, `suffix`
    kept whole: the prefix is shortened, never the unique part."""
    room = NAME_MAX - len(suffix) - 1
    head = name_prefix(prefix, room)
    return f"{head}.{suffix}" if head else suffix


def clean(value: str) -> str:
    """`value` without control characters, trimmed."""
    return _CONTROL.sub(" ", value).strip()


def text(value: str, limit: int = FIELD_MAX) -> str:
    """At most `limit` characters (the CRD counts characters), an ellipsis marking a cut."""
    value = clean(value)
    if len(value) <= limit:
        return value
    return value[: limit - 1] + ELLIPSIS


def utf8_text(value: str, limit_bytes: int) -> str:
    """At most `limit_bytes` of UTF-8 (the Event API counts bytes), cut at a
    character boundary, an ellipsis marking a cut."""
    value = clean(value)
    encoded = value.encode("utf-8", "replace")
    if len(encoded) <= limit_bytes:
        return value
    room = limit_bytes - len(ELLIPSIS.encode())
    return encoded[:room].decode("utf-8", "ignore") + ELLIPSIS


def fault_id(raw: str) -> str:
    """A fault's identity as gpuheal carries it: the reported id when it fits the
    record (at most FIELD_MAX characters, no control characters), else a readable
    prefix and a digest of the original, so two odd ids never merge into one."""
    stripped = raw.strip()
    if stripped and len(stripped) <= FIELD_MAX and not _CONTROL.search(stripped):
        return stripped
    room = FIELD_MAX - DIGEST_CHARS - 1
    prefix = clean(stripped)[:room].rstrip()
    return f"{prefix}~{digest(raw)}" if prefix else f"fault-{digest(raw)}"
