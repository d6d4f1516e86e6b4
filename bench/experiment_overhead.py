"""Orchestration overhead per trial of a tuning experiment on the control plane.

    .venv/bin/python bench/experiment_overhead.py [--values 5] [--db sqlite|postgresql://...]

Everything a trial costs except fio's own runtime: the control plane (uvicorn on 127.0.0.1,
SQLite unless --db) drives a real agent over gRPC on a fixture host whose fio is the test
suite's SurfaceFio (it measures a response surface and returns at once). Per trial that is the
Apply of the desired profiles plus the trial's overlay (journaled on the agent), the trial's row
and benchmark run in one transaction, StartBenchmark, WatchBenchmark, GetBenchmarkResult, the
result and raw files stored, the measurement and the evidence recorded, ForgetBenchmark. The
figure is the experiment's wall time (submission to its end, the final put-back included)
divided by its trials. Target (issue 15): under 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the fixture host and the fake fio live with the tests

import httpx  # noqa: E402

from stortune.agent.serve import Agent, ServeOptions  # noqa: E402
from stortune.server import (  # noqa: E402
    RecordingController,
    Settings,
    create_app,
    serving,
)
from stortune.server.agentclient import AgentClients  # noqa: E402
from stortune.server.auth import Role  # noqa: E402
from tests.agent.fakefio import SurfaceFio  # noqa: E402
from tests.e2e.surface_agent import SURFACE, host  # noqa: E402
from tests.server.support import issue_token  # noqa: E402

TARGET_S = 1.0
VALUES = [0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def experiment(values: list[int]) -> dict[str, Any]:
    return {"apiVersion": "stortune/v1", "kind": "TuningExperiment", "metadata": {"name": "overhead"},
            "spec": {"hostSelector": {"matchLabels": {"role": "bench"}},
                     "target": {"device": {"kind": ["loop"]}},
                     "workloads": [{"preset": "stream-32k", "runtime": "1s"}],
                     "objective": {"metric": "read_bandwidth"},
                     "parameters": [{"tunable": "read_ahead_kb", "values": values}],
                     "strategy": "grid", "repeats": {"min": 2, "max": 2}, "budget": {"trials": 200}}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=5, help="read_ahead_kb values swept (grid)")
    parser.add_argument("--db", default="", help="SQLAlchemy URL (default: SQLite in a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fs = host(Path(tmp) / "host")
        queue = fs.sysfs / "block" / "loop7" / "queue"
        agent = Agent(fs, Path(tmp) / "state", ServeOptions(listen="127.0.0.1:0", insecure=True, grace=1))
        agent.service.bench.runner = SurfaceFio(lambda: int((queue / "read_ahead_kb").read_text()),
                                                lambda ra: SURFACE.get(ra, 250e6))
        address = agent.start()
        settings = Settings(db_url=args.db or f"sqlite:///{tmp}/cp.db")
        app = create_app(settings, controller=RecordingController(), agents=AgentClients())
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = serving.Server(app, log_level="warning", lifespan="on")
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            while not server.started:
                time.sleep(0.02)
            url = f"http://127.0.0.1:{sock.getsockname()[1]}/api/v1"
            token = issue_token(app, Role.ADMIN, name="bench")
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
                _, topology, _ = asyncio.run(_topology(address))
                http.post("/agents/register", json={
                    "name": "bench-1", "address": address, "labels": {"role": "bench"},
                    "facts": {"kernel": "6.1.0", "agent_version": "bench", "boot_id": "b"},
                    "topology": topology.model_dump(mode="json")}).raise_for_status()
                started = time.monotonic()
                created = http.post("/experiments", json=experiment(VALUES[: args.values]))
                created.raise_for_status()
                exp_id = created.json()["metadata"]["uid"]
                while True:
                    doc = http.get(f"/experiments/{exp_id}").json()
                    if doc["status"]["state"] in ("done", "failed", "cancelled"):
                        break
                    time.sleep(0.05)
                wall = time.monotonic() - started
        finally:
            server.should_exit = True
            thread.join(timeout=15)
            agent.stop()
            app.state.engine.dispose()
    trials = doc["status"]["trials"]
    spans = [(t["finishedAt"], t["startedAt"]) for t in trials if t["finishedAt"] and t["startedAt"]]
    from datetime import datetime

    per_trial = [(datetime.fromisoformat(f) - datetime.fromisoformat(s)).total_seconds() for f, s in spans]
    per = wall / len(trials)
    print(f"experiment {exp_id}: {doc['status']['state']}, {len(trials)} trials in {wall:.2f} s "
          f"(fio's own runtime: 0 s, SurfaceFio), db {settings.db_url.split(':')[0]}")
    print(f"orchestration per trial: {per:.3f} s (wall / trials, submission to the host put back); "
          f"trial rows: median {statistics.median(per_trial):.3f} s, max {max(per_trial):.3f} s "
          f"(queued run to recorded measurement)")
    print(f"target < {TARGET_S:g} s: {'met' if per < TARGET_S else 'NOT met'}")
    return 0 if per < TARGET_S else 1


async def _topology(address: str) -> Any:
    clients = AgentClients()
    try:
        return await clients.for_address(address).get_topology()
    finally:
        await clients.close()


if __name__ == "__main__":
    raise SystemExit(main())
