"""Repeats, the noise rule, iozone tables and threshold verdicts."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from stortune.schemas.bench import presets
from stortune.schemas.bench.results import DeviceStats, evaluate, mark_slowest
from stortune.schemas.bench.spec import Threshold
from stortune.schemas.bench.stats import NOISE_FLOOR, compare, delta, iozone_tables, summarize
from stortune.schemas.bench.steps import TargetFacts

values = st.lists(st.floats(min_value=1e-3, max_value=1e12, allow_nan=False), min_size=1, max_size=12)


def test_summary_of_repeats() -> None:
    s = summarize([100.0, 110.0, 90.0])
    assert (s.n, s.mean, s.min, s.max) == (3, 100.0, 90.0, 110.0)
    assert s.stdev == pytest.approx(10.0)  # sample standard deviation
    assert s.cv == pytest.approx(0.1) and s.noisy
    quiet = summarize([100.0, 101.0, 99.0])
    assert not quiet.noisy and quiet.cv == pytest.approx(0.01)
    assert not summarize([5.0]).noisy and summarize([5.0]).stdev == 0


@given(values)
def test_summary_bounds(xs: list[float]) -> None:
    s = summarize(xs)
    assert s.min <= s.mean * (1 + 1e-9) and s.mean <= s.max * (1 + 1e-9)
    assert s.stdev >= 0 and (s.n > 1 or not s.noisy)


@given(values, st.floats(min_value=1e-3, max_value=1e3))
def test_cv_does_not_depend_on_the_unit(xs: list[float], k: float) -> None:
    a, b = summarize(xs), summarize([x * k for x in xs])
    assert a.cv is not None and b.cv is not None
    assert b.cv == pytest.approx(a.cv, rel=1e-6, abs=1e-9)


@given(values)
def test_a_result_never_differs_from_itself(xs: list[float]) -> None:
    s = summarize(xs)
    assert not delta("s", "read_bandwidth", s, s).significant


@given(values, values)
def test_significant_means_outside_the_noise_shown(a_xs: list[float], b_xs: list[float]) -> None:
    """What is shown is what is judged: the change against the noise interval, nothing else."""
    a, b = summarize(a_xs), summarize(b_xs)
    d = delta("s", "read_iops", a, b)
    assert d.delta_pct is not None and d.noise_low_pct is not None and d.noise_high_pct is not None
    assert d.noise_low_pct <= -100 * NOISE_FLOOR and d.noise_high_pct >= 100 * NOISE_FLOOR
    assert d.significant == (d.delta_pct < d.noise_low_pct or d.delta_pct > d.noise_high_pct)
    assert d.noise_pct == (d.noise_high_pct if d.delta_pct >= 0 else -d.noise_low_pct)
    assert d.significant == (abs(d.delta_pct) > d.noise_pct)
    if d.significant:
        assert abs(d.delta_pct) > 100 * NOISE_FLOOR
        assert (d.verdict == "better") == (d.delta_pct > 0)  # IOPS: up is better
    assert d.significant == (d.verdict != "within noise")


def test_the_issues_case_a_fall_beyond_an_uneven_band() -> None:
    """-99.8% beside ±364.3% called significant: the band is even in ratios (x/÷ 4.64), and the
    old display showed only its upper side, next to a change of the arithmetic means. The same
    data now shows the change judged and the interval it is judged against."""
    a = summarize([5390.0, 10000.0, 18550.0])  # IOPS whose repeats vary 3.4 times
    b = summarize([22.6, 22.6, 22.6])         # then the device nearly stopped
    d = delta("randread", "read_iops", a, b)
    assert d.delta_pct == pytest.approx(-99.77, abs=0.01)  # the geometric means: 10000 -> 22.6
    assert d.noise_low_pct == pytest.approx(-78.5, abs=0.1)
    assert d.noise_high_pct == pytest.approx(364.3, abs=0.1)
    assert d.noise_pct == pytest.approx(78.5, abs=0.1)  # the side the change went
    assert d.significant and d.verdict == "worse"
    # a fall that stays inside the interval on the low side is noise, though the old "±364%" hid it
    inside = delta("randread", "read_iops", a, summarize([3000.0, 3000.0, 3000.0]))
    assert inside.delta_pct == pytest.approx(-70.0, abs=0.1)
    assert not inside.significant and inside.noise_pct == pytest.approx(78.5, abs=0.1)
    # and a rise must pass the upper side
    up = delta("randread", "read_iops", a, summarize([40_000.0] * 3))
    assert up.delta_pct == pytest.approx(300.0, abs=0.1) and not up.significant
    assert delta("randread", "read_iops", a, summarize([50_000.0] * 3)).verdict == "better"


def test_the_change_judged_is_of_the_geometric_means() -> None:
    """One wild repeat moves the arithmetic mean; the rule and its figure do not follow it."""
    a = summarize([100.0, 100.0, 100.0])
    b = summarize([100.0, 100.0, 1000.0])  # arithmetic mean +200%, geometric mean +115%
    d = delta("s", "read_bandwidth", a, b)
    assert d.delta == pytest.approx(300.0)
    assert d.delta_pct == pytest.approx(100 * (10 ** (1 / 3) - 1))
    assert not d.significant and d.delta_pct < (d.noise_high_pct or 0)


@given(values, st.floats(min_value=0.5, max_value=2.0))
def test_the_rule_does_not_depend_on_the_unit(xs: list[float], k: float) -> None:
    ys = [x * 1.3 for x in xs]
    plain = delta("s", "read_iops", summarize(xs), summarize(ys))
    scaled = delta("s", "read_iops", summarize([x * k for x in xs]), summarize([y * k for y in ys]))
    assert plain.significant == scaled.significant


@given(st.floats(min_value=1.0, max_value=1e9), st.floats(min_value=0.06, max_value=5.0))
def test_a_clean_change_beyond_the_floor_is_significant(base: float, change: float) -> None:
    assume(base * change > 1e-6)
    a, b = summarize([base] * 3), summarize([base * (1 + change)] * 3)
    assert delta("s", "read_bandwidth", a, b).verdict == "better"
    assert delta("s", "read_lat_p99", a, b).verdict == "worse"  # latency up is worse


def test_the_noise_rule_on_numbers() -> None:
    a = summarize([500.0, 510.0, 490.0])
    assert delta("s", "read_bandwidth", a, summarize([520.0, 530.0, 510.0])).verdict == "within noise"
    # 4% up with no spread is under the 5% floor
    assert not delta("s", "read_bandwidth", summarize([100.0] * 3), summarize([104.0] * 3)).significant
    big = delta("s", "read_bandwidth", a, summarize([1000.0, 1010.0, 990.0]))
    assert big.significant and big.delta_pct == pytest.approx(100.0, abs=0.05)
    assert big.noise_pct is not None and 5.0 <= big.noise_pct < 10  # a tiny spread: a small band
    # 200 +- 100 against 300: a 50% gain, but inside what A's own repeats did
    spread = delta("s", "read_bandwidth", summarize([100.0, 200.0, 300.0]), summarize([300.0, 290.0, 310.0]))
    assert not spread.significant and spread.noise_pct is not None and spread.noise_pct > 100
    # proportional noise: a 20x gain stays clear even when B's repeats vary 5x
    wild = delta("s", "read_bandwidth", summarize([36.0, 40.0, 44.0, 38.0, 42.0]),
                 summarize([400.0, 2000.0, 900.0, 1700.0, 600.0]))
    assert wild.significant and wild.verdict == "better"
    # with one run a side only the floor can judge
    assert delta("s", "read_iops", summarize([100.0]), summarize([106.0])).significant
    # a zero value (idle CPU) is judged on the values themselves
    cpu = delta("s", "cpu_usr", summarize([0.0, 0.0, 0.0]), summarize([2.0, 2.1, 1.9]))
    assert cpu.significant and cpu.verdict == "worse" and cpu.delta_pct is None


def test_compare_pairs_steps_and_metrics_present_on_both_sides() -> None:
    one = {"a": {"read_bandwidth": summarize([1.0]), "read_iops": summarize([2.0])},
           "only-a": {"read_iops": summarize([1.0])}}
    two = {"a": {"read_bandwidth": summarize([2.0])}, "only-b": {"read_iops": summarize([1.0])}}
    rows = compare(one, two)
    assert [(r.step, r.metric, r.verdict) for r in rows] == [("a", "read_bandwidth", "better")]


def test_iozone_table_by_thread_count() -> None:
    steps = presets.expand("iozone-seq", "iozone-seq", presets.Overrides(), TargetFacts())
    summaries = {s.name: {("read_bandwidth" if s.pattern == "read" else "write_bandwidth"):
                          summarize([s.threads * 100.0 + len(s.phase or "")])} for s in steps}
    summaries["iozone-seq/t2/read"] = {"read_bandwidth": summarize([100.0, 300.0])}
    (table,) = iozone_tables(steps, summaries)
    assert [r.threads for r in table.rows] == [1, 2, 10]
    assert table.phases == ["write", "rewrite", "read", "reread"]
    assert table.rows[2].bandwidth == {"write": 1005.0, "rewrite": 1007.0, "read": 1004.0, "reread": 1006.0}
    assert table.rows[1].noisy == ["read"]


def threshold(**kw: object) -> Threshold:
    return Threshold.model_validate(kw)


def test_thresholds_give_a_verdict_per_matching_step() -> None:
    summaries = {"seq-1m/read": {"read_bandwidth": summarize([400e6, 410e6])},
                 "iometer-4k/randread": {"read_lat_p99": summarize([25_000.0])}}
    verdict = evaluate([threshold(metric="read_bandwidth", step="seq-1m/*", min="386MB/s"),
                        threshold(metric="read_lat_p99", max="20ms")], summaries)
    assert [o.passed for o in verdict.outcomes] == [True, False] and not verdict.passed
    assert verdict.outcomes[1].message == "iometer-4k/randread: read_lat_p99 25.00 ms is above 20.00 ms"
    missing = evaluate([threshold(metric="write_iops", min=1)], summaries)
    assert not missing.passed and missing.outcomes[0].message == "no step matching '*' measured write_iops"


def member(name: str, await_ms: float, util: float = 50.0) -> DeviceStats:
    return DeviceStats(device=name, relation="md-member", above="md0", seconds=10, read_ios=100,
                       write_ios=0, read_bytes=1, write_bytes=0, read_iops=10, write_iops=0,
                       read_bytes_per_s=1, write_bytes_per_s=0, util_percent=util, await_ms=await_ms)


def test_the_slowest_member_of_an_array_stands_out() -> None:
    marked = mark_slowest([member("sdb", 4.0), member("sdc", 4.4), member("sdd", 19.0), member("sde", 3.9)])
    assert [d.device for d in marked if d.slowest] == ["sdd"]
    even = mark_slowest([member("sdb", 4.0), member("sdc", 4.4), member("sdd", 5.0)])
    assert not any(d.slowest for d in even)
