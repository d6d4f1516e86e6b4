"""The benchmark run queue through the REST API, with the agent faked at its one seam.

Runs are rows: they are started one per host in order, followed, stored with
their result and raw files, retried when the agent is busy or away, failed with
the agent's reason when it refuses, cancelled, and picked up again by a
restarted server. Every test runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi import FastAPI

from stortune.schemas.protection import HOW_TO_CHANGE
from stortune.schemas.topology import Device, DeviceKind, Mount, Topology
from stortune.server.agentclient import (
    AgentBusy,
    AgentRejected,
    AgentUnreachable,
    FakeAgentClients,
)
from tests.server.benchfakes import BenchAgent, spec_doc, streamers
from tests.server.builders import API, loop_topology, registration
from tests.server.conftest import Eventually
from tests.server.support import AppFactory, FakeClock, TestClient, admin_client

RUNS = f"{API}/benchmarks/runs"
FAST = {"benchmark_interval_s": 0.05, "benchmark_unreachable_timeout_s": 60}


def address(host: str) -> str:
    return registration(host)["address"]


@pytest.fixture
def agents() -> FakeAgentClients:
    return FakeAgentClients()


@pytest.fixture
def agent(agents: FakeAgentClients) -> BenchAgent:
    return agents.add(BenchAgent(address=address("h1")))  # type: ignore[return-value]


@pytest.fixture
def server(make_app: AppFactory, agents: FakeAgentClients) -> FastAPI:
    from stortune.server import RecordingController

    return make_app(agents=agents, controller=RecordingController(), **FAST)


@pytest.fixture
def client(server: FastAPI) -> Iterator[TestClient]:
    with admin_client(server) as test_client:
        register(test_client, "h1")
        yield test_client


def register(client: TestClient, name: str, labels: dict[str, str] | None = None) -> None:
    body = registration(name, labels=labels, topology=loop_topology(name))
    assert client.post(f"{API}/agents/register", json=body).status_code == 200


def start(client: TestClient, doc: dict[str, Any], **params: str) -> list[str]:
    response = client.post(RUNS, json=doc, params=params)
    assert response.status_code == 201, response.text
    return [item["metadata"]["name"] for item in response.json()["items"]]


def run(client: TestClient, run_id: str) -> dict[str, Any]:
    response = client.get(f"{RUNS}/{run_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def state(client: TestClient, run_id: str) -> str:
    return str(run(client, run_id)["status"]["state"])


def calls(agent: BenchAgent, method: str) -> list[Any]:
    return [args for name, args in agent.calls if name == method]


def test_a_run_is_started_followed_and_its_result_stored(
        client: TestClient, agent: BenchAgent, eventually: Eventually) -> None:
    (run_id,) = start(client, streamers(repeats=3))
    doc = eventually(lambda: (d := run(client, run_id))["status"]["state"] == "done" and d, what="run done")
    status = doc["status"]
    assert doc["spec"]["host"] == "h1" and doc["spec"]["requestedBy"].startswith("test-admin (token ")
    assert status["progress"]["percent"] == 100.0 and status["finishedAt"]
    assert status["context"] == {"kernel": "6.1.0-test", "fioVersion": "fio-3.33", "topologyHash": "topo-1",
                                 "profiles": {"streaming": 1}}
    result = status["result"]
    assert [s["step"] for s in result["summaries"]] == ["seq-1m/read", "seq-1m/write"]
    read = result["summaries"][0]["metrics"]["read_bandwidth"]
    assert read["n"] == 3 and read["stdev"] > 0 and read["cv"] is not None and not read["noisy"]
    assert result["context"]["settings"]["loop0"]["read_ahead_kb"] == 128

    raw = client.get(f"{RUNS}/{run_id}/raw").json()
    paths = [item["path"] for item in raw["items"]]
    assert len(paths) == 2 * 3 * 3 and "steps/000-seq-1m_read-r0/fio.json" in paths
    one = client.get(f"{RUNS}/{run_id}/raw", params={"path": "steps/000-seq-1m_read-r0/job.fio"}).json()
    assert one["items"] == [{"path": "steps/000-seq-1m_read-r0/job.fio", "text": "[seq-1m/read]\nrw=read\n"}]

    # The listing is cheap: no result in it. The agent was asked to forget what is now stored.
    (listed,) = client.get(RUNS).json()["items"]
    assert listed["metadata"]["name"] == run_id and listed["status"]["result"] is None
    eventually(lambda: calls(agent, "forget_benchmark") == [run_id], what="forget")
    assert [args[0] for args in calls(agent, "start_benchmark")] == [run_id]


def test_runs_of_one_host_go_one_at_a_time_in_order(
        client: TestClient, agents: FakeAgentClients, agent: BenchAgent, eventually: Eventually) -> None:
    agent.auto = False
    other = agents.add(BenchAgent(address=address("h2"), auto=False))
    register(client, "h2")
    first, second = start(client, spec_doc("first"), host="h1"), start(client, spec_doc("second"), host="h1")
    (elsewhere,) = start(client, spec_doc("third"), host="h2")
    eventually(lambda: state(client, first[0]) == "running" and state(client, elsewhere) == "running",
               what="h1's first and h2's run running")
    assert state(client, second[0]) == "queued"  # waits for h1's first run
    assert [args[0] for args in calls(agent, "start_benchmark")] == first

    agent.finish(first[0])
    eventually(lambda: state(client, first[0]) == "done", what="first done")
    eventually(lambda: state(client, second[0]) == "running", what="second started")
    assert [args[0] for args in calls(agent, "start_benchmark")] == [first[0], second[0]]
    assert calls(other, "start_benchmark")[0][0] == elsewhere
    listed = [i["metadata"]["name"] for i in client.get(RUNS, params={"host": "h1"}).json()["items"]]
    assert listed == [second[0], first[0]]  # newest first
    running = client.get(RUNS, params={"state": ["running", "queued"]}).json()["items"]
    assert {i["metadata"]["name"] for i in running} == {second[0], elsewhere}


def test_live_progress_is_stored(client: TestClient, agent: BenchAgent, eventually: Eventually) -> None:
    agent.auto = False
    (run_id,) = start(client, streamers())
    eventually(lambda: calls(agent, "start_benchmark"), what="started")
    agent.running(run_id, percent=42.0)
    progress = eventually(lambda: (p := run(client, run_id)["status"]["progress"]).get("percent") == 42.0
                          and p, what="progress stored")
    assert progress["readBytesPerSecond"] == 400e6 and progress["message"] == "step 1/2 seq-1m/read"
    assert run(client, run_id)["status"]["message"] == "step 1/2 seq-1m/read"


def test_a_busy_agent_is_asked_again_after_a_backoff(
        client: TestClient, agent: BenchAgent, clock: FakeClock, eventually: Eventually) -> None:
    agent.fail("start_benchmark", AgentBusy(agent.address, "busy: benchmark by-hand running", "ABORTED"),
               times=2)
    (run_id,) = start(client, streamers())
    waiting = eventually(lambda: (s := run(client, run_id)["status"])["attempts"] == 1 and s, what="deferred")
    assert waiting["state"] == "queued" and waiting["nextAttemptAt"]
    assert waiting["message"].startswith("waiting: busy: benchmark by-hand running; next try in ")
    clock.advance(10)
    eventually(lambda: run(client, run_id)["status"]["attempts"] == 2, what="second attempt")
    assert len(calls(agent, "start_benchmark")) == 2  # not retried before its time
    clock.advance(10)
    eventually(lambda: state(client, run_id) == "done", what="done once the agent is free")
    assert len(calls(agent, "start_benchmark")) == 3


def test_a_refused_run_fails_with_the_agents_reason(
        client: TestClient, agent: BenchAgent, eventually: Eventually) -> None:
    reason = "refusing to write to /dev/loop0: loop0 holds ext4 (filesystem), signature at byte 1080"
    agent.fail("start_benchmark", AgentRejected(agent.address, reason, "FAILED_PRECONDITION"))
    (run_id,) = start(client, streamers())
    status = eventually(lambda: (s := run(client, run_id)["status"])["state"] == "failed" and s,
                        what="failed")
    assert status["message"] == f"refused by the agent: {reason}"
    assert status["result"] is None and len(calls(agent, "start_benchmark")) == 1


def test_an_unreachable_agent_is_retried_then_the_run_fails_with_the_reason(
        client: TestClient, agent: BenchAgent, clock: FakeClock, eventually: Eventually) -> None:
    agent.unreachable("connection refused")
    (run_id,) = start(client, streamers())
    eventually(lambda: run(client, run_id)["status"]["attempts"] >= 1, what="first attempt")
    assert "unreachable since" in run(client, run_id)["status"]["message"]
    for _ in range(20):
        status = run(client, run_id)["status"]
        if status["state"] == "failed":
            break
        clock.now = datetime.fromisoformat(status["nextAttemptAt"]) + timedelta(seconds=1)
        eventually(lambda a=status["attempts"]: run(client, run_id)["status"]["attempts"] > a
                   or state(client, run_id) == "failed", what="another attempt")
    status = run(client, run_id)["status"]
    assert status["state"] == "failed"
    assert status["message"].startswith(f"not started: agent at {agent.address} unreachable since ")
    assert status["message"].endswith(": connection refused")


def test_hostile_a_running_run_of_a_deleted_host_whose_agent_is_away_ends_and_is_not_followed(
        client: TestClient, agent: BenchAgent, eventually: Eventually) -> None:
    """It was followed, its agent dialled, until the unreachable timeout (10 minutes)."""
    agent.auto = False
    (run_id,) = start(client, streamers())
    eventually(lambda: state(client, run_id) == "running", what="running")
    agent.unreachable("connection refused")
    assert client.delete(f"{API}/hosts/h1").status_code == 200
    status = eventually(lambda: (s := run(client, run_id)["status"])["state"] == "failed" and s,
                        what="failed")
    assert "h1 was deleted" in status["message"]
    followed = len(agent.calls)
    time.sleep(10 * FAST["benchmark_interval_s"])  # the dispatcher's passes go on meanwhile
    assert state(client, run_id) == "failed" and len(agent.calls) == followed


def test_an_agent_that_lost_a_running_run_fails_it(
        client: TestClient, agent: BenchAgent, eventually: Eventually) -> None:
    agent.auto = False
    (run_id,) = start(client, streamers())
    eventually(lambda: state(client, run_id) == "running", what="running")
    agent.started.pop(run_id)
    agent.benchmarks.pop(run_id)  # the agent's state directory was wiped
    status = eventually(lambda: (s := run(client, run_id)["status"])["state"] == "failed" and s,
                        what="failed")
    assert "no longer has this run" in status["message"]


def test_cancel_a_queued_run_at_once_and_a_running_one_through_its_agent(
        client: TestClient, agent: BenchAgent, eventually: Eventually) -> None:
    agent.auto = False
    (first,) = start(client, streamers())
    (second,) = start(client, streamers())
    eventually(lambda: state(client, first) == "running", what="first running")

    response = client.post(f"{RUNS}/{second}/cancel")
    assert response.status_code == 200 and response.json()["status"]["state"] == "cancelled"
    assert response.json()["status"]["message"] == "cancelled before it started"

    response = client.post(f"{RUNS}/{first}/cancel")
    assert response.status_code == 202
    assert response.json()["status"]["cancelRequested"] is True
    status = eventually(lambda: (s := run(client, first)["status"])["state"] == "cancelled" and s,
                        what="cancelled by the agent")
    assert calls(agent, "cancel_benchmark") == [first]
    assert len(status["result"]["runs"]) == 1  # what finished before the cancel is kept
    assert [args[0] for args in calls(agent, "start_benchmark")] == [first]  # never the cancelled one
    again = client.post(f"{RUNS}/{first}/cancel")
    assert again.status_code == 200 and again.json()["status"]["state"] == "cancelled"


def test_a_restarted_server_reattaches_to_running_runs_and_starts_queued_ones(
        make_app: AppFactory, agents: FakeAgentClients, agent: BenchAgent, eventually: Eventually) -> None:
    agent.auto = False
    first = make_app(agents=agents, **FAST)
    with admin_client(first) as client:
        register(client, "h1")
        (running,) = start(client, streamers())
        (queued,) = start(client, streamers())
        eventually(lambda: state(client, running) == "running", what="running")
    first.state.engine.dispose()
    # While no server runs, the benchmark ends on the host.
    agent.finish(running)
    agent.auto = True

    second = make_app(agents=agents, **FAST)
    with admin_client(second) as client:
        eventually(lambda: state(client, running) == "done", what="the running run re-attached and stored")
        eventually(lambda: state(client, queued) == "done", what="the queued run started after it")
        assert run(client, running)["status"]["result"]["state"] == "done"
    starts = [args[0] for args in calls(agent, "start_benchmark")]
    assert starts == [running, queued]  # re-attached, not started again


def test_a_cancel_asked_for_survives_a_restart(
        make_app: AppFactory, agents: FakeAgentClients, agent: BenchAgent, eventually: Eventually) -> None:
    agent.auto = False
    agent.fail("cancel_benchmark", AgentUnreachable(agent.address, "connection reset", "UNAVAILABLE"))
    first = make_app(agents=agents, **FAST)
    with admin_client(first) as client:
        register(client, "h1")
        (run_id,) = start(client, streamers())
        eventually(lambda: state(client, run_id) == "running", what="running")
        assert client.post(f"{RUNS}/{run_id}/cancel").status_code == 202
        eventually(lambda: calls(agent, "cancel_benchmark"), what="a cancel attempted")
    first.state.engine.dispose()
    agent.fail("cancel_benchmark", None)

    second = make_app(agents=agents, **FAST)
    with admin_client(second) as client:
        eventually(lambda: state(client, run_id) == "cancelled", what="cancelled after the restart")


def test_stopping_while_the_queue_is_woken_stops(server: FastAPI) -> None:
    """A wake-up (a driver ending) in the same tick as stop()'s cancel must not keep the
    dispatcher running: on Python 3.11 asyncio.wait_for swallowed that cancel, and the app's
    shutdown waited forever for the dispatcher's loop."""
    dispatcher = server.state.benchmarks

    async def start_then_stop_while_woken() -> None:
        await dispatcher.start()
        await asyncio.sleep(0.3)  # the first pass is over: the loop waits to be woken
        dispatcher._wakeup.set()  # set directly, as a driver's done-callback does, then cancel
        await asyncio.wait_for(dispatcher.stop(), timeout=10)

    asyncio.run(start_then_stop_while_woken())


def test_invalid_requests_name_the_field(client: TestClient) -> None:
    bad = streamers(workloads=[{"preset": "seq-1m", "runtime": "1q"}])
    response = client.post(RUNS, json=bad)
    assert response.status_code == 422
    assert response.json()["details"]["causes"][0] == {
        "field": "spec.workloads[0].runtime", "reason": "FieldValueInvalid",
        "message": "'1q' is not a duration like 30s, 500ms, 2m or 30 (seconds)"}

    def cause(doc: dict[str, Any], **params: str) -> tuple[int, str, str]:
        r = client.post(RUNS, json=doc, params=params)
        found = (r.json().get("details", {}).get("causes") or [{"field": "", "message": ""}])[0]
        return r.status_code, found["field"], found["message"]

    assert cause(spec_doc()) == (422, "spec.hostSelector", "required by the control plane: name the hosts "
                                 "to run on with matchLabels or matchExpressions, or give ?host=NAME")
    assert cause(streamers(), host="h1")[0] == 201
    assert cause(spec_doc(selector={"matchLabels": {"role": "db"}})) == (
        422, "spec.hostSelector", "matches no registered host")
    mismatch = spec_doc(selector={"matchLabels": {"role": "db"}})
    assert cause(mismatch, host="h1")[:2] == (422, "spec.hostSelector")
    assert client.post(RUNS, json=spec_doc(), params={"host": "nope"}).status_code == 404
    unsafe = spec_doc()
    unsafe["spec"]["allowDestructive"] = False
    status, field, message = cause(unsafe, host="h1")
    assert (status, field) == (422, "spec") and "allowDestructive is not true" in message
    yaml_body = client.post(RUNS, params={"host": "h1"}, headers={"content-type": "application/yaml"},
                            content="apiVersion: stortune/v1\nkind: BenchmarkSpec\nmetadata: {name: y}\n"
                                    "spec: {target: {file: {path: /srv/x.dat, size: 1G}}, workloads: "
                                    "[{preset: seq-1m, runtime: 1s}]}\n")
    assert yaml_body.status_code == 201, yaml_body.text
    assert client.get(f"{RUNS}/no-such-run").status_code == 404
    assert client.get(f"{RUNS}/bad%20id").status_code == 404


def test_hostile_a_dry_run_on_the_root_disk_names_the_refusal_the_agent_would_make(
        client: TestClient) -> None:
    vda = Device(name="vda", kind=DeviceKind.DISK, id="name:vda", partitions=["vda1"])
    vda1 = Device(name="vda1", kind=DeviceKind.PARTITION, id="name:vda1", parent="vda",
                  mounts=[Mount(mountpoint="/", fstype="ext4", source="/dev/vda1", options=["rw"])])
    body = registration("h3", topology=Topology(hostname="h3", devices=[vda, vda1]))
    assert client.post(f"{API}/agents/register", json=body).status_code == 200
    reads = spec_doc(target={"device": {"name": ["vda"]}},
                     workloads=[{"preset": "stream-32k", "runtime": "1s"}])
    host = client.post(RUNS, json=reads, params={"dryRun": "All", "host": "h3"}).json()["hosts"][0]
    assert host["refusals"] == ["vda carries vda1, which holds /: a protected device, no benchmark runs on"
                                f" it ({HOW_TO_CHANGE})"]
    writes = spec_doc(target={"device": {"name": ["vda"]}})
    host = client.post(RUNS, json=writes, params={"dryRun": "All", "host": "h3"}).json()["hosts"][0]
    assert host["refusals"][1:] == ["vda has partitions vda1"]
    assert client.get(RUNS).json()["items"] == []


def test_a_dry_run_shows_the_hosts_and_their_steps(client: TestClient) -> None:
    register(client, "h2", labels={"role": "streamer"})
    response = client.post(RUNS, json=streamers(workloads=[{"preset": "iometer-4k", "runtime": "5s"}]),
                           params={"dryRun": "All"})
    assert response.status_code == 200
    body = response.json()
    assert body["kind"] == "BenchmarkRunDryRun" and [h["host"] for h in body["hosts"]] == ["h1", "h2"]
    h1 = body["hosts"][0]
    assert h1["target"] == "loop0" and h1["problems"] == [] and h1["refusals"] == []
    assert [(s["name"], s["iodepth"], s["runtime"]) for s in h1["steps"]] == [
        ("iometer-4k/randread", 4, 5.0), ("iometer-4k/randwrite", 4, 5.0), ("iometer-4k/oltp", 4, 5.0)]
    assert client.get(RUNS).json()["items"] == []  # nothing queued
    missing = client.post(RUNS, json=spec_doc(target={"device": {"kind": ["disk"]}}),
                          params={"dryRun": "All", "host": "h1"}).json()
    assert missing["hosts"][0]["problems"] == ["spec.target.device matches no device of this host"]


def test_starting_runs_is_rate_limited_per_token(make_app: AppFactory, agents: FakeAgentClients) -> None:
    app = make_app(agents=agents, rate_limits={"benchmark-runs": 4}, **FAST)
    with admin_client(app) as client:
        register(client, "h1")
        codes = [client.post(RUNS, json=streamers(), params={"dryRun": "All"}).status_code for _ in range(3)]
    assert codes[0] == 200 and codes[-1] == 429


def test_two_servers_on_one_database_start_each_run_once(
        make_app: AppFactory, agents: FakeAgentClients, db_url: str, eventually: Eventually) -> None:
    """Two replicas, six runs on three hosts: each run is started, followed and forgotten by one
    server (on PostgreSQL the hosts' shards divide them; SQLite has one server by design)."""
    if not db_url.startswith("postgresql"):
        pytest.skip("several servers share PostgreSQL only")
    hosts = ["h1", "h2", "h3"]
    fakes = [agents.add(BenchAgent(address=address(h), running_s=0.2)) for h in hosts]
    from stortune.server import RecordingController
    # Leases long enough that a loaded machine's late renewal is no lapse (a lapse stops a driver,
    # and its successor may send the start again: harmless, an agent starts a run id once, but
    # not what this test counts).
    one = make_app(agents=agents, controller=RecordingController(), shard_lease_s=8, **FAST)
    two = make_app(agents=agents, controller=RecordingController(), shard_lease_s=8, **FAST)

    def split() -> bool:
        x, y = one.state.ownership.owned(), two.state.ownership.owned()
        return bool(x) and bool(y) and len(x | y) == 64 and not x & y

    with admin_client(one) as a, admin_client(two) as b:
        for h in hosts:
            register(a, h)
        eventually(split, timeout=60, what="the shards split between the servers")
        queued = [*start(a, streamers(), host="h1"), *start(b, streamers(), host="h1")]
        for h in ("h2", "h3"):
            queued += [*start(a, streamers(), host=h), *start(b, streamers(), host=h)]
        eventually(lambda: all(state(a, r) == "done" for r in queued), what="every run done", timeout=120)
        started = [args[0] for fake in fakes for args in calls(fake, "start_benchmark")]
        assert sorted(started) == sorted(queued)  # each once: not once per server
        def forgotten() -> list[str]:
            return sorted(run_id for fake in fakes for run_id in calls(fake, "forget_benchmark"))

        # Each forgotten; the sweep may repeat a forget its driver made a moment before (on one
        # server as on two: the agent answers NotFound, which counts as forgotten).
        eventually(lambda: set(forgotten()) == set(queued), what="each run forgotten", timeout=60)
