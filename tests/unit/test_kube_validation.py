"""The validation pod's projection: what the gate reads from a real-shaped Pod."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from gpuheal.kube.validation import ValidationPodJson, validation_pod
from tests.corpus import FQDN_253

JOB = "gpuheal-validate-4f1c2a9b3d-1"
MESSAGE = json.dumps({"result": "fail", "tool": "dcgmi-diag", "detail": "Memory: GPU 3"})


def pod(status: dict[str, Any], node_name: str = "") -> ValidationPodJson:
    raw = {
        "metadata": {
            "name": f"{JOB}-x7k2q",
            "namespace": "gpuheal-system",
            "resourceVersion": "812",
            "labels": {
                "gpuheal.io/validation": "true",
                "gpuheal.io/validation-job": JOB,
                "batch.kubernetes.io/job-name": JOB,
            },
            "annotations": {"gpuheal.io/node": FQDN_253},
        },
        "spec": {"nodeName": node_name, "containers": [{"name": "validate", "image": "dcgm"}]},
        "status": status,
    }
    return msgspec.json.decode(json.dumps(raw).encode(), type=ValidationPodJson)


def test_an_unscheduled_pod_names_its_node_and_the_schedulers_message() -> None:
    message = "0/12 nodes are available: 1 node(s) had untolerated taint(s)."
    view = validation_pod(
        pod(
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": message,
                        "lastTransitionTime": None,
                    }
                ],
            }
        )
    )
    assert (view.job, view.node, view.phase) == (JOB, FQDN_253, "Pending")
    assert view.unschedulable == message and view.exit_code is None


def test_a_finished_pod_carries_its_exit_code_and_termination_message() -> None:
    view = validation_pod(
        pod(
            {
                "phase": "Failed",
                "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": "validate",
                        "state": {
                            "terminated": {"exitCode": 1, "reason": "Error", "message": MESSAGE}
                        },
                    }
                ],
            },
            node_name=FQDN_253,
        )
    )
    assert (view.exit_code, view.reason, view.message) == (1, "Error", MESSAGE)
    assert view.unschedulable == ""


def test_a_waiting_container_says_why_and_nulls_read_as_empty() -> None:
    view = validation_pod(
        pod(
            {
                "phase": "Pending",
                "reason": None,
                "containerStatuses": [
                    {
                        "name": "validate",
                        "state": {
                            "waiting": {"reason": "ErrImagePull", "message": "pull access denied"}
                        },
                    },
                    {"name": "sidecar", "state": {"terminated": {"exitCode": 2}}},
                ],
            }
        )
    )
    assert view.waiting == "ErrImagePull: pull access denied"
    assert view.exit_code is None  # another container's end is not the validation's
