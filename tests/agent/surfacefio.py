"""A fake FioRunner whose bandwidth is a function of the device's settings at run time.

For experiment tests that need the engine to see an answer without running fio: at each
run it reads the target's queue attributes from the (fixture) sysfs, asks ``response``
for read bandwidth, and hands back a captured fio output rewritten to that bandwidth.
It keeps what it saw, so a test can check which values were in effect during each trial.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from stortune.agent.bench.fio import FioInvocation, FioOutcome, FioStatus
from stortune.agent.kernelfs import KernelFS
from tests.agent.fakefio import capture

Response = Callable[[Mapping[str, str]], float]
_ATTRS = ("read_ahead_kb", "nr_requests", "scheduler")


def current(fs: KernelFS, device: str) -> dict[str, str]:
    """The device's queue attributes as the fake kernel shows them (scheduler: its choice)."""
    out = {}
    for attr in _ATTRS:
        path = fs.sysfs / "block" / device / "queue" / attr
        if path.exists():
            text = path.read_text().strip()
            out[attr] = next((w.strip("[]") for w in text.split() if w.startswith("[")), text)
    return out


class SurfaceFio:
    def __init__(self, fs: KernelFS, device: str, response: Response) -> None:
        self.fs = fs
        self.device = device
        self.response = response
        self.seen: list[dict[str, str]] = []
        self.template = json.loads(capture("fio-3.33-group-reporting.json"))
        #: Set while a run is under way; a run whose settings ``hold_if`` accepts holds until
        #: ``release`` is set or the run is cancelled.
        self.running = threading.Event()
        self.release = threading.Event()
        self.hold_if: Callable[[Mapping[str, str]], bool] | None = None

    def version(self) -> str:
        return "fio-3.33"

    def run(self, invocation: FioInvocation, *, on_status: Callable[[FioStatus], None],
            cancel: threading.Event, on_start: Callable[[int], None] | None = None) -> FioOutcome:
        settings = current(self.fs, self.device)
        self.seen.append(settings)
        if on_start is not None:
            on_start(2**22 + len(self.seen))  # above pid_max's default: no such process
        self.running.set()
        hold = self.hold_if is not None and self.hold_if(settings)
        while hold and not (self.release.is_set() or cancel.is_set()):
            cancel.wait(0.01)
        self.running.clear()
        doc = copy.deepcopy(self.template)
        bw = self.response(settings)
        read = doc["jobs"][0]["read"]
        read["bw_bytes"], read["bw"] = int(bw), int(bw / 1024)
        read["iops"] = bw / (32 << 10)
        output = json.dumps(doc)
        Path(invocation.output).write_text(output)
        Path(invocation.stderr).write_text("")
        return FioOutcome(returncode=1 if cancel.is_set() else 0, output=output, stderr="",
                          cancelled=cancel.is_set(), pid=2**22)
