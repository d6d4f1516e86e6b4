"""Each strategy on the simulated device (noise of the CV measured on this machine): finds the
optimum within the noise, bayesian needs fewer trials than the grid, a flat device keeps the
current settings, a drifting device is flagged, and constraints exclude what they must."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import pytest

from stortune.schemas.bench.stats import NOISE_FLOOR
from stortune.schemas.catalog import Value
from stortune.schemas.tuning.engine import Engine
from stortune.schemas.tuning.experiment import TuningSpec
from stortune.schemas.tuning.simulate import (
    NOISE_CV,
    Surface,
    drive,
    flat,
    search_cost,
    streaming,
    true_best,
    within_noise,
)
from tests.schemas.tuning.docs import experiment

BASELINE = {"read_ahead_kb": 128, "nr_requests": 64, "scheduler": "mq-deadline"}
TOLERANCE = max(NOISE_FLOOR, NOISE_CV)


def spec(strategy: str, **extra: Any) -> TuningSpec:
    return experiment(strategy=strategy, budget={"trials": 400}, parameters=[
        {"tunable": "read_ahead_kb", "values": [0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]},
        {"tunable": "nr_requests", "range": {"min": 32, "max": 1024, "scale": "log", "steps": 6}},
        {"tunable": "scheduler", "values": ["none", "mq-deadline"]}], **extra).spec


@pytest.mark.parametrize("strategy", ["one-at-a-time", "grid", "bayesian"])
def test_each_strategy_finds_the_optimum_within_the_noise(strategy: str) -> None:
    cost = search_cost(spec(strategy), BASELINE, Surface(streaming, seed=11), seed=11)
    assert within_noise(spec(strategy), cost.found, cost.best, TOLERANCE), cost
    assert cost.to_within_noise is not None


def test_bayesian_gets_there_in_fewer_trials_than_the_grid() -> None:
    grid = search_cost(spec("grid"), BASELINE, Surface(streaming, seed=12), seed=12)
    bayes = search_cost(spec("bayesian"), BASELINE, Surface(streaming, seed=12), seed=12)
    assert bayes.to_within_noise is not None and grid.to_within_noise is not None
    assert bayes.to_within_noise < grid.to_within_noise
    assert bayes.trials <= 0.4 * grid.trials  # the search stops once the model stalls
    assert bayes.points < grid.points == 120


def test_one_at_a_time_measures_at_most_the_sum_of_the_value_counts() -> None:
    s = spec("one-at-a-time")
    cost = search_cost(s, BASELINE, Surface(streaming, seed=13), seed=13)
    assert cost.points <= sum(len(p.choices()) for p in s.parameters)


def test_the_bayesian_search_replays_to_the_same_proposal() -> None:
    s = spec("bayesian")
    live = Engine(s, BASELINE, seed=3)
    surface = Surface(streaming, seed=3)
    for _ in range(30):
        req = live.next()
        assert req is not None
        live.record(surface.run(req))
    restarted = Engine(s, BASELINE, history=live.measurements, seed=3)
    assert restarted.next() == live.next()


@pytest.mark.parametrize("strategy", ["one-at-a-time", "grid", "bayesian"])
def test_a_flat_surface_keeps_the_current_settings(strategy: str) -> None:
    out = drive(Engine(spec(strategy), BASELINE, seed=4), Surface(flat, seed=4))
    assert out.recommendation.keepCurrent and out.recommendation.values == BASELINE
    assert "noise" in out.recommendation.reason or "measured best" in out.recommendation.reason


def test_a_surface_that_shifts_during_the_run_trips_the_baseline_check() -> None:
    out = drive(Engine(spec("one-at-a-time"), BASELINE), Surface(streaming, drift=0.02, seed=5))
    assert not out.baseline.reliable
    assert "moved" in out.baseline.reason and (out.baseline.moved_pct or 0) > 20
    steady = drive(Engine(spec("one-at-a-time"), BASELINE), Surface(streaming, seed=5))
    assert steady.baseline.reliable, steady.baseline.reason


def test_a_latency_bound_excludes_the_unconstrained_optimum() -> None:
    free = spec("grid")
    (best, _) = true_best(free, streaming, "read_bandwidth")
    assert best["read_ahead_kb"] == 2048
    bounded = spec("grid", constraints=[{"metric": "read_lat_p99", "max": "15ms"}])
    out = drive(Engine(bounded, BASELINE, seed=6), Surface(streaming, seed=6))
    chosen = out.recommendation.values
    assert not out.recommendation.keepCurrent
    assert streaming(chosen)["read_lat_p99"] <= 15_000 and chosen["read_ahead_kb"] == 1024
    too_slow = [t for t in out.trials if t.point["read_ahead_kb"] >= 2048]
    assert too_slow and all(not t.feasible and "read_lat_p99" in t.violations[0] for t in too_slow)


def unfair(point: Mapping[str, Value]) -> dict[str, float]:
    """Large read-ahead starves concurrent streams: per-job CV grows with it."""
    ra = point["read_ahead_kb"]
    assert isinstance(ra, int)
    return {**streaming(point), "job_cv": 2 + ra / 256}


def test_a_fairness_bound_excludes_windows_that_starve_streams() -> None:
    s = spec("one-at-a-time", constraints=[{"fairness": "read_bandwidth", "maxCV": "10%"}])
    out = drive(Engine(s, BASELINE, seed=7), Surface(unfair, seed=7))
    ra = out.recommendation.values["read_ahead_kb"]
    assert isinstance(ra, int) and 2 + ra / 256 <= 10 * 1.2
    assert any("per-job read_bandwidth CV" in v for t in out.trials for v in t.violations)


def test_a_memory_bound_rules_out_stripe_caches_before_any_run() -> None:
    s = experiment(target={"device": {"kind": ["md"]}}, constraints=[{"memory": "64MiB"}], parameters=[
        {"tunable": "stripe_cache_size", "values": [256, 1024, 4096, 8192, 16384]}]).spec

    def cache(point: Mapping[str, Value]) -> dict[str, float]:
        size = point["stripe_cache_size"]
        assert isinstance(size, int)
        return {"read_bandwidth": 1e8 * (1 + size / 4096)}

    eng = Engine(s, {"stripe_cache_size": 256}, members=4)
    out = drive(eng, Surface(cache, seed=8))
    assert {m.point["stripe_cache_size"] for m in eng.measurements} <= {256, 1024, 4096}
    assert out.recommendation.values == {"stripe_cache_size": 4096}


def test_effects_say_which_parameters_mattered() -> None:
    out = drive(Engine(spec("one-at-a-time"), BASELINE, seed=9), Surface(streaming, seed=9))
    effects = out.effects
    assert effects["read_ahead_kb"] is not None and effects["read_ahead_kb"] > 100
    assert effects["scheduler"] is not None and effects["scheduler"] < effects["read_ahead_kb"] / 5


def test_the_engine_imports_no_optimiser_until_the_bayesian_search_runs() -> None:
    code = ("import sys, stortune.schemas.tuning.engine, stortune.schemas.tuning.experiment,"
            " stortune.schemas.tuning.overlay; assert 'optuna' not in sys.modules, 'optuna imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    planner = ("import sys, stortune.schemas.planner, stortune.schemas.documents;"
               " assert not [m for m in sys.modules if m.startswith('stortune.schemas.tuning')]")
    subprocess.run([sys.executable, "-c", planner], check=True, timeout=60)
