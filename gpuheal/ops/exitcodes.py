"""Exit codes of the operator commands, one meaning each (docs/operations.md).

Scripts branch on these: 0 all good, 1 could not do the job (API unreachable,
forbidden), 2 bad usage or config, 3 the command worked and found problems
(doctor, audit), 4 a wait ran out (drain deadline), 5 the node does not exist.
A failed health gate exits 64 + the sum of its failing checks' bits
(gate.CHECK_BITS), so each failing check is readable from the code alone.
"""

from __future__ import annotations

OK = 0
ERROR = 1
USAGE = 2
FINDINGS = 3
TIMED_OUT = 4
NOT_FOUND = 5
GATE_FAILED = 64  # | the failing checks' bits
