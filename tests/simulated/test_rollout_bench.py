"""bench/rollout.py for real, small: a handful of hollow hosts take a change all at once, then
in waves 1 / 10% / 100%, and the script ends with its one JSON line; its flags are bounded and
SIGTERM stops the control plane it started."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.hollow import host_name
from bench.rollout import NAME, WAVES
from stortune.schemas.rollout.spec import RolloutSpec
from stortune.schemas.rollout.waves import deal

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = [sys.executable, str(ROOT / "bench/rollout.py")]
HOSTS = 5


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.parametrize(("flags", "named"), [
    (["--hosts", "0"], "--hosts"),
    (["--hosts", "60001"], "--hosts"),
    (["--procs", "0"], "--procs"),
    (["--rounds", "0"], "--rounds"),
    (["--rounds", "21"], "--rounds"),
    (["--step", "0.01"], "--step"),
    (["--port", "80"], "--port"),
    (["--db", "sqlite:///x.db"], "--db"),
])
def test_hostile_flags_refused_naming_the_flag(flags: list[str], named: str) -> None:
    done = subprocess.run([*SCRIPT, *flags], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert named in done.stderr
    assert done.stdout == ""


@pytest.mark.slow(seconds=25)
def test_hostile_sigterm_mid_run_stops_the_control_plane() -> None:
    bench = subprocess.Popen([*SCRIPT, "--hosts", "3", "--procs", "1", "--step", "0.1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert bench.stderr is not None
    try:
        first = bench.stderr.readline()  # "N hollow hosts ... (pid PID)", once the server is up
        match = re.search(r"\(pid (\d+)\)", first)
        assert match, first
        server = int(match.group(1))
        assert _alive(server)
        bench.send_signal(signal.SIGTERM)
        out, _ = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 143
    assert out == ""  # no figures from an interrupted run
    deadline = time.monotonic() + 30
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(server)


@pytest.mark.slow(seconds=40)
def test_a_handful_of_hosts_all_at_once_then_in_waves_twice() -> None:
    # Two rounds: the second's changes must still concern every host (values not set before).
    done = subprocess.run([*SCRIPT, "--hosts", str(HOSTS), "--procs", "1", "--step", "0.1",
                           "--interval", "5", "--rounds", "2"],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout  # one JSON line, progress on stderr
    result = json.loads(lines[0])
    assert set(result) == {"hosts", "all_at_once_s", "rollout_s", "ratio", "all_at_once_cpu_ms_per_host",
                           "rollout_cpu_ms_per_host", "waves", "db", "rounds"}
    assert result["hosts"] == HOSTS
    assert result["db"] == "sqlite"
    assert result["rounds"] == 2
    assert done.stderr.count("waves 1 / 10% / 100%: generation") == 2
    # The waves the server dealt are the pure core's for these hosts (5: one canary, 10% of 5
    # rounds up to the canary already taken, the rest).
    names = [host_name(i) for i in range(HOSTS)]
    expected = [len(w) for w in deal(NAME, names, RolloutSpec.model_validate({"waves": WAVES}).waves)]
    assert result["waves"] == expected
    assert sum(result["waves"]) == HOSTS
    assert result["all_at_once_s"] > 0 and result["rollout_s"] > 0
    assert result["ratio"] == pytest.approx(result["rollout_s"] / result["all_at_once_s"], rel=0.01)
    # The server worked for both changes (its CPU, not this process's).
    assert result["all_at_once_cpu_ms_per_host"] > 0 and result["rollout_cpu_ms_per_host"] > 0
