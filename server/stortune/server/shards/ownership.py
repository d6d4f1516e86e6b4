"""Which hosts this server works on, and the fence every transaction of that work carries.

A host's shard is ``crc32(name) % SHARDS``: stable across processes and versions (Python's
own ``hash`` of a string is not). 64 shards spread a fleet evenly over a handful of servers
and keep a handover small (a sixty-fourth of the fleet at a time).

Fencing: work on a host runs inside ``fenced(fence)`` (a context variable, so it follows the
work into ``asyncio.to_thread`` and into tasks it starts). With a keeper installed on the
sessionmaker, each transaction begun there first reads the host's lease row ``FOR KEY SHARE``
and checks that this server still owns it under the same generation and that it has not
expired; if not, ``LeaseLost`` is raised before anything is read or written. The lock makes
a takeover (its ``FOR UPDATE SKIP LOCKED`` claim) pass the shard over while fenced transactions
are in flight, and every later fenced transaction of the old owner fails; it does not block
the owner's own renewals and give-ups (``FOR NO KEY UPDATE``).
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sqlalchemy.orm import Session, sessionmaker

SHARDS = 64
#: Called on the event loop after the owned shards changed: (gained, lost).
Listener = Callable[[frozenset[int], frozenset[int]], None]


def shard_of(host: str) -> int:
    return zlib.crc32(host.encode("utf-8")) % SHARDS


@dataclass(frozen=True)
class Fence:
    """A lease as it was when work on a host began."""

    host: str
    shard: int
    owner: str
    generation: int


class LeaseLost(Exception):
    """This server no longer holds the lease the work began under."""

    def __init__(self, fence: Fence) -> None:
        super().__init__(f"{fence.host}: shard {fence.shard} is no longer owned by {fence.owner}"
                         f" under generation {fence.generation}")
        self.fence = fence


_CURRENT: ContextVar[Fence | None] = ContextVar("stortune_fence", default=None)


@contextlib.contextmanager
def fenced(fence: Fence) -> Iterator[None]:
    """Every transaction begun inside (in this task, its threads and its child tasks) is fenced."""
    token = _CURRENT.set(fence)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current_fence() -> Fence | None:
    return _CURRENT.get()


def ensure_held(ownership: Ownership) -> None:
    """Before acting on an agent: the lease the current work runs under must still be held."""
    fence = _CURRENT.get()
    if fence is not None and not ownership.holds(fence):
        raise LeaseLost(fence)


def moved(ownership: Ownership, drivers: dict[str, asyncio.Task[None]]) -> list[str]:
    """Cancel the driver of every host whose shard this server no longer holds (its new owner
    picks the work up from the stored rows); the hosts let go."""
    gone = [host for host in drivers if ownership.fence(host) is None]
    for host in gone:
        drivers[host].cancel()
    return gone


@runtime_checkable
class Ownership(Protocol):
    replica: str

    def fence(self, host: str) -> Fence | None:
        """The lease to work on ``host`` under now; None when this server does not own it."""
        ...

    def holds(self, fence: Fence) -> bool:
        """Is ``fence`` still this server's, unexpired (checked before acting on an agent)?"""
        ...

    def leads(self) -> bool:
        """Fleet-wide chores (profile summaries, lease expiry, schedules) run on one server."""
        ...

    def watch(self, listener: Listener) -> None: ...

    def install(self, sessions: sessionmaker[Session]) -> None:
        """Fence the transactions of ``sessions`` begun inside ``fenced``."""
        ...

    def working(self, fence: Fence) -> contextlib.AbstractContextManager[None]:
        """Counts work in flight on the fence's shard: a shard given up waits for it."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class AllShards:
    """One server owns every host (SQLite, the embedded single-process default): no fencing."""

    def __init__(self, replica: str = "local") -> None:
        self.replica = replica

    def fence(self, host: str) -> Fence | None:
        return Fence(host, shard_of(host), self.replica, 0)

    def holds(self, fence: Fence) -> bool:
        return True

    def leads(self) -> bool:
        return True

    def watch(self, listener: Listener) -> None:
        pass  # nothing ever changes hands

    def install(self, sessions: sessionmaker[Session]) -> None:
        pass

    def working(self, fence: Fence) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass
