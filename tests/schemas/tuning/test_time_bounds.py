"""An experiment owns its hosts until it ends, so its time is bounded: each step's runtime, the
wall-time budget (with a default), and the fit of the least search into that budget (issue 26,
point 5); and where applyResult stores its profile is said, never guessed (point 3)."""

from __future__ import annotations

from typing import Any

import pytest

from stortune.schemas.bench.spec import RUNTIME_MAX, parse_benchmark
from stortune.schemas.documents import DocumentError
from stortune.schemas.tuning.experiment import DURATION_DEFAULT, DURATION_MAX, parse_experiment
from tests.schemas.tuning.docs import doc


def _problems(data: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(DocumentError) as caught:
        parse_experiment(data)
    return [(p.path, p.message) for p in caught.value.problems]


def test_hostile_64_workloads_of_a_million_hours_and_10000_trials_are_refused_naming_the_runtime() -> None:
    workloads = [{"preset": "stream-32k", "name": f"w{i}", "runtime": "1000000h"} for i in range(64)]
    found = _problems(doc(workloads=workloads, budget={"trials": 10_000}))
    assert [path for path, _ in found] == [f"spec.workloads[{i}].runtime" for i in range(64)]
    assert "longer than a day" in found[0][1] and "shorter" in found[0][1]


def test_hostile_workloads_within_a_day_that_outlast_the_budget_are_refused_naming_the_duration() -> None:
    workloads = [{"preset": "stream-32k", "name": f"w{i}", "runtime": "24h"} for i in range(64)]
    found = _problems(doc(workloads=workloads, budget={"trials": 10_000}))
    assert found[0][0] == "spec.budget.duration", found
    assert "6h cannot hold the 11 trials" in found[0][1] and "1536h" in found[0][1]


@pytest.mark.parametrize("field", ["runtime", "rampTime"])
def test_a_step_time_of_a_day_is_accepted_and_one_past_it_refused(field: str) -> None:
    budget = {"trials": 60, "duration": DURATION_MAX}
    at = parse_experiment(doc(workloads=[{"preset": "stream-32k", field: RUNTIME_MAX}], budget=budget))
    assert at.spec.trial_seconds() >= RUNTIME_MAX
    found = _problems(doc(workloads=[{"preset": "stream-32k", field: RUNTIME_MAX + 1}], budget=budget))
    assert found[0][0] == f"spec.workloads[0].{field}", found
    explicit = {"name": "seq", "pattern": "read", field: RUNTIME_MAX + 1}
    found = _problems(doc(workloads=[explicit], budget=budget))
    assert found[0][0] == f"spec.workloads[0].{field}", found


def test_a_benchmark_step_is_bounded_the_same_way() -> None:
    spec: dict[str, Any] = {"apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "b"},
                            "spec": {"target": {"device": {"kind": ["loop"]}},
                                     "workloads": [{"preset": "stream-32k", "runtime": RUNTIME_MAX}]}}
    assert parse_benchmark(spec).spec.workloads[0].runtime == RUNTIME_MAX
    spec["spec"]["workloads"][0]["runtime"] = "1000000h"
    with pytest.raises(DocumentError) as caught:
        parse_benchmark(spec)
    assert caught.value.problems[0].path == "spec.workloads[0].runtime"


def test_the_least_search_just_fitting_the_budget_is_accepted_and_a_second_less_refused() -> None:
    # stream-32k at 20s, 3 + 3 baseline runs, 2 of one point, 3 to confirm: 11 trials, 220 s.
    fits = parse_experiment(doc(budget={"trials": 60, "duration": 220}))
    assert fits.spec.trial_seconds() == 20 and fits.spec.least_trials == 11
    found = _problems(doc(budget={"trials": 60, "duration": 219}))
    assert found[0][0] == "spec.budget.duration" and "11 trials" in found[0][1], found


def test_the_duration_has_a_default_and_a_maximum_and_trials_a_maximum() -> None:
    assert parse_experiment(doc(budget={"trials": 60})).spec.budget.duration == DURATION_DEFAULT == 6 * 3600
    assert parse_experiment(doc(budget=None)).spec.budget.duration == DURATION_DEFAULT
    assert parse_experiment(doc(budget={"trials": 60, "duration": DURATION_MAX})).spec.budget.duration \
        == DURATION_MAX
    found = _problems(doc(budget={"trials": 60, "duration": DURATION_MAX + 1}))
    assert found[0][0] == "spec.budget.duration", found
    assert parse_experiment(doc(budget={"trials": 10_000})).spec.budget.trials == 10_000
    assert _problems(doc(budget={"trials": 10_001}))[0][0] == "spec.budget.trials"


# -- where applyResult stores its profile -------------------------------------------------------------
@pytest.mark.parametrize(("result", "apply", "path"), [
    ({"replace": True}, True, "spec.result.resourceVersion"),
    ({"resourceVersion": "12"}, True, "spec.result.replace"),
    ({"replace": True, "resourceVersion": "12; drop"}, True, "spec.result.resourceVersion"),
    ({"replace": True, "resourceVersion": "1" * 19}, True, "spec.result.resourceVersion"),
    ({"name": "Not A Name"}, True, "spec.result.name"),
    ({"replace": True, "resourceVersion": "12"}, False, "spec.result.replace"),
])
def test_hostile_result_fields_are_refused_naming_them(result: dict[str, Any], apply: bool,
                                                       path: str) -> None:
    found = _problems(doc(result=result, applyResult=apply))
    assert found[0][0] == path, found


def test_the_result_profile_is_named_by_the_document_or_after_the_experiment() -> None:
    assert parse_experiment(doc(applyResult=True)).result_name == "streamer-readahead"
    named = parse_experiment(doc(applyResult=True, result={"name": "streamers-tuned"}))
    assert named.result_name == "streamers-tuned"
    replacing = parse_experiment(doc(applyResult=True, result={"replace": True, "resourceVersion": "41"}))
    assert replacing.spec.result is not None and replacing.spec.result.resourceVersion == "41"
    assert parse_experiment(replacing.document()) == replacing
