"""The node's systemd for the agent's host reboot (the chart's agent.hostReboot:
`nsenter --mount=/proc/1/ns/mnt -- /bin/systemctl reboot` from a hostPID pod), made
harmless: the agent runs confined, as PID 1 of a PID namespace of its own, in a mount
namespace of its own where /bin/systemctl is a script that records the reboot.

`nsenter --mount=/proc/1/ns/mnt` enters the mount namespace of whatever /proc/1 is.
Under `unshare --pid --fork --mount --mount-proc`, /proc is that PID namespace's own
procfs and its 1 is the jail script, then (it execs) the agent: the namespace entered
is the private one, where the simulated systemctl is bind-mounted over the real one.
The jail script checks all of it before it starts the agent (it is PID 1, its
namespaces are not the test's, /proc/1 is itself, and each systemctl it covers is the
simulated one) and refuses otherwise; a machine without /bin/systemctl fails the test
saying so (there is nothing to cover, and the agent's command would fail, not reboot).
Nothing outside that mount namespace sees the bind mount.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from gpuheal.sim.kured import (
    CONFINEMENT_CHECK,
    UNSHARE_FLAGS,
    ConfinementError,
    namespaces_problem,
    own_namespaces,
)

SYSTEMCTL = (Path("/bin/systemctl"), Path("/usr/bin/systemctl"))

JAIL = (
    r"""#!/bin/sh
# PID 1 of the agent's own PID namespace, in its own mount namespace
# (gpuheal/sim/hostsystemd.py starts it under unshare): covers systemctl with the
# simulated one, then execs the agent. Refuses unless confined so.
# usage: jail.sh FAKE_SYSTEMCTL TEST_MNT_NS TEST_PID_NS AGENT [ARGS...]
set -eu
fake=$1 test_mnt=$2 test_pid=$3
shift 3
refuse() { echo "host-systemd jail: refusing to start the agent: $*" >&2; exit 70; }
"""
    + CONFINEMENT_CHECK
    + r"""[ -e /bin/systemctl ] || refuse "no /bin/systemctl to cover with the simulated one"
for path in /bin/systemctl /usr/bin/systemctl; do
  [ -e "$path" ] || continue
  mount --bind "$fake" "$path"
  cmp -s "$fake" "$path" || refuse "$path is not the simulated systemctl after the bind mount"
done
echo "host-systemd jail: PID 1 of $pid in $mnt (the test: $test_pid, $test_mnt)" >&2
exec "$@"
"""
)

# /bin/systemctl in the jail: reboots nothing; one line per call, with its arguments
# and the namespaces it ran in.
_SYSTEMCTL = """#!/bin/sh
ns="$(readlink /proc/self/ns/mnt) $(readlink /proc/self/ns/pid)"
echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) $* $ns" >> {calls}
"""


class HostSystemd:
    """The jail the agent runs in (`wrap`, its argv's prefix) and what the simulated
    systemctl was asked (`calls`)."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir / "host-systemd"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.calls_path = self.dir / "systemctl-calls"
        self.systemctl = self.dir / "systemctl"
        self.systemctl.write_text(_SYSTEMCTL.format(calls=shlex.quote(str(self.calls_path))))
        self.systemctl.chmod(0o755)
        self.jail = self.dir / "jail.sh"
        self.jail.write_text(JAIL)
        self.jail.chmod(0o755)

    def wrap(self) -> list[str]:
        """The prefix that runs a command as PID 1 of the jail; raises ConfinementError
        where the machine cannot confine it."""
        unshare = shutil.which("unshare")
        problem = (
            "no unshare (util-linux) on PATH" if unshare is None else namespaces_problem(unshare)
        )
        if problem is None and not SYSTEMCTL[0].exists():
            problem = f"no {SYSTEMCTL[0]} to cover with the simulated systemctl"
        if problem is not None or unshare is None:
            raise ConfinementError(f"the agent's host reboot cannot be confined: {problem}")
        mnt, pid = own_namespaces()
        return [unshare, *UNSHARE_FLAGS, "--", "/bin/sh", str(self.jail), str(self.systemctl),
                mnt, pid]  # fmt: skip

    def calls(self) -> list[str]:
        """What systemctl was asked, one call per line (`<time> <args> <mnt> <pid>`)."""
        if not self.calls_path.exists():
            return []
        return self.calls_path.read_text().splitlines()
