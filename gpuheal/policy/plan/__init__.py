"""Decide what to do about one node: state + config + now -> plan.

Level-triggered and re-runnable: the plan is computed from what is observed
(the node, its pods, its GPUFault records), so running it again after a crash
or a duplicate event continues where the world is, never repeating a finished
step. The order of actions inside a plan is the order of the safety rules:
the record (the lock) before anything that is not idempotent (the taint is:
Plan.steps runs it first), the durable record of an action after the action.

The fault lifecycle is one module per stage, run by the dispatcher
(dispatch.py): admit (admit.py, with watch.py and approve.py), fence (fence.py),
drain (drain.py), repair (repair.py), recover (recover.py); the phases a
record may move between are declared in phases.py.
"""

from gpuheal.policy.plan.dispatch import plan, plan_node_gone
from gpuheal.policy.plan.signals import current_signal, reported

__all__ = [
    "current_signal",
    "plan",
    "plan_node_gone",
    "reported",
]
