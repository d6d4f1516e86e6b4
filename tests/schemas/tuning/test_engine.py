"""The engine's order, budget, failures and replay, driven by the simulated device."""

from __future__ import annotations

import pytest

from stortune.schemas.tuning.engine import Engine
from stortune.schemas.tuning.simulate import Surface, drive, flat, streaming
from stortune.schemas.tuning.space import Measurement, TrialRequest
from tests.schemas.tuning.docs import experiment

BASELINE = {"read_ahead_kb": 0, "nr_requests": 64}


def test_the_baseline_comes_first_and_last() -> None:
    eng = Engine(experiment().spec, BASELINE)
    drive(eng, Surface(streaming, seed=1))
    purposes = [m.purpose for m in eng.measurements]
    assert purposes[:2] == ["baseline", "baseline"]
    assert purposes[-2:] == ["baseline-end", "baseline-end"]
    assert all(m.point == BASELINE for m in eng.measurements if m.purpose.startswith("baseline"))
    assert eng.finished_reason == "done"
    assert eng.next() is None


def test_the_baseline_must_name_every_parameter() -> None:
    with pytest.raises(ValueError, match="no value for nr_requests"):
        Engine(experiment().spec, {"read_ahead_kb": 0})


def test_replay_from_history_continues_with_the_same_request() -> None:
    spec = experiment(strategy="grid").spec
    live = Engine(spec, BASELINE)
    surface = Surface(streaming, seed=2)
    for _ in range(9):
        req = live.next()
        assert req is not None
        live.record(surface.run(req))
    again = Engine(spec, BASELINE, history=list(live.measurements))
    assert again.next() == live.next()
    # Recording a trial twice (a retried write) changes nothing; a different one is refused.
    again.record(live.measurements[3])
    assert len(again.measurements) == 9
    with pytest.raises(ValueError, match="already recorded"):
        other = {"read_ahead_kb": 4, "nr_requests": 64}
        again.record(live.measurements[3].model_copy(update={"point": other}))
    with pytest.raises(ValueError, match="before trial 9"):
        again.record(live.measurements[3].model_copy(update={"index": 11}))


def test_a_failed_point_is_retried_once_and_counts_against_the_budget() -> None:
    def fail(req: TrialRequest) -> str | None:
        return "fio died" if req.point.get("read_ahead_kb") == 1024 else None

    eng = Engine(experiment().spec, BASELINE)
    out = drive(eng, Surface(streaming, seed=3, fail=fail))
    failed = [m for m in eng.measurements if not m.ok]
    assert len(failed) == 2 and {m.point["read_ahead_kb"] for m in failed} == {1024}
    assert out.failed == 2
    assert all(s.point["read_ahead_kb"] != 1024 for s in out.trials if s.feasible)


def test_the_trial_budget_keeps_room_for_the_confirmation_and_the_end_baseline() -> None:
    eng = Engine(experiment(budget={"trials": 13}).spec, BASELINE)
    drive(eng, Surface(streaming, seed=4))
    purposes = [m.purpose for m in eng.measurements]
    assert len(purposes) == 13
    assert purposes[-6:] == ["confirm"] * 3 + ["baseline-end"] * 3
    assert eng.finished_reason == "budget-trials"


def test_the_duration_budget_ends_the_search() -> None:
    eng = Engine(experiment().spec, BASELINE)
    surface = Surface(streaming, seed=5)
    elapsed = 0.0
    while (req := eng.next(elapsed_s=elapsed)) is not None:
        eng.record(surface.run(req))
        elapsed += 10.0 if len(eng.measurements) < 5 else 2000.0  # 30 minutes are up after 5 trials
    purposes = [m.purpose for m in eng.measurements]
    assert purposes[3:5] == ["explore", "explore"]
    assert set(purposes[5:]) == {"confirm", "baseline-end"} and purposes[-1] == "baseline-end"
    assert eng.finished_reason == "budget-duration"


def test_a_baseline_that_fails_twice_ends_the_experiment() -> None:
    eng = Engine(experiment().spec, BASELINE)
    out = drive(eng, Surface(streaming, fail=lambda req: "apply refused"))
    assert eng.finished_reason == "baseline-failed"
    assert len(eng.measurements) == 2
    assert out.recommendation.keepCurrent


def test_progress_names_the_leader_and_the_best_so_far() -> None:
    eng = Engine(experiment().spec, BASELINE)
    drive(eng, Surface(streaming, seed=6))
    progress = eng.progress()
    assert progress.done == len(eng.measurements)
    assert progress.leader is not None and progress.leader["read_ahead_kb"] >= 1024
    assert len(progress.best_so_far) == progress.done
    best = [b for b in progress.best_so_far if b is not None]
    assert best[-1] == progress.leader_mean


def test_one_at_a_time_sweeps_each_parameter_from_the_baseline() -> None:
    eng = Engine(experiment(repeats={"min": 1, "max": 1}).spec, BASELINE)
    drive(eng, Surface(streaming, seed=7))
    explored = [m.point for m in eng.measurements if m.purpose == "explore"]
    first = [p for p in explored if p["nr_requests"] == 64]
    assert [p["read_ahead_kb"] for p in first] == [128, 1024, 4096, 16384]
    best_ra = {p["read_ahead_kb"] for p in explored if p["nr_requests"] != 64}
    assert len(best_ra) == 1 and best_ra <= {1024, 4096}


def test_a_flat_device_keeps_the_current_settings() -> None:
    out = drive(Engine(experiment().spec, BASELINE), Surface(flat, seed=8))
    assert out.recommendation.keepCurrent
    assert out.recommendation.values == BASELINE
    assert not out.recommendation.significant


def test_measurements_of_another_experiment_are_refused() -> None:
    eng = Engine(experiment().spec, BASELINE)
    with pytest.raises(ValueError, match="not a point of this experiment"):
        eng.record(Measurement(index=0, point={"scheduler": "none"}, purpose="baseline"))
