"""What refused an eviction, as the API server says it (policy/v1 Eviction, 429)."""

from __future__ import annotations

import json

from gpuheal.controller.effects.pods import refused_by
from gpuheal.kube.api import ApiError, _error

# The body kube-apiserver answers when a budget allows no disruption.
PDB_REFUSAL = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
    "reason": "TooManyRequests",
    "details": {
        "causes": [
            {
                "reason": "DisruptionBudget",
                "message": (
                    "The disruption budget trainer-pdb needs 1 healthy pods and has 1 currently"
                ),
            }
        ]
    },
    "code": 429,
}


def test_the_budget_named_in_the_causes_is_what_refused() -> None:
    err = _error(429, json.dumps(PDB_REFUSAL).encode())
    assert err.causes[0].type == "DisruptionBudget"
    assert refused_by(err, "ml-team") == "PodDisruptionBudget ml-team/trainer-pdb"


def test_without_a_budget_cause_the_message_says_what_refused() -> None:
    throttled = ApiError(429, "TooManyRequests", "Too many requests, please try again later.")
    assert refused_by(throttled, "ml") == "Too many requests, please try again later."
    odd = ApiError(429, "TooManyRequests", "x", ())
    assert refused_by(odd, "ml") == "x"
