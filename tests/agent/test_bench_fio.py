"""The real fio runner: status lines, a short run, cancel leaving no process (its job processes
included, which fio puts in sessions of their own), fio missing."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from stortune.agent.bench.errors import FioNotInstalledError
from stortune.agent.bench.fio import FioInvocation, FioStatus, SubprocessFioRunner, parse_status_line
from stortune.schemas.bench.fioresult import parse
from tests.agent.procs import pids_in_group, processes_with

needs_fio = pytest.mark.skipif(shutil.which("fio") is None,
                               reason="fio is not installed (Debian package fio)")


@pytest.mark.parametrize(("line", "status"), [
    ("Jobs: 1 (f=1): [R(1)][60.0%][r=5760MiB/s][r=92.2k IOPS][eta 00m:02s]",
     FioStatus(60.0, 5760 * 2**20, None, 92200.0, None, 2)),
    ("Jobs: 2 (f=2): [m(2)][40.5%][r=1234KiB/s,w=567KiB/s][r=308,w=141 IOPS][eta 01h:02m:03s]",
     FioStatus(40.5, 1234 * 1024.0, 567 * 1024.0, 308.0, 141.0, 3723)),
    ("Jobs: 1 (f=1): [W(1)][12.5%][w=1.2GiB/s][w=1.2M IOPS][eta 01d:00h:00m:10s]",
     FioStatus(12.5, None, 1.2 * 2**30, None, 1.2e6, 86410)),
    ("Jobs: 1 (f=1): [_(1)][100.0%][eta 00m:00s]", FioStatus(100.0, eta_seconds=0)),
])
def test_status_lines(line: str, status: FioStatus) -> None:
    assert parse_status_line(line) == status


@pytest.mark.parametrize("line", ["Jobs: 1 (f=1)", "", "fio-3.33", "Starting 1 process"])
def test_lines_without_figures_say_nothing(line: str) -> None:
    assert parse_status_line(line) is None


def invocation(tmp_path: Path, job: str, timeout: float | None = None) -> FioInvocation:
    (tmp_path / "job.fio").write_text(job)
    return FioInvocation(tmp_path / "job.fio", tmp_path / "fio.json", tmp_path / "stderr.txt", tmp_path,
                         timeout)


def job(tmp_path: Path, *, runtime: str, numjobs: int = 1) -> str:
    return (f"[global]\nfilename={tmp_path / 'data'}\nrw=randread\nbs=4k\nsize=8M\nruntime={runtime}\n"
            f"time_based=1\nioengine=psync\nnumjobs={numjobs}\ngroup_reporting=1\n[t]\n")


@needs_fio
def test_a_short_run_writes_json_apart_from_stderr(tmp_path: Path) -> None:
    seen: list[FioStatus] = []
    started: list[int] = []
    outcome = SubprocessFioRunner().run(invocation(tmp_path, job(tmp_path, runtime="500ms")),
                                        on_status=seen.append, cancel=threading.Event(),
                                        on_start=started.append)
    assert outcome.returncode == 0 and not outcome.cancelled
    assert started == [outcome.pid]
    result = parse(outcome.output)
    assert result.ok and result.read.iops > 0
    assert (tmp_path / "fio.json").read_text() == outcome.output
    assert "{" not in outcome.stderr


@needs_fio
def test_cancel_stops_every_fio_process(tmp_path: Path) -> None:
    """Cancelled at fio's first status line (its jobs are running), a 60-s run is stopped by the
    runner's signal, not run to its end: fio says it was terminated (or, past the grace, it was
    SIGKILLed), and none of its processes is left."""
    cancel = threading.Event()
    started: list[int] = []
    runner = SubprocessFioRunner(kill_grace=5)
    inv = invocation(tmp_path, job(tmp_path, runtime="60s", numjobs=3))
    outcome = runner.run(inv, on_status=lambda s: cancel.set(), cancel=cancel, on_start=started.append)
    assert outcome.cancelled and not outcome.timed_out
    assert outcome.returncode == -signal.SIGKILL or \
        "fio: terminating on signal 15" in parse(outcome.output).preamble, outcome
    assert pids_in_group(started[0]) == []
    assert processes_with(str(inv.job_file)) == []


def children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError):
                continue
    return out


@needs_fio
def test_a_leader_killed_while_it_starts_its_jobs_leaves_no_job_behind(tmp_path: Path) -> None:
    """fio's job processes call setsid(): killing the leader's group misses them, and a leader
    killed before it gave them the go leaves them waiting forever (seen on a loaded CI host)."""
    cancel = threading.Event()
    runner = SubprocessFioRunner(kill_grace=0)  # SIGKILL at once: the leader never stops its jobs itself
    inv = invocation(tmp_path, job(tmp_path, runtime="60s", numjobs=4))

    def cancel_once_a_job_forked(leader: int) -> None:
        def watch() -> None:
            while not children_of(leader) and not cancel.is_set():
                time.sleep(0.001)
            cancel.set()
        threading.Thread(target=watch, daemon=True).start()

    outcome = runner.run(inv, on_status=lambda s: None, cancel=cancel, on_start=cancel_once_a_job_forked)
    assert outcome.cancelled
    assert processes_with(str(inv.job_file)) == [], (outcome.returncode, outcome.stderr)
    assert pids_in_group(outcome.pid) == []


@needs_fio
def test_a_run_past_its_timeout_is_stopped(tmp_path: Path) -> None:
    outcome = SubprocessFioRunner(kill_grace=2).run(
        invocation(tmp_path, job(tmp_path, runtime="60s"), timeout=1.0), on_status=lambda s: None,
        cancel=threading.Event())
    assert outcome.timed_out and not outcome.cancelled
    assert pids_in_group(outcome.pid) == []


def test_missing_fio_names_the_debian_package(tmp_path: Path) -> None:
    runner = SubprocessFioRunner(binary="fio-not-installed-here")
    with pytest.raises(FioNotInstalledError, match=r"install Debian's package fio \(apt-get install fio\)"):
        runner.version()
    with pytest.raises(FioNotInstalledError):
        runner.run(invocation(tmp_path, "[t]\n"), on_status=lambda s: None, cancel=threading.Event())
    assert not (tmp_path / "fio.json").exists()
    assert os.listdir(tmp_path) == ["job.fio"]
