"""Several servers on one PostgreSQL database: shard leases, their handover and fencing.

Real keepers on a real database (a new one per test), driven tick by tick, so every
handover is a step the test takes, not a wait: a second server takes half, a server
that stops gives its shards up, a server that dies loses them when the leases run out,
and a server that lost a shard cannot write under its old lease (the hostile case: a
stale owner still at work).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from stortune.server.db.engine import make_engine, make_sessions
from stortune.server.db.migrate import upgrade
from stortune.server.shards import SHARDS, AllShards, Fence, LeaseLost, ShardKeeper, fenced, shard_of
from stortune.server.shards.notices import batches
from tests.server.conftest import new_pg_database

LEASE_S = 1.5


def keeper(engine: Engine, name: str) -> ShardKeeper:
    """Renewing only when the test says (``tick``), so each handover is a step of the test."""
    return ShardKeeper(engine, lease_s=LEASE_S, replica=name, renew_every=3600)


@pytest.fixture
def engine() -> Iterator[Engine]:
    for url in new_pg_database("stortune_shards"):
        engine = make_engine(url)
        upgrade(engine)
        try:
            yield engine
        finally:
            engine.dispose()


def host_in(shards: frozenset[int]) -> str:
    return next(f"host-{i}" for i in range(10_000) if shard_of(f"host-{i}") in shards)


async def fencing(engine: Engine, sessions: sessionmaker[Session]) -> tuple[ShardKeeper, str, Fence]:
    """Server "a", alone, fencing ``sessions``; one of its hosts and the fence it works on it under."""
    a = keeper(engine, "a")
    a.install(sessions)
    await a.start()
    host = host_in(a.owned())
    fence = a.fence(host)
    assert fence is not None
    return a, host, fence


def write(sessions: sessionmaker[Session]) -> None:
    """One transaction: the fence's guard runs at its start."""
    with sessions() as session:
        session.execute(text("SELECT 1"))
        session.commit()


def test_hosts_spread_over_every_shard() -> None:
    counts = [0] * SHARDS
    for i in range(10_000):
        counts[shard_of(f"node{i:05d}.example.com")] += 1
    assert min(counts) > 100 and max(counts) < 220  # about 156 each
    assert shard_of("a") == shard_of("a")  # stable: crc32, not Python's salted hash


def test_notices_batch_under_the_payload_limit() -> None:
    names = [f"host-{i:05d}.rack{i % 40}.example.com" for i in range(10_000)]
    sent = batches(names)
    assert all(len(b.encode()) < 8000 for b in sent)
    assert [n for b in sent for n in b.split("\n")] == names
    assert len(sent) < 70  # not one notice per host


def test_one_server_owns_everything_and_a_second_takes_half(engine: Engine) -> None:
    async def scenario() -> None:
        a = keeper(engine, "a")
        b = keeper(engine, "b")
        await a.start()
        assert a.owned() == frozenset(range(SHARDS)) and a.leads()
        await b.start()  # none free yet
        assert b.owned() == frozenset()
        await a.tick()  # sees two live servers: gives half up
        await b.tick()  # takes them
        assert len(a.owned()) == len(b.owned()) == SHARDS // 2
        assert a.owned() | b.owned() == frozenset(range(SHARDS)) and not a.owned() & b.owned()
        assert a.leads() != b.leads()  # exactly one does the fleet-wide chores
        await b.stop()  # gives its shards up at once
        await a.tick()
        assert a.owned() == frozenset(range(SHARDS))
        await a.stop()
    asyncio.run(scenario())


def test_a_dead_server_loses_its_shards_when_the_leases_run_out(engine: Engine) -> None:
    async def scenario() -> None:
        a = keeper(engine, "a")
        b = keeper(engine, "b")
        await a.start()
        await b.start()
        await a.tick()
        await b.tick()
        host = host_in(a.owned())
        stale = a.fence(host)
        assert stale is not None and b.fence(host) is None
        # a dies (no renewal, no release); b's renewals go on
        await b.tick()
        assert b.fence(host) is None  # not before a's leases ran out
        deadline = time.monotonic() + 10 * LEASE_S
        while b.fence(host) is None and time.monotonic() < deadline:
            await asyncio.sleep(LEASE_S / 3)
            await b.tick()
        taken = b.fence(host)
        assert taken is not None and taken.generation > stale.generation
        assert b.owned() == frozenset(range(SHARDS))
        assert not a.holds(stale)  # a stalled server stops trusting its leases by itself
        await b.stop()
    asyncio.run(scenario())


def test_a_server_that_lost_the_shard_cannot_write_under_its_old_lease(engine: Engine) -> None:
    """Hostile: the old owner is still at work (a long pause, a slow agent) when the new one took over."""
    sessions = make_sessions(engine)

    async def scenario() -> None:
        _, host, stale = await fencing(engine, sessions)
        with fenced(stale):  # while held: fine
            await asyncio.to_thread(write, sessions)
        # a stops renewing; b takes over once the leases run out
        await asyncio.sleep(LEASE_S + 0.2)
        b = keeper(engine, "b")
        await b.start()
        assert b.fence(host) is not None
        with fenced(stale), pytest.raises(LeaseLost, match=f"{host}: shard {stale.shard}"):
            await asyncio.to_thread(write, sessions)
        # outside a fence (API calls, the other servers' work) nothing is checked
        await asyncio.to_thread(write, sessions)
        await b.stop()
    asyncio.run(scenario())


def test_hostile_the_same_server_claiming_its_lost_shards_again_cannot_write_under_the_old_lease(
        engine: Engine) -> None:
    """Hostile: the server itself lost its leases (a long pause: no renewal for lease_s) and claimed
    them back one generation later; work begun before the pause is still running. The owner is the
    same, so only the generation tells the old lease from the new one: fencing on the owner alone
    passed the whole suite, which only tested a takeover by another server."""
    sessions = make_sessions(engine)

    async def scenario() -> None:
        a, host, stale = await fencing(engine, sessions)
        with fenced(stale):
            await asyncio.to_thread(write, sessions)
        await asyncio.sleep(LEASE_S + 0.2)  # paused past the lease: lost, and nobody else took it
        assert a.fence(host) is None and not a.holds(stale)
        await a.tick()  # back: the same server claims them again
        fresh = a.fence(host)
        assert fresh is not None
        assert (fresh.owner, fresh.generation) == (stale.owner, stale.generation + 1)
        assert a.holds(fresh) and not a.holds(stale)
        with fenced(stale), pytest.raises(LeaseLost, match=f"under generation {stale.generation}$"):
            await asyncio.to_thread(write, sessions)
        with fenced(fresh):
            await asyncio.to_thread(write, sessions)
        await a.stop()
    asyncio.run(scenario())


def test_servers_starting_together_claim_different_shards(engine: Engine) -> None:
    async def scenario() -> None:
        keepers = [keeper(engine, f"r{i}") for i in range(3)]
        await asyncio.gather(*(k.start() for k in keepers))
        for _ in range(3):
            for k in keepers:
                await k.tick()
        owned = [k.owned() for k in keepers]
        assert sum(len(o) for o in owned) == SHARDS
        assert all(not (x & y) for i, x in enumerate(owned) for y in owned[i + 1:])
        assert sorted(len(o) for o in owned) == [20, 22, 22]  # ceil(64 / 3) each, the rest to the last
        for k in keepers:
            await k.stop()
    asyncio.run(scenario())


def test_sqlite_is_one_process_that_owns_every_host() -> None:
    one = AllShards()
    fence = one.fence("any-host")
    assert fence is not None and one.holds(fence) and one.leads()


def test_a_reconcile_request_reaches_the_other_servers(engine: Engine) -> None:
    """LISTEN/NOTIFY between two servers' Notices: names batched, every name delivered once."""
    from stortune.server.shards import Notices

    got: list[str] = []
    receiver = Notices(engine, got.extend)
    sender = Notices(engine, lambda hosts: None)
    receiver.start()
    sender.start()
    try:
        assert receiver.listening.wait(10)
        names = [f"host-{i:04d}.example.com" for i in range(1000)]  # several notices' worth
        sender.publish(names[:500])
        sender.publish(names[500:])
        deadline = time.monotonic() + 10
        while len(got) < len(names) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(got) == names
    finally:
        sender.stop()
        receiver.stop()


def test_an_open_fenced_transaction_does_not_hold_up_its_servers_renewal(engine: Engine) -> None:
    """Hostile: a fenced write stuck behind a slow API write (the resourceVersion row) must not
    stall the renewal: a stalled renewal row-locks every other shard of the server, so nobody could
    take them and a new server could not even start."""
    import threading

    sessions = make_sessions(engine)
    opened, release = threading.Event(), threading.Event()

    async def scenario() -> None:
        a, _, fence = await fencing(engine, sessions)

        def stuck() -> None:
            with sessions() as session:
                session.execute(text("SELECT 1"))  # the guard ran: the lease row is locked
                opened.set()
                release.wait(30)

        with fenced(fence):
            holder = asyncio.ensure_future(asyncio.to_thread(stuck))
        assert await asyncio.to_thread(opened.wait, 10)
        try:
            await asyncio.wait_for(a.tick(), 20)  # a hang detector, not a timing: it returns at once
            assert a.holds(fence)
        finally:
            release.set()
            await holder
        await a.stop()
    asyncio.run(scenario())
