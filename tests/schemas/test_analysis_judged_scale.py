"""Slow members, saturation and the host analysis over what an agent may send: 100,000
members of one array in a step run, and more step runs than are worth judging."""

from __future__ import annotations

import random
import statistics

import pytest

from stortune.schemas.analysis.host import host_analysis
from stortune.schemas.analysis.members import medians_of_the_others, slow_members
from stortune.schemas.analysis.verdict import saturation
from stortune.schemas.bench.results import BenchmarkResult, DeviceStats, StepRun
from stortune.schemas.topology import Topology
from tests.schemas.test_analysis_members import stat


def test_medians_of_the_others_match_the_median_of_each_peer_list() -> None:
    rng = random.Random(16)
    for n in range(12):
        for _ in range(50):
            values = [float(rng.choice([1, 2, 2, 3, 5, 8, 13])) for _ in range(n)]
            expected = [statistics.median(values[:i] + values[i + 1:]) if n > 1 else None
                        for i in range(n)]
            assert medians_of_the_others(values) == expected


def _array(members: int, slow: str) -> list[DeviceStats]:
    return [stat(f"m{i}", await_ms=40.0 if f"m{i}" == slow else 2.0 + (i % 3) / 10)
            for i in range(members)]


@pytest.mark.slow(seconds=13)
def test_a_slow_member_among_100000_is_named_by_slow_members_and_saturation() -> None:
    # One median per member over its peers' list was quadratic: 4,000 members took 2 s,
    # 100,000 of them minutes (the sampler reports what it is given, the agent may send it).
    run = _array(100_000, slow="m777")
    slow = slow_members([run, run, run])
    assert [(m.member, m.runs_slow, m.peers) for m in slow] == [("m777", 3, 99_999)]
    saturated = saturation(run)
    assert [s.device for s in saturated] == ["m777"]
    assert saturated[0].peers_await_ms == 2.1


def _result(*runs: list[DeviceStats]) -> BenchmarkResult:
    return BenchmarkResult.model_construct(runs=[
        StepRun.model_construct(step="s", repeat=i, state="done", devices=devices)
        for i, devices in enumerate(runs)])


def test_step_runs_past_the_budget_are_left_out_and_the_analysis_says_so() -> None:
    topology = Topology(hostname="h")
    newest = _result(*[_array(5, slow="m1") for _ in range(3)])
    older = _result(*[_array(5, slow="m2") for _ in range(3)])  # m2 was slow long ago
    analysis = host_analysis(topology, results=[newest, older, older], max_stats=15)
    assert [m.member for m in analysis.slow_members] == ["m1"]
    bounded = [c for c in analysis.checks if c.code == "analysis-bounded"]
    assert len(bounded) == 1 and "6 older step runs left out" in bounded[0].message
    everything = host_analysis(topology, results=[newest, older, older])
    assert [m.member for m in everything.slow_members] == ["m2"]  # 6 of 9 runs
    assert not [c for c in everything.checks if c.code == "analysis-bounded"]
