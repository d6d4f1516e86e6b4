"""Failed sign-ins, per client address: throttled, and logged in aggregate.

Every call that presents a token or a session cookie the server refuses spends one from its
address's bucket (``failed_auth_burst`` failures, refilled at ``failed_auth_per_minute``).
While the bucket is empty, the address's calls are 429 with Retry-After before their
credentials are looked up, unless they carry credentials this server accepted within the
hour (still looked up, so a revocation holds): a fleet behind one NAT address keeps its
agents' token when someone else there guesses. Counted in this process; several replicas
each count their own.

The refusals are logged as Kubernetes aggregates events: the first from an address is
written, the following ones are counted and said with the next line, at most one line per
address every ``LOG_EVERY_S``, plus one when the address starts being throttled.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta

from stortune.server.api.buckets import RateLimiter
from stortune.server.errors import TooManyRequests

log = logging.getLogger(__name__)

LOG_EVERY_S = 60.0
#: Credentials accepted this recently from anywhere are still looked up from a throttled address.
ACCEPTED_FOR_S = 3600.0
MAX_ACCEPTED = 4096
_LIMIT = "failed-sign-ins"


@dataclass
class _Record:
    said_at: datetime | None = None
    unsaid: int = 0  # refusals counted since the last line
    throttled: bool = False


class FailedSignIns:
    """The throttle and the log of refused credentials, keyed by client address."""

    def __init__(self, *, burst: int, per_minute: float, max_addresses: int = 10_000) -> None:
        self.burst = burst
        self.per_minute = per_minute
        self._buckets = RateLimiter(max_buckets=max_addresses)
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._max = max_addresses
        #: Digests of credentials accepted lately, and when: they are looked up even while throttled.
        self._accepted: OrderedDict[str, datetime] = OrderedDict()
        self._lock = threading.Lock()

    def accepted(self, digest: str, now: datetime) -> None:
        with self._lock:
            self._accepted[digest] = now
            self._accepted.move_to_end(digest)
            while len(self._accepted) > MAX_ACCEPTED:
                self._accepted.popitem(last=False)

    def vouched(self, digest: str | None, now: datetime) -> bool:
        """``digest``'s credentials were accepted within ACCEPTED_FOR_S."""
        with self._lock:
            at = self._accepted.get(digest) if digest is not None else None
        return at is not None and now - at < timedelta(seconds=ACCEPTED_FOR_S)

    def _wait(self, address: str, now: datetime) -> float:
        return self._buckets.waiting(_LIMIT, address, per_minute=self.per_minute, burst=self.burst, now=now)

    def check(self, address: str, now: datetime) -> None:
        """TooManyRequests while ``address`` has no failures left to spend."""
        wait = self._wait(address, now)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            self.refused(address, now, "a call: throttled")
            raise TooManyRequests(
                f"too many failed sign-ins from {address} ({self.burst}, then {self.per_minute:g} a minute): "
                f"retry in {seconds} s with a valid token", retry_after_s=seconds)

    def failed(self, address: str, now: datetime, what: str) -> None:
        """Credentials from ``address`` were refused (``what``: the call and why, for the log)."""
        self._buckets.take(_LIMIT, address, per_minute=self.per_minute, burst=self.burst, now=now)
        dry = self._wait(address, now) > 0
        with self._lock:
            record = self._record(address)
            starts, record.throttled = dry and not record.throttled, dry
        self.refused(address, now, what)
        if starts:
            log.warning("throttling %s: %d failed sign-ins; its calls with credentials not accepted before "
                        "are 429 until it slows down", address, self.burst)

    def refused(self, address: str, now: datetime, what: str) -> None:
        """Log a refusal from ``address``, or count it for the next line."""
        with self._lock:
            record = self._record(address)
            if record.said_at is not None and now - record.said_at < timedelta(seconds=LOG_EVERY_S):
                record.unsaid += 1
                return
            unsaid, record.unsaid, record.said_at = record.unsaid, 0, now
        more = f" (and {unsaid} more refused from this address since the last line)" if unsaid else ""
        log.info("refused %s from %s%s", what, address, more)

    def _record(self, address: str) -> _Record:
        record = self._records.get(address)
        if record is None:
            record = self._records[address] = _Record()
            while len(self._records) > self._max:
                self._records.popitem(last=False)
        self._records.move_to_end(address)
        return record
