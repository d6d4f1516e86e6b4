"""spec.rollout: hostile documents are refused naming the field; the defaults are issue 27's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stortune.schemas import export
from stortune.schemas.bench.spec import BenchmarkSpecBody, parse_benchmark
from stortune.schemas.documents import DocumentError
from stortune.schemas.rollout.spec import MAX_WAVES, RolloutSpec, check_stored_benchmark, parse_rollout

STREAM = {"preset": "stream-32k", "runtime": "10s"}


def refused(data: Any) -> list[tuple[str, str]]:
    with pytest.raises(DocumentError) as info:
        parse_rollout(data)
    return [(p.path, p.message) for p in info.value.problems]


def test_hostile_thousands_of_waves_are_refused_at_the_list() -> None:
    waves = [{"hosts": i + 1} for i in range(5000)] + [{"percent": 100}]
    assert refused({"waves": waves}) == [("spec.rollout.waves", f"List should have at most {MAX_WAVES} items"
                                                                " after validation, not 5001")]


def test_hostile_waves_at_the_limit_pass_and_one_past_is_refused() -> None:
    at_limit = [{"hosts": i + 1} for i in range(MAX_WAVES - 1)] + [{"percent": 100}]
    assert len(parse_rollout({"waves": at_limit}).waves) == MAX_WAVES
    found = refused({"waves": [{"hosts": i + 1} for i in range(MAX_WAVES)] + [{"percent": 100}]})
    assert [p for p, _ in found] == ["spec.rollout.waves"]


@pytest.mark.parametrize(("wave", "path"), [
    ({"hosts": 0}, "spec.rollout.waves[0].hosts"),
    ({"hosts": -3}, "spec.rollout.waves[0].hosts"),
    ({"hosts": 100_001}, "spec.rollout.waves[0].hosts"),
    ({"percent": 0}, "spec.rollout.waves[0].percent"),
    ({"percent": -5}, "spec.rollout.waves[0].percent"),
    ({"percent": 100.5}, "spec.rollout.waves[0].percent"),
    ({"percent": 1e400}, "spec.rollout.waves[0].percent"),
    ({"percent": float("nan")}, "spec.rollout.waves[0].percent"),
    ({"percent": "10%"}, "spec.rollout.waves[0].percent"),
    ({"percent": True}, "spec.rollout.waves[0].percent"),
    ({"hosts": 1, "percent": 5}, "spec.rollout.waves[0]"),
    ({}, "spec.rollout.waves[0]"),
    ({"hosts": 1, "color": "red"}, "spec.rollout.waves[0].color"),
])
def test_hostile_wave_sizes_are_refused_naming_the_wave(wave: dict[str, Any], path: str) -> None:
    found = refused({"waves": [wave, {"percent": 100}]})
    assert [p for p, _ in found] == [path]


def test_hostile_percent_over_100_on_the_last_wave() -> None:
    assert refused({"waves": [{"hosts": 1}, {"percent": 101}]})[0][0] == "spec.rollout.waves[1].percent"


def test_hostile_waves_that_do_not_end_at_100_percent_are_refused() -> None:
    """Decision: the last wave is {percent: 100}, written out, never implied."""
    (path, message), = refused({"waves": [{"hosts": 1}, {"hosts": 5}]})
    assert path == "spec.rollout.waves[1]" and "{percent: 100}" in message
    assert refused({"waves": [{"percent": 50}]})[0][0] == "spec.rollout.waves[0]"


@pytest.mark.parametrize("waves", [
    [{"percent": 10}, {"percent": 10}, {"percent": 100}],
    [{"hosts": 5}, {"hosts": 2}, {"percent": 100}],
    [{"percent": 100}, {"percent": 100}],
])
def test_hostile_sizes_that_do_not_grow_would_make_empty_waves(waves: list[dict[str, Any]]) -> None:
    (path, message), = refused({"waves": waves})
    assert path.startswith("spec.rollout.waves[") and "is not above" in message


@pytest.mark.parametrize(("field", "value"), [
    ("maxUnavailable", 0), ("maxUnavailable", -1), ("maxUnavailable", "0%"), ("maxUnavailable", "101%"),
    ("maxUnavailable", "ten"), ("maxUnavailable", True), ("maxUnavailable", 1.5),
    ("maxFailures", -1), ("maxFailures", "-1%"), ("maxFailures", "150%"), ("maxFailures", 10**9),
    ("maxFailures", "5 %%"), ("maxFailures", "1" * 10_000 + "%"),
])
def test_hostile_limits_are_refused_naming_the_field(field: str, value: object) -> None:
    assert [p for p, _ in refused({field: value})] == [f"spec.rollout.{field}"]


@pytest.mark.parametrize("soak", ["8760h", 10**12, "169h", 604801, "1" * 100 + "s", "-2m", "2 weeks"])
def test_hostile_a_soak_of_years_or_nonsense_is_refused(soak: object) -> None:
    assert [p for p, _ in refused({"soak": soak})] == ["spec.rollout.soak"]


def test_a_soak_of_exactly_a_week_is_accepted() -> None:
    assert parse_rollout({"soak": "168h"}).soak == 7 * 86400


def test_hostile_unknown_fields_are_refused_where_they_are() -> None:
    found = refused({"waves": [{"percent": 100}], "maxSurge": 1,
                     "analysis": {"benchmark": STREAM, "threshold": 3}})
    assert sorted(p for p, _ in found) == ["spec.rollout.analysis.threshold", "spec.rollout.maxSurge"]


@pytest.mark.parametrize("benchmark", [
    {"preset": "iozone-seq"}, {"preset": "seq-1m"}, {"preset": "oltp-8k", "runtime": "10s"},
    {"name": "w", "pattern": "randwrite", "runtime": "10s"}, {"name": "w", "pattern": "randrw"},
])
def test_hostile_an_analysis_that_writes_to_the_raw_device_is_refused(benchmark: dict[str, Any]) -> None:
    (path, message), = refused({"analysis": {"benchmark": benchmark}})
    assert path == "spec.rollout.analysis.benchmark"
    assert "write to the raw device" in message and "stream-32k" in message


def test_hostile_a_stored_spec_that_writes_to_a_device_is_unfit_even_with_allow_destructive() -> None:
    analysis = parse_rollout({"analysis": {"benchmark": "seq-bench"}}).analysis
    assert analysis is not None

    def stored(target: dict[str, Any]) -> BenchmarkSpecBody:
        return parse_benchmark({"apiVersion": "stortune/v1", "kind": "BenchmarkSpec",
                                "metadata": {"name": "seq-bench"},
                                "spec": {"target": target, "allowDestructive": True,
                                         "workloads": [{"preset": "seq-1m"}]}}).spec

    (problem,) = check_stored_benchmark(analysis, stored({"device": {"name": ["sd*"]}}))
    assert problem.startswith("@benchmark seq-1m/write write to the raw device")
    # A file target writes a file the host allows; the control plane asks the host, not this check.
    assert check_stored_benchmark(analysis, stored({"file": {"path": "/srv/f", "size": "1G"}})) == []


@pytest.mark.parametrize(("analysis", "path"), [
    ({"benchmark": "Not_A_Name"}, "spec.rollout.analysis.benchmark"),
    ({"benchmark": {"preset": "nope"}}, "spec.rollout.analysis.benchmark.preset"),
    ({"benchmark": {**STREAM, "runtime": "2d"}}, "spec.rollout.analysis.benchmark.runtime"),
    ({"benchmark": STREAM, "objectives": [{"metric": "write_bandwidth"}]},
     "spec.rollout.analysis.objectives[0]"),
    ({"benchmark": STREAM, "objectives": [{"metric": "read_bandwidth", "step": "x*"}]},
     "spec.rollout.analysis.objectives[0].step"),
    ({"benchmark": STREAM, "objectives": [{"metric": "nope"}]}, "spec.rollout.analysis.objectives[0].metric"),
    ({"benchmark": STREAM, "maxAge": "30d"}, "spec.rollout.analysis.maxAge"),
    ({"benchmark": STREAM, "maxAge": "200h"}, "spec.rollout.analysis.maxAge"),
    ({"benchmark": STREAM, "waves": [4]}, "spec.rollout.analysis.waves"),
    ({"benchmark": STREAM, "waves": [0]}, "spec.rollout.analysis.waves[0]"),
    ({"benchmark": STREAM, "waves": [1, 1]}, "spec.rollout.analysis.waves[1]"),
    ({"benchmark": STREAM, "requireImprovement": "yes"}, "spec.rollout.analysis.requireImprovement"),
])
def test_hostile_analysis_fields_are_refused_by_path(analysis: dict[str, Any], path: str) -> None:
    assert [p for p, _ in refused({"analysis": analysis})] == [path]


@pytest.mark.parametrize("field", ["waves", "maxUnavailable", "maxFailures", "soak", "onFailure", "analysis"])
def test_hostile_all_at_once_takes_no_other_field(field: str) -> None:
    value = {"waves": [{"percent": 100}], "maxUnavailable": 2, "maxFailures": 1, "soak": "1m",
             "onFailure": "pause", "analysis": {"benchmark": STREAM}}[field]
    (path, message), = refused({"strategy": "all-at-once", field: value})
    assert path == f"spec.rollout.{field}" and "all-at-once" in message


def test_all_at_once_parses_back_from_its_canonical_form() -> None:
    # document() (and a stored StorageProfile's) writes every default out: those say nothing.
    spec = parse_rollout({"strategy": "all-at-once"})
    assert parse_rollout(spec.document()) == spec
    assert parse_rollout({"strategy": "all-at-once", "maxFailures": 0, "onFailure": "rollback"}) == spec


def test_without_a_rollout_the_defaults_are_the_issues() -> None:
    spec = parse_rollout(None)
    assert spec.document() == {"strategy": "waves", "waves": [{"hosts": 1}, {"percent": 10},
                                                              {"percent": 100}],
                               "maxUnavailable": "10%", "maxFailures": 0, "soak": 0.0,
                               "onFailure": "rollback"}


def test_the_issues_example_reads_and_round_trips() -> None:
    spec = parse_rollout({"waves": [{"hosts": 1}, {"percent": 10}, {"percent": 100}], "maxUnavailable": "10%",
                          "maxFailures": "5%", "soak": "2m", "onFailure": "pause",
                          "analysis": {"benchmark": STREAM, "requireImprovement": True, "maxAge": "1h",
                                       "objectives": [{"metric": "read_bandwidth", "goal": "maximize"}]}})
    assert (spec.soak, spec.maxUnavailable, spec.maxFailures) == (120.0, "10%", "5%")
    assert spec.analysis is not None and spec.analysis.maxAge == 3600 and spec.analysis.waves == [1]
    assert parse_rollout(spec.document()) == spec
    # With its nulls too (model_dump_json, as a stored rollout state holds it).
    assert parse_rollout(spec.model_dump(mode="json")) == spec
    named = parse_rollout({"analysis": {"benchmark": "stream-nightly", "waves": [2, 1]}}).analysis
    assert named is not None and named.waves == [1, 2]


def test_the_json_schema_is_exported_and_the_profile_holds_it() -> None:
    schemas = export.render()
    rollout = json.loads(schemas["rollout.schema.json"])
    assert rollout["properties"]["waves"]["maxItems"] == MAX_WAVES
    assert rollout["properties"]["waves"]["default"] == [{"hosts": 1}, {"percent": 10}, {"percent": 100}]
    assert rollout["$defs"]["Wave"]["properties"]["hosts"]["minimum"] == 1
    profile = json.loads(schemas["storageprofile.schema.json"])
    field = profile["$defs"]["ProfileSpec"]["properties"]["rollout"]
    inline = next(s for s in field["anyOf"] if s.get("title") == "RolloutSpec")
    assert inline["properties"]["waves"]["maxItems"] == MAX_WAVES and inline["additionalProperties"] is False
    assert RolloutSpec.model_json_schema()["additionalProperties"] is False
