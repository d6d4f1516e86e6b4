"""What one trial runs (benchmark_for) and what it measured (measure), on fio's real output."""

from __future__ import annotations

import math
from pathlib import Path

from stortune.schemas.bench import fioresult
from stortune.schemas.bench.results import BenchmarkResult, RunState, StepRun, summarize_runs
from stortune.schemas.bench.spec import parse_benchmark
from stortune.schemas.bench.steps import TargetFacts
from stortune.schemas.tuning.space import TrialRequest, benchmark_for, failed, measure
from tests.schemas.tuning.docs import experiment

FIO = Path(__file__).resolve().parents[2] / "fixtures" / "fio"
REQ = TrialRequest(index=4, point={"read_ahead_kb": 128, "nr_requests": 64}, purpose="explore",
                   total_estimate=20, reason="test")


def result(state: RunState = "done", fairness: bool = True) -> BenchmarkResult:
    exp = experiment(constraints=[{"fairness": "read_bandwidth", "maxCV": 10}] if fairness else [])
    spec = benchmark_for(exp, "t-1")
    steps = spec.steps(TargetFacts())
    fio = fioresult.parse((FIO / "fio-3.33-two-jobs.json").read_text())
    runs = [StepRun(step=steps[0].name, repeat=0, state="done", started_at=1.0, finished_at=2.0, fio=fio,
                    metrics=fio.metrics())]
    return BenchmarkResult(run_id="r1", name="t-1", state=state, spec=spec.document(), created_at=0.0,
                           steps=steps, runs=runs, summaries=summarize_runs(steps, runs))


def test_the_trial_benchmark_is_the_experiment_workload_once() -> None:
    exp = experiment(workloads=[{"preset": "stream-32k", "runtime": "20s", "repeats": 3}])
    spec = benchmark_for(exp, "streamer-readahead-t3")
    assert spec.spec.repeats == 1 and not spec.spec.allowDestructive
    assert spec.spec.target.device == exp.spec.target.device
    assert all(s.repeats == 1 and not s.per_job for s in spec.steps(TargetFacts()))
    assert parse_benchmark(spec.document()) == spec
    fair = experiment(constraints=[{"fairness": "read_bandwidth", "maxCV": 10}])
    assert all(s.per_job for s in benchmark_for(fair, "x").steps(TargetFacts()))


def test_measure_takes_the_objective_and_the_per_job_spread() -> None:
    m = measure(result(), experiment(constraints=[{"fairness": "read_bandwidth", "maxCV": 10}]), REQ, "h1")
    assert m.ok and m.index == 4 and m.host == "h1" and m.run_id == "r1"
    assert m.metrics["read_bandwidth"] == 838860800.0 + 310689185.0
    jobs = [838860800.0, 310689185.0]
    mean = sum(jobs) / 2
    cv = 100 * math.sqrt(sum((j - mean) ** 2 for j in jobs)) / mean
    assert m.job_cv is not None and math.isclose(m.job_cv, cv)


def test_a_run_that_did_not_finish_is_a_failed_measurement() -> None:
    m = measure(result(state="failed"), experiment(), REQ)
    assert not m.ok and "failed" in m.message
    gone = failed(REQ, "agent lost")
    assert not gone.ok and gone.point == REQ.point and gone.message == "agent lost"


def test_a_run_without_the_objective_metric_is_not_ok() -> None:
    m = measure(result().model_copy(update={"summaries": []}), experiment(), REQ)
    assert not m.ok and "measured read_bandwidth" in m.message
