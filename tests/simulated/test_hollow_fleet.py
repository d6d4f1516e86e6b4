"""bench/hollow.py for real, small: 20 hollow hosts (real agent service, registrar and host
identity over fixture trees) register with stortune-server processes and converge to a profile.

On SQLite with one server, and on PostgreSQL with two replicas sharing a fresh database (the
server tests' helper; skipped with the reason when PostgreSQL is not reachable). Builds on
bench/fleet.py's launcher, so the bench's start and clean-up are what is tested.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import fleet
from bench.hollow import address_of, host_name
from tests.server.conftest import new_pg_database

HOSTS = 20

pytestmark = pytest.mark.slow(seconds=18)


@pytest.fixture(params=["sqlite-1", "postgresql-2"])
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[str | None, int]]:
    """(database URL, None: the launcher's SQLite; replicas)."""
    if request.param == "sqlite-1":
        yield None, 1
    else:
        # Closed explicitly, so the database is dropped as soon as the test is done with it.
        with contextlib.closing(new_pg_database("stortune_hollow")) as urls:
            for url in urls:
                yield url, 2


def test_hollow_hosts_register_and_converge(backend: tuple[str | None, int]) -> None:
    db_url, replicas = backend
    args = argparse.Namespace(agents="hollow", procs=2, replicas=replicas, db=None, interval=5.0,
                              heartbeat=None, server_arg=[], keep=False)
    with contextlib.ExitStack() as stack:
        running = fleet.launch(args, HOSTS, stack, db_url=db_url)
        assert len(running.servers) == replicas
        base = running.urls[0]
        fleet.wait_for("hollow hosts registered", lambda: fleet.registered(base) >= HOSTS, 60, 0.2)
        hosts = {h["metadata"]["name"]: h for h in fleet.get(base + "/api/v1/hosts")["items"]}
        assert set(hosts) == {host_name(i) for i in range(HOSTS)}
        # Each on an address of its own (one port, many loopback addresses), as it registered.
        assert {h["spec"]["address"] for h in hosts.values()} == {
            address_of(i, int(hosts[host_name(0)]["spec"]["address"].rpartition(":")[2]))
            for i in range(HOSTS)}

        generation = fleet.apply_profile(running)
        fleet.wait_for("every hollow host Ready", lambda: fleet.ready_count(base, generation) >= HOSTS,
                       60, 0.2)
        # Applied by the real executor, into each host's own fixture tree.
        for i in (0, HOSTS - 1):
            attr = Path(running.work, host_name(i), "sys/class/block/loop0/queue/read_ahead_kb")
            assert attr.read_text().strip() == "4096"
        work = running.work
    assert not work.exists()
    assert all(p.poll() is not None for p in running.servers + running.agents)
