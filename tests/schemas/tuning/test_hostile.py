"""A hostile operator (or a broken agent) against the tuning core: every input is bounded,
every bad figure is a failed run, never a crash, a NaN in the outcome or a stuck engine."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import pytest

from stortune.schemas.bench.spec import load_benchmark
from stortune.schemas.documents import DocumentError, load_profiles, parse_profile
from stortune.schemas.matching import mismatch
from stortune.schemas.planner import plan
from stortune.schemas.topology import Device, DeviceKind, ScsiHost, Topology
from stortune.schemas.tuning import engine as engine_module
from stortune.schemas.tuning import evidence
from stortune.schemas.tuning.engine import Engine
from stortune.schemas.tuning.evidence import Outcome, TrialSummary, usable
from stortune.schemas.tuning.experiment import (
    TuningExperiment,
    TuningSpec,
    load_experiments,
    parse_experiment,
)
from stortune.schemas.tuning.fleet import pooled
from stortune.schemas.tuning.overlay import overlay_profile
from stortune.schemas.tuning.recommend import class_match, recommended_profile
from stortune.schemas.tuning.simulate import Surface, streaming
from stortune.schemas.tuning.space import Measurement, Point, point_key
from stortune.schemas.tuning.strategies import Bayesian, Dimension, Tried
from tests.schemas.topologies import num, streamer_with_md
from tests.schemas.tuning.docs import doc, experiment

BASELINE = {"read_ahead_kb": 0, "nr_requests": 64}
BIG = {"read_ahead_kb": 16384}


def _run(spec_kw: dict[str, object], bad: dict[str, float]) -> Engine:
    """The engine to its end, the runs of read_ahead_kb=16384 reporting ``bad`` figures."""
    eng = Engine(experiment(**spec_kw).spec, BASELINE)
    surface = Surface(streaming, seed=3)
    while (req := eng.next()) is not None:
        m = surface.run(req)
        if m.point["read_ahead_kb"] == BIG["read_ahead_kb"]:
            m = Measurement.model_validate({**m.model_dump(), "metrics": {**m.metrics, **bad}})
        eng.record(m)
    return eng


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0, 1e308, 1e200])
def test_a_figure_no_device_can_measure_is_a_failed_run(value: float) -> None:
    spec = experiment(constraints=[{"metric": "read_lat_p99", "max": "20ms"}]).spec
    m = Measurement(index=0, point=BASELINE, purpose="baseline",
                    metrics={"read_bandwidth": value, "read_lat_p99": value}, job_cv=value)
    assert not usable(spec, m)
    assert m.metrics == {} and m.job_cv is None
    eng = _run({"constraints": [{"metric": "read_lat_p99", "max": "20ms"}]},
               {"read_bandwidth": value})
    out = eng.outcome()
    assert eng.finished_reason == "done"
    json.dumps(out.model_dump(mode="json"), allow_nan=False)  # no NaN/inf reaches the evidence
    assert all(t.point["read_ahead_kb"] != 16384 or t.n == 0 for t in out.trials)


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
def test_a_constrained_figure_that_is_not_a_number_never_makes_a_point_feasible(value: float) -> None:
    eng = _run({"constraints": [{"metric": "read_lat_p99", "max": "200ms"}]}, {"read_lat_p99": value})
    out = eng.outcome()
    json.dumps(out.model_dump(mode="json"), allow_nan=False)
    big = [t for t in out.trials if t.point["read_ahead_kb"] == 16384]
    assert big and not any(t.feasible for t in big)
    assert out.recommendation.values["read_ahead_kb"] != 16384


def test_a_fairness_figure_that_is_missing_or_not_a_number_is_a_violation() -> None:
    spec = experiment(constraints=[{"fairness": "read_bandwidth", "maxCV": 10}]).spec
    eng = Engine(spec, BASELINE)
    surface = Surface(lambda p: {**streaming(p), "job_cv": 5.0}, seed=3)
    while (req := eng.next()) is not None:
        m = surface.run(req)
        if m.point["read_ahead_kb"] == 16384:
            m = m.model_copy(update={"job_cv": None})
        eng.record(m)
    big = [t for t in eng.outcome().trials if t.point["read_ahead_kb"] == 16384]
    assert big and not any(t.feasible for t in big)
    assert "not measured" in big[0].violations[0]


def test_measurements_are_bounded() -> None:
    with pytest.raises(ValueError, match="metrics"):
        Measurement(index=0, point=BASELINE, purpose="baseline", metrics={f"m{i}": 1.0 for i in range(100)})
    with pytest.raises(ValueError, match="metrics"):
        Measurement(index=0, point=BASELINE, purpose="baseline", metrics={"x" * 1000: 1.0})


def test_a_fleet_whose_hosts_report_zero_or_negative_figures_does_not_crash() -> None:
    spec = experiment().spec
    by_host: dict[str, list[Measurement]] = {}
    for host, bad in (("a", 0.0), ("b", -5.0)):
        eng = Engine(spec, BASELINE)
        surface = Surface(streaming, seed=4)
        while (req := eng.next()) is not None:
            m = surface.run(req)
            if m.point["read_ahead_kb"] == 1024:
                m = Measurement.model_validate({**m.model_dump(), "metrics": {"read_bandwidth": bad}})
            eng.record(m)
        by_host[host] = eng.measurements
    out = pooled(by_host, spec, {"a": BASELINE, "b": BASELINE})
    json.dumps(out.model_dump(mode="json"), allow_nan=False)


def test_figures_slipped_past_validation_are_dropped_when_recorded() -> None:
    eng = Engine(experiment().spec, BASELINE)
    req = eng.next()
    assert req is not None
    m = Measurement(index=req.index, point=req.point, purpose=req.purpose, metrics={"read_bandwidth": 1.0})
    eng.record(m.model_copy(update={"metrics": {"read_bandwidth": math.nan}, "job_cv": -3.0}))
    assert eng.measurements[0].metrics == {} and eng.measurements[0].job_cv is None


def _problems(data: object) -> list[tuple[str, str]]:
    with pytest.raises(DocumentError) as err:
        parse_experiment(data)
    return [(p.path, p.message) for p in err.value.problems]


@pytest.mark.parametrize(("rng", "words"), [
    ({"min": 4, "max": 10**400, "scale": "log"}, "less than or equal"),
    ({"min": 4, "max": 2**1000}, "less than or equal"),
    ({"min": 10**30, "max": 10**31}, "less than or equal"),
])
def test_absurd_ranges_are_refused_by_field(rng: dict[str, object], words: str) -> None:
    found = _problems(doc(parameters=[{"tunable": "read_ahead_kb", "range": rng}]))
    assert found and found[0][0].startswith("spec.parameters[0].range") and words in found[0][1], found
    assert all(len(m) < 400 for _, m in found)


@pytest.mark.parametrize("duration", ["99999999999999999999999h", 1e308, "400d", 10**12])
def test_a_duration_budget_is_bounded(duration: object) -> None:
    found = _problems(doc(budget={"trials": 60, "duration": duration}))
    assert found[0][0] == "spec.budget.duration", found


EXPERIMENT_YAML = """apiVersion: stortune/v1
kind: TuningExperiment
metadata: {name: a}
spec:
  target: {device: {kind: [loop]}}
  workloads: [{preset: stream-32k}]
  objective: {metric: read_bandwidth}
  parameters: [{tunable: read_ahead_kb, values: [0, 128]}]
"""


@pytest.mark.parametrize(("text", "words"), [
    ("[" * 50_000 + "]" * 50_000, "nested deeper than"),
    ("a:\n" + "".join("  " * i + " - \n" for i in range(1, 200)), "nested deeper than"),
    ("a: &a [b, *a]\n", "cycle"),
    ("a: &a {b: {c: *a}}\n", "cycle"),
    (EXPERIMENT_YAML + "metadata: {name: b}\n", "duplicate key 'metadata'"),
    (EXPERIMENT_YAML.replace("parameters:", "parameters: []\n  parameters:"), "duplicate key 'parameters'"),
    ("a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}' if i > 1 else '*a'] * 9)}]\n" for i in range(1, 9)),
     "expands to more than"),
])
def test_hostile_yaml_is_a_document_error_not_a_crash(text: str, words: str) -> None:
    for load in (load_experiments, load_profiles, load_benchmark):
        with pytest.raises(DocumentError) as err:
            load(text, "x.yaml")
        assert words in str(err.value), (load, str(err.value)[:300])


def test_anchors_and_merge_keys_still_read() -> None:
    text = EXPERIMENT_YAML.replace("metadata: {name: a}", "metadata: &m {name: a}\nx-meta: *m").replace(
        "x-meta: *m\n", "")
    assert load_experiments(text)[0].name == "a"
    merged = EXPERIMENT_YAML.replace("target: {device: {kind: [loop]}}",
                                     "target: {device: {<<: {kind: [disk]}, kind: [loop]}}")
    assert load_experiments(merged)[0].spec.target.device.kind is not None


def _device(name: str, model: str | None = None, driver: str | None = None) -> Device:
    """A disk whose controller's driver is ``driver``; "=x": no controller driver, x its own."""
    own = driver[1:] if driver and driver.startswith("=") else None
    return Device(name=name, kind=DeviceKind.DISK, id=f"name:{name}", model=model, driver=own,
                  scsi_host=ScsiHost(name="host0", driver=None if own else driver) if driver else None,
                  tunables={"read_ahead_kb": num(128)})


@pytest.mark.parametrize(("model", "driver"), [
    ("x" * 4000, "megaraid_sas"),
    ("\u00e9" * 200, None),
    ("a b/c" * 80, "mpt3sas"),
    ("PERC 5/i", "drv "),
    ("ST.*(a|b)$^{1,2}\\", " megaraid_sas\t"),
    ("QEMU HARDDISK", "=virtio_blk"),  # a SCSI host without a driver, the device's own
])
def test_the_recommended_match_takes_any_model_or_driver_and_matches_its_device(
        model: str, driver: str | None) -> None:
    target = _device("sdq", model, driver)
    match = class_match(target)
    profile = parse_profile({"apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "p"},
                             "spec": {"rules": [{"name": "r", "match": match,
                                                 "settings": {"read_ahead_kb": 4096}}]}}, "p")
    rule = profile.spec.rules[0].match
    assert mismatch(rule, target) is None
    if len(model) < 100:
        assert mismatch(rule, _device("sdr", model + "X", driver)) is not None


def _long_run(trials: int) -> Engine:
    params = [{"tunable": "read_ahead_kb", "range": {"min": 4, "max": 65536, "scale": "log", "steps": 64}},
              {"tunable": "nr_requests", "range": {"min": 4, "max": 2048, "scale": "log", "steps": 60}}]
    spec = experiment(strategy="grid", parameters=params, budget={"trials": trials},
                      repeats={"min": 1, "max": 2}).spec
    eng = Engine(spec, {"read_ahead_kb": 128, "nr_requests": 64})
    surface = Surface(streaming, seed=1)
    while (req := eng.next()) is not None:
        eng.record(surface.run(req))
    return eng


def _reference_best_so_far(eng: Engine) -> list[float | None]:
    """The best feasible mean after each trial, from scratch each time."""
    out: list[float | None] = []
    for i in range(1, len(eng.measurements) + 1):
        order = evidence.ranked(eng.spec, evidence.by_point(eng.spec, eng.measurements[:i], eng.members))
        out.append(order[0].mean if order else None)
    return out


def test_the_live_view_of_a_long_experiment_does_not_rank_every_point_after_every_trial(
        monkeypatch: pytest.MonkeyPatch) -> None:
    eng = _long_run(400)
    assert eng.best_so_far() == _reference_best_so_far(eng)
    # progress() is what GET /experiments/{id} calls: it must not sort the whole history once per
    # trial (quadratic: 0.6 s at 1,150 trials, a minute at the budget's 10,000).
    ranked_items = 0
    real = evidence.ranked

    def counting(spec: TuningSpec, summaries: Sequence[TrialSummary]) -> list[TrialSummary]:
        nonlocal ranked_items
        ranked_items += len(summaries)
        return real(spec, summaries)

    keys = 0

    def counting_keys(point: Point) -> tuple[tuple[str, int | str], ...]:
        nonlocal keys
        keys += 1
        return point_key(point)

    monkeypatch.setattr(evidence, "ranked", counting)
    for module in (engine_module, evidence):
        monkeypatch.setattr(module, "point_key", counting_keys)
    eng.progress()
    points = len({point_key(m.point) for m in eng.measurements})
    assert ranked_items <= 2 * points
    assert keys <= 4 * len(eng.measurements)  # not once per point per trial


@pytest.mark.parametrize("seed", [0, 2**31 - 1, 123_456_789])
def test_bayesian_proposals_stay_in_the_declared_values_whatever_the_seed(seed: int) -> None:
    dims = [Dimension("read_ahead_kb", (0, 4, 4096, 16384)), Dimension("nr_requests", (32, 2048)),
            Dimension("scheduler@beneath", ("none", "bfq")), Dimension("queue_depth", (1,))]
    search = Bayesian(dims, maximize=False, seed=seed, budget_points=40)
    tried: list[Tried] = [Tried(point={"read_ahead_kb": 128, "nr_requests": 64, "scheduler@beneath": "kyber",
                                       "queue_depth": 32}, mean=5.0, feasible=True)]  # the baseline, off grid
    while (point := search.propose(tried)) is not None:
        assert all(point[d.key] in d.choices for d in dims), point
        assert point_key(point) not in {point_key(t.point) for t in tried}
        tried.append(Tried(point=point, mean=float(len(tried) % 7), feasible=len(tried) % 3 > 0))
    assert len(tried) <= 1 + 4 * 2 * 2


def test_a_history_from_another_document_or_baseline_is_refused_not_replayed() -> None:
    wide = experiment(parameters=[{"tunable": "read_ahead_kb", "values": [0, 128, 16384]},
                                  {"tunable": "nr_requests", "values": [32, 64]}]).spec
    eng = Engine(wide, BASELINE)
    surface = Surface(streaming, seed=1)
    while (req := eng.next()) is not None:
        eng.record(surface.run(req))
    assert eng.outcome().recommendation.values["read_ahead_kb"] == 16384
    # The document was changed between restarts: its history must not make the engine run or
    # recommend a value the document no longer lists.
    narrow = experiment(parameters=[{"tunable": "read_ahead_kb", "values": [0, 128]},
                                    {"tunable": "nr_requests", "values": [32, 64]}]).spec
    with pytest.raises(ValueError, match=r"read_ahead_kb=16384.*not a value of this experiment"):
        Engine(narrow, BASELINE, history=eng.measurements)
    # A baseline run must be of the baseline.
    other = {"read_ahead_kb": 128, "nr_requests": 64}
    with pytest.raises(ValueError, match="baseline"):
        Engine(narrow, other, history=eng.measurements[:2])
    fresh = Engine(narrow, BASELINE)
    with pytest.raises(ValueError, match="baseline"):
        fresh.record(Measurement(index=0, point=other, purpose="baseline", metrics={"read_bandwidth": 1.0}))


def _md_members_scheduler() -> tuple[Topology, TuningExperiment, Outcome]:
    topo = streamer_with_md()
    exp = experiment(target={"device": {"kind": ["md"]}}, parameters=[
        {"tunable": "scheduler", "at": "beneath", "values": ["mq-deadline", "none"]}])
    eng = Engine(exp.spec, {"scheduler@beneath": "mq-deadline"})
    surface = Surface(lambda p: {"read_bandwidth": 2e8 * (1.5 if p["scheduler@beneath"] == "none" else 1)},
                      seed=1)
    while (req := eng.next()) is not None:
        eng.record(surface.run(req))
    return topo, exp, eng.outcome()


def test_the_md_members_scheduler_reaches_the_disks_under_their_partitions() -> None:
    topo, exp, out = _md_members_scheduler()
    assert out.recommendation.values == {"scheduler@beneath": "none"}
    md0 = topo.device("md0")
    assert md0 is not None
    # Without an explicit list, the devices beneath come from the topology as for the overlay:
    # the md members are partitions, the scheduler is their disks'.
    profile = recommended_profile(exp, out, md0, topo)
    wanted = {(d.device, d.tunable): d.desired for d in plan([profile], topo).desired}
    assert {wanted.get((d, "scheduler")) for d in ("sdb", "sdc", "sdd")} == {"none"}
    assert wanted.get(("sda", "scheduler")) is None  # not the PERC volume beside the array


def test_a_recommendation_no_device_can_carry_says_so() -> None:
    topo, exp, out = _md_members_scheduler()
    md0 = topo.device("md0")
    assert md0 is not None
    with pytest.raises(ValueError, match="none of the devices beneath md0 takes scheduler"):
        recommended_profile(exp, out, md0, None, [])


@pytest.mark.parametrize("value", ["../../../proc/sys/kernel/core_pattern", "a/b", "none\n", "none\x00bfq",
                                   "..", "none mq-deadline", "[none]", "bfq;reboot", "x" * 100_000])
def test_a_scheduler_value_is_a_bare_name_never_a_path_or_two_lines(value: str) -> None:
    for at in ("target", "beneath"):
        found = _problems(doc(parameters=[{"tunable": "scheduler", "at": at, "values": ["none", value]}]))
        assert found[0][0] == "spec.parameters[0].values[1]" and len(found[0][1]) < 300, found


@pytest.mark.parametrize("tunable", ["dev.raid.speed_limit_min", "dev.raid.speed_limit_max",
                                     "vm.dirty_ratio"])
def test_host_wide_tunables_are_refused_on_the_target_and_beneath(tunable: str) -> None:
    for at in ("target", "beneath"):
        found = _problems(doc(parameters=[{"tunable": tunable, "at": at, "values": [1000]}]))
        assert found[0][0] == "spec.parameters[0].tunable", found


@pytest.mark.parametrize("name", ["loop1", "cciss!c0d0", "pmem0.1", "dm-1", "a:b+c", "sda"])
def test_the_overlay_matches_its_target_and_no_neighbour(name: str) -> None:
    # (A device name cannot hold a glob's * ? [ ]: topology.DEVICE_NAME_PATTERN.)
    neighbours = ["loop1", "loop10", "loop1p1", "sda", "sdaa", "cciss!c0d0", "cciss!c0d1", "pmem0.1",
                  "pmem0a1", "dm-1", "dm-10", "a:b+c", "a:bbc"]
    target = _device(name)
    overlay = overlay_profile("e" * 253, {"read_ahead_kb": 4096}, target)
    assert len(overlay.name) <= 253 and overlay.name.startswith("tune-")
    hits = [n for n in neighbours if all(mismatch(r.match, _device(n)) is None for r in overlay.spec.rules)]
    assert hits == [name]
