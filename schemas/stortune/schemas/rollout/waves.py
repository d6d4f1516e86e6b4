"""Dealing hosts to waves, and the limits a wave and a rollout run under.

The order is a hash of the profile's name and the host's name (sha256), not of the fleet: it
is the same after a restart, on every replica and whatever order the hosts are listed in, and
each profile picks its own canaries (one host is not every profile's guinea pig). Adding a
host never reorders the others; it can only shift a wave boundary by one, so only a host on a
boundary moves, to the neighbouring wave that has hosts (tests/schemas/rollout/test_waves.py).
The machine deals once, when a rollout starts, and keeps the waves in its state; a host
enrolling later joins the last wave rather than redealing the rest.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from fractions import Fraction

from stortune.schemas.rollout.spec import RolloutSpec, Wave

#: What all-at-once is: one wave of everyone, every host changed at once, no failure halts.
_EVERYONE = Wave(percent=100)


def order_key(profile: str, host: str) -> bytes:
    """Where ``host`` stands in ``profile``'s rollouts (NUL cannot occur in either name)."""
    return hashlib.sha256(f"{profile}\0{host}".encode()).digest()


def ordered(profile: str, hosts: Iterable[str]) -> list[str]:
    """The hosts (deduplicated) in ``profile``'s rollout order."""
    return sorted(set(hosts), key=lambda h: (order_key(profile, h), h))


def _percent_of(percent: float | str, of: int, *, up: bool) -> int:
    exact = Fraction(str(percent)) * of / 100  # str: 10.1 is 10.1, not its binary neighbour
    return math.ceil(exact) if up else math.floor(exact)


def wave_size(wave: Wave, total: int) -> int:
    """How many of ``total`` hosts the waves up to and including ``wave`` take."""
    if total == 0:
        return 0
    if wave.hosts is not None:
        return min(wave.hosts, total)
    assert wave.percent is not None  # Wave._one
    return min(total, max(1, _percent_of(wave.percent, total, up=True)))


def waves_of(spec: RolloutSpec) -> list[Wave]:
    return [_EVERYONE] if spec.strategy == "all-at-once" else list(spec.waves)


def deal(profile: str, hosts: Iterable[str], waves: Sequence[Wave]) -> list[list[str]]:
    """Each wave's own hosts (a host belongs to the first wave that takes it); a wave whose
    size the waves before already reach is empty. The last wave takes whoever is left."""
    order = ordered(profile, hosts)
    out: list[list[str]] = []
    taken = 0
    for i, wave in enumerate(waves):
        upto = len(order) if i == len(waves) - 1 else max(taken, wave_size(wave, len(order)))
        out.append(order[taken:upto])
        taken = upto
    return out


def _count(count: int | str, of: int, *, up: bool) -> int:
    return count if isinstance(count, int) else _percent_of(count.removesuffix("%"), of, up=up)


def max_unavailable(spec: RolloutSpec, wave_hosts: int) -> int:
    """Hosts of a wave of ``wave_hosts`` that may be changing at once: a percentage rounds up,
    and at least one, or the wave would never move."""
    if spec.strategy == "all-at-once":
        return max(1, wave_hosts)
    return max(1, _count(spec.maxUnavailable, wave_hosts, up=True))


def max_failures(spec: RolloutSpec, rollout_hosts: int) -> int:
    """Failed hosts tolerated in a rollout of ``rollout_hosts``: a percentage rounds down (5% of
    ten hosts tolerates none). all-at-once never halts (today's behaviour)."""
    if spec.strategy == "all-at-once":
        return rollout_hosts
    return _count(spec.maxFailures, rollout_hosts, up=False)
