"""Search efficiency of the tuning strategies on the simulated surface, and the engine's own cost.

    .venv/bin/python bench/tuning_search.py [--seeds 10] [--json]

The surface (stortune.schemas.tuning.simulate.streaming) is buffered 32K streams against
read_ahead_kb (10 values) x nr_requests (6, log scale) x scheduler (2): 120 points, with
multiplicative noise of the CV measured on this machine (simulate.NOISE_CV). For every
strategy and seed the whole experiment runs (2 to 5 repeats, baselines at both ends) and
the script counts the trials until the leader's true value stays within the noise floor (5%)
of the best point of the exhaustive grid. Targets (issue 15): bayesian at most 40% of the
grid's trials; one-at-a-time at most the sum of the parameters' value counts (in points).
It also times ``Engine.next`` + ``Engine.record`` per trial (the orchestration the engine adds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from stortune.schemas.bench.stats import NOISE_FLOOR
from stortune.schemas.tuning.engine import Engine
from stortune.schemas.tuning.experiment import TuningSpec, parse_experiment
from stortune.schemas.tuning.simulate import NOISE_CV, Surface, search_cost, streaming, within_noise

BASELINE = {"read_ahead_kb": 128, "nr_requests": 64, "scheduler": "mq-deadline"}


def spec(strategy: str, trials: int = 400) -> TuningSpec:
    return parse_experiment({
        "apiVersion": "stortune/v1", "kind": "TuningExperiment", "metadata": {"name": "search"},
        "spec": {
            "target": {"device": {"kind": ["loop"]}},
            "workloads": [{"preset": "stream-32k", "runtime": "20s"}],
            "objective": {"metric": "read_bandwidth", "goal": "maximize"},
            "parameters": [
                {"tunable": "read_ahead_kb", "values": [0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]},
                {"tunable": "nr_requests", "range": {"min": 32, "max": 1024, "scale": "log", "steps": 6}},
                {"tunable": "scheduler", "values": ["none", "mq-deadline"]},
            ],
            "strategy": strategy, "repeats": {"min": 2, "max": 5}, "budget": {"trials": trials},
        }}).spec


def engine_seconds_per_trial(strategy: str, seed: int) -> tuple[float, float]:
    """Wall time of next() + record() per trial over a whole run (the surface's time excluded),
    and of one progress() at the end (the live view's, the dearest: it replays the whole run)."""
    s = spec(strategy)
    engine = Engine(s, BASELINE, seed=seed)
    surface = Surface(streaming, seed=seed)
    spent = 0.0
    while True:
        t0 = time.perf_counter()
        req = engine.next()
        spent += time.perf_counter() - t0
        if req is None:
            break
        m = surface.run(req)
        t0 = time.perf_counter()
        engine.record(m)
        spent += time.perf_counter() - t0
    t0 = time.perf_counter()
    engine.progress()
    return spent / max(1, len(engine.measurements)), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    report: dict[str, Any] = {"noise_cv": NOISE_CV, "strategies": {}}
    value_counts = sum(len(p.choices()) for p in spec("grid").parameters)
    for strategy in ("grid", "one-at-a-time", "bayesian"):
        costs = [search_cost(spec(strategy), BASELINE, Surface(streaming, seed=seed), seed=seed)
                 for seed in range(args.seeds)]
        never = 10**6  # a run whose leader never settled within the noise
        reached = [c.to_within_noise for c in costs]
        counted = [r if r is not None else never for r in reached]
        report["strategies"][strategy] = {
            "trials_to_within_noise_median": statistics.median(counted),
            "trials_to_within_noise_max": max(counted),
            "never_within_noise": sum(1 for r in reached if r is None),
            "trials_median": statistics.median(c.trials for c in costs),
            "points_median": statistics.median(c.points for c in costs),
            "recommended_within_noise": sum(1 for c in costs if within_noise(spec(strategy), c.found, c.best,
                                                                             max(NOISE_FLOOR, NOISE_CV))),
            "runs": len(costs),
        }
        per_trial, progress = engine_seconds_per_trial(strategy, 0)
        report["strategies"][strategy].update(engine_ms_per_trial=1000 * per_trial,
                                              progress_ms_at_end=1000 * progress)
    s = report["strategies"]
    grid_trials = s["grid"]["trials_median"]
    report["bayesian_share_of_grid"] = s["bayesian"]["trials_to_within_noise_median"] / grid_trials
    report["bayesian_share_of_grid_to_within_noise"] = (
        s["bayesian"]["trials_to_within_noise_median"] / s["grid"]["trials_to_within_noise_median"])
    report["one_at_a_time_points_vs_value_counts"] = [s["one-at-a-time"]["points_median"], value_counts]
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"surface: 120 points, noise CV {100 * NOISE_CV:.1f}%, {args.seeds} seeds; medians")
    print(f"{'strategy':14} {'to-within-noise':>15} {'max':>5} {'trials':>7} {'points':>7}"
          f" {'recommended ok':>15} {'engine ms/trial':>16} {'progress ms':>12}")
    for name, r in s.items():
        print(f"{name:14} {r['trials_to_within_noise_median']:>15} {r['trials_to_within_noise_max']:>5}"
              f" {r['trials_median']:>7} {r['points_median']:>7}"
              f" {r['recommended_within_noise']:>10}/{r['runs']:<4} {r['engine_ms_per_trial']:>16.2f}"
              f" {r['progress_ms_at_end']:>12.1f}")
    print(f"bayesian reaches the noise of the grid's best in {100 * report['bayesian_share_of_grid']:.0f}%"
          f" of the grid's trials (target <= 40%); in"
          f" {100 * report['bayesian_share_of_grid_to_within_noise']:.0f}% of the trials the grid"
          " itself needed to get there")
    print(f"one-at-a-time measures {s['one-at-a-time']['points_median']} points; the parameters' value"
          f" counts sum to {value_counts} (target: at most that)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
