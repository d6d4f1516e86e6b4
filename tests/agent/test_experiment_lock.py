"""The experiment lock: while `stortune-agent tune` runs, only its own changes reach the kernel.

Every other apply, restore, recovery and benchmark on the state directory (the
daemon's converge, the control plane's Apply and StartBenchmark) is refused with
"busy: experiment <id> running"; an experiment killed before it put its device
back is undone at the next start.
"""

from __future__ import annotations

import contextvars
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stortune.agent import daemon, journal, local
from stortune.agent.journal import ExperimentBusyError, HostBusyError
from stortune.agent.kernelfs import KernelFS
from stortune.agent.serve import Agent
from stortune.schemas.documents import parse_profile
from stortune.schemas.profile import StorageProfile
from stortune.server.agentclient import AgentBusy
from tests.agent.fakekernel import read_queue
from tests.fixtures.agent_host import Host
from tests.rpc.conftest import call, profile


def loops(name: str, priority: int = 0, **settings: int | str) -> StorageProfile:
    return parse_profile({
        "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": name},
        "spec": {"priority": priority,
                 "rules": [{"name": "all", "match": {"name": ["fake0"]}, "settings": settings}]},
    })


def elsewhere(fn: object, *args: object) -> object:
    """Call ``fn`` as code that does not hold the experiment (another thread, the daemon)."""
    return contextvars.Context().run(fn, *args)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "two words", "tab\there", "new\nline"])
def test_an_experiment_id_must_be_one_word(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="must be one word"), journal.hold_experiment(tmp_path, bad):
        pass
    assert journal.experiment_running(tmp_path) is None
    assert journal.abandoned_experiment(tmp_path) is None


def test_only_the_experiment_itself_may_change_settings(fake_kernel: KernelFS, tmp_path: Path) -> None:
    state = tmp_path / "state"
    base = loops("base", nr_requests=64)
    assert local.converge(fake_kernel, [base], state).ok
    with journal.hold_experiment(state, "exp-7"):
        assert journal.experiment_running(state) == "exp-7"
        # Its own trial: applied with the desired state, never stored as desired.
        trial = local.converge(fake_kernel, [base], state, overlay=[loops("trial", 100, read_ahead_kb=0)])
        assert trial.ok and read_queue(fake_kernel, "fake0", "read_ahead_kb") == "0"
        # Anyone else, the daemon's converge first of all, is told who holds the host.
        with pytest.raises(ExperimentBusyError, match="busy: experiment exp-7 running"):
            elsewhere(daemon.converge, fake_kernel, state)
        with pytest.raises(HostBusyError):
            elsewhere(local.restore, fake_kernel, state)
        with pytest.raises(ExperimentBusyError):
            elsewhere(lambda: journal.hold_benchmark(state, "other").__enter__())
        with pytest.raises(ExperimentBusyError, match="exp-7"), journal.hold_experiment(state, "exp-8"):
            pass
        assert read_queue(fake_kernel, "fake0", "read_ahead_kb") == "0"
        # The end of a trial: back to the desired state alone.
        assert local.converge(fake_kernel, [base], state).ok
    assert journal.experiment_running(state) is None and journal.abandoned_experiment(state) is None
    assert read_queue(fake_kernel, "fake0", "read_ahead_kb") == "128"
    saved = local.saved_desired(state)
    assert saved is not None and [p.metadata.name for p in saved.profiles] == ["base"]
    report = daemon.converge(fake_kernel, state)  # free again
    assert report is not None and report.ok


def test_a_converge_that_remembers_nothing_keeps_no_desired_state(fake_kernel: KernelFS,
                                                                   tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert local.converge(fake_kernel, [], state, overlay=[loops("trial", read_ahead_kb=0)],
                          remember=False).ok
    assert local.saved_desired(state) is None
    assert local.converge(fake_kernel, [], state, remember=False).ok
    assert read_queue(fake_kernel, "fake0", "read_ahead_kb") == "128"
    assert journal.load_originals(state) == {}


def test_an_apply_over_grpc_during_an_experiment_is_busy(agent: Agent, host: Host) -> None:
    with journal.hold_experiment(agent.state_dir, "exp-rpc"):
        with pytest.raises(AgentBusy) as err:
            call(lambda c: c.for_address(agent.address).apply([profile(read_ahead_kb=4096)], {}, "x"))
        assert err.value.retryable and err.value.code == "ABORTED"
        assert "busy: experiment exp-rpc running" in str(err.value)
        assert host.queue("read_ahead_kb") == "128"
    result = call(lambda c: c.for_address(agent.address).apply([profile(read_ahead_kb=4096)], {}, "y"))
    assert result.ok and host.queue("read_ahead_kb") == "4096"


HOLDER = """
import sys, time
from stortune.agent import journal, local
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.documents import parse_profile

sysfs, procfs, state = sys.argv[1:]
trial = parse_profile({"apiVersion": "stortune/v1", "kind": "StorageProfile",
                       "metadata": {"name": "tune-x"},
                       "spec": {"priority": 1000, "rules": [{"name": "t", "match": {"name": ["fake0"]},
                                                            "settings": {"read_ahead_kb": 0}}]}})
with journal.hold_experiment(state, "exp-killed"):
    local.converge(KernelFS.at(sysfs, procfs), [], state, overlay=[trial], remember=False)
    print("trial", flush=True)
    time.sleep(60)
"""


def test_an_experiment_killed_mid_trial_is_undone_at_the_next_start(fake_kernel: KernelFS,
                                                                     tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert local.converge(fake_kernel, [loops("base", nr_requests=64)], state).ok
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(fake_kernel.sysfs),
                              str(fake_kernel.procfs), str(state)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "trial", child.stderr
        assert journal.experiment_running(state) == "exp-killed"
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=30)
    assert read_queue(fake_kernel, "fake0", "read_ahead_kb") == "0"  # the trial's value, left behind
    assert journal.experiment_running(state) is None
    assert journal.abandoned_experiment(state) == "exp-killed"
    with pytest.raises(journal.StateError, match="experiment exp-killed was interrupted"), \
            journal.hold_experiment(state, "next"):
        pass

    done = local.recover(fake_kernel, state)  # what serve, apply and restore do first

    assert done is not None and "experiment exp-killed was interrupted" in done
    assert read_queue(fake_kernel, "fake0", "read_ahead_kb") == "128"
    assert read_queue(fake_kernel, "fake0", "nr_requests") == "64"  # the desired state stays
    assert journal.abandoned_experiment(state) is None
    assert local.recover(fake_kernel, state) is None
    with journal.hold_experiment(state, "next"):
        pass


def test_a_failure_inside_the_experiment_leaves_it_for_recovery(fake_kernel: KernelFS,
                                                                tmp_path: Path) -> None:
    state = tmp_path / "state"
    with pytest.raises(RuntimeError), journal.hold_experiment(state, "exp-err"):
        local.converge(fake_kernel, [], state, overlay=[loops("t", read_ahead_kb=0)], remember=False)
        raise RuntimeError("trial went wrong")
    assert journal.abandoned_experiment(state) == "exp-err"
    assert local.recover(fake_kernel, state) is not None
    assert read_queue(fake_kernel, "fake0", "read_ahead_kb") == "128"
