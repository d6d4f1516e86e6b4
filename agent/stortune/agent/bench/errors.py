"""The benchmark errors, in one place.

    local.AgentError
    └── BenchmarkError              cannot run: the message says why and what to change
        ├── UnsafeTargetError       the target may not be written (reasons listed)
        ├── FioNotInstalledError    no fio binary: install Debian's package fio
        └── UnknownRunError         no such run on this agent
    journal.StateLockedError
    └── journal.HostBusyError
        ├── journal.BenchmarkBusyError   a benchmark runs: no second one, no apply meanwhile
        └── journal.ExperimentBusyError  a tuning experiment runs: only its own applies and benchmarks

The RPC layer maps AgentError to FAILED_PRECONDITION and StateLockedError to
ABORTED (the control plane retries those); UnknownRunError should be NOT_FOUND.
"""

from __future__ import annotations

from stortune.agent.journal import BenchmarkBusyError
from stortune.agent.local import AgentError

__all__ = ["BenchmarkBusyError", "BenchmarkError", "FioNotInstalledError", "UnknownRunError",
           "UnsafeTargetError"]


class BenchmarkError(AgentError):
    """A benchmark that cannot run (or a run that cannot be found)."""


class UnsafeTargetError(BenchmarkError):
    def __init__(self, target: str, reasons: list[str]) -> None:
        self.target = target
        self.reasons = reasons
        super().__init__(f"refusing to write to {target}: " + "; ".join(reasons))


class FioNotInstalledError(BenchmarkError):
    def __init__(self, binary: str) -> None:
        super().__init__(f"fio is not installed ({binary!r} not found on PATH): install Debian's"
                         " package fio (apt-get install fio)")


class UnknownRunError(BenchmarkError):
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no benchmark run {run_id!r} on this agent")
