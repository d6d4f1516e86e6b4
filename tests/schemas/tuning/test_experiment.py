"""The TuningExperiment document: every bad input named by its field path, then the happy path."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stortune.schemas.documents import DocumentError
from stortune.schemas.tuning.experiment import (
    MAX_DOCUMENT_BYTES,
    load_experiments,
    parse_experiment,
)
from tests.schemas.tuning.docs import BASE, doc, experiment


def problems(data: Any, **kw: Any) -> list[tuple[str, str]]:
    with pytest.raises(DocumentError) as err:
        parse_experiment(data, **kw)
    return [(p.path, p.message) for p in err.value.problems]


@pytest.mark.parametrize(("spec", "path", "words"), [
    ({"parameters": [{"tunable": "read_ahead", "values": [1]}]}, "spec.parameters[0].tunable",
     "unknown tunable 'read_ahead'"),
    ({"parameters": [{"tunable": "read_ahead_kb", "values": [0, 5]}]}, "spec.parameters[0].values[1]",
     "multiple of 4"),
    ({"parameters": [{"tunable": "nr_requests", "values": [32, 4096]}]}, "spec.parameters[0].values[1]",
     "<= 2048"),
    ({"parameters": [{"tunable": "nr_requests", "values": ["64"]}]}, "spec.parameters[0].values[0]",
     "must be an integer"),
    ({"parameters": [{"tunable": "nr_requests", "values": [64, 1.5]}]}, "spec.parameters[0].values[1]",
     "must be an integer or a name, got 1.5"),
    ({"parameters": [{"tunable": "nr_requests", "values": [True]}]}, "spec.parameters[0].values[0]",
     "got True"),
    ({"parameters": [{"tunable": "scheduler", "values": ["none", "Bad Name"]}]},
     "spec.parameters[0].values[1]", "scheduler name"),
    ({"parameters": [{"tunable": "nr_requests", "values": [32, 32]}]}, "spec.parameters[0].values[1]",
     "listed twice"),
    ({"parameters": []}, "spec.parameters", "at least 1"),
    ({"parameters": [{"tunable": "nr_requests", "values": []}]}, "spec.parameters[0].values", "at least 1"),
    ({"parameters": [{"tunable": "nr_requests"}]}, "spec.parameters[0]", "exactly one of values"),
    ({"parameters": [{"tunable": "read_ahead_kb", "values": [0]},
                     {"tunable": "read_ahead_kb", "values": [4]}]}, "spec.parameters[1].tunable", "also"),
    ({"parameters": [{"tunable": "read_ahead_kb", "range": {"min": 4, "max": 100000, "steps": 100}},
                     {"tunable": "nr_requests", "range": {"min": 4, "max": 2048, "steps": 100}}]},
     "spec.parameters", "10000 points; at most 4096"),
    ({"parameters": [{"tunable": "nr_requests", "range": {"min": 1, "max": 9000, "scale": "log"}}]},
     "spec.parameters[0].range", "expands to 1"),
    ({"parameters": [{"tunable": "nr_requests", "range": {"min": 0, "max": 64, "scale": "log"}}]},
     "spec.parameters[0].range", "log scale"),
    ({"parameters": [{"tunable": "scheduler", "range": {"min": 1, "max": 3}}]}, "spec.parameters[0].range",
     "takes names"),
    ({"parameters": [{"tunable": "stripe_cache_size", "values": [256]}]}, "spec.parameters[0].tunable",
     "none of target.device.kind"),
    ({"parameters": [{"tunable": "dev.raid.speed_limit_min", "values": [1000]}]},
     "spec.parameters[0].tunable", "host-wide"),
    ({"objective": {"metric": "read_bw"}}, "spec.objective.metric", "unknown metric"),
    ({"objective": {"metric": "read_bandwidth", "step": "nope*"}}, "spec.objective.step", "matches no step"),
    ({"objective": {"metric": "read_bandwidth", "goal": "most"}}, "spec.objective.goal", "maximize"),
    ({"budget": {"trials": 3}}, "spec.budget.trials", "no room for a search"),
    ({"budget": {"trials": 10}}, "spec.budget.trials", "take 11"),
    ({"repeats": {"min": 1, "max": 1, "baseline": 1, "confirm": 1}, "budget": {"trials": 3}},
     "spec.budget.trials", "take 4"),
    ({"repeats": {"baseline": 0}}, "spec.repeats.baseline", "greater than or equal to 1"),
    ({"repeats": {"min": 4, "max": 2}}, "spec.repeats", "below min"),
    ({"constraints": [{"memory": "0"}]}, "spec.constraints[0].memory", "greater than 0"),
    ({"constraints": [{"memory": "lots"}]}, "spec.constraints[0].memory", ""),
    ({"constraints": [{"fairness": "read_bandwidth", "maxCV": "0%"}]}, "spec.constraints[0].maxCV",
     "above 0%"),
    ({"constraints": [{"fairness": "read_iops", "maxCV": 10}]}, "spec.constraints[0].fairness", ""),
    ({"workloads": [{"name": "one", "pattern": "read", "runtime": 5}],
      "constraints": [{"fairness": "read_bandwidth", "maxCV": 10}]}, "spec.constraints[0].fairness",
     "needs concurrent jobs"),
    ({"constraints": [{"metric": "read_lat_p99", "max": "fast"}]}, "spec.constraints[0].max", "latency"),
    ({"constraints": [{"metric": "read_lat_p99"}]}, "spec.constraints[0]", "give min, max"),
    ({"constraints": [{"metric": "write_lat_p99", "max": "5ms"}]}, "spec.constraints[0]",
     "write_lat_p99 would never be measured"),
    ({"objective": {"metric": "write_bandwidth"}}, "spec.objective", "no step it names writes"),
    ({"workloads": [{"preset": "seq-1m"}]}, "spec.workloads", "read workloads only"),
    ({"workloads": []}, "spec.workloads", "at least 1"),
    ({"maxHosts": 65}, "spec.maxHosts", "64"),
    ({"target": {"file": {"path": "/srv/x", "size": "1G"}}}, "spec.target.file", "unknown field"),
    ({"strategy": "random"}, "spec.strategy", "one-at-a-time"),
    ({"surprise": 1}, "spec.surprise", "unknown field"),
])
def test_bad_input_names_the_field(spec: dict[str, Any], path: str, words: str) -> None:
    found = problems(doc(**spec))
    assert any(p == path and words in m for p, m in found), found


def test_the_grid_limit_is_the_callers() -> None:
    assert experiment()  # 5 x 4 = 20 points
    assert problems(doc(), max_grid=10) == [
        ("spec.parameters", "the grid holds 5 x 4 = 20 points; at most 10: fewer values or parameters")]


def test_not_an_experiment() -> None:
    assert problems([]) == [("", "expected a mapping, got list")]
    assert problems({**BASE, "kind": "StorageProfile"})[0][0] == "kind"
    assert problems({**BASE, "apiVersion": "v2"})[0][0] == "apiVersion"


def test_oversized_documents_are_refused_before_parsing() -> None:
    with pytest.raises(DocumentError, match="longer than"):
        load_experiments("#" * (MAX_DOCUMENT_BYTES + 1))
    values = list(range(0, 4 * 300, 4))
    found = problems(doc(parameters=[{"tunable": "read_ahead_kb", "values": values}]))
    assert found[0][0] == "spec.parameters[0].values" and "at most 256" in found[0][1]
    many = [{"tunable": "nr_requests", "values": [32]}] * 17
    assert problems(doc(parameters=many))[0][0] == "spec.parameters"


def test_patterns_are_bounded() -> None:
    found = problems(doc(objective={"metric": "read_bandwidth", "step": "*" * 5000}))
    assert found[0][0] == "spec.objective.step"
    found = problems(doc(target={"device": {"model": "(a" * 3000}}))
    assert found[0][0] == "spec.target.device.model"


def test_load_reports_every_document() -> None:
    text = "kind: TuningExperiment\napiVersion: stortune/v1\n---\n{}\n"
    with pytest.raises(DocumentError) as err:
        load_experiments(text, "exp.yaml")
    assert {p.where for p in err.value.problems} == {"exp.yaml (document 1)", "exp.yaml (document 2)"}
    with pytest.raises(DocumentError, match="holds no TuningExperiment"):
        load_experiments("", "empty.yaml")


def test_a_valid_experiment_reads_and_round_trips() -> None:
    exp = experiment(parameters=[
        {"tunable": "read_ahead_kb", "values": [0, 128, 1024]},
        {"tunable": "nr_requests", "range": {"min": 32, "max": 1024, "scale": "log", "steps": 6}},
        {"tunable": "scheduler", "at": "beneath", "values": ["none", "mq-deadline"]},
    ], constraints=[{"metric": "read_lat_p99", "max": "50000us"},
                    {"fairness": "read_bandwidth", "maxCV": "10%"}])
    assert exp.spec.keys == ["read_ahead_kb", "nr_requests", "scheduler@beneath"]
    assert exp.spec.parameters[1].choices() == [32, 64, 128, 256, 512, 1024]
    assert exp.spec.objective.maximize
    assert exp.spec.constraints[0].max == 50_000  # type: ignore[union-attr]
    assert parse_experiment(exp.document()) == exp
    [again] = load_experiments(__import__("json").dumps(exp.document()))
    assert again == exp


def test_the_designs_example_reads() -> None:
    [exp] = load_experiments(DESIGN_EXAMPLE, "design.yaml")
    assert exp.spec.keys == ["read_ahead_kb", "nr_requests", "scheduler@beneath"]
    assert [type(c).__name__ for c in exp.spec.constraints] == ["MetricBound", "Fairness", "MemoryBound"]


DESIGN_EXAMPLE = """
apiVersion: stortune/v1
kind: TuningExperiment
metadata: {name: streamer-readahead}
spec:
  hostSelector: {matchLabels: {role: streamer}}
  maxHosts: 1
  target: {device: {kind: [disk], driver: megaraid_sas}}
  workloads: [{preset: stream-32k, runtime: 20s}]
  objective: {metric: read_bandwidth, goal: maximize, step: "*"}
  constraints:
    - {metric: read_lat_p99, max: 50ms}
    - {fairness: read_bandwidth, maxCV: 10%}
    - {memory: 512MiB}
  parameters:
    - {tunable: read_ahead_kb, values: [0, 128, 1024, 4096, 16384]}
    - {tunable: nr_requests, range: {min: 32, max: 1024, scale: log, steps: 6}}
    - {tunable: scheduler, at: beneath, values: [none, mq-deadline]}
  strategy: one-at-a-time
  repeats: {min: 2, max: 5}
  budget: {trials: 30, duration: 30m}
  applyResult: false
"""


def test_log_ranges_deduplicate_and_keep_multiples() -> None:
    exp = experiment(parameters=[{"tunable": "read_ahead_kb",
                                  "range": {"min": 4, "max": 16, "scale": "log", "steps": 8}}])
    assert exp.spec.parameters[0].choices() == [4, 8, 12, 16]


def test_goal_defaults_to_the_metrics_direction() -> None:
    assert not experiment(objective={"metric": "read_lat_p99"}).spec.objective.maximize


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats()
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12)
_FIELDS = st.sampled_from(["target", "workloads", "objective", "constraints", "parameters", "strategy",
                           "repeats", "budget", "maxHosts", "hostSelector", "applyResult", "seed"])


@settings(max_examples=300, deadline=None)
@given(field=_FIELDS, value=_JSON, inner=st.sampled_from(["parameters", "constraints", "objective"]))
def test_any_garbage_is_a_document_error_naming_a_field(field: str, value: Any, inner: str) -> None:
    data = doc(**{field: value})
    if inner in data["spec"] and isinstance(data["spec"][inner], list) and data["spec"][inner]:
        data["spec"][inner] = [value, *data["spec"][inner][1:]]
    try:
        parse_experiment(data)
    except DocumentError as exc:
        assert exc.problems and all(p.path.startswith("spec") for p in exc.problems), exc.problems
