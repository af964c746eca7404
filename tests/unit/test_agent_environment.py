"""The agent's environment probe over host trees shaped like real ones: a DGX H100
(NVSwitches, Fabric Manager), a PCIe node without, a node without the runtime hook,
one whose paths the agent cannot read. And the fact's format, and its config keys."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpuheal.agent import environment
from gpuheal.agent.config import RUNTIME_CONFIGS, parse_agent_config
from gpuheal.agent.environment import EnvironmentProbe, probe_environment
from gpuheal.config import ConfigError
from gpuheal.model import ENVIRONMENT_FACTS
from gpuheal.policy.environment import MISSING, OK, Fact, describe, encode, parse
from tests.hosts import (
    CONTAINERD_STOCK,
    CRIO_DROP_IN,
    NO_DRIVER_MODULES,
    NVSWITCH_H100,
    HostTree,
    dgx_h100,
    pcie_l40s,
)


def value(tree: HostTree) -> str:
    return encode(probe_environment(tree.paths()))


def test_a_dgx_h100_with_its_daemons_up_is_all_ok(tmp_path: Path) -> None:
    tree = dgx_h100(tmp_path)
    assert value(tree) == "modules=ok;persistenced=ok;fabricmanager=ok;runtimehook=ok"


def test_fabric_manager_stopped_on_an_nvswitch_system_is_bad(tmp_path: Path) -> None:
    tree = dgx_h100(tmp_path)
    tree.stop("nv-fabricmanage")  # the comm is cut at 15 characters
    facts = probe_environment(tree.paths())
    assert encode(facts) == "modules=ok;persistenced=ok;fabricmanager=stopped;runtimehook=ok"
    assert facts["fabricmanager"].bad
    assert describe("fabricmanager", facts["fabricmanager"]) == (
        "Fabric Manager (nv-fabricmanager) is not running on an NVSwitch system"
    )


def test_the_nvswitch_driver_alone_shows_the_switches(tmp_path: Path) -> None:
    """No readable PCI list (the switches then known from the nvswitch driver only)."""
    tree = dgx_h100(tmp_path)
    tree.stop("nv-fabricmanage")
    (tree.proc / "bus" / "pci" / "devices").unlink()
    assert probe_environment(tree.paths())["fabricmanager"] == Fact("stopped")
    for entry in (tree.proc / "driver" / "nvidia-nvswitch" / "devices").iterdir():
        entry.unlink()
    assert probe_environment(tree.paths())["fabricmanager"] == Fact("unknown")


def test_a_pcie_node_needs_no_fabric_manager_and_its_hook_is_a_drop_in(tmp_path: Path) -> None:
    tree = pcie_l40s(tmp_path)
    assert value(tree) == "modules=ok;persistenced=ok;fabricmanager=n/a;runtimehook=ok"


def test_nvswitch_pci_ids_are_the_configs(tmp_path: Path) -> None:
    tree = pcie_l40s(tmp_path)
    paths = replace(tree.paths(), nvswitch_pci_ids=("10de:26b9",))  # the L40S itself, say
    assert probe_environment(paths)["fabricmanager"] == Fact("stopped")
    assert NVSWITCH_H100 == "10de22a3"


def test_a_node_whose_runtime_does_not_name_the_nvidia_runtime_misses_the_hook(
    tmp_path: Path,
) -> None:
    tree = pcie_l40s(tmp_path)
    (tree.host / "etc" / "containerd" / "conf.d" / "99-nvidia.toml").unlink()
    tree.write("/etc/containerd/config.toml", CONTAINERD_STOCK)  # named in a comment only
    facts = probe_environment(tree.paths())
    assert facts["runtimehook"] == Fact(MISSING)
    assert "not configured" in describe("runtimehook", facts["runtimehook"])


def test_cri_o_with_nvidias_drop_in_has_the_hook(tmp_path: Path) -> None:
    tree = HostTree(tmp_path)
    tree.write("/etc/crio/crio.conf.d/99-nvidia.conf", CRIO_DROP_IN)
    assert probe_environment(tree.paths())["runtimehook"] == Fact(OK)


def test_modules_missing_after_a_reboot_are_named(tmp_path: Path) -> None:
    tree = pcie_l40s(tmp_path)
    tree.write("/proc/modules", NO_DRIVER_MODULES)
    facts = probe_environment(tree.paths())
    assert encode(facts).startswith("modules=missing:nvidia,nvidia_uvm,nvidia_modeset;")
    assert describe("modules", facts["modules"]) == (
        "kernel modules not loaded: nvidia, nvidia_uvm, nvidia_modeset"
    )


def test_a_module_still_loading_is_not_loaded(tmp_path: Path) -> None:
    tree = pcie_l40s(tmp_path)
    tree.write("/proc/modules", "nvidia_uvm 4911104 0 - Loading 0x0000000000000000 (POE)\n")
    facts = probe_environment(tree.paths())
    assert facts["modules"] == Fact(MISSING, ("nvidia", "nvidia_uvm", "nvidia_modeset"))


def test_what_the_agent_cannot_read_is_unknown_not_bad(tmp_path: Path) -> None:
    """The container's own /proc (no kthreadd: the host's daemons are not in it), a
    modules file that cannot be read, no runtime config mounted."""
    tree = HostTree(tmp_path)
    tree.processes({1: "python3", 7: "gpuheal"})
    (tree.proc / "modules").mkdir()  # reading it fails (EISDIR), as an unmounted path would
    facts = probe_environment(tree.paths())
    assert encode(facts) == (
        "modules=unknown;persistenced=unknown;fabricmanager=unknown;runtimehook=unknown"
    )
    assert not any(f.bad for f in facts.values())
    nothing = HostTree(tmp_path / "absent")  # not even a directory
    assert probe_environment(nothing.paths()) == facts


def test_a_config_the_agent_cannot_read_is_not_a_missing_hook(tmp_path: Path) -> None:
    tree = HostTree(tmp_path)
    (tree.host / "etc" / "containerd" / "config.toml").mkdir(parents=True)
    assert probe_environment(tree.paths())["runtimehook"] == Fact("unknown")


def test_the_probe_looks_again_only_when_due_and_warns_about_bad_facts(tmp_path: Path) -> None:
    tree = dgx_h100(tmp_path)
    now = [0.0]
    probe = EnvironmentProbe((), tree.proc / "driver/nvidia/version", tree.paths(), 30.0,
                             clock=lambda: now[0])  # fmt: skip
    assert probe.run().warnings == ()
    assert probe.value == "modules=ok;persistenced=ok;fabricmanager=ok;runtimehook=ok"
    tree.stop("nv-fabricmanage")
    now[0] = 29.0
    probe.run()
    assert "fabricmanager=ok" in str(probe.value)  # not due yet
    now[0] = 30.0
    result = probe.run()
    assert "fabricmanager=stopped" in str(probe.value)
    assert result.ran and not result.findings  # warnings, never faults
    assert result.warnings == (
        "Fabric Manager (nv-fabricmanager) is not running on an NVSwitch system",
    )


def test_a_probe_that_breaks_is_counted_as_not_run_and_keeps_the_last_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = dgx_h100(tmp_path)
    probe = EnvironmentProbe((), tree.proc / "driver/nvidia/version", tree.paths(), 0.0)
    probe.run()
    before = probe.value

    def broken(_: Path) -> set[str] | None:
        raise RuntimeError("unforeseen")

    monkeypatch.setattr(environment, "loaded_modules", broken)
    result = probe.run()
    assert (result.ran, result.error) == (False, "unforeseen")
    assert probe.value == before


# -- the value's format -------------------------------------------------------------


def test_encode_keeps_only_names_and_the_order() -> None:
    facts = {
        "runtimehook": Fact(OK),
        "modules": Fact(MISSING, ("nvidia_uvm", "bad;name", "x=y", "nvidia_modeset")),
        "other": Fact(OK),
    }
    assert encode(facts) == "modules=missing:nvidia_uvm,nvidia_modeset;runtimehook=ok"


@pytest.mark.parametrize(
    "text",
    ["modules", "modules=", "modules=OK", "modules=missing:a;b", "=ok", "modules=ok:a b"],
)
def test_parse_refuses_what_is_not_name_state(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not name=state|not a name"):
        parse(text)


def test_parse_skips_facts_a_newer_agent_may_add() -> None:
    assert parse("modules=ok;gdrcopy=missing") == {"modules": Fact(OK)}


names = st.sampled_from(ENVIRONMENT_FACTS)
states = st.sampled_from(["ok", "n/a", "unknown", "missing", "stopped"])
details = st.lists(st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True), max_size=3)


@given(st.dictionaries(names, st.builds(Fact, states, details.map(tuple))))
def test_encode_then_parse_round_trips(facts: dict[str, Fact]) -> None:
    assert parse(encode(facts)) == facts if facts else encode(facts) == ""


@given(st.text(max_size=200))
def test_parse_raises_only_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):
        parse(text)


# -- config ---------------------------------------------------------------------------


def test_the_probes_paths_are_config_keys() -> None:
    config = parse_agent_config(
        yaml.safe_load("""
        procRoot: /host/proc
        hostRoot: /host
        runtimeConfigPaths: [/etc/crio/crio.conf.d/*]
        requiredModules: [nvidia, nvidia_uvm, nvidia_peermem]
        nvswitchPciIds: ["10de:22a3"]
        envFactsSeconds: 60
        """)
    )
    assert config.host_root == Path("/host")
    assert config.runtime_config_paths == ("/etc/crio/crio.conf.d/*",)
    assert config.required_modules == ("nvidia", "nvidia_uvm", "nvidia_peermem")
    assert config.nvswitch_pci_ids == ("10de:22a3",)
    assert parse_agent_config({}).runtime_config_paths == RUNTIME_CONFIGS


@pytest.mark.parametrize(
    ("key", "bad", "said"),
    [
        ("runtimeConfigPaths", ["etc/containerd/config.toml"], "absolute host file paths"),
        ("runtimeConfigPaths", ["/etc/../root/.ssh/id_rsa"], "without '..'"),
        ("runtimeConfigPaths", ["/"], "file paths"),
        ("requiredModules", ["nvidia;rm"], "kernel module names"),
        ("nvswitchPciIds", ["22a3"], "PCI vendor:device"),
        ("envFactsSeconds", -1, "envFactsSeconds"),
    ],
)
def test_bad_probe_keys_are_refused_by_name(key: str, bad: object, said: str) -> None:
    with pytest.raises(ConfigError, match=key) as err:
        parse_agent_config({key: bad})
    assert said in str(err.value)
