"""`stortune-agent tune` for real: fio on a direct-I/O loop device, the command as a user runs it.

The device (``stream_loop``) reads past the page cache, so read-ahead decides what 8
buffered 32K streams get: a sweep must find that 0 is worst by far. Then the faults: a
SIGKILL mid-trial leaves the device consistent and the next start puts it back; Ctrl-C
stops fio and puts the settings back before the command exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stortune.agent import journal
from tests.agent.procs import processes_with
from tests.loopdev import queue_attributes

pytestmark = [pytest.mark.root, pytest.mark.slow]
AGENT = [sys.executable, "-m", "stortune.agent.cli"]


def experiment(device: str, values: list[int], *, repeats: dict[str, int] | None = None,
               trials: int = 16) -> dict[str, Any]:
    return {
        "apiVersion": "stortune/v1", "kind": "TuningExperiment", "metadata": {"name": "loop-readahead"},
        "spec": {
            "target": {"device": {"kind": ["loop"], "name": [device]}},
            "workloads": [{"preset": "stream-32k", "runtime": "20s"}],
            "objective": {"metric": "read_bandwidth", "goal": "maximize"},
            "parameters": [{"tunable": "read_ahead_kb", "values": values}],
            "strategy": "one-at-a-time",
            "repeats": repeats or {"min": 2, "max": 3},
            "budget": {"trials": trials},
        },
    }


def backing(device: str) -> str:
    return (Path("/sys/block") / device / "loop" / "backing_file").read_text().strip()


def agent(*args: str, state: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*AGENT, *args, "--state-dir", str(state)], capture_output=True, text=True,
                          timeout=600, check=False)
    if check:
        assert proc.returncode in (0, 2), proc.stderr
    return proc


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    """The agent's state directory; any fio a test left behind is stopped afterwards."""
    path = tmp_path / "state"
    yield path
    for pid in processes_with(str(path)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start(tmp_path: Path, state: Path, doc: dict[str, Any]) -> subprocess.Popen[str]:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc))
    return subprocess.Popen([*AGENT, "tune", "-f", str(path), "--state-dir", str(state), "-o", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_trial(proc: subprocess.Popen[str], device: str, state: Path, value: str) -> None:
    """Until fio runs a trial with read_ahead_kb=``value`` (a trial value, not the baseline's)."""
    ra = Path("/sys/block") / device / "queue" / "read_ahead_kb"
    deadline = time.monotonic() + 300
    while not (ra.read_text().strip() == value and fio_running(state)):
        if proc.poll() is not None:
            pytest.fail(f"tune exited ({proc.returncode}) before the trial: {proc.communicate()[1]}")
        if time.monotonic() > deadline:
            pytest.fail("no trial with the new value started")
        time.sleep(0.05)


def fio_running(state: Path) -> bool:
    return any("fio" in Path(f"/proc/{pid}/comm").read_text() for pid in processes_with(str(state / "bench"))
               if Path(f"/proc/{pid}/comm").exists())


def test_a_readahead_sweep_finds_that_streams_need_it(stream_loop: str, tmp_path: Path, state: Path) -> None:
    before = queue_attributes(stream_loop)
    path, profile = tmp_path / "exp.yaml", tmp_path / "recommended.yaml"
    path.write_text(yaml.safe_dump(experiment(stream_loop, [0, 128, 1024])))

    run = agent("tune", "-f", str(path), "-o", "json", "--profile-out", str(profile), state=state)

    result = json.loads(run.stdout)
    rec = result["recommendation"]
    assert run.returncode == 0 and result["finished"] == "done", run.stderr
    assert result["current"] == {"read_ahead_kb": 0}
    assert not rec["keepCurrent"] and rec["values"]["read_ahead_kb"] >= 128, rec
    assert rec["significant"] and rec["gain"]["low"] > 0, rec
    # Back at its settings, every queue attribute as before; nothing recorded to put back.
    assert queue_attributes(stream_loop) == before
    assert journal.load_originals(state) == {} and journal.pending(state) == []
    assert journal.abandoned_experiment(state) is None

    # The recommendation is a profile that applies, after which the host is in sync with it.
    doc = yaml.safe_load(profile.read_text())
    (rule,) = doc["spec"]["rules"]
    assert rule["settings"] == {"read_ahead_kb": rec["values"]["read_ahead_kb"]}
    assert rule["match"]["id"] == ["loop:*/" + Path(backing(stream_loop)).name]  # this loop, not all
    applied = agent("apply", "-f", str(profile), state=state)
    assert applied.returncode == 0, applied.stderr
    assert queue_attributes(stream_loop)["read_ahead_kb"] == str(rec["values"]["read_ahead_kb"])
    assert agent("plan", "-f", str(profile), state=state).returncode == 0  # in sync: nothing to do
    assert agent("restore", state=state).returncode == 0
    assert queue_attributes(stream_loop) == before


def test_sigkill_mid_trial_leaves_the_device_consistent_and_the_next_start_puts_it_back(
        stream_loop: str, tmp_path: Path, state: Path) -> None:
    before = queue_attributes(stream_loop)
    proc = start(tmp_path, state, experiment(stream_loop, [0, 4096]))
    try:
        wait_for_trial(proc, stream_loop, state, "4096")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    # Consistent: the trial's apply was a whole transaction, its original recorded.
    assert journal.pending(state) == []
    (original,) = journal.load_originals(state).values()
    assert (original.tunable, original.value) == ("read_ahead_kb", 0)
    experiment_id = journal.abandoned_experiment(state)
    assert experiment_id is not None and experiment_id.startswith("loop-readahead-")

    # The next start of the agent (here its one-shot re-apply) puts the device back.
    restarted = agent("serve", "--once", state=state)
    assert restarted.returncode == 0, restarted.stderr
    assert f"experiment {experiment_id} was interrupted" in restarted.stderr
    assert queue_attributes(stream_loop) == before
    assert journal.abandoned_experiment(state) is None and journal.load_originals(state) == {}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_fio_and_puts_the_settings_back(stream_loop: str, tmp_path: Path, state: Path,
                                                     sig: signal.Signals) -> None:
    before = queue_attributes(stream_loop)
    proc = start(tmp_path, state, experiment(stream_loop, [0, 4096]))
    try:
        wait_for_trial(proc, stream_loop, state, "4096")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1 and f"interrupted by {sig.name}" in err, err
    assert json.loads(out)["finished"] == "interrupted"
    assert processes_with(str(state)) == []  # no fio left
    assert queue_attributes(stream_loop) == before
    assert journal.load_originals(state) == {} and journal.experiment_running(state) is None
    assert journal.abandoned_experiment(state) is None
