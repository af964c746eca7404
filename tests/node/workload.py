"""The tier's test workload: a one-GPU training pod on the workload image (busybox, built
by testenv/node/build.sh) that says in its log what reached it and when.

Its log is also a file in a hostPath directory of the node (`journal`): the kubelet
removes a pod's container logs with the pod, and the tests read what happened after.
Each line: `<unix time> <what>`.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from gpuheal.model import CHECKPOINT_REQUESTED
from gpuheal.sim.nodes import GPU_RESOURCE

REAL_NODE_TOLERATION = {
    "key": "gpuheal.test/real-node",
    "operator": "Exists",
    "effect": "NoSchedule",
}

# The main process: a checkpoint request seen through the downward API volume is
# logged once; SIGTERM takes `stop_s` seconds to save and exit 0.
_MAIN = """
say() { echo "$(date +%s) $*" | tee -a "/journal/$HOSTNAME.log"; }
trap 'say SIGTERM; sleep {stop_s}; say exited; exit 0' TERM
say started
asked=""
while true; do
  if [ -z "$asked" ] && grep -q {key} /podinfo/annotations; then
    asked=yes; say checkpoint-requested "$(grep {key} /podinfo/annotations)"
  fi
  sleep 0.5 & wait $!
done
"""
_PRE_STOP = 'echo "$(date +%s) preStop" | tee -a "/journal/$HOSTNAME.log" >/proc/1/fd/1; sleep 1'


def trainer_template(image: str, journal: Path, *, grace_s: int, stop_s: int) -> dict[str, Any]:
    """The pod template: one GPU, the real node's toleration, a preStop hook, a grace
    period of `grace_s` and a SIGTERM that takes `stop_s`."""
    main = _MAIN.replace("{stop_s}", str(stop_s)).replace(
        "{key}", shlex.quote(CHECKPOINT_REQUESTED)
    )
    return {
        "metadata": {"labels": {"app": "trainer"}},
        "spec": {
            "terminationGracePeriodSeconds": grace_s,
            "tolerations": [REAL_NODE_TOLERATION],
            "containers": [
                {
                    "name": "train",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", main],
                    "resources": {"limits": {GPU_RESOURCE: "1"}},
                    "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", _PRE_STOP]}}},
                    "volumeMounts": [
                        {"name": "podinfo", "mountPath": "/podinfo"},
                        {"name": "journal", "mountPath": "/journal"},
                    ],
                }
            ],
            "volumes": [
                {
                    "name": "podinfo",
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "annotations",
                                "fieldRef": {"fieldPath": "metadata.annotations"},
                            }
                        ]
                    },
                },
                {
                    "name": "journal",
                    "hostPath": {"path": str(journal), "type": "DirectoryOrCreate"},
                },
            ],
        },
    }


def journal(directory: Path, pod: str) -> list[tuple[float, str]]:
    """One pod's journal, in the order written: (unix time, what)."""
    path = directory / f"{pod}.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(float(when), what) for when, _, what in (line.partition(" ") for line in lines)]
