"""Per-token rate limits of expensive calls: token buckets, answered with 429 and Retry-After.

    @router.get("/{name}/diagnostics", dependencies=[RateLimited("diagnostics", per_minute=6)])

or, when only some calls of a route are expensive, take a ``Quota`` and spend it::

    DryRunQuota = Annotated[Quota, QuotaOf("dry-run", per_minute=120)]
    ...
    if dry_run:
        quota.spend()

Each (limit name, token) has a bucket of ``burst`` calls (default: a quarter
minute's worth), refilled at ``per_minute``; ``--rate-limit NAME=PER_MINUTE``
(Settings.rate_limits) overrides a route's rate, and scales its burst alike.
The buckets live in this process: several servers behind one address each
allow the rate, which is enough to keep one token from monopolising a server.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi import Depends, Request

from stortune.server.api.deps import NowDep, SettingsDep
from stortune.server.api.security import CurrentPrincipal
from stortune.server.errors import TooManyRequests

_EPSILON = 1e-9


@dataclass
class _Bucket:
    tokens: float
    at: datetime


class RateLimiter:
    """Token buckets keyed by (limit, token id); safe across threads."""

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
            elapsed = max(0.0, (now - bucket.at).total_seconds())
            bucket.tokens = min(float(burst), bucket.tokens + elapsed * rate)
            bucket.at = now
            if bucket.tokens >= 1.0 - _EPSILON:  # time in float seconds does not add up exactly
                bucket.tokens = max(0.0, bucket.tokens - 1.0)
                return 0.0
            return (1.0 - bucket.tokens) / rate

    def _prune(self, now: datetime, rate: float, burst: int) -> None:
        # Buckets that have refilled since their last use hold no state worth keeping.
        full = [k for k, b in self._buckets.items()
                if b.tokens + (now - b.at).total_seconds() * rate >= burst]
        for key in full or list(self._buckets)[: len(self._buckets) // 2]:
            del self._buckets[key]


@dataclass(frozen=True)
class Quota:
    """One caller's budget for one limit, spent by ``spend()``."""

    limiter: RateLimiter
    name: str
    key: str
    per_minute: float
    burst: int
    now: datetime

    def spend(self) -> None:
        wait = self.limiter.take(self.name, self.key, per_minute=self.per_minute, burst=self.burst,
                                 now=self.now)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            raise TooManyRequests(
                f"rate limit {self.name!r} reached for this token ({self.per_minute:g} calls per minute, "
                f"bursts of {self.burst}); retry in {seconds} s", retry_after_s=seconds)


def quota(name: str, *, per_minute: float, burst: int | None = None) -> Callable[..., Awaitable[Quota]]:
    """A dependency giving the caller's ``Quota`` of the limit ``name``."""

    async def dependency(request: Request, principal: CurrentPrincipal, settings: SettingsDep,
                         now: NowDep) -> Quota:
        rate = settings.rate_limits.get(name, per_minute)
        # An overridden rate scales the burst with it; by default a quarter minute's worth.
        size = max(1, math.ceil((burst if burst is not None else per_minute / 4) * rate / per_minute))
        limiter: RateLimiter = request.app.state.rate_limiter
        return Quota(limiter, name, principal.token_id, rate, size, now)

    return dependency


def QuotaOf(name: str, *, per_minute: float, burst: int | None = None) -> Any:
    """``Annotated[Quota, QuotaOf("dry-run", per_minute=120)]``."""
    return Depends(quota(name, per_minute=per_minute, burst=burst))


def RateLimited(name: str, *, per_minute: float, burst: int | None = None) -> Any:
    """A route dependency spending one call of ``name`` per request (429 when exhausted)."""
    source = quota(name, per_minute=per_minute, burst=burst)

    # Depends as the default: annotations are strings here (PEP 563) and FastAPI could
    # not resolve the closure's ``source`` from one.
    async def spend(budget: Quota = Depends(source)) -> None:  # noqa: B008
        budget.spend()

    return Depends(spend)
