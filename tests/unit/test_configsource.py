"""The reference to the controller's ConfigMap (ops/configsource.py): NAMESPACE/NAME
or a clear error; the integration tests read real ConfigMaps."""

from __future__ import annotations

import pytest

from gpuheal.config import ConfigError
from gpuheal.ops.configsource import parse_ref

pytestmark = pytest.mark.unit


def test_a_reference_is_namespace_and_name() -> None:
    assert parse_ref("gpuheal-system/gpuheal-controller") == (
        "gpuheal-system",
        "gpuheal-controller",
    )


@pytest.mark.parametrize("ref", ["", "gpuheal-controller", "/name", "namespace/", "a/b/c"])
def test_anything_else_names_the_flag(ref: str) -> None:
    with pytest.raises(ConfigError, match=r"--controller-config .* is not NAMESPACE/NAME"):
        parse_ref(ref)
