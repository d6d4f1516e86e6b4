"""The fio seam: ``FioRunner`` runs one job file; ``SubprocessFioRunner`` is the real one.

fio writes its JSON result to a file (``--output``), its errors to a separate
stderr file, and its status line to stdout, which the runner parses for live
progress (``--eta=always``: fio prints it even to a pipe). fio starts in its
own session, so cancelling signals the whole process group: SIGTERM (fio stops
its jobs and still writes what it measured), then SIGKILL after a grace
period, and the group is killed again once the leader has exited, before it is
reaped, so the group id cannot be reused in between. fio's job processes call
setsid() themselves, so the group does not hold them: a leader killed while it
was still starting its jobs leaves them waiting forever for its go. They are
found by the command line they inherited (it ends in this run's job file) and
killed as well. A stopped run returns once the killed processes are gone (they
finish their in-flight I/O first). Tests use a fake runner; nothing else spawns fio.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from stortune.agent.bench.errors import BenchmarkError, FioNotInstalledError

# Jobs: 1 (f=1): [R(1)][60.0%][r=5760MiB/s][r=92.2k IOPS][eta 00m:02s]
# Jobs: 2 (f=2): [m(2)][40.0%][r=1234KiB/s,w=567KiB/s][r=308,w=141 IOPS][eta 01h:02m:03s]
_PERCENT = re.compile(r"\]\[(\d+(?:\.\d+)?)%\]")
_BW = re.compile(r"\[((?:[rwt]=[\d.]+[KMGTP]?i?B/s,?)+)\]")
_IOPS = re.compile(r"\[((?:[rwt]=[\d.]+[kMG]?,?)+) IOPS\]")
_ETA = re.compile(r"\[eta\s+(?:(\d+)d:)?(?:(\d+)h:)?(\d+)m:(\d+)s\]")
_BW_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_DEC = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}


@dataclass(frozen=True)
class FioStatus:
    percent: float | None = None
    read_bytes_per_s: float | None = None
    write_bytes_per_s: float | None = None
    read_iops: float | None = None
    write_iops: float | None = None
    eta_seconds: int | None = None


def _pairs(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


def parse_status_line(line: str) -> FioStatus | None:
    """One of fio's status lines -> what it says; None when it says nothing measurable."""
    if not line.lstrip().startswith("Jobs:"):
        return None
    percent = _PERCENT.search(line)
    eta = _ETA.search(line)
    rates: dict[str, float] = {}
    if m := _BW.search(line):
        for key, value in _pairs(m.group(1)).items():
            v = re.fullmatch(r"([\d.]+)([KMGTP]?)i?B/s", value)
            if v:
                rates[f"{key}_bw"] = float(v.group(1)) * _BW_UNITS[v.group(2)]
    if m := _IOPS.search(line):
        for key, value in _pairs(m.group(1)).items():
            v = re.fullmatch(r"([\d.]+)([kMG]?)", value)
            if v:
                rates[f"{key}_iops"] = float(v.group(1)) * _DEC[v.group(2)]
    if percent is None and eta is None and not rates:
        return None
    seconds = None
    if eta:
        d, h, m_, s = (int(g) if g else 0 for g in eta.groups())
        seconds = ((d * 24 + h) * 60 + m_) * 60 + s
    return FioStatus(
        percent=float(percent.group(1)) if percent else None,
        read_bytes_per_s=rates.get("r_bw"), write_bytes_per_s=rates.get("w_bw"),
        read_iops=rates.get("r_iops"), write_iops=rates.get("w_iops"), eta_seconds=seconds,
    )


@dataclass(frozen=True)
class FioInvocation:
    job_file: Path
    output: Path  # fio's JSON result
    stderr: Path
    cwd: Path
    timeout: float | None = None  # seconds; the run is stopped (not cancelled) past it
    #: fio --readonly: fio refuses to start any write job (a command-line switch, not a job option)
    readonly: bool = False


@dataclass(frozen=True)
class FioOutcome:
    returncode: int
    output: str  # the JSON file's text ("" when fio wrote none)
    stderr: str
    cancelled: bool = False
    timed_out: bool = False
    pid: int = 0


class FioRunner(Protocol):
    def version(self) -> str:
        """``fio-3.33``; raises FioNotInstalledError when fio is missing."""
        ...

    def run(self, invocation: FioInvocation, *, on_status: Callable[[FioStatus], None],
            cancel: threading.Event, on_start: Callable[[int], None] | None = None) -> FioOutcome:
        """Run one job file to its end, or until ``cancel`` is set."""
        ...


#: How long a stopped run waits for its SIGKILLed job processes: they finish the direct I/O
#: they have in flight first, which on a loaded host (a loop device over a busy disk) can take
#: far longer than the grace a running fio gets to stop by itself.
REAP_WAIT_S = 60.0


class SubprocessFioRunner:
    def __init__(self, binary: str = "fio", *, kill_grace: float = 5.0,
                 reap_wait: float = REAP_WAIT_S) -> None:
        self.binary = binary
        self.kill_grace = kill_grace
        self.reap_wait = reap_wait
        self._version: str | None = None

    def _exe(self) -> str:
        exe = shutil.which(self.binary)
        if exe is None:
            raise FioNotInstalledError(self.binary)
        return exe

    def version(self) -> str:
        if self._version is None:
            proc = subprocess.run([self._exe(), "--version"], capture_output=True, text=True,
                                  timeout=30, check=False)
            text = proc.stdout.strip()
            if proc.returncode != 0 or not text:
                raise BenchmarkError(f"{self.binary} --version failed: {proc.stderr.strip()[:200]}")
            self._version = text.splitlines()[0]
        return self._version

    def run(self, invocation: FioInvocation, *, on_status: Callable[[FioStatus], None],
            cancel: threading.Event, on_start: Callable[[int], None] | None = None) -> FioOutcome:
        argv = [self._exe(), "--output-format=json", f"--output={invocation.output}",
                "--eta=always", "--eta-newline=1", "--eta-interval=1",
                *(["--readonly"] if invocation.readonly else []), str(invocation.job_file)]
        with open(invocation.stderr, "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=err, cwd=invocation.cwd, start_new_session=True,
                                    close_fds=True)
        assert proc.stdout is not None
        reader = threading.Thread(target=_read_status, args=(proc.stdout.fileno(), on_status),
                                  name="stortune-fio-status", daemon=True)
        reader.start()
        job = str(invocation.job_file)
        cancelled = timed_out = stopped = False
        try:
            if on_start is not None:
                on_start(proc.pid)
            deadline = None if invocation.timeout is None else time.monotonic() + invocation.timeout
            while not _exited(proc.pid):
                if cancel.is_set() or (deadline is not None and time.monotonic() > deadline):
                    cancelled, timed_out = cancel.is_set(), not cancel.is_set()
                    stopped = True
                    self._stop(proc.pid, job)
                    break
                cancel.wait(0.1)
        except BaseException:
            stopped = True
            self._stop(proc.pid, job)
            raise
        finally:
            _kill_group(proc.pid, signal.SIGKILL)  # job processes left behind by the leader
            orphans = kill_fio_of(job)  # a leader that died by itself may leave them too
            returncode = proc.wait()
            if stopped or orphans:
                _wait_gone(proc.pid, job, self.reap_wait)
            reader.join(5)
            proc.stdout.close()
        return FioOutcome(
            returncode=returncode, output=_text(invocation.output), stderr=_text(invocation.stderr),
            cancelled=cancelled, timed_out=timed_out, pid=proc.pid,
        )

    def _stop(self, pid: int, job: str) -> None:
        """SIGTERM the group, SIGKILL it and the job processes after the grace period; returns
        once the leader exited."""
        _kill_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.kill_grace
        while not _exited(pid):
            if time.monotonic() > deadline:
                _kill_group(pid, signal.SIGKILL)
                kill_fio_of(job)
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
                return
            time.sleep(0.05)


def _exited(pid: int) -> bool:
    """Has the leader exited? Leaves it unreaped (WNOWAIT), so its group id stays reserved."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _wait_gone(pgid: int, job: str, timeout: float) -> None:
    """Until no live process of the run is left (bounded): a killed job process still
    finishes the direct I/O it has in flight before it exits. Zombies (their parent, or an
    init that does not reap, has yet to collect them) hold nothing and are not waited for.
    A job the leader forked just before it died is killed here too."""
    deadline = time.monotonic() + timeout
    while (_live_in_group(pgid) or kill_fio_of(job)) and time.monotonic() < deadline:
        time.sleep(0.02)


def kill_fio_of(job: str) -> list[int]:
    """SIGKILL every live process whose command line ends in the job file ``job``."""
    return kill_fio_running(lambda last: last == job)


def kill_fio_running(match: Callable[[str], bool]) -> list[int]:
    """SIGKILL every live process whose last command-line argument (fio's job file; its job
    processes inherit the leader's command line, a zombie's is empty) ``match``es; the pids
    signalled. This host's own /proc: processes the agent started are no kernel fact to fake."""
    hit = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            if not match(argv[-1].decode("utf-8", "replace")):
                continue
            os.kill(int(entry.name), signal.SIGKILL)
        except OSError:  # gone meanwhile (ProcessLookupError is one)
            continue
        hit.append(int(entry.name))
    return hit


def _live_in_group(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _read_status(fd: int, on_status: Callable[[FioStatus], None]) -> None:
    """fio ends status lines with \\r (and \\n every --eta-newline): split on both."""
    pending = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            return
        if not chunk:
            return
        *lines, pending = re.split(rb"[\r\n]", pending + chunk)
        for line in lines:
            status = parse_status_line(line.decode("utf-8", "replace"))
            if status is not None:
                with contextlib.suppress(Exception):  # a progress sink must not stop the run
                    on_status(status)


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
