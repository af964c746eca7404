"""The controller's in-memory dedupe layer (Reconciler.memory)."""

from __future__ import annotations

from gpuheal.policy.dedupe import TtlSet
from tests.corpus import unique_eks_node


def test_keys_never_looked_up_again_do_not_pile_up() -> None:
    """Each handled node/fault pair is added once; most are never looked up again
    (the fault does not repeat). Expired ones must not stay for the process's life."""
    memory = TtlSet(ttl=60.0)
    for second in range(10_000):
        memory.add(f"{unique_eks_node()}/xid-79-{second}", float(second))
    print(f"{len(memory)} keys kept after 10,000 adds one second apart (ttl 60 s)")
    assert len(memory) <= 2 * 64 + 60


def test_live_keys_are_kept_through_the_sweeps() -> None:
    memory = TtlSet(ttl=1_000.0)
    for i in range(500):
        memory.add(f"n{i}/f", float(i))
    assert len(memory) == 500
    assert all(memory.contains(f"n{i}/f", 500.0) for i in range(500))
    assert not memory.contains("n0/f", 1_000.0)  # expired at 0 + 1000
