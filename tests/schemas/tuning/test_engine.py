"""The engine's order, budget, failures and replay, driven by the simulated device."""

from __future__ import annotations

import pytest

from stortune.schemas.tuning.engine import Engine, trial_plan
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


def test_the_plan_says_what_a_run_will_do_before_it_runs() -> None:
    plan = trial_plan(experiment().spec, BASELINE)
    assert plan.parameters == {"read_ahead_kb": [0, 128, 1024, 4096, 16384],
                               "nr_requests": [32, 64, 128, 256]}
    assert plan.grid_size == 20 and plan.baseline_runs == 3 and plan.confirm_runs == 3
    assert plan.first == [{"read_ahead_kb": v, "nr_requests": 64} for v in (128, 1024, 4096, 16384)]
    assert plan.trials_estimate <= plan.trials_budget
    grid = trial_plan(experiment(strategy="grid").spec, BASELINE)
    assert grid.first[:2] == [{"read_ahead_kb": 0, "nr_requests": 32},
                              {"read_ahead_kb": 0, "nr_requests": 64}]
    md = experiment(target={"device": {"kind": ["md"]}}, constraints=[{"memory": "64MiB"}],
                    parameters=[{"tunable": "stripe_cache_size", "values": [256, 4096, 8192]}]).spec
    capped = trial_plan(md, {"stripe_cache_size": 256}, members=4)
    assert capped.parameters == {"stripe_cache_size": [256, 4096]}
    assert capped.excluded == {"stripe_cache_size": [8192]}


def test_a_run_rebuilt_after_it_ended_keeps_its_reason() -> None:
    for trials, elapsed, reason in ((60, 0.0, "done"), (13, 0.0, "budget-trials"),
                                    (60, 5000.0, "budget-duration")):
        spec = experiment(budget={"trials": trials, "duration": "30m"}).spec
        eng = Engine(spec, BASELINE)
        surface = Surface(streaming, seed=6)
        while (req := eng.next(elapsed_s=elapsed if len(eng.measurements) > 4 else 0.0)) is not None:
            eng.record(surface.run(req))
        assert eng.finished_reason == reason
        again = Engine(spec, BASELINE, history=eng.measurements)
        assert again.next() is None and again.finished_reason == reason


def test_a_run_without_a_finite_objective_counts_as_failed() -> None:
    eng = Engine(experiment().spec, BASELINE)
    req = eng.next()
    assert req is not None
    eng.record(Measurement(index=0, point=req.point, purpose=req.purpose,
                           metrics={"read_bandwidth": float("nan")}))
    out = eng.outcome()
    assert out.trials[0].n == 0 and out.trials[0].failures == 1
    again = eng.next()
    assert again is not None and again.purpose == "baseline" and "run 2" in again.reason
