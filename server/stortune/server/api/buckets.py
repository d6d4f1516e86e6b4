"""Token buckets: a burst of calls, refilled at a rate; the rule every limit here spends by.

Apart from the routes' limits (api/ratelimit.py) so that the authentication middleware
(api/access.py, through api/signins.py) counts failed sign-ins by the same rule without
importing the routes' machinery.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

_EPSILON = 1e-9


@dataclass
class _Bucket:
    tokens: float
    at: datetime


def spend_one(tokens: float, at: datetime, now: datetime, *, rate: float, burst: int) -> tuple[float, float]:
    """One call from a bucket of ``tokens`` last counted ``at``, refilled at ``rate`` per second
    up to ``burst``: (tokens left, seconds until a call is allowed: 0 when this one is)."""
    elapsed = max(0.0, (now - at).total_seconds())
    tokens = min(float(burst), tokens + elapsed * rate)
    if tokens >= 1.0 - _EPSILON:  # time in float seconds does not add up exactly
        return max(0.0, tokens - 1.0), 0.0
    return tokens, (1.0 - tokens) / rate


class Limiter(Protocol):
    def take(self, name: str, key: str, *, per_minute: float, burst: int, now: datetime) -> float:
        """Spend one call: 0 when allowed, else the seconds until one is."""
        ...


class RateLimiter:
    """Token buckets keyed by (limit, token id), in this process; safe across threads."""

    def __init__(self, max_buckets: int = 10_000) -> None:
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._max = max_buckets
        self._lock = threading.Lock()

    def take(self, name: str, key: str, *, per_minute: float, burst: int, now: datetime) -> float:
        """Spend one call: 0 when allowed, else the seconds until one is."""
        rate = per_minute / 60.0
        with self._lock:
            bucket = self._buckets.get((name, key))
            if bucket is None:
                if len(self._buckets) >= self._max:
                    self._prune(now, rate, burst)
                bucket = self._buckets[(name, key)] = _Bucket(float(burst), now)
            bucket.tokens, wait = spend_one(bucket.tokens, bucket.at, now, rate=rate, burst=burst)
            bucket.at = now
            return wait

    def waiting(self, name: str, key: str, *, per_minute: float, burst: int, now: datetime) -> float:
        """Seconds until a call of ``key`` would be allowed (0: now), spending nothing."""
        with self._lock:
            bucket = self._buckets.get((name, key))
            if bucket is None:
                return 0.0
            return spend_one(bucket.tokens, bucket.at, now, rate=per_minute / 60.0, burst=burst)[1]

    def _prune(self, now: datetime, rate: float, burst: int) -> None:
        # Buckets that have refilled since their last use hold no state worth keeping.
        full = [k for k, b in self._buckets.items()
                if b.tokens + (now - b.at).total_seconds() * rate >= burst]
        for key in full or list(self._buckets)[: len(self._buckets) // 2]:
            del self._buckets[key]
