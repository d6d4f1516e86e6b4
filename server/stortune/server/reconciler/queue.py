"""A work queue of host names, with the semantics of client-go's workqueue.

* A key waits in the queue at most once, however often it is added.
* A key is handed to one worker at a time. Added again while it is being
  processed, it is queued once more when that worker calls ``done``, so the
  change that caused the add is never missed and never raced.
* Failures are retried after a per-key exponential backoff
  (``add_rate_limited``); ``forget`` resets it after a success.
* ``add`` may be called from any thread (the API's sync routes run in a
  thread pool); everything else is called on the queue's event loop.
* A new key wakes one waiting worker, not all of them (as asyncio.Queue does):
  sixteen idle workers woken for every drift check was a noticeable part of an
  idle control plane's CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections import deque

from stortune.schemas import backoff


class Backoff:
    """Per-key exponential delays: ``base`` doubling up to ``cap``, each shortened by up to
    ``jitter`` (a fraction) so that hosts failing together do not retry together."""

    def __init__(self, base: float = 0.5, cap: float = 60.0, jitter: float = 0.2,
                 rng: random.Random | None = None) -> None:
        if not 0 < base <= cap or not 0 <= jitter < 1:
            raise ValueError("need 0 < base <= cap and 0 <= jitter < 1")
        self.base, self.cap, self.jitter = base, cap, jitter
        self._rng = rng or random.Random()  # noqa: S311 (spreading retries, not secrets)
        self._failures: dict[str, int] = {}

    def next(self, key: str) -> float:
        """The delay before the next retry of ``key``; counts one more failure."""
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        return backoff.shortened(n, self.base, self.cap, self.jitter, self._rng.random())

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)


class WorkQueue:
    """Make it on the event loop that will consume it."""

    def __init__(self, backoff: Backoff | None = None) -> None:
        self.backoff = backoff or Backoff()
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()  # queued, or to be queued again when done
        self._processing: set[str] = set()
        self._waiting: dict[str, asyncio.TimerHandle] = {}  # delayed adds
        self._getters: deque[asyncio.Future[None]] = deque()  # workers waiting for a key
        self._shut = False

    # -- adding -------------------------------------------------------------------
    def add(self, key: str) -> None:
        """Queue ``key`` (no-op if it is already queued); safe from any thread."""
        if threading.get_ident() == self._thread:
            self._add(key)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server has stopped
            self._loop.call_soon_threadsafe(self._add, key)

    def _add(self, key: str) -> None:
        if self._shut or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:  # else done() queues it
            self._queue.append(key)
            self._wake_one()

    def add_after(self, key: str, delay: float) -> None:
        """Queue ``key`` in ``delay`` seconds; an earlier pending add of it wins."""
        if delay <= 0:
            self._add(key)
            return
        when = self._loop.time() + delay
        pending = self._waiting.get(key)
        if pending is not None:
            if pending.when() <= when:
                return
            pending.cancel()
        self._waiting[key] = self._loop.call_at(when, self._fire, key)

    def _fire(self, key: str) -> None:
        self._waiting.pop(key, None)
        self._add(key)

    def add_rate_limited(self, key: str) -> float:
        """Retry ``key`` after its backoff; returns the delay."""
        delay = self.backoff.next(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        """``key`` succeeded: its next failure starts from the base delay again."""
        self.backoff.forget(key)

    # -- consuming ----------------------------------------------------------------
    async def get(self) -> str | None:
        """The next key, marked as being processed; None once the queue is shut down."""
        while not self._queue:
            if self._shut:
                return None
            waiter = self._loop.create_future()
            self._getters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken and cancelled at once: the key is another worker's
                raise
        if self._shut:
            return None
        key = self._queue.popleft()
        self._processing.add(key)
        self._dirty.discard(key)
        if self._queue:
            self._wake_one()  # let another waiting worker take the next one
        return key

    def _wake_one(self) -> None:
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def done(self, key: str) -> None:
        """Processing of ``key`` ended; if it was added meanwhile it is queued again."""
        self._processing.discard(key)
        if key in self._dirty and not self._shut:
            self._queue.append(key)
            self._wake_one()

    def shutdown(self) -> None:
        """Hand out no more keys; workers waiting in ``get`` get None."""
        self._shut = True
        for handle in self._waiting.values():
            handle.cancel()
        self._waiting.clear()
        while self._getters:
            self._wake_one()

    # -- looking --------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._queue)

    @property
    def shutting_down(self) -> bool:
        return self._shut

    def processing(self) -> frozenset[str]:
        return frozenset(self._processing)

    def delayed(self) -> frozenset[str]:
        return frozenset(self._waiting)

    def delays(self) -> dict[str, float]:
        """Seconds until each delayed key is queued."""
        now = self._loop.time()
        return {key: handle.when() - now for key, handle in self._waiting.items()}
