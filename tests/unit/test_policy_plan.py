"""The pure policy: what the controller decides for one node, rule by rule."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from hypothesis import example, given
from hypothesis import strategies as st

from gpuheal import values
from gpuheal.clock import iso
from gpuheal.config import ConditionRule, Config
from gpuheal.model import (
    FAULT_ID,
    FAULT_REASON,
    FAULT_SEVERITY,
    HANDLED_FAULT_ID,
    LAST_PROCESS_TIME,
    MANAGED_LABEL,
    STATE_LABEL,
    STATUS,
    TAINT_KEY,
    ActionEntry,
    Condition,
    FaultRecord,
    FaultSignal,
    Mode,
    NodeView,
    Phase,
    PodView,
    Severity,
    Taint,
    fault_record_name,
)
from gpuheal.policy.actions import (
    AddTaint,
    CreateRecord,
    DeletePod,
    Emit,
    Evict,
    MarkHandled,
    NodeState,
    RemoveTaint,
    UpdateRecord,
)
from gpuheal.policy.backoff import Blocked
from gpuheal.policy.breaker import quarantine_capacity
from gpuheal.policy.plan import current_signal, plan
from gpuheal.sources import Seen
from gpuheal.values import taint_value
from gpuheal.vocabulary import Entry
from tests.corpus import EKS_NODES
from tests.helpers import NO_GUARD

NOW = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)
# As the agent reports them on an EKS node: the fault id is the node name and 24
# characters, past a taint value's 63 (the controller writes taint_value(F1)).
N1 = EKS_NODES[0]
F1 = f"{N1}-20261129T115959Z-4f1c2a"
# The disruption guard's actions are tests/unit/test_policy_disruption.py's: off
# here, so that these plans are this module's rules alone.
CONFIG = Config(breaker_max_nodes=100, breaker_max_percent=100, autoscalers=NO_GUARD)


def faulty(name: str = N1, fault_id: str = F1, **annotations: str) -> NodeView:
    return NodeView(
        name=name,
        resource_version="1",
        labels={"nvidia.com/gpu.present": "true"},
        annotations={STATUS: "faulty", FAULT_ID: fault_id, FAULT_REASON: "XidCritical79"}
        | annotations,
        gpus=8,
        conditions=(READY,),
    )


# Ready, as a live node is: the health gate checks it before a node is returned.
READY = Condition("Ready", "True")


def healthy(name: str = N1, **annotations: str) -> NodeView:
    return NodeView(
        name=name,
        resource_version="1",
        annotations=dict(annotations),
        gpus=8,
        conditions=(READY,),
    )


def tainted(node: NodeView, fault_id: str = F1) -> NodeView:
    return replace(node, taints=(Taint(TAINT_KEY, "NoSchedule", taint_value(fault_id)),))


def gpu_pod(name: str, node: str = N1) -> PodView:
    return PodView(
        namespace="ml", name=name, uid=f"uid-{name}", node=node, phase="Running", gpu=True
    )


def record(phase: Phase, node: str = N1, fault_id: str = F1, **kw: object) -> FaultRecord:
    if phase is Phase.DETECTED:
        # As the controller writes one: a Detected record without entries is one whose
        # status was never written (test_a_status_left_to_the_drain_pass_...).
        kw.setdefault("actions", (ActionEntry(iso(NOW), Entry.DETECT, "ok", "node-annotation"),))
    return FaultRecord(
        name=fault_record_name(node, fault_id),
        node=node,
        fault_id=fault_id,
        phase=phase,
        **kw,  # type: ignore[arg-type]
    )


def refused(
    fault_id: str, *, since: dt.datetime, retry_at: dt.datetime, attempts: int = 1
) -> Blocked:
    return Blocked(fault_id, since, attempts, retry_at, "PodDisruptionBudget ml/budget")


def fault_signal(node: NodeView, config: Config) -> FaultSignal | None:
    """The node's own report, as the plan reads it from the registered sources."""
    return current_signal(Seen(node, config))


def kinds(p: object) -> list[str]:
    return [type(a).__name__ for a in p.actions]  # type: ignore[attr-defined]


def test_signal_from_the_agent_annotations() -> None:
    sig = fault_signal(faulty(**{"gpuheal.io/fault-devices": "GPU-a, GPU-b"}), CONFIG)
    assert sig is not None
    assert (sig.fault_id, sig.reason, sig.devices) == (F1, "XidCritical79", ("GPU-a", "GPU-b"))
    assert fault_signal(healthy(), CONFIG) is None
    # "faulty" without a fault id is not a usable report.
    assert fault_signal(healthy(**{STATUS: "faulty"}), CONFIG) is None


def test_signal_from_another_detectors_condition_is_stable_per_transition() -> None:
    rule = ConditionRule(type="AcceleratedHardwareReady", status="False", severity=Severity.P1)
    config = replace(CONFIG, conditions=(rule,))
    cond = Condition("AcceleratedHardwareReady", "False", "NvidiaXID79", "", "2026-11-29T10:00:00Z")
    node = replace(healthy(), conditions=(cond,))
    first, again = fault_signal(node, config), fault_signal(node, config)
    assert first is not None and again is not None
    assert first.fault_id == again.fault_id
    assert (first.reason, first.severity) == ("NvidiaXID79", Severity.P1)
    later = replace(node, conditions=(replace(cond, last_transition_time="2026-11-29T11:00:00Z"),))
    assert fault_signal(later, config).fault_id != first.fault_id  # type: ignore[union-attr]
    assert fault_signal(replace(node, conditions=(replace(cond, status="True"),)), config) is None


def test_new_fault_in_full_mode_records_taints_then_evicts_gpu_pods_only() -> None:
    pods = (
        gpu_pod("a"),
        gpu_pod("b"),
        replace(gpu_pod("cpu"), gpu=False),
        replace(gpu_pod("ds"), daemonset=True),
        replace(gpu_pod("done"), phase="Succeeded"),
        replace(gpu_pod("leaving"), deleting=True),
    )
    p = plan(NodeState(faulty(), pods=pods, gpu_nodes=10), CONFIG, NOW)
    assert kinds(p) == [
        *("CreateRecord", "UpdateRecord", "Emit", "AddTaint", "UpdateRecord", "Emit"),
        *("Evict", "Evict", "UpdateRecord"),
    ]
    assert [a.pod.name for a in p.actions if isinstance(a, Evict)] == ["a", "b"]
    assert p.new_quarantine
    assert p.requeue_after == CONFIG.eviction_retry_base_seconds  # "leaving" still terminating


def test_pods_still_terminating_cost_no_write_only_a_requeue() -> None:
    # Found by bench/quarantine.py: rewriting the record on every reconcile while pods
    # sat out their grace period made each status write's own watch event trigger the
    # next write (255 status PATCHes for one node).
    pods = (replace(gpu_pod("a"), deleting=True), replace(gpu_pod("b"), deleting=True))
    state = NodeState(tainted(faulty()), pods=pods, records=(record(Phase.DRAINING),), gpu_nodes=10)
    p = plan(state, CONFIG, NOW)
    assert p.actions == ()
    assert p.requeue_after == CONFIG.eviction_retry_base_seconds


def test_drained_node_is_marked_handled_before_its_record_says_drained() -> None:
    state = NodeState(tainted(faulty()), records=(record(Phase.DRAINING),), gpu_nodes=10)
    p = plan(state, CONFIG, NOW)
    assert kinds(p) == ["MarkHandled", "UpdateRecord"]
    assert p.actions[1].phase is Phase.DRAINED  # type: ignore[union-attr]
    assert not p.new_quarantine


def test_handled_fault_without_record_is_a_duplicate() -> None:
    p = plan(NodeState(faulty(**{HANDLED_FAULT_ID: F1})), CONFIG, NOW)
    assert p.actions == () and p.suppressed == "handled"


def test_fresh_fault_inside_the_cooldown_waits_for_it() -> None:
    last = iso(NOW - dt.timedelta(seconds=100))
    node = faulty(fault_id="f2", **{HANDLED_FAULT_ID: F1, LAST_PROCESS_TIME: last})
    p = plan(NodeState(node), replace(CONFIG, cooldown_seconds=600), NOW)
    assert p.suppressed == "cooldown" and p.actions == ()
    assert p.requeue_after is not None and abs(p.requeue_after - 500) < 1e-6


def test_observe_mode_records_and_notifies_only() -> None:
    config = replace(CONFIG, mode_by_reason={"XidCritical79": Mode.OBSERVE})
    p = plan(NodeState(faulty(), pods=(gpu_pod("a"),)), config, NOW)
    # Nothing for the node (not even the handled-* annotations): the record notes
    # what the other modes would have done.
    assert kinds(p) == ["CreateRecord", "UpdateRecord", "Emit", "WouldQuarantine"]


def test_quarantine_mode_taints_without_evicting() -> None:
    config = replace(CONFIG, mode=Mode.QUARANTINE)
    p = plan(NodeState(faulty(), pods=(gpu_pod("a"),), gpu_nodes=4), config, NOW)
    assert "Evict" not in kinds(p) and "AddTaint" in kinds(p) and kinds(p)[-1] == "MarkHandled"


def test_breaker_holds_a_fault_beyond_the_cap() -> None:
    config = replace(CONFIG, breaker_max_nodes=10, breaker_max_percent=10)
    full = frozenset(f"q{i}" for i in range(2))
    p = plan(NodeState(faulty(), gpu_nodes=20, quarantined=full), config, NOW)
    assert kinds(p) == ["CreateRecord", "UpdateRecord", "Emit", "Emit"]
    assert p.actions[0].phase is Phase.HELD  # type: ignore[union-attr]
    assert [a.reason for a in p.actions if isinstance(a, Emit)] == [
        "GPUFaultDetected",
        "GPUFaultHeld",
    ]
    assert p.requeue_after == config.hold_retry_seconds
    # Capacity frees: the held fault proceeds.
    held = NodeState(
        faulty(), records=(record(Phase.HELD),), gpu_nodes=20, quarantined=full - {"q0"}
    )
    assert "AddTaint" in kinds(plan(held, config, NOW))


def test_breaker_capacity_is_the_smaller_cap_but_at_least_one() -> None:
    config = replace(CONFIG, breaker_max_nodes=10, breaker_max_percent=10)
    assert quarantine_capacity(50, config) == 5
    assert quarantine_capacity(1000, config) == 10
    assert quarantine_capacity(3, config) == 1
    assert quarantine_capacity(3, replace(config, breaker_max_nodes=0)) == 0


def test_a_manual_untaint_is_respected_and_noted_once() -> None:
    state = NodeState(faulty(), records=(record(Phase.DRAINED),), gpu_nodes=10)
    p = plan(state, CONFIG, NOW)
    assert p.suppressed == "manual-untaint"
    assert kinds(p) == ["UpdateRecord", "MarkHandled"]
    noted = record(Phase.DRAINED, actions=(ActionEntry("t", "manual-untaint", "respected"),))
    again = plan(
        NodeState(faulty(**{HANDLED_FAULT_ID: F1}), records=(noted,), gpu_nodes=10), CONFIG, NOW
    )
    assert again.actions == ()


def test_a_manual_untaint_takes_our_state_label_with_it() -> None:
    """No `gpuheal.io/state=quarantined` without our taint: selectors and dashboards
    would count the node as quarantined."""
    labelled = replace(faulty(), labels={**faulty().labels, STATE_LABEL: "quarantined"})
    state = NodeState(labelled, records=(record(Phase.DRAINED),), gpu_nodes=10)
    p = plan(state, CONFIG, NOW)
    assert p.suppressed == "manual-untaint"
    assert kinds(p) == ["UpdateRecord", "MarkHandled", "RemoveTaint"]
    # With our taint on, the label stays; a maintenance label is a person's, never ours.
    on = plan(replace(state, node=tainted(labelled)), CONFIG, NOW)
    assert "RemoveTaint" not in kinds(on)
    person = replace(healthy(), labels={STATE_LABEL: "maintenance"})
    assert plan(NodeState(person), CONFIG, NOW).actions == ()


def test_a_label_left_without_taint_or_fault_is_removed() -> None:
    stale = replace(healthy(), labels={STATE_LABEL: "quarantined"})
    assert kinds(plan(NodeState(stale), CONFIG, NOW)) == ["RemoveTaint"]
    # Recovering after a person's untaint: the label goes now, not at the resolution.
    recovering = record(Phase.RECOVERING, recovering_since=iso(NOW))
    p = plan(NodeState(stale, records=(recovering,)), CONFIG, NOW)
    assert kinds(p) == ["RemoveTaint"]


def test_opt_out_label_wins() -> None:
    node = replace(faulty(), labels={MANAGED_LABEL: "false"})
    assert plan(NodeState(node), CONFIG, NOW).suppressed == "opt-out"


def test_recovery_waits_for_the_window_then_untaints_and_resolves() -> None:
    config = replace(CONFIG, recovery_window_seconds=60)
    node = tainted(healthy())
    first = plan(NodeState(node, records=(record(Phase.DRAINED),)), config, NOW)
    assert kinds(first) == ["UpdateRecord"]
    update = first.actions[0]
    assert isinstance(update, UpdateRecord) and update.phase is Phase.RECOVERING
    assert first.requeue_after == 60
    recovering = record(Phase.RECOVERING, recovering_since=update.recovering_since or "")
    early = plan(NodeState(node, records=(recovering,)), config, NOW + dt.timedelta(seconds=30))
    assert early.actions == () and early.requeue_after == 30
    done = plan(NodeState(node, records=(recovering,)), config, NOW + dt.timedelta(seconds=60))
    assert kinds(done) == ["RemoveTaint", "UpdateRecord", "Emit"]
    assert isinstance(done.actions[0], RemoveTaint)


def test_our_taint_without_an_open_record_restores_the_record_never_lifts_it_unchecked() -> None:
    """A person deleted the open record: the record is made again (Quarantined), so
    the node goes through the recovery window and the gate like any other."""
    node = tainted(healthy(**{HANDLED_FAULT_ID: F1}))
    restored = plan(NodeState(node), CONFIG, NOW)
    assert kinds(restored) == ["CreateRecord", "UpdateRecord", "Emit"]
    create = restored.actions[0]
    assert isinstance(create, CreateRecord) and create.phase is Phase.QUARANTINED
    assert create.name == fault_record_name(N1, F1) and create.signal.reason == "RecordRestored"
    # A closed record already has the name (its Resolved came without the untaint).
    beside = plan(NodeState(node, records=(record(Phase.RESOLVED),)), CONFIG, NOW)
    (again,) = [a for a in beside.actions if isinstance(a, CreateRecord)]
    assert again.name == fault_record_name(N1, f"{F1}-restored")
    # Both closed: the taint is a person's; the plan leaves it (doctor names it).
    closed = (record(Phase.RESOLVED), record(Phase.RESOLVED, fault_id=f"{F1}-restored"))
    assert plan(NodeState(node, records=closed), CONFIG, NOW).actions == ()
    # An open record, or no taint: nothing to restore.
    assert kinds(plan(NodeState(healthy()), CONFIG, NOW)) == []
    assert "CreateRecord" not in kinds(
        plan(NodeState(node, records=(record(Phase.DRAINED),)), CONFIG, NOW)
    )


def test_no_recovery_starts_for_a_fault_whose_source_has_not_looked_since_the_start() -> None:
    """A restarted controller holds no DCGM signal until its first poll: that silence
    is no news, and the node must not be released on it."""
    config = replace(CONFIG, recovery_window_seconds=0)
    node = tainted(healthy())
    dcgm = record(Phase.RECOVERING, recovering_since=iso(NOW), source="dcgm/xid")
    waiting = plan(NodeState(node, records=(dcgm,), unsettled=frozenset({"dcgm"})), config, NOW)
    assert waiting.actions == () and waiting.requeue_after == config.hold_retry_seconds
    other = record(Phase.DRAINED, fault_id="am-1", source="alertmanager")
    both = NodeState(node, records=(dcgm, other), unsettled=frozenset({"dcgm"}))
    assert [a.name for a in plan(both, config, NOW).actions if isinstance(a, UpdateRecord)] == [
        other.name
    ]  # another source's fault recovers as ever
    looked = plan(NodeState(node, records=(dcgm,)), config, NOW)
    assert "RemoveTaint" in kinds(looked)


def test_fault_returning_while_recovering_goes_back_to_quarantine() -> None:
    rec = record(Phase.RECOVERING, recovering_since=iso(NOW))
    p = plan(NodeState(tainted(faulty()), records=(rec,), gpu_nodes=10), CONFIG, NOW)
    update = next(a for a in p.actions if isinstance(a, UpdateRecord))
    assert update.phase is Phase.QUARANTINED and update.recovering_since == ""


def test_a_held_fault_whose_node_recovers_is_resolved_without_touching_the_node() -> None:
    p = plan(NodeState(healthy(), records=(record(Phase.HELD),)), CONFIG, NOW)
    assert kinds(p) == ["UpdateRecord", "Emit"]
    assert p.actions[0].phase is Phase.RESOLVED  # type: ignore[union-attr]


def test_a_blocked_eviction_becomes_a_delete_after_the_timeout_but_never_when_protected() -> None:
    config = replace(CONFIG, eviction_delete_after_seconds=300)
    blocked = {
        "ml/a": refused(F1, since=NOW - dt.timedelta(seconds=301), retry_at=NOW),
        "kube-system/b": refused(F1, since=NOW - dt.timedelta(days=1), retry_at=NOW),
    }
    pods = (gpu_pod("a"), replace(gpu_pod("b"), namespace="kube-system"), gpu_pod("c"))
    state = NodeState(
        tainted(faulty()), pods=pods, records=(record(Phase.DRAINING),), blocked=blocked
    )
    actions = plan(state, config, NOW).actions
    assert [type(a) for a in actions if isinstance(a, Evict | DeletePod)] == [
        DeletePod,
        Evict,
        Evict,
    ]
    # Without a configured timeout nothing is ever deleted.
    never = plan(state, CONFIG, NOW).actions
    assert not any(isinstance(a, DeletePod) for a in never)


def test_a_refused_eviction_waits_for_its_retry_time_with_no_request_and_no_write() -> None:
    # The PDB storm: every reconcile (a watch echo, a pod event) used to evict again
    # and rewrite the record, about 10 times a second for one blocked pod.
    blocked = {"ml/a": refused(F1, since=NOW, retry_at=NOW + dt.timedelta(seconds=8))}
    state = NodeState(
        tainted(faulty()), pods=(gpu_pod("a"),), records=(record(Phase.DRAINING),), blocked=blocked
    )
    early = plan(state, CONFIG, NOW + dt.timedelta(seconds=3))
    assert early.actions == ()
    assert early.requeue_after == 5  # when the next attempt is due
    due = plan(state, CONFIG, NOW + dt.timedelta(seconds=8))
    assert kinds(due) == ["Evict", "UpdateRecord"]


def test_only_the_pods_that_are_due_are_tried_and_the_soonest_retry_wins() -> None:
    blocked = {
        "ml/a": refused(F1, since=NOW, retry_at=NOW + dt.timedelta(seconds=30)),
        "ml/b": refused(F1, since=NOW, retry_at=NOW + dt.timedelta(seconds=9)),
    }
    pods = (gpu_pod("a"), gpu_pod("b"), gpu_pod("c"))
    state = NodeState(
        tainted(faulty()), pods=pods, records=(record(Phase.DRAINING),), blocked=blocked
    )
    p = plan(state, CONFIG, NOW)
    assert [a.pod.name for a in p.actions if isinstance(a, Evict)] == ["c"]
    assert p.requeue_after == CONFIG.eviction_retry_base_seconds  # c was tried now
    waiting = replace(state, pods=pods[:2])
    assert plan(waiting, CONFIG, NOW).requeue_after == 9


def test_a_refusal_for_an_earlier_fault_does_not_delay_a_new_one() -> None:
    blocked = {"ml/a": refused("f0", since=NOW, retry_at=NOW + dt.timedelta(seconds=60))}
    state = NodeState(
        tainted(faulty()), pods=(gpu_pod("a"),), records=(record(Phase.DRAINING),), blocked=blocked
    )
    assert kinds(plan(state, CONFIG, NOW)) == ["Evict", "UpdateRecord"]


def test_the_delete_deadline_cuts_a_long_backoff_short() -> None:
    config = replace(CONFIG, eviction_delete_after_seconds=300)
    since = NOW - dt.timedelta(seconds=290)
    blocked = {"ml/a": refused(F1, since=since, retry_at=NOW + dt.timedelta(seconds=60))}
    state = NodeState(
        tainted(faulty()), pods=(gpu_pod("a"),), records=(record(Phase.DRAINING),), blocked=blocked
    )
    assert plan(state, config, NOW).requeue_after == 10
    assert kinds(plan(state, config, NOW + dt.timedelta(seconds=10))) == [
        "DeletePod",
        "UpdateRecord",
    ]


def test_a_new_fault_supersedes_the_open_record_of_the_old_one() -> None:
    old = record(Phase.DRAINED, fault_id=F1)
    node = tainted(faulty(fault_id="f2", **{HANDLED_FAULT_ID: F1}), F1)
    p = plan(NodeState(node, records=(old,), gpu_nodes=10), CONFIG, NOW)
    first = p.actions[0]
    assert isinstance(first, UpdateRecord) and first.name == old.name
    assert first.phase is Phase.RESOLVED
    create = next(a for a in p.actions if isinstance(a, CreateRecord))
    assert create.signal.fault_id == "f2"
    carry = next(a for a in p.actions if isinstance(a, AddTaint))
    assert carry.fault_id == "f2"
    assert MarkHandled(N1, "f2") in p.actions


def test_the_new_faults_record_names_the_records_it_supersedes() -> None:
    old = record(Phase.DRAINED, fault_id=F1)
    node = tainted(faulty(fault_id="f2", **{HANDLED_FAULT_ID: F1}), F1)
    p = plan(NodeState(node, records=(old,), gpu_nodes=10), CONFIG, NOW)
    create = next(a for a in p.actions if isinstance(a, CreateRecord))
    assert create.supersedes == (F1,)


def test_the_new_faults_record_names_a_fault_whose_taint_had_no_record() -> None:
    """A pass died between fault F1's taint and its record: the next fault takes
    the node over, and its record names F1 (by the taint's value) all the same."""
    node = tainted(faulty(fault_id="f2"), "short-id-1")
    p = plan(NodeState(node, gpu_nodes=10), CONFIG, NOW)
    create = next(a for a in p.actions if isinstance(a, CreateRecord))
    assert create.supersedes == ("short-id-1",)


def test_a_fault_id_superseded_before_its_record_was_made_is_stale_when_it_returns() -> None:
    newer = record(Phase.QUARANTINED, fault_id="f2", supersedes=("short-id-1",))
    node = tainted(faulty(fault_id="short-id-1"), "f2")
    p = plan(NodeState(node, records=(newer,), gpu_nodes=10), CONFIG, NOW)
    assert p.actions == () and p.suppressed == "reused"


def _superseded(entry: str = Entry.SUPERSEDED) -> FaultRecord:
    return record(
        Phase.RESOLVED, fault_id=F1, actions=(ActionEntry(iso(NOW), entry, "ok", "by f2"),)
    )


def test_a_superseded_fault_id_reported_again_is_stale_and_leaves_the_newer_fault_alone() -> None:
    """A person re-using `manual-001` after a newer fault took the node: nothing of
    the newer fault's changes (its record stays open, its taint stays)."""
    newer = record(Phase.DRAINED, fault_id="f2", supersedes=(F1,))
    node = tainted(faulty(fault_id=F1, **{HANDLED_FAULT_ID: "f2"}), "f2")
    p = plan(NodeState(node, records=(_superseded(), newer), gpu_nodes=10), CONFIG, NOW)
    assert p.actions == () and p.suppressed == "reused" and p.fault_id == F1


def test_a_recovered_fault_id_reported_again_is_reused_a_rejected_one_still_resolved() -> None:
    node = faulty(fault_id=F1)
    for entry, why in ((Entry.UNTAINT, "reused"), (Entry.REJECTED, "resolved")):
        p = plan(NodeState(node, records=(_superseded(entry),), gpu_nodes=10), CONFIG, NOW)
        assert p.actions == () and p.suppressed == why, entry


def test_an_open_record_a_newer_one_superseded_is_closed_when_its_id_returns() -> None:
    """The superseding pass died before it closed the older record: both are open,
    the newer one names the older. The older id's return closes it, and nothing else."""
    older = record(Phase.DRAINED, fault_id=F1)
    newer = record(Phase.QUARANTINED, fault_id="f2", supersedes=(F1,))
    node = tainted(faulty(fault_id=F1, **{HANDLED_FAULT_ID: F1}), "f2")
    p = plan(NodeState(node, records=(older, newer), gpu_nodes=10), CONFIG, NOW)
    assert p.suppressed == "reused"
    (closed,) = p.actions
    assert isinstance(closed, UpdateRecord) and closed.name == older.name
    assert closed.phase is Phase.RESOLVED and closed.entry.action == Entry.SUPERSEDED


def test_fault_record_names_are_deterministic_valid_and_distinct() -> None:
    a = fault_record_name("gpu-node-1.example.com", "xid/79 at 12:00")
    assert a == fault_record_name("gpu-node-1.example.com", "xid/79 at 12:00")
    assert a != fault_record_name("gpu-node-1.example.com", "xid/79 at 12:01")
    assert a.startswith("gpu-node-1.example.com-") and len(a) <= 253
    assert all(ch.isalnum() or ch in "-." for ch in a) and a == a.lower()
    assert fault_record_name("X" * 300, "f").startswith("x" * 200)


_DNS_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)
NODE_NAMES = (
    st.lists(_DNS_LABEL, min_size=1, max_size=12)
    .map(".".join)
    .filter(lambda name: len(name) <= 253)
)


@given(node=NODE_NAMES, fault_id=st.text(max_size=80), device=st.text(max_size=40))
@example(node="a" * 199 + ".b" + "c" * 40, fault_id="f", device="")  # a dot at the cut
@example(node="a" * 198 + "-b.c" + "d" * 40, fault_id="f", device="")
def test_every_node_names_records_have_a_name_the_api_server_takes(
    node: str, fault_id: str, device: str
) -> None:
    """Node names are DNS subdomains of up to 253 characters: the record's name must
    be one too, or the record (the lock) is refused and the node never fenced."""
    assert values.is_subdomain(fault_record_name(node, fault_id, device))


def test_a_resolved_fault_reported_again_with_the_same_id_is_not_remediated_again() -> None:
    state = NodeState(faulty(), records=(record(Phase.RESOLVED),), gpu_nodes=10)
    p = plan(state, CONFIG, NOW)
    assert p.actions == () and p.suppressed == "resolved"


def _external(severity: Severity, fault_id: str = "am-1") -> FaultSignal:
    return FaultSignal(N1, fault_id, "DcgmXid79", "alertmanager", severity)


def test_an_external_signal_drives_the_same_policy_and_the_nodes_own_report_wins() -> None:
    p = plan(NodeState(healthy(), external=(_external(Severity.P0),), gpu_nodes=10), CONFIG, NOW)
    assert "AddTaint" in kinds(p) and p.fault_id == "am-1"
    own = plan(NodeState(faulty(), external=(_external(Severity.P0),), gpu_nodes=10), CONFIG, NOW)
    assert own.fault_id == F1


def test_p2_is_recorded_only() -> None:
    p = plan(NodeState(healthy(), external=(_external(Severity.P2),), gpu_nodes=10), CONFIG, NOW)
    assert kinds(p) == ["CreateRecord", "UpdateRecord", "Emit"]  # nothing on the node


def test_p1_notifies_then_escalates_after_the_window() -> None:
    config = replace(CONFIG, p1_escalation_seconds=600)
    signal = _external(Severity.P1)
    first = plan(NodeState(healthy(), external=(signal,), gpu_nodes=10), config, NOW)
    assert kinds(first) == ["CreateRecord", "UpdateRecord", "Emit"] and first.requeue_after == 600
    watched = record(Phase.DETECTED, fault_id="am-1", created_at=iso(NOW), severity=Severity.P1)
    state = NodeState(healthy(), external=(signal,), records=(watched,), gpu_nodes=10)
    early = plan(state, config, NOW + dt.timedelta(seconds=599))
    assert early.actions == () and early.suppressed == "watching"
    assert early.requeue_after is not None and abs(early.requeue_after - 1) < 1e-6
    late = plan(state, config, NOW + dt.timedelta(seconds=600))
    assert "AddTaint" in kinds(late)
    escalate = late.actions[0]
    assert isinstance(escalate, UpdateRecord) and escalate.entry.action == "escalate"
    assert escalate.entry.detail == "still present after 600s"
    assert next(a.reason for a in late.actions if isinstance(a, Emit)) == "GPUFaultEscalated"
    # An escalated P1 still meets the breaker.
    tight = replace(config, breaker_max_nodes=1)
    held = plan(replace(state, quarantined=frozenset({"q"})), tight, NOW + dt.timedelta(hours=1))
    assert kinds(held) == ["UpdateRecord", "Emit", "UpdateRecord", "Emit"]
    assert held.actions[2].phase is Phase.HELD  # type: ignore[union-attr]


P1_CONFIG = replace(CONFIG, p1_escalation_seconds=600)


def test_the_agents_p1_annotation_is_watched_like_a_p1_from_the_api() -> None:
    # Before: every annotated fault was P0, so a hot GPU was tainted and drained at once.
    hot = faulty(**{FAULT_REASON: "Thermal", FAULT_SEVERITY: "P1"})
    assert fault_signal(hot, P1_CONFIG).severity is Severity.P1  # type: ignore[union-attr]
    pods = (gpu_pod("trainer-0"),)
    first = plan(NodeState(hot, pods=pods, gpu_nodes=10), P1_CONFIG, NOW)
    assert kinds(first) == ["CreateRecord", "UpdateRecord", "Emit"] and first.requeue_after == 600
    created = first.actions[0]
    assert isinstance(created, CreateRecord) and created.signal.severity is Severity.P1
    assert not first.new_quarantine
    watched = record(Phase.DETECTED, created_at=iso(NOW), severity=Severity.P1)
    state = NodeState(hot, pods=pods, records=(watched,), gpu_nodes=10)
    early = plan(state, P1_CONFIG, NOW + dt.timedelta(seconds=300))
    assert early.actions == () and early.suppressed == "watching"
    late = plan(state, P1_CONFIG, NOW + dt.timedelta(seconds=600))
    assert {"AddTaint", "Evict"} <= set(kinds(late))
    # Cooled inside the window: resolved, the node never touched.
    cooled = plan(NodeState(healthy(), pods=pods, records=(watched,)), P1_CONFIG, NOW)
    assert kinds(cooled) == ["UpdateRecord", "Emit"]
    assert cooled.actions[0].phase is Phase.RESOLVED  # type: ignore[union-attr]


def test_an_annotated_p2_is_recorded_only_and_absent_severity_is_p0() -> None:
    p2 = plan(NodeState(faulty(**{FAULT_SEVERITY: "p2"}), gpu_nodes=10), CONFIG, NOW)
    assert kinds(p2) == ["CreateRecord", "UpdateRecord", "Emit"]  # nothing on the node
    # `kubectl annotate` without a severity: P0, as before, with nothing to say about it.
    sig = fault_signal(faulty(), CONFIG)
    assert sig is not None and sig.severity is Severity.P0 and sig.altered == ()
    assert "AddTaint" in kinds(plan(NodeState(faulty(), gpu_nodes=10), CONFIG, NOW))


def test_a_severity_that_is_not_one_is_taken_as_p0_and_said_once() -> None:
    node = faulty(**{FAULT_SEVERITY: "warning"})
    sig = fault_signal(node, CONFIG)
    assert sig is not None and sig.severity is Severity.P0 and sig.altered == ("fault-severity",)
    p = plan(NodeState(node, gpu_nodes=10), CONFIG, NOW)
    said = [a for a in p.actions if isinstance(a, Emit) and a.reason == "GPUFaultInputNormalized"]
    assert len(said) == 1 and said[0].warning
    assert "fault-severity that is not P0, P1 or P2 (taken as P0)" in said[0].note
    assert "AddTaint" in kinds(p)


def test_a_watched_p1_that_worsens_to_p0_is_acted_on_at_once() -> None:
    watched = record(Phase.DETECTED, created_at=iso(NOW), severity=Severity.P1)
    worse = faulty(**{FAULT_SEVERITY: "P0"})
    p = plan(NodeState(worse, records=(watched,), gpu_nodes=10), P1_CONFIG, NOW)
    assert kinds(p)[:2] == ["UpdateRecord", "Emit"] and "AddTaint" in kinds(p)
    assert p.actions[0].entry.detail == "now reported P0"  # type: ignore[union-attr]
    assert p.new_quarantine
    # Escalated stays escalated: reported P1 again (or a record acted on as P0) is not
    # watched again, and the escalation is said once.
    escalated = replace(
        watched,
        phase=Phase.DRAINED,
        actions=(ActionEntry(iso(NOW), "escalate", "ok", "now reported P0"),),
    )
    again = plan(
        NodeState(tainted(faulty(**{FAULT_SEVERITY: "P1"})), records=(escalated,), gpu_nodes=10),
        P1_CONFIG,
        NOW,
    )
    assert again.suppressed != "watching" and "Emit" not in kinds(again)
    p0_record = record(Phase.DRAINED, created_at=iso(NOW))
    lower = NodeState(tainted(faulty(**{FAULT_SEVERITY: "P1"})), records=(p0_record,))
    assert plan(lower, P1_CONFIG, NOW).suppressed != "watching"


def test_p1_taint_fences_a_watched_fault_with_noschedule_and_escalation_applies_the_effect() -> (
    None
):
    config = replace(P1_CONFIG, p1_taint=True, taint_effect="NoExecute")
    hot = faulty(**{FAULT_REASON: "Thermal", FAULT_SEVERITY: "P1"})
    pods = (gpu_pod("trainer-0"),)
    first = plan(NodeState(hot, pods=pods, gpu_nodes=10), config, NOW)
    assert kinds(first) == [
        "CreateRecord",
        "UpdateRecord",
        "Emit",
        "AddTaint",
        "UpdateRecord",
        "Emit",
    ]
    assert first.actions[3] == AddTaint(N1, F1, "NoSchedule") and first.new_quarantine
    assert first.requeue_after == 600
    # Inside the window, once fenced: nothing more, no eviction.
    fenced = record(Phase.QUARANTINED, created_at=iso(NOW), severity=Severity.P1)
    state = NodeState(tainted(hot), pods=pods, records=(fenced,), gpu_nodes=10)
    assert plan(state, config, NOW + dt.timedelta(seconds=10)).actions == ()
    # After it: the configured effect, then the drain.
    late = plan(state, config, NOW + dt.timedelta(seconds=600))
    assert AddTaint(N1, F1, "NoExecute") in late.actions and "Evict" in kinds(late)
    # A full breaker: watched without the fence.
    tight = replace(config, breaker_max_nodes=1)
    full = NodeState(hot, pods=pods, gpu_nodes=10, quarantined=frozenset({"other"}))
    assert kinds(plan(full, tight, NOW)) == ["CreateRecord", "UpdateRecord", "Emit"]
    # Off (the default): no taint.
    assert "AddTaint" not in kinds(plan(NodeState(hot, gpu_nodes=10), P1_CONFIG, NOW))
