"""`stortune-agent tune` ends at spec.budget.duration (issue 26, point 5): the fio run in flight
is stopped and not measured, the settings go back, the experiment lock is released, and the
command says so and exits 1. The deadline is read from a clock the tests move (no waiting)."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from stortune.agent import journal, local, tune_cli
from stortune.agent.tune import LocalExperiment, TuneResult
from stortune.schemas.documents import parse_profile
from stortune.schemas.tuning.timing import DEADLINE
from tests.agent.surfacefio import SurfaceFio
from tests.agent.test_tune import experiment, readahead_surface, run_experiment, untouched, with_node
from tests.agent.test_tune import tune_cli as run_cli
from tests.fixtures.agent_host import Host

#: spec.budget.duration of these experiments, in seconds.
TEN_MINUTES = 600.0


class Clock:
    """A monotonic clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def late_on_the_first_point(clock: Clock) -> Callable[[Mapping[str, str]], bool]:
    """A hold for SurfaceFio: the first run off the baseline (read-ahead 128) is still running
    when the deadline passes (the clock moves past it), and holds until it is stopped."""
    def hold(settings: Mapping[str, str]) -> bool:
        if settings["read_ahead_kb"] == "128":
            return False
        clock.now += TEN_MINUTES + 1
        return True
    return hold


def finishes(target: Callable[[], Any], fio: SurfaceFio) -> None:
    """Run ``target`` in a thread; without the deadline the held run would never end, so after a
    generous wait fio is released (the test then fails on what ended it, instead of hanging)."""
    worker = threading.Thread(target=target)
    worker.start()
    worker.join(60)
    stuck = worker.is_alive()
    fio.release.set()
    worker.join(60)
    assert not stuck, "the run in flight at the deadline was not stopped"


@pytest.mark.parametrize("runtime", ["1000000h", "86401s"])
def test_hostile_a_runtime_past_a_day_is_refused_naming_the_field_before_anything_runs(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str], runtime: str) -> None:
    doc = experiment(workloads=[{"preset": "stream-32k", "runtime": runtime}], budget={"trials": 10_000})
    for extra in ((), ("--dry-run",)):
        assert run_cli(with_node(host), tmp_path, doc, *extra) == 1
        err = capsys.readouterr().err
        assert "spec.workloads[0].runtime" in err and "longer than a day" in err, err
        assert "Traceback" not in err
        untouched(host, tmp_path)


def test_hostile_the_dry_run_refuses_what_the_run_refuses(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A desired profile that would beat the trials' values: the run's refusal, from the dry run."""
    top = parse_profile({"apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "a-top"},
                         "spec": {"priority": 1000, "rules": [{"name": "r", "match": {"kind": ["loop"]},
                                                               "settings": {"nr_requests": 64}}]}})
    assert local.converge(host.fs, [top], tmp_path / "state").ok
    assert run_cli(with_node(host), tmp_path, experiment(), "--dry-run") == 1
    captured = capsys.readouterr()
    assert "a-top have the highest priority" in captured.err and captured.out == "", captured
    assert journal.experiment_running(tmp_path / "state") is None


def test_hostile_the_deadline_stops_the_trial_in_flight_and_gives_the_host_back(
        host: Host, tmp_path: Path) -> None:
    """applyResult is asked for, but a run cut by its deadline was never confirmed: nothing kept."""
    state = tmp_path / "state"
    base = parse_profile({"apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "base"},
                          "spec": {"rules": [{"name": "r", "match": {"kind": ["loop"]},
                                              "settings": {"nr_requests": 64}}]}})
    assert local.converge(host.fs, [base], state).ok
    clock = Clock()
    doc = experiment(applyResult=True, budget={"trials": 30, "duration": "10m"})
    exp, fio = run_experiment(host, tmp_path, doc, clock=clock)
    fio.hold_if = late_on_the_first_point(clock)
    results: list[TuneResult] = []
    finishes(lambda: results.append(exp.run()), fio)

    (result,) = results
    assert result.finished == DEADLINE
    # The baseline's runs are measured; the run stopped at the deadline is not evidence.
    assert [t.measurement.point["read_ahead_kb"] for t in result.trials] == [128] * 3
    assert [s["read_ahead_kb"] for s in fio.seen] == ["128"] * 3 + ["0"]
    assert result.left == "settings"
    assert host.queue("read_ahead_kb") == "128" and host.queue("nr_requests") == "64"
    saved = local.saved_desired(state)
    assert saved is not None and [p.name for p in saved.profiles] == ["base"]
    assert journal.experiment_running(state) is None and journal.abandoned_experiment(state) is None
    assert not list((state / "bench").iterdir())


def test_the_command_says_the_deadline_ended_it_and_exits_1(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    fio = SurfaceFio(host.fs, "loop7", readahead_surface())
    fio.hold_if = late_on_the_first_point(clock)
    # The CLI's experiment, with fio and the clock replaced at their seams.
    monkeypatch.setattr(tune_cli, "LocalExperiment",
                        functools.partial(LocalExperiment, runner=fio, clock=clock))
    codes: list[int] = []
    doc = experiment(budget={"trials": 30, "duration": "10m"})
    finishes(lambda: codes.append(run_cli(with_node(host), tmp_path, doc)), fio)

    assert codes == [1]
    err = capsys.readouterr().err
    assert "the time budget ran out (spec.budget.duration 10m) after 3 trial(s)" in err, err
    assert "loop7 is back at its settings" in err
    assert host.queue("read_ahead_kb") == "128"
    assert journal.experiment_running(tmp_path / "state") is None


def test_the_search_stops_in_time_for_its_closing_runs_and_ends_by_its_budget(
        host: Host, tmp_path: Path) -> None:
    """Trials of 5 s against a 15 minute budget, each taking a minute by the clock: judged with the
    confirmation and the end baseline reserved (6 runs at the pace so far), the search is cut
    while they still fit, so the experiment ends by its budget, confirmed, the last run ending
    on the deadline itself and not cut by it."""
    clock = Clock()
    doc = experiment(budget={"trials": 30, "duration": "15m"})
    exp, fio = run_experiment(host, tmp_path, doc, clock=clock)
    surface = readahead_surface()

    def a_minute_each(settings: Mapping[str, str]) -> float:
        clock.now += 60
        return surface(settings)

    fio.response = a_minute_each
    started = clock.now
    result = exp.run()
    assert result.finished == "budget-duration"
    assert clock.now - started == 15 * 60
    purposes = [t.measurement.purpose for t in result.trials]
    assert purposes[-6:] == ["confirm"] * 3 + ["baseline-end"] * 3, purposes
    assert host.queue("read_ahead_kb") == "128"


def test_the_dry_run_shows_how_long_the_device_is_held_and_writes_nothing(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The figures of the control plane's dry run (trialSeconds, estimatedSeconds, durationSeconds),
    from the same function; the estimate is capped by budget.duration."""
    long_trials = experiment(workloads=[{"preset": "stream-32k", "runtime": "50s"}],
                             budget={"trials": 30, "duration": "10m"})
    assert run_cli(with_node(host), tmp_path, long_trials, "--dry-run", "-o", "json") == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["device"] == "loop7" and plan["baseline"] == {"read_ahead_kb": 128}
    assert plan["trialSeconds"] == 50 and plan["durationSeconds"] == TEN_MINUTES
    assert plan["estimatedTrials"] * 50 > TEN_MINUTES and plan["estimatedSeconds"] == TEN_MINUTES
    untouched(host, tmp_path)

    short_trials = experiment(budget={"trials": 30, "duration": "10m"})
    assert run_cli(host, tmp_path, short_trials, "--dry-run") == 0
    out = capsys.readouterr().out
    trials = int(out.split("about ", 1)[1].split(" trial(s)")[0])
    assert f"time: about {trials * 5}s (5s a trial); the host is given back within 10m" in out, out
    untouched(host, tmp_path)
