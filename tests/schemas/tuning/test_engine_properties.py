"""Whatever fails and whatever the budget: the engine ends within its budget, asks for no trial
twice, retries a failed point once at most, and replays to the same requests."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stortune.schemas.tuning.engine import Engine
from stortune.schemas.tuning.simulate import Surface, streaming
from stortune.schemas.tuning.space import TrialRequest
from tests.schemas.tuning.docs import experiment

BASELINE = {"read_ahead_kb": 0, "nr_requests": 64}


@settings(max_examples=40, deadline=None)
@given(strategy=st.sampled_from(["one-at-a-time", "grid", "bayesian"]),
       trials=st.integers(min_value=11, max_value=70),
       failing=st.sets(st.integers(min_value=0, max_value=80), max_size=25),
       seed=st.integers(min_value=0, max_value=3))
def test_the_engine_ends_within_budget_and_replays(strategy: str, trials: int, failing: set[int],
                                                   seed: int) -> None:
    spec = experiment(strategy=strategy, budget={"trials": trials}).spec

    def fail(req: TrialRequest) -> str | None:
        return "injected" if req.index in failing else None

    surface = Surface(streaming, seed=seed, fail=fail)
    eng = Engine(spec, BASELINE, seed=seed)
    asked: list[TrialRequest] = []
    while (req := eng.next()) is not None:
        assert len(asked) < trials, "asked beyond the budget"
        asked.append(req)
        eng.record(surface.run(req))
    assert eng.finished_reason is not None
    assert [r.index for r in asked] == list(range(len(asked)))
    retries: dict[tuple[object, str], int] = {}
    for m in eng.measurements:
        if not m.ok and m.purpose in ("explore", "baseline", "baseline-end", "confirm"):
            key = (tuple(sorted(m.point.items())), m.purpose)
            retries[key] = retries.get(key, 0) + 1
    assert all(n <= 2 for n in retries.values())
    again = Engine(spec, BASELINE, history=eng.measurements[: len(asked) // 2], seed=seed)
    assert again.next() == asked[len(asked) // 2]
    outcome = eng.outcome()
    assert outcome.measurements == len(asked)
    if outcome.recommendation.keepCurrent:
        assert outcome.recommendation.values == BASELINE
