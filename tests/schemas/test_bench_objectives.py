"""What each step is for: its own figure by pattern, plus what the spec's thresholds name for it."""

from __future__ import annotations

from typing import Any

import pytest

from stortune.schemas.bench.objectives import objectives, own_metrics, threshold_globs
from stortune.schemas.bench.steps import WorkloadStep


def step(name: str, pattern: str) -> WorkloadStep:
    return WorkloadStep.model_validate({"name": name, "workload": name.partition("/")[0],
                                        "pattern": pattern, "block_size": 4096})


@pytest.mark.parametrize(("pattern", "expected"), [
    ("read", ["read_bandwidth"]),
    ("write", ["write_bandwidth"]),
    ("rw", ["read_bandwidth", "write_bandwidth"]),
    ("randread", ["read_iops", "read_lat_p99"]),
    ("randwrite", ["write_iops", "write_lat_p99"]),
    ("randrw", ["read_iops", "read_lat_p99", "write_iops", "write_lat_p99"]),
])
def test_a_steps_own_figure_follows_its_pattern(pattern: str, expected: list[str]) -> None:
    assert own_metrics(step("w/x", pattern)) == expected


def test_thresholds_add_what_they_name_to_the_steps_they_match() -> None:
    spec = {"spec": {"thresholds": [
        {"metric": "read_lat_p999", "step": "iometer-4k/randread", "max": 20000},
        {"metric": "cpu_sys", "max": 50},  # no step: every step
        {"metric": "read_bandwidth", "step": "seq-*/read", "min": 1e8},
    ]}}
    steps = [step("iometer-4k/randread", "randread"), step("seq-1m/read", "read"),
             step("seq-1m/write", "write")]
    found = objectives(steps, threshold_globs(spec))
    assert found == {
        "iometer-4k/randread": ["read_iops", "read_lat_p99", "read_lat_p999", "cpu_sys"],  # catalog order
        "seq-1m/read": ["read_bandwidth", "cpu_sys"],
        "seq-1m/write": ["write_bandwidth", "cpu_sys"],
    }


@pytest.mark.parametrize("spec", [
    {},
    {"spec": None},
    {"spec": {"thresholds": "read_bandwidth"}},
    {"spec": {"thresholds": [None, 3, "x", {"metric": "turbo"}, {"metric": ["read_iops"]}]}},
    {"spec": {"thresholds": [{"metric": "read_iops", "step": {"$ne": 1}}]}},
])
def test_hostile_or_odd_spec_documents_are_read_tolerantly(spec: dict[str, Any]) -> None:
    """A stored result's spec is read, never trusted: what is not a threshold adds nothing (and a
    glob that is not text matches every step, as a threshold without one does)."""
    globs = threshold_globs(spec)
    assert all(isinstance(m, str) and isinstance(g, str) for m, g in globs)
    found = objectives([step("seq-1m/read", "read")], globs)
    assert found["seq-1m/read"][0] == "read_bandwidth"


@pytest.mark.parametrize("glob", ["*" * 257, "seq-1m/read\x00", "[" * 300 + "*"])
def test_hostile_step_globs_a_spec_may_not_hold_name_no_step(glob: str) -> None:
    """A result's spec comes from the agent: its thresholds' step globs are matched as every glob is
    (schemas/patterns.py: RE2, at most 256 characters), never by Python's fnmatch, and one the
    document could not hold names no step instead of every one."""
    spec = {"spec": {"thresholds": [{"metric": "read_iops", "step": glob, "min": 1}]}}
    assert objectives([step("seq-1m/read", "read")], threshold_globs(spec)) == {
        "seq-1m/read": ["read_bandwidth"]}


def test_step_globs_match_as_in_the_spec() -> None:
    spec = {"spec": {"thresholds": [{"metric": "read_iops", "step": "seq-[!0-9]*/re?d", "min": 1},
                                    {"metric": "cpu_sys", "step": "seq-1m/[rw]*", "max": 9}]}}
    steps = [step("seq-1m/read", "read"), step("seq-xm/read", "read")]
    assert objectives(steps, threshold_globs(spec)) == {
        "seq-1m/read": ["read_bandwidth", "cpu_sys"], "seq-xm/read": ["read_bandwidth", "read_iops"]}
