"""The work queue: client-go semantics (dedupe, one worker per key, re-queue after done), backoff."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from stortune.server.reconciler.queue import Backoff, WorkQueue
from stortune.server.reconciler.runner import SUMMARY_SHARE, summary_pause

T = TypeVar("T")


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(scenario(), timeout=10))


async def drain(queue: WorkQueue) -> list[str]:
    """Every key queued now, each marked done at once."""
    keys = []
    while len(queue):
        key = await queue.get()
        assert key is not None
        keys.append(key)
        queue.done(key)
    return keys


def test_a_key_is_queued_once_however_often_it_is_added() -> None:
    async def scenario() -> list[str]:
        queue = WorkQueue()
        for key in ["a", "b", "a", "a", "c", "b"]:
            queue.add(key)
        return await drain(queue)

    assert run(scenario) == ["a", "b", "c"]


def test_a_key_added_while_processing_waits_for_done() -> None:
    async def scenario() -> None:
        queue = WorkQueue()
        queue.add("a")
        assert await queue.get() == "a"
        queue.add("a")
        queue.add("a")
        assert len(queue) == 0 and queue.processing() == {"a"}  # not handed to a second worker
        queue.done("a")
        assert len(queue) == 1  # once, for both adds
        assert await queue.get() == "a"
        queue.done("a")
        assert len(queue) == 0

    run(scenario)


def test_workers_never_process_one_key_concurrently() -> None:
    """Four workers, keys added while they are being processed: at most one worker per key,
    and every add is followed by a pass that started after it."""

    async def scenario() -> None:
        queue = WorkQueue()
        busy: set[str] = set()
        started: dict[str, int] = {}
        added: dict[str, int] = {}
        tick = 0

        async def worker() -> None:
            nonlocal tick
            while (key := await queue.get()) is not None:
                assert key not in busy
                busy.add(key)
                tick += 1
                started[key] = tick
                await asyncio.sleep(0)
                await asyncio.sleep(0)
                busy.discard(key)
                queue.done(key)

        workers = [asyncio.create_task(worker()) for _ in range(4)]
        rng = random.Random(7)
        for _ in range(300):
            key = rng.choice("abc")
            tick += 1
            added[key] = tick
            queue.add(key)
            await asyncio.sleep(0)
        while len(queue) or queue.processing():
            await asyncio.sleep(0)
        queue.shutdown()
        await asyncio.gather(*workers)
        assert all(started[k] > added[k] for k in added)

    run(scenario)


def test_backoff_doubles_to_the_cap_and_forget_resets_it() -> None:
    backoff = Backoff(base=0.5, cap=4, jitter=0)
    assert [backoff.next("h") for _ in range(6)] == [0.5, 1, 2, 4, 4, 4]
    assert backoff.next("other") == 0.5  # per key
    assert backoff.failures("h") == 6
    backoff.forget("h")
    assert backoff.failures("h") == 0 and backoff.next("h") == 0.5


def test_backoff_jitter_only_shortens() -> None:
    backoff = Backoff(base=1, cap=60, jitter=0.2, rng=random.Random(1))
    for n in range(10):
        delay = backoff.next("h")
        full = min(60, 2**n)
        assert 0.8 * full <= delay <= full
    with pytest.raises(ValueError):
        Backoff(base=0)


def test_rate_limited_adds_come_back_after_the_delay_and_forget_resets() -> None:
    async def scenario() -> None:
        queue = WorkQueue(Backoff(base=0.01, cap=1, jitter=0))
        assert queue.add_rate_limited("h") == 0.01
        assert len(queue) == 0 and queue.delayed() == {"h"}
        assert await queue.get() == "h"  # arrives once its delay ran out
        queue.done("h")
        assert queue.add_rate_limited("h") == 0.02
        queue.forget("h")
        assert queue.backoff.next("h") == 0.01

    run(scenario)


def test_an_earlier_delayed_add_wins() -> None:
    async def scenario() -> None:
        queue = WorkQueue()
        queue.add_after("h", 3600)
        queue.add_after("h", 0.01)  # replaces the later one
        queue.add_after("h", 7200)  # ignored: an earlier one is pending
        assert await queue.get() == "h"
        queue.done("h")
        assert queue.delayed() == frozenset()

    run(scenario)


def test_add_from_another_thread() -> None:
    async def scenario() -> str | None:
        queue = WorkQueue()
        thread = threading.Thread(target=queue.add, args=("from-thread",))
        thread.start()
        key = await queue.get()
        thread.join()
        return key

    assert run(scenario) == "from-thread"


def test_shutdown_wakes_workers_and_drops_later_adds() -> None:
    async def scenario() -> None:
        queue = WorkQueue()
        waiting = asyncio.create_task(queue.get())
        await asyncio.sleep(0)
        queue.add_after("later", 3600)
        queue.shutdown()
        assert await waiting is None
        queue.add("x")
        assert len(queue) == 0 and await queue.get() is None
        assert queue.delayed() == frozenset()

    run(scenario)


def test_each_added_key_goes_to_one_waiting_worker_and_shutdown_releases_the_rest() -> None:
    async def scenario() -> None:
        queue = WorkQueue()
        workers = [asyncio.create_task(queue.get()) for _ in range(4)]
        await asyncio.sleep(0)  # all four wait
        queue.add("a")
        queue.add("b")
        for _ in range(5):
            await asyncio.sleep(0)
        done = [w for w in workers if w.done()]
        assert sorted(w.result() for w in done) == ["a", "b"]
        queue.shutdown()
        rest = await asyncio.gather(*(w for w in workers if w not in done))
        assert rest == [None, None]

    run(scenario)


def test_a_worker_cancelled_as_it_is_woken_passes_the_key_on() -> None:
    async def scenario() -> str | None:
        queue = WorkQueue()
        first = asyncio.create_task(queue.get())
        second = asyncio.create_task(queue.get())
        await asyncio.sleep(0)
        queue.add("a")  # wakes the first waiter...
        first.cancel()  # ...which is cancelled before it runs: the key must not be stranded
        with pytest.raises(asyncio.CancelledError):
            await first
        return await asyncio.wait_for(second, timeout=5)

    assert run(scenario) == "a"


def test_profile_summaries_take_a_bounded_share_of_the_time_however_large_the_fleet() -> None:
    """A summary pass reads every host: a fast one waits the minimum, a slow one (a large fleet)
    waits in proportion, so passes fill at most SUMMARY_SHARE of the time."""
    assert summary_pause(0.001, 1.0) == 1.0
    for took in (0.5, 2.0, 7.5):
        pause = summary_pause(took, 1.0)
        assert pause > 1.0 and took / (took + pause) <= SUMMARY_SHARE + 1e-9
