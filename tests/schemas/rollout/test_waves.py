"""Dealing hosts to waves: sizes, a stable order, the limits resolved."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stortune.schemas.rollout import waves
from stortune.schemas.rollout.spec import parse_rollout

DEFAULT = parse_rollout(None).waves


def names(n: int) -> list[str]:
    return [f"host-{i:05d}" for i in range(n)]


@pytest.mark.parametrize(("fleet", "sizes"), [(0, [0, 0, 0]), (1, [1, 0, 0]), (7, [1, 0, 6]),
                                              (10, [1, 0, 9]), (11, [1, 1, 9]), (1000, [1, 99, 900])])
def test_default_waves_take_a_canary_a_tenth_rounded_up_then_everyone(fleet: int, sizes: list[int]) -> None:
    dealt = waves.deal("web", names(fleet), DEFAULT)
    assert [len(w) for w in dealt] == sizes
    assert sorted(h for w in dealt for h in w) == names(fleet)


def test_waves_come_in_the_profiles_order() -> None:
    dealt = waves.deal("web", names(50), parse_rollout({"waves": [{"hosts": 2}, {"percent": 50},
                                                                   {"percent": 100}]}).waves)
    assert [h for w in dealt for h in w] == waves.ordered("web", names(50))
    assert [len(w) for w in dealt] == [2, 23, 25]


def test_a_percentage_is_of_the_exact_decimal_written() -> None:
    """10.1% of 1000 is 101, not 102: float 10.1 * 10 is 101.00000000000001."""
    spec = parse_rollout({"waves": [{"percent": 10.1}, {"percent": 100}]})
    assert [len(w) for w in waves.deal("p", names(1000), spec.waves)] == [101, 899]


def test_dealing_is_the_same_whatever_order_and_duplicates_the_hosts_come_in() -> None:
    hosts = names(300)
    shuffled = random.Random(7).sample(hosts, len(hosts)) + hosts[:20]
    assert waves.deal("db", shuffled, DEFAULT) == waves.deal("db", hosts, DEFAULT)


def test_each_profile_picks_its_own_canaries() -> None:
    canaries = {waves.deal(f"profile-{i}", names(100), DEFAULT)[0][0] for i in range(20)}
    assert len(canaries) > 10


@settings(max_examples=60, deadline=None)
@given(fleet=st.integers(min_value=0, max_value=300), extra=st.text("abcdefgh-0123", min_size=1, max_size=12),
       sizes=st.lists(st.integers(min_value=1, max_value=99), max_size=4, unique=True))
def test_adding_a_host_keeps_the_others_order_and_moves_none_by_more_than_one_wave(
        fleet: int, extra: str, sizes: list[int]) -> None:
    """What is stable: the order of the others never changes; each wave boundary shifts by one at
    most, so only a host on a boundary moves, to the neighbouring wave that has hosts."""
    hosts = names(fleet)
    new = "new-" + extra
    percents = [{"percent": p} for p in sorted(sizes)]
    spec = parse_rollout({"waves": [{"hosts": 1}, *percents, {"percent": 100}]})
    before = waves.deal("p", hosts, spec.waves)
    after = waves.deal("p", [*hosts, new], spec.waves)
    assert [h for w in after for h in w if h != new] == [h for w in before for h in w]
    where = {h: i for i, w in enumerate(before) for h in w}
    moved = {h: (where[h], i) for i, w in enumerate(after) for h in w if h != new and i != where[h]}
    for old, now in moved.values():  # to the next wave that has hosts, never over one
        assert not any(before[k] or after[k] for k in range(min(old, now) + 1, max(old, now)))
    assert len(moved) <= len(spec.waves) - 1


@pytest.mark.parametrize(("value", "wave", "expected"), [(1, 1000, 1), (3, 2, 3), ("10%", 99, 10),
                                                         ("10%", 1, 1), ("1%", 1, 1), ("100%", 900, 900),
                                                         ("33%", 3, 1), ("34%", 3, 2)])
def test_max_unavailable_rounds_up_and_is_at_least_one(value: object, wave: int, expected: int) -> None:
    assert waves.max_unavailable(parse_rollout({"maxUnavailable": value}), wave) == expected


@pytest.mark.parametrize(("value", "fleet", "expected"), [(0, 1000, 0), (2, 7, 2), ("5%", 1000, 50),
                                                          ("5%", 10, 0), ("5%", 20, 1), ("0%", 50, 0),
                                                          ("100%", 7, 7)])
def test_max_failures_rounds_down(value: object, fleet: int, expected: int) -> None:
    assert waves.max_failures(parse_rollout({"maxFailures": value}), fleet) == expected


def test_all_at_once_is_one_wave_everyone_at_once_and_never_halts() -> None:
    spec = parse_rollout({"strategy": "all-at-once"})
    (everyone,) = waves.deal("p", names(1000), waves.waves_of(spec))
    assert len(everyone) == 1000
    assert waves.max_unavailable(spec, 1000) == 1000 and waves.max_failures(spec, 1000) == 1000
