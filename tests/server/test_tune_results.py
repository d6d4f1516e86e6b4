"""The driver's pure pieces: the baseline a host starts from and the settings it owns, and whether
a run measured the trial's values (something outside the experiment may have changed them)."""

from __future__ import annotations

from stortune.schemas.bench.spec import parse_benchmark
from stortune.schemas.tuning.experiment import parse_experiment
from stortune.server.tune.results import baseline_of, ending_message, values_not_in_effect
from tests.server.benchfakes import make_result, spec_doc, steady
from tests.server.builders import loop_topology
from tests.server.tunefakes import experiment_doc


def test_the_baseline_is_what_the_device_holds_and_the_experiment_owns_those_settings() -> None:
    exp = parse_experiment(experiment_doc(parameters=[
        {"tunable": "read_ahead_kb", "values": [0, 128]}, {"tunable": "scheduler", "values": ["none"]}]))
    device = loop_topology("h1", read_ahead_kb=512).devices[0]
    point, settings, owned = baseline_of(exp, device, [])
    assert point == {"read_ahead_kb": 512, "scheduler": "none"}
    assert settings == {"loop0": {"read_ahead_kb": 512, "scheduler": "none"}}
    assert owned == [["name:loop0", "read_ahead_kb"], ["name:loop0", "scheduler"]]


def test_a_run_under_other_values_than_the_trial_s_is_named() -> None:
    device = loop_topology("h1").devices[0]
    spec = parse_benchmark(spec_doc())
    ran = make_result("r1", spec, steady(), settings={"loop0": {"read_ahead_kb": 4096, "scheduler": "none"}})
    assert values_not_in_effect(ran, {"read_ahead_kb": 4096}, device, []) == ""
    assert values_not_in_effect(ran, {"read_ahead_kb": 128, "scheduler": "none"}, device, []) == (
        "loop0 read_ahead_kb 4096, wanted 128")


def test_how_an_end_is_said() -> None:
    assert ending_message("done", "budget-trials") == "done: the trial budget is spent"
    assert ending_message("failed", "the agent did not answer") == "failed: the agent did not answer"
    assert ending_message("cancelled", "cancelled") == "cancelled"


def test_the_search_stops_in_time_for_the_closing_runs_to_end_before_the_deadline() -> None:
    """Trials of 20 s, 10 minutes: judged by the time spent alone the search would run until the
    deadline and leave the confirmation and the end baseline past it (cut by the deadline, the
    result unconfirmed); judged with the closing runs reserved at the pace so far, all of them
    end within the budget."""
    from stortune.schemas.tuning.engine import Engine
    from stortune.schemas.tuning.simulate import Surface, streaming
    from stortune.schemas.tuning.timing import search_elapsed
    from tests.schemas.tuning.docs import experiment

    exp = experiment(budget={"trials": 60, "duration": "10m"}, strategy="grid")  # 20 points: 40 runs
    assert exp.spec.trial_seconds() == 20

    def run(reserve: bool) -> tuple[float, list[str]]:
        engine = Engine(exp.spec, {"read_ahead_kb": 0, "nr_requests": 64})
        surface, elapsed = Surface(streaming, seed=5), 0.0
        while (request := engine.next(elapsed_s=search_elapsed(exp.spec, elapsed, len(engine.measurements))
                                      if reserve else elapsed)) is not None:
            engine.record(surface.run(request))
            elapsed += 20.0
        return elapsed, [m.purpose for m in engine.measurements]

    late, _ = run(reserve=False)
    assert late > exp.spec.budget.duration  # the closing runs would have been cut at the deadline
    in_time, purposes = run(reserve=True)
    assert in_time <= exp.spec.budget.duration
    assert purposes[-6:] == ["confirm"] * 3 + ["baseline-end"] * 3
    assert search_elapsed(exp.spec, 0.0, 0) == 6 * 20  # before any trial: the workloads' runtime
    assert search_elapsed(exp.spec, 100.0, 2) == 100 + 6 * 50  # slower than planned: the pace seen
