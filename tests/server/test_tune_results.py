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
