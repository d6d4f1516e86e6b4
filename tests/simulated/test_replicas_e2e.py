"""Three `stortune-server` processes on one PostgreSQL database, simulated hosts, and a
`kill -9` of one replica in the middle of a rollout.

The hosts are real agents (``stortune-agent serve``'s Agent over gRPC with mutual TLS, each
on its own fixture sysfs tree and state directory) run several to a process by
bench/fleet.py. They register and heartbeat at the first replica (a load balancer's
job in production). The profile goes to the second; the third holds a third of the
shards and is killed with SIGKILL right after. Then: every host converges; each host
was applied once (no two replicas at once, no lost or repeated apply, one Applied event);
the dead replica's shards have new owners; and a rate limit holds across the replicas.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url

from tests.e2e.test_control_plane_e2e import eventually, free_port
from tests.server.conftest import new_pg_database

pytestmark = pytest.mark.slow(seconds=26)
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
HOSTS = 12
PROFILE = {
    "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "fleet-streaming"},
    "spec": {"hostSelector": {"matchLabels": {"role": "fleet"}}, "priority": 10,
             "rules": [{"name": "loops", "match": {"kind": ["loop"]},
                        "settings": {"read_ahead_kb": 4096, "nr_requests": 64}}]},
}


@pytest.fixture
def database() -> Iterator[str]:
    yield from new_pg_database("stortune_replicas")


def conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def owners(url: str) -> dict[str, int]:
    with psycopg.connect(conninfo(url)) as conn:
        rows = conn.execute("SELECT owner, count(*) FROM shard_leases WHERE owner IS NOT NULL"
                            " AND expires_at > now() GROUP BY owner").fetchall()
    return {str(o): int(n) for o, n in rows}


def ready(host: dict[str, Any], generation: int) -> bool:
    status = host.get("status", {})
    return status.get("appliedGenerations", {}).get("fleet-streaming") == generation and any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))


def test_a_replica_killed_mid_rollout_loses_nothing_and_doubles_nothing(database: str,
                                                                        tmp_path: Path) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    ports = [free_port() for _ in range(3)]
    bases = [f"http://127.0.0.1:{p}" for p in ports]

    def server(i: int) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [str(BIN / "stortune-server"), "--db", database, "--state-dir", str(tmp_path / f"r{i}"),
             "--pki-dir", str(tmp_path / "pki"), "--listen", f"127.0.0.1:{ports[i]}",
             "--reconcile-interval", "2", "--shard-lease", "6", "--rate-limit", "dry-run=12"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"r{i}.log", "wb"))  # noqa: SIM115
        procs.append(proc)
        return proc

    try:
        server(0)
        eventually("the first replica", lambda: httpx.get(bases[0] + "/healthz").status_code == 200)
        admin = {"Authorization": "Bearer " + (tmp_path / "r0/admin.token").read_text().strip()}
        token = (tmp_path / "r0/agent-bootstrap.token").read_text().strip()
        for i in (1, 2):
            server(i)
        for base in bases[1:]:
            eventually("the other replicas", lambda b=base: httpx.get(b + "/healthz").status_code == 200)
        agents = subprocess.Popen(
            [sys.executable, str(ROOT / "bench/fleet.py"), "--child", bases[0], "0", "1", str(HOSTS),
             str(tmp_path / "hosts")],
            stdout=subprocess.PIPE, stderr=open(tmp_path / "agents.log", "wb"),  # noqa: SIM115
            env={**os.environ, "STORTUNE_AGENT_TOKEN": token})
        procs.append(agents)
        assert agents.stdout is not None and agents.stdout.readline().strip() == b"ready"

        def hosts(base: str = bases[1]) -> list[dict[str, Any]]:
            return list(httpx.get(base + "/api/v1/hosts", headers=admin, timeout=10).json()["items"])

        eventually(f"{HOSTS} hosts registered", lambda: len(hosts()) == HOSTS)
        eventually("three replicas sharing the shards",
                   lambda: len(o := owners(database)) == 3 and sum(o.values()) == 64 and o)
        # The rollout: the profile through the second replica; the third killed at once.
        made = httpx.post(bases[1] + "/api/v1/profiles", json=PROFILE, headers=admin, timeout=10)
        assert made.status_code == 201, made.text
        generation = made.json()["metadata"]["generation"]
        victim = procs[2]
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)

        def all_ready() -> list[dict[str, Any]]:
            listed = hosts()
            return listed if all(ready(h, generation) for h in listed) else []

        converged = eventually("every host applied and Ready", all_ready, timeout=90)
        assert len(converged) == HOSTS
        survivors = eventually("the dead replica's shards taken over",  # within a lease and a renewal
                               lambda: len(o := owners(database)) == 2 and sum(o.values()) == 64 and o)
        assert len(survivors) == 2
        # One Applied event per host, and every host applied by one replica.
        for h in converged:
            name = h["metadata"]["name"]
            events = httpx.get(bases[0] + "/api/v1/events", params={"host": name, "limit": 500},
                               headers=admin, timeout=10).json()["items"]
            applied = [e for e in events if e["reason"] == "Applied"]
            assert len(applied) == 1, (name, applied)
        # A rate limit holds across the replicas: one token's dry runs (12 a minute, bursts of 6)
        # spread over the two left; limited per replica, each would let 6 through at once.
        limited = []
        for i in range(20):
            r = httpx.post(bases[i % 2] + "/api/v1/profiles", params={"dryRun": "All"},
                           json={**PROFILE, "metadata": {"name": f"dry-{i}"}}, headers=admin, timeout=10)
            limited.append(r.status_code)
        allowed = limited.count(200) + limited.count(201)
        assert 429 in limited and allowed <= 9, limited  # 6, and what refilled meanwhile
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
