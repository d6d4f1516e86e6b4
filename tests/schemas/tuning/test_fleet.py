"""Several hosts of a class: per-host outcomes, the pooled answer, and whether it holds everywhere."""

from __future__ import annotations

from stortune.schemas.tuning.engine import Engine
from stortune.schemas.tuning.fleet import pooled
from stortune.schemas.tuning.simulate import Surface, drive, flat, streaming
from stortune.schemas.tuning.space import Measurement
from tests.schemas.tuning.docs import experiment

BASELINE = {"read_ahead_kb": 0, "nr_requests": 64}
SPEC = experiment(parameters=[{"tunable": "read_ahead_kb", "values": [0, 128, 1024, 2048]},
                              {"tunable": "nr_requests", "values": [64, 256]}]).spec


def run(surface: Surface, host: str) -> list[Measurement]:
    eng = Engine(SPEC, BASELINE, seed=surface.seed)
    drive(eng, surface)
    return [m.model_copy(update={"host": host}) for m in eng.measurements]


def test_a_gain_on_every_host_holds_everywhere() -> None:
    by_host = {f"h{i}": run(Surface(streaming, seed=20 + i), f"h{i}") for i in range(3)}
    out = pooled(by_host, SPEC, dict.fromkeys(by_host, BASELINE))
    assert not out.keepCurrent and out.significant and out.holds_everywhere
    assert out.values is not None and out.values["read_ahead_kb"] in (1024, 2048)
    assert out.gain is not None and out.gain.low > 0
    assert [v.host for v in out.hosts] == ["h0", "h1", "h2"] and all(v.significant for v in out.hosts)
    assert set(out.perHost) == {"h0", "h1", "h2"}


def test_one_hosts_luck_does_not_hold_everywhere() -> None:
    by_host = {"lucky": run(Surface(streaming, seed=30), "lucky"),
               "flat": run(Surface(flat, seed=31), "flat")}
    out = pooled(by_host, SPEC, dict.fromkeys(by_host, BASELINE))
    assert not out.holds_everywhere
    verdicts = {v.host: v for v in out.hosts}
    assert not verdicts["flat"].significant
    assert out.perHost["flat"].recommendation.keepCurrent
    assert "not significant on flat" in out.reason or out.keepCurrent


def test_no_hosts_keep_the_current_settings() -> None:
    out = pooled({}, SPEC, {})
    assert out.keepCurrent and not out.holds_everywhere and out.values is None
