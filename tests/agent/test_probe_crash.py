"""kill -9 of the process running a probe: the host is free again, the probe is marked failed,
and the fio it had started (its own session, so it outlives the agent) is stopped by the next
agent instead of loading the disks under the next benchmark.

fio is a stand-in process (the fio runner seam's binary): it sleeps with the job file on its
command line, as fio does, and never touches the fixture's device nodes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stortune.agent import journal
from stortune.agent.kernelfs import KernelFS
from stortune.agent.probe.runner import ProbeManager
from tests.agent.test_probe import FIVE_SECONDS, fs  # noqa: F401 (fixture)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="device nodes need root (mknod)")

FAKE_FIO = """#!{python}
import sys, time
if "--version" in sys.argv:
    print("fio-3.33")
    sys.exit(0)
time.sleep(3600)
"""

CHILD = """
import sys, threading
from stortune.agent.bench.fio import SubprocessFioRunner
from stortune.agent.kernelfs import KernelFS
from stortune.agent.probe.jobs import ProbeSettings
from stortune.agent.probe.runner import ProbeManager

sysfs, procfs, dev, state, fio = sys.argv[1:]
manager = ProbeManager(KernelFS.at(sysfs, procfs, dev), __import__("pathlib").Path(state),
                       runner=SubprocessFioRunner(fio), settings=ProbeSettings(seconds=5))
manager.start("md0", "probe-crash")
threading.Event().wait()
"""


def _pids_running(needle: str) -> list[int]:
    """Processes (not zombies) whose command line holds ``needle``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state != "Z" and int(entry) != os.getpid():
            found.append(int(entry))
    return found


def _wait_for(what: str, check: object, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.05)


def test_a_killed_agent_frees_the_host_fails_its_probe_and_its_fio_is_stopped(
        fs: KernelFS, tmp_path: Path) -> None:  # noqa: F811
    fio = tmp_path / "fio"
    fio.write_text(FAKE_FIO.format(python=sys.executable))
    fio.chmod(0o755)
    state = tmp_path / "state"
    probe_dir = str(state / "probes" / "probe-crash")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(fs.sysfs), str(fs.procfs), str(fs.dev),
                              str(state), str(fio)])
    orphans: list[int] = []
    try:
        _wait_for("the probe's fio started", lambda: _pids_running(probe_dir) != [])
        orphans = _pids_running(probe_dir)
        assert journal.benchmark_running(state) == "probe-crash"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        # the agent is gone, its fio is not (its own session): it still reads the disks
        assert _pids_running(probe_dir) == orphans

        manager = ProbeManager(fs, state, settings=FIVE_SECONDS)  # the next agent
        _wait_for("the orphan fio stopped", lambda: _pids_running(probe_dir) == [])
        result = manager.result("probe-crash")
        assert result is not None and result.state == "failed"
        assert "stopped during the probe" in result.message
        with journal.hold_benchmark(state, "bench-after", apply_timeout=1):  # the host is free
            assert journal.benchmark_running(state) == "bench-after"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
