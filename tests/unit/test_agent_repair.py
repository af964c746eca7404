"""The agent's side of a repair: verify the request, act at most once (across
restarts), answer; the fake NVML backend's reset."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from gpuheal.agent.config import AgentConfig, parse_agent_config
from gpuheal.agent.debounce import Report
from gpuheal.agent.fakenvml import FakeNvml
from gpuheal.agent.repair import (
    STARTED,
    Attempt,
    Repairer,
    RepairFailedError,
    RepairLog,
    nvml_reset,
    smi_reset,
)
from gpuheal.config import ConfigError
from gpuheal.model import REPAIR_REQUEST, REPAIR_RESULT, Severity
from gpuheal.policy.repairwire import Outcome, RepairRequest, RepairResult, fault_digest
from gpuheal.sim.agent import gpu_spec
from gpuheal.xid import Action
from tests.corpus import EKS_NODES

NODE = EKS_NODES[0]
FAULT = f"{NODE}-20261201T092500Z-4f1c2a"
AT = "2026-12-01T09:30:00Z"


def report(*devices: str) -> Report:
    return Report(FAULT, AT, "EccContained94", "Xid 94", devices, Severity.P1)


def asked(action: Action, attempt: int = 1, fault: str = FAULT) -> dict[str, str]:
    return {REPAIR_REQUEST: RepairRequest(action, fault_digest(fault), attempt, AT).encode()}


class Node:
    """One node's spec, state directory and boot, as the agent sees them."""

    def __init__(self, tmp: Path, **device: object) -> None:
        self.tmp = tmp
        self.spec = gpu_spec(NODE, 2)
        self.spec["devices"][0].update(device)
        self.spec_path = tmp / "nvml-spec.yaml"
        self.spec_path.write_text(yaml.safe_dump(self.spec))
        self.gpu = self.spec["devices"][0]["uuid"]
        self.boot = "boot-1"
        self.cleared: list[tuple[str, ...]] = []

    def agent(self, config: AgentConfig | None = None) -> Repairer:
        """A (re)started agent's repairer: the state file is the node's."""
        lib = FakeNvml(self.spec_path)
        return Repairer(
            config or AgentConfig(repair_enabled=True),
            node=NODE,
            boot_id=self.boot,
            repairs=RepairLog(self.tmp / "agent-state-repair.json"),
            reset=nvml_reset(lib),
            nvml=lib,
            on_reset=self.cleared.append,
        )

    def resets(self) -> list[tuple[str, str]]:
        return FakeNvml(self.spec_path).resets()


def test_a_verified_reset_is_done_once_and_clears_what_a_reset_clears(tmp_path: Path) -> None:
    node = Node(tmp_path, eccUncorrectedVolatile=3, remappedRows={"pending": True})
    agent = node.agent()
    result = agent.answer(asked(Action.RESET_GPU), report(node.gpu))
    assert result is not None and result.outcome is Outcome.DONE
    assert result.key == f"{fault_digest(FAULT)}/1" and node.gpu in result.detail
    assert node.resets() == [(node.gpu, "ok")]
    assert node.cleared == [(node.gpu,)]  # the held Xid events of the GPU end
    device = yaml.safe_load(node.spec_path.read_text())["devices"][0]
    assert device["eccUncorrectedVolatile"] == 0 and not device["remappedRows"]["pending"]
    # The result not yet on the node (the PATCH failed): the same answer, no second reset.
    again = agent.answer(asked(Action.RESET_GPU), report(node.gpu))
    assert again == result and len(node.resets()) == 1
    # Nor after a restart; and once the result is on the node there is nothing to say.
    restarted = node.agent()
    assert restarted.answer(asked(Action.RESET_GPU), report(node.gpu)) == result
    on_node = asked(Action.RESET_GPU) | {REPAIR_RESULT: result.encode()}
    assert restarted.answer(on_node, report(node.gpu)) is None
    assert len(node.resets()) == 1


def test_a_gpu_a_process_holds_is_not_reset_and_the_agent_says_why(tmp_path: Path) -> None:
    node = Node(tmp_path, processes=[{"pid": 4242, "usedMemoryMiB": 1024}])
    result = node.agent().answer(asked(Action.RESET_GPU), report(node.gpu))
    assert result is not None and result.outcome is Outcome.REFUSED
    assert result.detail == f"GPU in use: {node.gpu} by pid 4242"
    assert node.resets() == []


def test_a_reset_fails_on_demand_then_succeeds(tmp_path: Path) -> None:
    node = Node(tmp_path, resetFailures=1)
    agent = node.agent()
    first = agent.answer(asked(Action.RESET_GPU, 1), report(node.gpu))
    assert first is not None and first.outcome is Outcome.FAILED and not node.cleared
    second = agent.answer(asked(Action.RESET_GPU, 2), report(node.gpu))
    assert second is not None and second.outcome is Outcome.DONE
    assert node.resets() == [(node.gpu, "failed"), (node.gpu, "ok")]


@pytest.mark.parametrize(
    ("request_", "reported", "why"),
    [
        (asked(Action.RESET_GPU, fault="another-fault"), report("GPU-x"), "not the fault"),
        (asked(Action.RESET_GPU), None, "reports no fault"),
        (asked(Action.RESET_GPU), report(), "names no GPU"),
        (asked(Action.REBOOT), report("GPU-x"), "repairRebootMethod: none"),
    ],
)
def test_a_request_the_agent_cannot_verify_is_refused_untouched(
    tmp_path: Path, request_: dict[str, str], reported: Report | None, why: str
) -> None:
    node = Node(tmp_path)
    result = node.agent().answer(request_, reported)
    assert result is not None and result.outcome is Outcome.REFUSED and why in result.detail
    assert node.resets() == []


def test_no_request_or_an_undecodable_one_does_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path)
    assert node.agent().answer({}, report(node.gpu)) is None
    assert node.agent().answer({REPAIR_REQUEST: "reset everything"}, report(node.gpu)) is None
    assert node.resets() == []


def test_a_reboot_is_answered_after_the_node_is_back(tmp_path: Path) -> None:
    sentinel = tmp_path / "run" / "reboot-required"
    config = AgentConfig(
        repair_enabled=True, repair_reboot_method="sentinel", repair_reboot_sentinel=sentinel
    )
    node = Node(tmp_path)
    agent = node.agent(config)
    assert agent.answer(asked(Action.REBOOT), report(node.gpu)) is None
    assert sentinel.read_text().startswith(f"gpuheal {fault_digest(FAULT)}/1")
    sentinel.unlink()
    assert node.agent(config).answer(asked(Action.REBOOT), report(node.gpu)) is None  # same boot
    assert not sentinel.exists()  # not asked twice
    node.boot = "boot-2"
    result = node.agent(config).answer(asked(Action.REBOOT), None)
    assert result is not None and result.outcome is Outcome.DONE
    assert "boot-1 -> boot-2" in result.detail and not sentinel.exists()


def sentinel_config(tmp_path: Path) -> AgentConfig:
    # A sentinel on a path a reboot does not empty (not a tmpfs): only the agent's
    # removal keeps the reboot daemon from rebooting the node again.
    return AgentConfig(
        repair_enabled=True,
        repair_reboot_method="sentinel",
        repair_reboot_sentinel=tmp_path / "persistent" / "reboot-required",
    )


def test_a_sentinel_that_outlives_its_reboot_is_removed_once_the_boot_id_changed(
    tmp_path: Path,
) -> None:
    config = sentinel_config(tmp_path)
    sentinel = config.repair_reboot_sentinel
    node = Node(tmp_path)
    assert node.agent(config).answer(asked(Action.REBOOT), report(node.gpu)) is None
    written = sentinel.read_text()
    assert node.agent(config).answer(asked(Action.REBOOT), report(node.gpu)) is None
    assert sentinel.read_text() == written  # the same boot: kept for the daemon, not rewritten
    node.boot = "boot-2"  # rebooted; the file survived
    agent = node.agent(config)  # the agent's start sweeps it
    assert not sentinel.exists()
    result = agent.answer(asked(Action.REBOOT), None)
    assert result is not None and result.outcome is Outcome.DONE
    # Asked again before the result is on the Node: the same answer, nothing written,
    # and the reboot daemon's next look finds nothing: no second reboot.
    again = node.agent(config).answer(asked(Action.REBOOT), None)
    assert again is not None and again.outcome is Outcome.DONE and again.time == result.time
    assert not sentinel.exists()


def test_a_sentinel_written_before_the_agent_died_is_removed_with_its_failed_answer(
    tmp_path: Path,
) -> None:
    config = sentinel_config(tmp_path)
    sentinel = config.repair_reboot_sentinel
    node = Node(tmp_path)
    agent = node.agent(config)
    # The agent wrote STARTED and the sentinel, then died before it wrote REBOOTING.
    agent.log.put(f"{fault_digest(FAULT)}/1", Attempt("reboot", STARTED, AT, "", node.boot))
    sentinel.parent.mkdir(parents=True)
    sentinel.write_text(f"gpuheal {fault_digest(FAULT)}/1 {AT}\n")
    result = node.agent(config).answer(asked(Action.REBOOT), report(node.gpu))
    assert result is not None and result.outcome is Outcome.FAILED
    assert not sentinel.exists()  # a failed attempt must not reboot the node later


def test_a_sentinel_someone_else_wrote_is_never_removed(tmp_path: Path) -> None:
    config = sentinel_config(tmp_path)
    sentinel = config.repair_reboot_sentinel
    sentinel.parent.mkdir(parents=True)
    sentinel.write_text("*** System restart required ***\n")  # update-notifier's
    node = Node(tmp_path)
    node.agent(config)
    node.boot = "boot-2"
    node.agent(config)
    assert sentinel.read_text() == "*** System restart required ***\n"


def test_an_agent_killed_while_acting_answers_failed_and_does_not_act_again(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)

    def killed(uuid: str) -> None:
        raise KeyboardInterrupt  # the process dies in the middle of the reset

    agent = node.agent()
    agent.reset = killed
    with pytest.raises(KeyboardInterrupt):
        agent.answer(asked(Action.RESET_GPU), report(node.gpu))
    result = node.agent().answer(asked(Action.RESET_GPU), report(node.gpu))
    assert result is not None and result.outcome is Outcome.FAILED
    assert "restarted during the reset; not tried again" in result.detail
    assert node.resets() == []


def test_the_real_reset_is_nvidia_smi_r_per_gpu(tmp_path: Path) -> None:
    said = tmp_path / "argv"
    script = tmp_path / "nvidia-smi"
    script.write_text(
        f'#!{sys.executable}\nimport sys\nopen("{said}", "w").write(" ".join(sys.argv[1:]))\n'
    )
    script.chmod(0o755)
    smi_reset([str(script)], 5)("GPU-0a1b")
    assert said.read_text() == "-r -i GPU-0a1b"
    failing = tmp_path / "failing"
    failing.write_text(
        f"#!{sys.executable}\nimport sys\nprint('In use by another client')\nsys.exit(255)\n"
    )
    failing.chmod(0o755)
    with pytest.raises(RepairFailedError, match="exited 255: In use by another client"):
        smi_reset([str(failing)], 5)("GPU-0a1b")


def test_the_result_round_trips_through_the_annotation() -> None:
    result = RepairResult(Action.RESET_GPU, fault_digest(FAULT), 1, Outcome.DONE, AT, "reset x")
    assert result.encode().startswith("reset-gpu;")


def test_the_agent_config_keys() -> None:
    config = parse_agent_config({"repairEnabled": True, "repairRebootMethod": "sentinel"})
    assert config.repair_enabled and config.repair_reboot_method == "sentinel"
    with pytest.raises(ConfigError, match="repairRebootCommand"):
        parse_agent_config({"repairRebootMethod": "command"})
