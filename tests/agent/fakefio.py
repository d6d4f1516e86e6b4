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


class SurfaceFio:
    """A FioRunner measuring a response surface of the target's settings in effect, with noise.

    What the experiment tests need of fio: each run reads the target's ``read_ahead_kb`` from the
    host's sysfs at the moment it starts (what the trial's Apply left there) and reports
    ``surface(read_ahead_kb)`` bytes/s, times multiplicative lognormal noise of ``cv``, as fio's
    own JSON (a captured output, rescaled), so the agent parses, measures and stores it as any run.

    ``control`` (a directory) steers it from another process: a file ``hold`` holding seconds makes
    each run last that long (0 or absent: at once) unless cancelled, and every run appends
    ``start <step dir> <hold seconds>`` / ``end <step dir> <outcome>`` to ``calls.log``, so a
    test counts fio runs per benchmark run across agent restarts.
    """

    def __init__(self, read_ahead: Callable[[], int], surface: Callable[[int], float], *, cv: float = 0.02,
                 seed: int = 0, control: Path | None = None) -> None:
        import random

        self.read_ahead = read_ahead
        self.surface = surface
        self.cv = cv
        self.rng = random.Random(seed)
        self.control = control
        self.calls: list[FioInvocation] = []
        self.template = capture("fio-3.33-group-reporting.json")

    def version(self) -> str:
        return "fio-3.33"

    def _note(self, line: str) -> None:
        if self.control is not None:
            with open(self.control / "calls.log", "a", encoding="utf-8") as fh:
                fh.write(line + "\n")

    def _hold(self) -> float:
        if self.control is None:
            return 0.0
        try:
            return float((self.control / "hold").read_text().strip() or 0)
        except (OSError, ValueError):
            return 0.0

    def output(self, bandwidth: float) -> str:
        import json

        data = json.loads(self.template[self.template.index("{"):])
        for job in data["jobs"]:
            read = job["read"]
            scale = bandwidth / read["bw_bytes"] if read["bw_bytes"] else 1.0
            for key in ("bw_bytes", "bw", "iops"):
                read[key] = read[key] * scale
            read["bw_bytes"], read["bw"] = int(read["bw_bytes"]), int(read["bw"])
        return json.dumps(data)

    def run(self, invocation: FioInvocation, *, on_status: Callable[[FioStatus], None],
            cancel: threading.Event, on_start: Callable[[int], None] | None = None) -> FioOutcome:
        import math

        self.calls.append(invocation)
        where = str(invocation.job_file.parent)
        hold = self._hold()
        self._note(f"start {where} {hold:g}")
        sigma = math.sqrt(math.log(1 + self.cv * self.cv))
        bandwidth = self.surface(self.read_ahead()) * math.exp(self.rng.gauss(-sigma * sigma / 2, sigma))
        if on_start is not None:
            on_start(2**22 + len(self.calls))  # above pid_max's default: no such process
        cancel.wait(hold)
        output = self.output(bandwidth)
        invocation.output.write_text(output)
        invocation.stderr.write_text("")
        self._note(f"end {where} {'cancelled' if cancel.is_set() else 'done'}")
        return FioOutcome(returncode=1 if cancel.is_set() else 0, output=output, stderr="",
                          cancelled=cancel.is_set(), pid=2**22)
