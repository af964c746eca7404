"""Config keys of `gpuheal audit`: expected labels and taints, fleet-wide and per pool."""

from __future__ import annotations

import pytest

from gpuheal.config import Config, ConfigError, parse_config
from gpuheal.model import Taint


def test_expected_labels_and_taints_default_to_none() -> None:
    pools = Config().pools
    assert pools.expected_labels == {} and pools.expected_taints == ()


def test_expected_labels_and_taints_are_parsed() -> None:
    config = parse_config(
        {
            "pools": {
                "expectedLabels": {"topology.kubernetes.io/zone": "*"},
                "expectedTaints": ["nvidia.com/gpu:NoSchedule", "dedicated=ml:NoExecute"],
                "byName": {
                    "h100": {
                        "expectedLabels": {"example.com/tier": "training"},
                        "expectedTaints": ["example.com/x=a=b:PreferNoSchedule"],
                    }
                },
            }
        }
    )
    pools = config.pools
    assert pools.expected_labels == {"topology.kubernetes.io/zone": "*"}
    assert pools.expected_taints == (
        Taint(key="nvidia.com/gpu", effect="NoSchedule"),
        Taint(key="dedicated", effect="NoExecute", value="ml"),
    )
    h100 = pools.by_name["h100"]
    assert h100.expected_labels == {"example.com/tier": "training"}
    assert h100.expected_taints == (
        Taint(key="example.com/x", effect="PreferNoSchedule", value="a=b"),
    )


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"pools": {"expectedTaints": ["nvidia.com/gpu"]}}, r"pools\.expectedTaints: must be key"),
        ({"pools": {"expectedTaints": ["gpu:Sometimes"]}}, "got 'gpu:Sometimes'"),
        ({"pools": {"expectedTaints": [":NoSchedule"]}}, r"pools\.expectedTaints: must be key"),
        ({"pools": {"expectedTaints": "gpu:NoSchedule"}}, "must be a list"),
        ({"pools": {"expectedLabels": ["zone"]}}, r"pools\.expectedLabels: must be a map"),
        (
            {"pools": {"byName": {"a": {"expectedTaints": ["x=y"]}}}},
            r"pools\.byName\.a\.expectedTaints: must be key",
        ),
        (
            {"pools": {"byName": {"a": {"expectedLabels": {"k": 1}}}}},
            r"pools\.byName\.a\.expectedLabels: must be a map",
        ),
    ],
)
def test_bad_expectations_are_refused_naming_the_key(document: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(document)
