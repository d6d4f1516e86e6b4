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
On SQLite (one server) the buckets live in this process; on PostgreSQL, where several
servers share the database, they live in it (api/sharedlimits.py), so a token gets the
rate once across all of them.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi import Depends, Request

from stortune.server.api.buckets import Limiter, RateLimiter, spend_one
from stortune.server.api.deps import NowDep, SettingsDep
from stortune.server.api.security import CurrentPrincipal, authorize_route
from stortune.server.errors import TooManyRequests

__all__ = ["Limiter", "Quota", "QuotaOf", "RateLimited", "RateLimiter", "quota", "sized", "spend_one"]

@dataclass(frozen=True)
class Quota:
    """One caller's budget for one limit, spent by ``spend()``."""

    limiter: Limiter
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


def sized(rate_limits: Mapping[str, float], name: str, *, per_minute: float,
          burst: int | None = None) -> tuple[float, int]:
    """The rate of the limit ``name`` (``per_minute`` unless Settings.rate_limits overrides it) and
    its bucket's size: ``burst``, by default a quarter minute's worth, scaled with an overridden rate."""
    rate = rate_limits.get(name, per_minute)
    return rate, max(1, math.ceil((burst if burst is not None else per_minute / 4) * rate / per_minute))


def quota(name: str, *, per_minute: float, burst: int | None = None) -> Callable[..., Awaitable[Quota]]:
    """A dependency giving the caller's ``Quota`` of the limit ``name``."""

    async def dependency(request: Request, principal: CurrentPrincipal, settings: SettingsDep,
                         now: NowDep) -> Quota:
        rate, size = sized(settings.rate_limits, name, per_minute=per_minute, burst=burst)
        limiter: Limiter = request.app.state.rate_limiter
        return Quota(limiter, name, principal.token_id, rate, size, now)

    return dependency


def QuotaOf(name: str, *, per_minute: float, burst: int | None = None) -> Any:
    """``Annotated[Quota, QuotaOf("dry-run", per_minute=120)]``."""
    return Depends(quota(name, per_minute=per_minute, burst=burst))


def RateLimited(name: str, *, per_minute: float, burst: int | None = None) -> Any:
    """A route dependency spending one call of ``name`` per request (429 when exhausted)."""
    source = quota(name, per_minute=per_minute, burst=burst)

    # Depends as the default: annotations are strings here (PEP 563) and FastAPI could
    # not resolve the closure's ``source`` from one. Not async: a shared bucket is a database
    # round trip, which belongs in the thread pool, not on the event loop. The route's
    # dependencies run before its parameters, its permission among them: checked here first.
    def spend(request: Request, budget: Quota = Depends(source)) -> None:  # noqa: B008
        authorize_route(request)
        budget.spend()

    return Depends(spend)
