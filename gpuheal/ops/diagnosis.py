"""`gpuheal doctor`'s reasoning: the runbook's four questions, answered from Facts.

1. Is the node registered and Ready?
2. Does the scheduler see its GPUs? (ops/visibility.py)
3. Why did workloads not move? (ops/movement.py)
4. What else is affected: the same pool, driver, rack? (ops/neighbours.py)

This module asks them in order, answers the first itself, and is the Report.

Pure: a function of the objects the doctor read (ops/findings.Facts) and the
config. Each answer is a list of Findings, plain sentences that say what is
wrong and what to do, never a dump of the objects.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuheal.clock import parse_time
from gpuheal.config import Config
from gpuheal.kube.details import Node
from gpuheal.model import (
    MAINTENANCE_CORDONED,
    MAINTENANCE_REASON,
    MAINTENANCE_SINCE,
    STATE_LABEL,
    STATE_MAINTENANCE,
    FaultRecord,
)
from gpuheal.ops import exitcodes
from gpuheal.ops.cluster import annotations_of, labels_of
from gpuheal.ops.findings import (
    BAD,
    INFO,
    OK,
    WARN,
    Facts,
    Finding,
    condition_of,
    conditions_of,
    plural,
    said,
    when,
)
from gpuheal.ops.history import history, history_data, history_table
from gpuheal.ops.movement import question_workloads
from gpuheal.ops.neighbours import question_affected
from gpuheal.ops.output import Notes, Table
from gpuheal.ops.visibility import question_gpus
from gpuheal.policy.nodes import in_maintenance

QUESTIONS = (
    ("ready", "Is the node registered and Ready?"),
    ("gpus", "Does the scheduler see its GPUs?"),
    ("workloads", "Why did workloads not move?"),
    ("affected", "What else is affected?"),
)
_PRESSURE = ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")
_STYLE = {OK: "ok", INFO: "", WARN: "warn", BAD: "bad"}


@dataclass(frozen=True)
class Answer:
    id: str
    question: str
    findings: tuple[Finding, ...]


@dataclass(frozen=True)
class Diagnosis:
    """The doctor's report: one Answer per question asked (only the first when the
    node is not registered). A Report for ops/output.render."""

    node: str
    registered: bool
    answers: tuple[Answer, ...]
    # What could not be read (no CRD, RBAC): the answers are less complete.
    unread: tuple[str, ...] = ()
    # The node's GPUFault records that remain, newest first; None: not read.
    history: tuple[FaultRecord, ...] | None = None
    now: dt.datetime | None = None

    @property
    def healthy(self) -> bool:
        return self.registered and not any(f.problem for a in self.answers for f in a.findings)

    @property
    def exit_code(self) -> int:
        if not self.registered:
            return exitcodes.NOT_FOUND
        return exitcodes.OK if self.healthy else exitcodes.FINDINGS

    def data(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "healthy": self.healthy,
            "questions": [
                {
                    "id": a.id,
                    "question": a.question,
                    "findings": [
                        {"severity": f.severity, "kind": f.kind, "text": f.text} for f in a.findings
                    ],
                }
                for a in self.answers
            ],
            "unread": list(self.unread),
            "history": None if self.history is None else history_data(self.history),
        }

    def views(self) -> Sequence[Table | Notes]:
        views: list[Table | Notes] = [
            Notes(
                title=f"{i}. {a.question}",
                lines=tuple((_STYLE[f.severity], f.text) for f in a.findings),
            )
            for i, a in enumerate(self.answers, start=1)
        ]
        problems = sum(f.problem for a in self.answers for f in a.findings)
        verdict = (
            ("ok", f"Node {self.node}: nothing wrong found.")
            if self.healthy
            else ("bad", f"Node {self.node}: {plural(problems, 'problem')} found (exit 3).")
            if self.registered
            else ("bad", f"Node {self.node} is not registered (exit 5).")
        )
        if self.history is not None and self.now is not None:
            views.append(history_table(self.history, self.now))
        unread = tuple(("warn", f"Could not read {what}.") for what in self.unread)
        views.append(Notes(title="Summary", lines=(*unread, verdict)))
        return views


def diagnose(facts: Facts, config: Config) -> Diagnosis:
    """Ask the four questions in order; stop after the first when there is no node."""
    answers = [_answer(0, question_ready(facts, config))]
    if facts.node is None:
        return Diagnosis(node=facts.name, registered=False, answers=tuple(answers))
    node = facts.node
    answers.append(_answer(1, question_gpus(node, facts, config)))
    answers.append(_answer(2, question_workloads(node, facts, config)))
    answers.append(_answer(3, question_affected(node, facts, config)))
    return Diagnosis(
        node=facts.name,
        registered=True,
        answers=tuple(answers),
        unread=tuple(facts.unread),
        history=None if facts.faults is None else history(facts.faults),
        now=facts.now,
    )


def _answer(index: int, findings: list[Finding]) -> Answer:
    id_, question = QUESTIONS[index]
    return Answer(id=id_, question=question, findings=tuple(findings))


# -- 1. Is the node registered and Ready? ------------------------------------------------


def question_ready(facts: Facts, config: Config) -> list[Finding]:
    node, name, now = facts.node, facts.name, facts.now
    if node is None:
        return [
            Finding(
                BAD,
                "not-registered",
                f"Node {name} is not registered with the API server: check the kubelet on "
                "the host (systemctl status kubelet) and its bootstrap credentials.",
            )
        ]
    findings = []
    ready = condition_of(node, "Ready")
    if ready is None:
        findings.append(
            Finding(
                BAD,
                "not-ready",
                f"Node {name} has no Ready condition: its kubelet has never reported. Check "
                "the kubelet on the host (journalctl -u kubelet).",
            )
        )
    elif ready.status == "True":
        since = when(ready.lastTransitionTime, now)
        findings.append(Finding(OK, "ready", f"Node {name} is registered and Ready since {since}."))
    elif ready.status == "False":
        findings.append(
            Finding(
                BAD,
                "not-ready",
                f"Node {name} is NotReady since {when(ready.lastTransitionTime, now)} "
                f"({said(ready)}): its kubelet reports a problem. Check it on the host "
                "(journalctl -u kubelet): the container runtime, the network plugin, the disk.",
            )
        )
    else:
        findings.append(
            Finding(
                BAD,
                "not-ready",
                f"Node {name}'s status is Unknown since {when(ready.lastTransitionTime, now)} "
                f"({said(ready)}): its kubelet stopped reporting. The host may be down, hung "
                "or cut off from the API server: check its power and network, then the kubelet.",
            )
        )
    for condition in conditions_of(node):
        if condition.type in _PRESSURE and condition.status == "True":
            findings.append(
                Finding(
                    WARN,
                    "node-pressure",
                    f"Node {name} reports {condition.type} since "
                    f"{when(condition.lastTransitionTime, now)} ({said(condition)}): the "
                    "kubelet refuses new pods and may evict running ones until it clears.",
                )
            )
    findings += _schedulable(node, facts, config)
    return findings


def _schedulable(node: Node, facts: Facts, config: Config) -> list[Finding]:
    name, now = facts.name, facts.now
    annotations = annotations_of(node)
    cordoned = bool(node.spec.unschedulable)
    if in_maintenance(labels_of(node)):
        since = parse_time(annotations.get(MAINTENANCE_SINCE))
        reason = annotations.get(MAINTENANCE_REASON) or "none recorded"
        return [
            Finding(
                WARN,
                "in-maintenance",
                f"Node {name} is in maintenance since {when(since, now)}, reason: {reason}. "
                f"When the work is done run `gpuheal maintenance finish {name}`: it runs the "
                "health gate, then returns the node.",
            )
        ]
    if not cordoned:
        return [Finding(OK, "schedulable", f"Node {name} is not cordoned.")]
    if annotations.get(MAINTENANCE_CORDONED) == "true":
        return [
            Finding(
                WARN,
                "cordoned",
                f"Node {name} is cordoned by `gpuheal maintenance start` "
                f"(reason: {annotations.get(MAINTENANCE_REASON) or 'none recorded'}) but no "
                f"longer labelled {STATE_LABEL}={STATE_MAINTENANCE}: finish it with "
                f"`gpuheal maintenance finish {name}`.",
            )
        ]
    return [
        Finding(
            WARN,
            "cordoned",
            f"Node {name} is cordoned (spec.unschedulable), not by gpuheal: no new pods land "
            f"on it. Whoever cordoned it runs `kubectl uncordon {name}` once it is fit.",
        )
    ]
