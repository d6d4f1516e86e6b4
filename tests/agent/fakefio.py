"""A fake FioRunner for the manager's tests: canned fio outputs, no processes.

It writes the output and stderr files where the real runner makes fio write
them, reports status lines, and can hold a step until released or cancelled,
so tests can act while a benchmark is "running".
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from stortune.agent.bench.fio import FioInvocation, FioOutcome, FioStatus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fio"


def capture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


class FakeFio:
    def __init__(self, outputs: list[str] | str, *, stderr: str = "", returncode: int = 0,
                 statuses: tuple[FioStatus, ...] = (), hold: bool = False) -> None:
        self.outputs = [outputs] if isinstance(outputs, str) else list(outputs)
        self.stderr = stderr
        self.returncode = returncode
        self.statuses = statuses
        self.calls: list[FioInvocation] = []
        self.jobs: list[str] = []
        self.running = threading.Event()  # set while a step is held
        self.release = threading.Event()
        self.hold = hold

    def version(self) -> str:
        return "fio-3.33"

    def run(self, invocation: FioInvocation, *, on_status: Callable[[FioStatus], None],
            cancel: threading.Event, on_start: Callable[[int], None] | None = None) -> FioOutcome:
        self.calls.append(invocation)
        self.jobs.append(invocation.job_file.read_text())
        output = self.outputs[min(len(self.calls), len(self.outputs)) - 1]
        if on_start is not None:
            on_start(2**22 + len(self.calls))  # above pid_max's default: no such process
        for status in self.statuses:
            on_status(status)
        if self.hold:
            self.running.set()
            while not (self.release.is_set() or cancel.is_set()):
                cancel.wait(0.01)
            self.running.clear()
        invocation.output.write_text(output)
        invocation.stderr.write_text(self.stderr)
        return FioOutcome(returncode=1 if cancel.is_set() else self.returncode, output=output,
                          stderr=self.stderr, cancelled=cancel.is_set(), pid=2**22)
