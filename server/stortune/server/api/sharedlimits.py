"""Rate limits that hold across every server of one PostgreSQL database.

Each (limit, token) bucket is a row of ``rate_buckets``, read under a row lock, refilled and
spent by the same rule as the in-process buckets (ratelimit.spend_one) and written back in one
short transaction: two servers taking from one bucket at once queue on the row, so a token
gets its rate once, not once per server. Rate-limited calls are the expensive ones (dry runs,
diagnostics, charts), so a round trip each is cheap beside them. The rows are not resources:
writing them does not bump resourceVersion.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine, select, update
from sqlalchemy.dialects.postgresql import insert

from stortune.server.api.ratelimit import spend_one
from stortune.server.db.tables import RateBucket


class SharedRateLimiter:
    """``Limiter`` over the ``rate_buckets`` table (PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def take(self, name: str, key: str, *, per_minute: float, burst: int, now: datetime) -> float:
        this = (RateBucket.name == name) & (RateBucket.key == key)
        with self._engine.begin() as conn:
            conn.execute(insert(RateBucket).values(name=name, key=key, tokens=float(burst), at=now)
                         .on_conflict_do_nothing())
            tokens, at = conn.execute(select(RateBucket.tokens, RateBucket.at).where(this)
                                      .with_for_update()).one()
            left, wait = spend_one(tokens, at, now, rate=per_minute / 60.0, burst=burst)
            # Servers' clocks differ a little: never move the count back (it would refill twice).
            conn.execute(update(RateBucket).where(this).values(tokens=left, at=max(at, now)))
        return wait
