"""Benchmark schedules: cron expressions, one run per matching host, and fire times missed
while the server was down fired once, not once each."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import FastAPI

from stortune.server import RecordingController
from stortune.server.agentclient import FakeAgentClients
from stortune.server.bench import cron
from tests.server.benchfakes import BenchAgent, spec_doc, streamers
from tests.server.builders import API, loop_topology, registration
from tests.server.conftest import Eventually
from tests.server.support import AppFactory, FakeClock, TestClient, admin_client

S = f"{API}/benchmarks/schedules"
RUNS = f"{API}/benchmarks/runs"
FAST = {"benchmark_interval_s": 0.05}


def schedule_doc(name: str = "nightly", *, at: str = "0 * * * *", suspend: bool = False,
                 benchmark: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "stortune/v1", "kind": "BenchmarkSchedule", "metadata": {"name": name},
            "spec": {"schedule": at, "suspend": suspend, "benchmark": benchmark or streamers()}}


def register(client: TestClient, name: str, role: str = "streamer") -> None:
    body = registration(name, labels={"role": role}, topology=loop_topology(name))
    assert client.post(f"{API}/agents/register", json=body).status_code == 200


def scheduled_runs(client: TestClient, name: str = "nightly") -> list[dict[str, Any]]:
    return list(client.get(RUNS, params={"schedule": name}).json()["items"])


@pytest.fixture
def agents() -> FakeAgentClients:
    agents = FakeAgentClients()
    for host in ("h1", "h2", "db1"):
        agents.add(BenchAgent(address=registration(host)["address"]))
    return agents


def test_cron_expressions() -> None:
    noon = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)  # a Saturday
    assert cron.next_after("0 3 * * *", noon) == datetime(2025, 3, 2, 3, 0, tzinfo=UTC)
    assert cron.next_after("*/15 * * * mon-fri", noon) == datetime(2025, 3, 3, 0, 0, tzinfo=UTC)
    assert cron.next_after("0 12 * * *", noon) == datetime(2025, 3, 2, 12, 0, tzinfo=UTC)  # strictly after
    assert cron.next_after("@daily", noon) == datetime(2025, 3, 2, tzinfo=UTC)
    assert cron.check("  0  3 * *   * ") == "0 3 * * *"
    for bad, words in (("0 3 * * * *", "has 6 fields"), ("61 * * * *", "the minute field '61'"),
                       ("0 25 * * *", "the hour field '25'"), ("0 3 31 2 *", "never fires"),
                       ("@reboot", "known shortcuts"), ("", "empty")):
        with pytest.raises(ValueError, match=words):
            cron.check(bad)


def test_a_schedule_fires_once_after_downtime_however_many_times_it_missed(
        make_app: AppFactory, agents: FakeAgentClients, clock: FakeClock, eventually: Eventually) -> None:
    first = make_app(agents=agents, controller=RecordingController(), **FAST)
    with admin_client(first) as client:
        register(client, "h1")
        register(client, "h2")
        register(client, "db1", role="database")
        created = client.post(S, json=schedule_doc())
        assert created.status_code == 201, created.text
        assert created.json()["status"]["nextRunAt"] == "2025-03-01T13:00:00Z"
        assert scheduled_runs(client) == []
    first.state.engine.dispose()

    clock.advance(5 * 3600 + 60)  # down from 12:00 to 17:01: five fire times missed
    second = make_app(agents=agents, controller=RecordingController(), **FAST)
    with admin_client(second) as client:
        eventually(lambda: len(scheduled_runs(client)) == 2, what="one run per streamer")
        status = client.get(f"{S}/nightly").json()["status"]
        assert status["nextRunAt"] == "2025-03-01T18:00:00Z"
        assert status["lastFiredAt"] == "2025-03-01T17:01:00Z"
        assert status["lastMessage"] == "queued 2 run(s)"
        runs = scheduled_runs(client)
        assert sorted(r["spec"]["host"] for r in runs) == ["h1", "h2"]
        assert {r["spec"]["requestedBy"] for r in runs} == {"schedule nightly"}
        eventually(lambda: all(r["status"]["state"] == "done" for r in scheduled_runs(client)), what="done")
        clock.advance(30 * 60)  # 17:31: not due yet
        # A run asked for now is started by a pass that looked at the schedules first.
        probe = client.post(RUNS, json=spec_doc("probe"), params={"host": "h1"}).json()["items"][0]
        eventually(lambda: client.get(f"{RUNS}/{probe['metadata']['name']}").json()["status"]["state"]
                   == "done", what="a pass at 17:31")
        assert len(scheduled_runs(client)) == 2
        clock.advance(30 * 60)  # 18:01
        eventually(lambda: len(scheduled_runs(client)) == 4, what="the 18:00 firing")


def test_a_host_whose_previous_run_is_not_over_is_skipped(
        make_app: AppFactory, agents: FakeAgentClients, clock: FakeClock, eventually: Eventually) -> None:
    slow = agents.agents[registration("h1")["address"]]
    assert isinstance(slow, BenchAgent)
    slow.auto = False
    app = make_app(agents=agents, controller=RecordingController(), **FAST)
    with admin_client(app) as client:
        register(client, "h1")
        assert client.post(S, json=schedule_doc()).status_code == 201
        clock.advance(3600)
        eventually(lambda: len(scheduled_runs(client)) == 1, what="first firing")
        clock.advance(3600)
        eventually(lambda: client.get(f"{S}/nightly").json()["status"]["lastFiredAt"]
                   == "2025-03-01T14:00:00Z", what="second firing")
        assert len(scheduled_runs(client)) == 1
        assert client.get(f"{S}/nightly").json()["status"]["lastMessage"] == (
            "queued 0 run(s); skipped h1: the previous run is not over")


def test_suspend_replace_and_delete(app: FastAPI, clock: FakeClock, eventually: Eventually) -> None:
    with admin_client(app) as client:
        register(client, "h1")
        assert client.post(S, json=schedule_doc(suspend=True)).status_code == 201
        assert client.post(S, json=schedule_doc()).status_code == 409
        assert client.get(f"{S}/nightly").json()["status"]["nextRunAt"] is None
        replaced = client.put(f"{S}/nightly", json=schedule_doc(at="30 4 * * *"))
        assert replaced.status_code == 200
        assert replaced.json()["spec"]["schedule"] == "30 4 * * *"
        assert replaced.json()["status"]["nextRunAt"] == "2025-03-02T04:30:00Z"
        assert [s["metadata"]["name"] for s in client.get(S).json()["items"]] == ["nightly"]
        assert client.put(f"{S}/other", json=schedule_doc()).status_code == 422  # name differs from path
        assert client.delete(f"{S}/nightly").status_code == 200
        assert client.get(f"{S}/nightly").status_code == 404
        assert client.put(f"{S}/nightly", json=schedule_doc()).status_code == 404


def test_invalid_schedules_name_the_field(client: TestClient) -> None:
    def causes(doc: dict[str, Any]) -> dict[str, str]:
        response = client.post(S, json=doc)
        assert response.status_code == 422, response.text
        return {c["field"]: c["message"] for c in response.json()["details"]["causes"]}

    assert "spec.schedule" in causes(schedule_doc(at="61 * * * *"))
    assert causes(schedule_doc(benchmark=spec_doc())) == {
        "spec.benchmark.spec.hostSelector": "required: a schedule runs on the hosts this selector matches"}
    bad = schedule_doc(benchmark=streamers(workloads=[{"preset": "nope"}]))
    assert list(causes(bad)) == ["spec.benchmark.spec.workloads[0].preset"]
    extra = schedule_doc()
    extra["spec"]["every"] = "hour"
    assert causes(extra) == {"spec.every": "unknown field"}
    nameless = schedule_doc()
    nameless["metadata"] = {}
    assert "metadata.name" in causes(nameless)
